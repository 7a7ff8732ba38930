"""Iterative modulo scheduling (Rau, "Iterative Modulo Scheduling: An Algorithm for Software
Pipelining Loops", MICRO-27, 1994) and list scheduling, over resource reservation tables.

A loop body is a set of operations, each with an :class:`~perfcast.ir.rrt.RRT` (resource ×
cycle → units), and dependence edges ``(src, dst, latency, distance)``: ``dst`` of iteration
``i + distance`` may start ``latency`` cycles after ``src`` of iteration ``i`` starts. The
initiation interval II is the distance in cycles between the starts of consecutive iterations:

- **ResMII** = max over resources of ⌈units·cycles used per iteration / capacity⌉ (§2.1);
- **RecMII** = max over dependence cycles of ⌈Σ latency / Σ distance⌉ (§2.2), found here as the
  smallest II for which no cycle has positive weight Σ(latency − II·distance);
- the schedule places each op at a cycle where the **modulo reservation table** (MRT: resource ×
  II slots) has room, highest-priority first (height-based), evicting and rescheduling with a
  budget when an op finds no slot (§3–4); if the budget runs out, II + 1 is tried.

(II is searched cycle by cycle up to a thousand cycles, then in steps of 0.1 % of the lower
bound, so that kernels lasting millions of cycles schedule quickly.) A loop of ``n`` iterations
then takes ``(n − 1)·II + L`` cycles, ``L`` = one iteration's schedule
length. A DAG (a graph, no recurrences) is list-scheduled: each op as early as its predecessors
and the resources allow.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from perfcast.ir.rrt import RRT


@dataclass(frozen=True)
class Edge:
    src: str
    dst: str
    latency: int
    distance: int = 0


@dataclass(frozen=True)
class Schedule:
    ii: int
    res_mii: int
    rec_mii: int
    start: dict[str, int]  # op → issue cycle within one iteration
    length: int  # one iteration's schedule length
    limiter: str  # what set the II: "resource <r>", "recurrence <a→b→…>", or "search"

    def total(self, n: int) -> int:
        """Cycles of ``n`` iterations: (n − 1)·II + L."""
        return 0 if n <= 0 else (n - 1) * self.ii + self.length


def res_mii(ops: Mapping[str, RRT], capacity: Mapping[str, int]) -> tuple[int, str | None]:
    """(ResMII, the resource that sets it)."""
    best, which = 1, None
    for r in sorted({r for rrt in ops.values() for r in rrt.resources}):
        cap = capacity.get(r, 1)
        need = math.ceil(sum(rrt.usage(r) for rrt in ops.values()) / cap)
        if need > best or which is None and need == best:
            best, which = need, r
    return best, which


def _positive_cycle(names: Sequence[str], edges: Sequence[Edge], ii: int) -> bool:
    """Does the graph with weights latency − II·distance have a positive cycle? (Floyd–Warshall
    on longest paths; the graphs are loop bodies, tens of ops.)"""
    idx = {n: i for i, n in enumerate(names)}
    k = len(names)
    neg = -math.inf
    d = [[neg] * k for _ in range(k)]
    for e in edges:
        w = e.latency - ii * e.distance
        a, b = idx[e.src], idx[e.dst]
        d[a][b] = max(d[a][b], w)
    for m in range(k):
        dm = d[m]
        for i in range(k):
            dim = d[i][m]
            if dim == neg:
                continue
            di = d[i]
            for j in range(k):
                if dm[j] != neg and dim + dm[j] > di[j]:
                    di[j] = dim + dm[j]
    return any(d[i][i] > 0 for i in range(k))


def rec_mii(names: Sequence[str], edges: Sequence[Edge]) -> tuple[int, str | None]:
    """(RecMII, a description of the critical recurrence) — 1 when there is none."""
    carried = [e for e in edges if e.distance > 0]
    if not carried:
        return 1, None
    hi = max(1, sum(e.latency for e in edges))
    lo = 1
    while lo < hi:  # smallest II without a positive cycle
        mid = (lo + hi) // 2
        if _positive_cycle(names, edges, mid):
            lo = mid + 1
        else:
            hi = mid
    if lo == 1 and not _positive_cycle(names, edges, 0):
        return 1, None
    # name the recurrence: the carried edge whose own cycle (back through this iteration's
    # edges) has the largest latency per distance
    def ratio(e: Edge) -> float:
        back = _longest(names, [x for x in edges if x.distance == 0], e.dst, e.src)
        return -1.0 if back is None else (back + e.latency) / e.distance

    worst = max(carried, key=ratio)
    return lo, f"{worst.src}→{worst.dst} (distance {worst.distance})"


def _longest(names, edges, a: str, b: str) -> int | None:
    """Longest path a → b over acyclic edges (0 when a is b), None when b is unreachable."""
    best: dict[str, int] = {a: 0}
    order = list(names)
    for _ in order:
        changed = False
        for e in edges:
            if e.src in best and best[e.src] + e.latency > best.get(e.dst, -1):
                best[e.dst] = best[e.src] + e.latency
                changed = True
        if not changed:
            break
    return best.get(b)


def _overloaded(intervals, capacity: int) -> bool:
    """Do ``(start, end, units)`` intervals ever hold more than ``capacity`` units at once?"""
    events = []
    for a, b, u in intervals:
        events += [(a, u), (b, -u)]
    load = 0
    for _, du in sorted(events):  # at equal times releases (negative) come first
        load += du
        if load > capacity:
            return True
    return False


class _MRT:
    """Modulo reservation table: per resource, the units in use on the ring of II slots, kept as
    intervals (a span of n cycles at cycle t covers ⌊n/II⌋ whole turns plus a remainder), with
    who holds them."""

    def __init__(self, ii: int, capacity: Mapping[str, int]):
        self.ii, self.capacity = ii, capacity
        self.held: dict[str, list[tuple[int, int, int, str]]] = {}  # resource → (start, end, units, op)

    def _pieces(self, rrt: RRT, t: int):
        ii = self.ii
        for r, o, n, u in rrt.spans:
            if not u or not n:
                continue
            turns, rest = divmod(n, ii)
            if turns:
                yield r, 0, ii, u * turns
            if rest:
                a = (t + o) % ii
                if a + rest <= ii:
                    yield r, a, a + rest, u
                else:
                    yield r, a, ii, u
                    yield r, 0, a + rest - ii, u

    def fits(self, rrt: RRT, t: int) -> bool:
        new: dict[str, list[tuple[int, int, int]]] = {}
        for r, a, b, u in self._pieces(rrt, t):
            new.setdefault(r, []).append((a, b, u))
        return not any(_overloaded([h[:3] for h in self.held.get(r, ())] + pieces, self.capacity.get(r, 1))
                       for r, pieces in new.items())

    def conflicts(self, rrt: RRT, t: int) -> set[str]:
        out: set[str] = set()
        for r, a, b, _ in self._pieces(rrt, t):
            out |= {op for x, y, _, op in self.held.get(r, ()) if x < b and a < y}
        return out

    def place(self, name: str, rrt: RRT, t: int) -> None:
        for r, a, b, u in self._pieces(rrt, t):
            self.held.setdefault(r, []).append((a, b, u, name))

    def remove(self, name: str) -> None:
        for r in self.held:
            self.held[r] = [h for h in self.held[r] if h[3] != name]

    def candidates(self, rrt: RRT, estart: int) -> list[int]:
        """Issue cycles in [estart, estart + II) where feasibility can change: estart, and every
        cycle that lines one of the op's spans up with the end of a held interval."""
        ii = self.ii
        out = {estart}
        for r, o, n, u in rrt.spans:
            for _, end, _, _ in self.held.get(r, ()):
                out.add(estart + (end - o - estart) % ii)
        return sorted(out)


def _feasible_alone(ops: Mapping[str, RRT], capacity: Mapping[str, int]) -> None:
    for name, rrt in ops.items():
        for r, _, n, u in rrt.spans:
            if n and u > capacity.get(r, 1):
                raise ValueError(f"op {name} needs {u} units of {r} at once; capacity {capacity.get(r, 1)}")


def modulo_schedule(ops: Mapping[str, RRT], edges: Sequence[Edge], capacity: Mapping[str, int],
                    budget_ratio: int = 6, max_ii: int | None = None) -> Schedule:
    """The smallest-II modulo schedule found by iterative modulo scheduling."""
    names = list(ops)
    if not names:
        return Schedule(1, 1, 1, {}, 0, "empty body")
    _feasible_alone(ops, capacity)
    rmii, rres = res_mii(ops, capacity)
    cmii, crec = rec_mii(names, edges)
    mii = max(rmii, cmii)
    limit = max_ii or max(mii, sum(rrt.length for rrt in ops.values()) + sum(e.latency for e in edges) + 1)
    # II is searched in steps of 1 cycle for small loops and of ⌈MII/1024⌉ cycles for kernels
    # whose ops last thousands of cycles: the II found is then within 0.1 % of the smallest
    step = max(1, -(-mii // 1024))
    for ii in range(mii, limit + step, step):
        start = _iterative(ops, edges, capacity, ii, budget_ratio * len(names))
        if start is not None:
            length = max(start[n] + ops[n].length for n in names)
            if ii == rmii and rmii >= cmii and rres is not None:
                limiter = f"resource {rres}"
            elif ii == cmii and crec is not None:
                limiter = f"recurrence {crec}"
            else:
                limiter = "search (no schedule at the lower bound)"
            return Schedule(ii, rmii, cmii, start, length, limiter)
    raise RuntimeError(f"no modulo schedule up to II = {limit}")


def _heights(ops, edges, ii) -> dict[str, int]:
    """HeightR (Rau §3.2): the longest path to the end, with edge weights latency − II·distance."""
    h = {n: ops[n].length for n in ops}
    for _ in range(len(ops) + 1):
        changed = False
        for e in edges:
            v = h[e.dst] + e.latency - ii * e.distance
            if v > h[e.src]:
                h[e.src] = v
                changed = True
        if not changed:
            break
    return h


def _iterative(ops, edges, capacity, ii: int, budget: int) -> dict[str, int] | None:
    preds: dict[str, list[Edge]] = {n: [] for n in ops}
    succs: dict[str, list[Edge]] = {n: [] for n in ops}
    for e in edges:
        preds[e.dst].append(e)
        succs[e.src].append(e)
    height = _heights(ops, edges, ii)
    rank = {n: i for i, n in enumerate(ops)}  # ties keep the body's order
    order = sorted(ops, key=lambda n: (-height[n], rank[n]))
    mrt = _MRT(ii, capacity)
    time: dict[str, int] = {}
    last: dict[str, int] = {}
    pending = list(order)
    while pending and budget > 0:
        budget -= 1
        op = pending.pop(0)
        estart = max((time[e.src] + e.latency - ii * e.distance for e in preds[op] if e.src in time), default=0)
        estart = max(estart, 0)
        slot = next((t for t in mrt.candidates(ops[op], estart) if mrt.fits(ops[op], t)), None)
        if slot is None:  # evict: at Estart, or one past this op's previous slot
            slot = estart if op not in last or estart > last[op] else last[op] + 1
            for victim in mrt.conflicts(ops[op], slot):
                mrt.remove(victim)
                time.pop(victim)
                pending.append(victim)
        mrt.place(op, ops[op], slot)
        time[op] = last[op] = slot
        for e in succs[op]:  # successors whose dependence is now violated are rescheduled
            if e.dst in time and e.dst != op and time[e.dst] < slot + e.latency - ii * e.distance:
                mrt.remove(e.dst)
                time.pop(e.dst)
                pending.append(e.dst)
        pending.sort(key=lambda n: (-height[n], rank[n]))
    if pending:
        return None
    base = min(time.values())
    return {n: t - base for n, t in time.items()}


def list_schedule(ops: Mapping[str, RRT], edges: Sequence[Edge], capacity: Mapping[str, int]
                  ) -> tuple[dict[str, int], int]:
    """A DAG's list schedule (in the given op order, each as early as its predecessors and the
    resources allow): (start cycles, length)."""
    _feasible_alone(ops, capacity)
    preds: dict[str, list[Edge]] = {n: [] for n in ops}
    for e in edges:
        if e.distance:
            raise ValueError("list scheduling takes a DAG (no loop-carried edges)")
        preds[e.dst].append(e)
    held: dict[str, list[tuple[int, int, int]]] = {}  # resource → (start, end, units)

    def fits(rrt: RRT, t: int) -> bool:
        for r, o, n, u in rrt.spans:
            if not (n and u):
                continue
            a, b = t + o, t + o + n
            overlapping = [(max(x, a), min(y, b), v) for x, y, v in held.get(r, ()) if x < b and a < y]
            if _overloaded([(a, b, u), *overlapping], capacity.get(r, 1)):
                return False
        return True

    start: dict[str, int] = {}
    for op in ops:  # the op order is a topological order (trace order)
        rrt = ops[op]
        est = max((start[e.src] + e.latency for e in preds[op]), default=0)
        cands = sorted({est} | {end - o for r, o, n, u in rrt.spans for _, end, _ in held.get(r, ())
                                if end - o > est})
        t = next(c for c in cands if fits(rrt, c))
        for r, o, n, u in rrt.spans:
            if n and u:
                held.setdefault(r, []).append((t + o, t + o + n, u))
        start[op] = t
    length = max((start[n] + ops[n].length for n in ops), default=0)
    return start, length
