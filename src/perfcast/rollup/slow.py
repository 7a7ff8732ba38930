"""The slow roll-up: a resource-aware schedule of a priced op tree at one design point.

Every leaf gets a resource reservation table on the device (``perfcast.ir.rrt``): the cycles, at
the device clock, for which it keeps each resource busy — matrix unit, vector unit, HBM/DMA,
on-chip memory, each link axis — from the same pricing as the analytic time
(the performance model's ``resource_times``; the empirical model's measured time scales the
analytic terms so that their max is the measurement), so that one leaf alone takes exactly its
priced time. A leaf may carry its own table (``Leaf.rrt``, e.g. the WE-3 reference kernel), which
wins.

- A ``Loop`` is **modulo-scheduled** (:mod:`perfcast.rollup.modulo`): its body's ops and their
  dependences — dataflow inside a kernel, stream order between kernels, accumulators carried to
  the next iteration — give ResMII, RecMII and the smallest feasible II; the loop takes
  ``(n − 1)·II + L``. A nested loop or block is scheduled first and enters its parent as one
  unit with its own length and occupancy (each resource's busy cycles, from its start).
- A ``Graph`` is **list-scheduled** as a DAG.

The result says, per loop, which resource or recurrence set the II, and bounds itself: the pure
resource bound (the busiest resource's total cycles) ≤ the slow result ≤ the serial sum of the
leaves (the fast roll-up without launch latency) — a schedule worse than serial is replaced by
the serial one, so the bound always holds. Kernel launch latency is added once per launch, in
series, as in the fast roll-up.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import sympy

from perfcast.ir import Graph, Leaf, Loop, Op
from perfcast.ir.cost import Cost
from perfcast.ir.rrt import RRT
from perfcast.rollup.modulo import Edge, list_schedule, modulo_schedule


@dataclass(frozen=True)
class LoopReport:
    path: str
    n: int
    ii: int
    res_mii: int
    rec_mii: int
    limiter: str
    length: int  # one iteration's schedule length
    cycles: int  # the loop: (n − 1)·II + length (or the serial schedule if that is shorter)
    serial_cycles: int  # n × the iteration's serial sum

    def as_dict(self) -> dict:
        return {"loop": self.path, "n": self.n, "ii": self.ii, "res_mii": self.res_mii, "rec_mii": self.rec_mii,
                "limiter": self.limiter, "iteration_cycles": self.length, "cycles": self.cycles,
                "serial_cycles": self.serial_cycles}


@dataclass
class _Unit:
    name: str
    rrt: RRT
    serial: int  # serial sum of the leaves inside
    usage: dict[str, int]  # resource → busy cycles (all iterations)
    inputs: frozenset[str]
    outputs: frozenset[str]
    events: list = field(default_factory=list)  # (name, resource, start, cycles) for traces


@dataclass
class SlowResult:
    cycles: int
    clock_hz: float
    launch_time_s: float
    loops: list[LoopReport]
    resource_bound_cycles: int
    serial_cycles: int
    events: list  # (name, resource, start cycle, cycles)

    @property
    def time_s(self) -> float:
        return self.cycles / self.clock_hz + self.launch_time_s

    @property
    def resource_bound_time_s(self) -> float:
        """The busiest resource's cycles alone, with the same launch latency: the lower bound."""
        return self.resource_bound_cycles / self.clock_hz + self.launch_time_s

    @property
    def serial_time_s(self) -> float:
        """The leaves one after another, with the same launch latency: the upper bound."""
        return self.serial_cycles / self.clock_hz + self.launch_time_s

    def as_dict(self) -> dict:
        top = self.loops[0] if self.loops else None
        return {"cycles": self.cycles, "time_s": self.time_s, "clock_hz": self.clock_hz,
                "ii": top.ii if top else None, "limiter": top.limiter if top else None,
                "resource_bound_cycles": self.resource_bound_cycles, "serial_cycles": self.serial_cycles,
                "launch_time_s": self.launch_time_s, "loops": [x.as_dict() for x in self.loops]}


class SlowRollup:
    """Schedules ``op`` priced by ``model`` on ``device`` at ``point`` (symbol name → value)."""

    def __init__(self, model, device, capacity: Mapping[str, int] | None = None, trace_iterations: int = 3):
        self.model = model
        self.device = device
        self.clock = float(device.clock_hz)
        self.capacity = dict(capacity) if capacity is not None else _capacities(device)
        self.trace_iterations = trace_iterations
        self._compiled: dict = {}
        self._busy: dict = {}
        self._kernels: dict = {}

    def run(self, op: Op, point: Mapping[str, float], launch_time_s: float = 0.0) -> SlowResult:
        self.point = {str(k): v for k, v in point.items()}
        self.loops: list[LoopReport] = []
        unit = self._unit(op, "", kernel=None, in_kernel=False)
        bound = max(unit.usage.values(), default=0)
        cycles = min(unit.rrt.length, unit.serial)
        return SlowResult(cycles, self.clock, launch_time_s, self.loops, bound, unit.serial, unit.events)

    # --- leaves -------------------------------------------------------------------------
    def _value(self, e) -> float:
        """``e`` at the point. Expressions are compiled once (``lambdify``, the model's NumPy
        efficiency curves) and reused at every point: a sweep substitutes numbers, not symbols."""
        fn = self._compiled.get(e)
        if fn is None:
            fn = self._compiled[e] = self._compile(e)
        return fn(self.point)

    def _compile(self, e):
        e = sympy.sympify(e)
        if e.is_number:
            v = float(self.model.realize(e))
            return lambda point: v
        names = sorted(s.name for s in e.free_symbols)
        f = sympy.lambdify([sympy.Symbol(n) for n in names],
                           e.xreplace({s: sympy.Symbol(s.name) for s in e.free_symbols}),
                           modules=[self.model.numpy_functions(), "numpy"])

        def at(point):
            missing = [n for n in names if n not in point]
            if missing:
                raise ValueError(f"{e} needs a value for {', '.join(missing)} at the design point")
            return float(f(*(point[n] for n in names)))

        return at

    def _cycles(self, seconds) -> int:
        return max(0, math.ceil(self._value(seconds) * self.clock - 1e-9))

    def leaf_rrt(self, leaf: Leaf, kernel: Cost | None) -> RRT:
        """The leaf's table at the point: its own, or one derived from the pricing."""
        if leaf.rrt is not None:
            return leaf.rrt.at(self.point)
        key = (id(leaf), id(kernel))
        busy = self._busy.get(key)
        if busy is None:  # the expressions do not depend on the point: built once
            busy = self._busy[key] = self.model.resource_times(leaf, kernel)
        cyc = {r: self._cycles(t) for r, t in busy.items()}
        spans, compute = [], 0
        for r in ("matrix", "vector"):  # the same cores: matrix work, then vector work
            if cyc.get(r):
                spans.append((r, compute, cyc[r], 1))
                compute += cyc[r]
        spans += [(r, 0, c, 1) for r, c in cyc.items() if r not in ("matrix", "vector") and c]
        return RRT(spans=tuple(spans))

    # --- structure ----------------------------------------------------------------------
    def _unit(self, op: Op, path: str, kernel: Cost | None, in_kernel: bool) -> _Unit:
        here = f"{path}/{op.name}" if path else op.name
        if isinstance(op, Leaf):
            rrt = self.leaf_rrt(op, kernel)
            usage: dict[str, int] = {}
            for r, _, n, u in rrt.spans:
                usage[r] = usage.get(r, 0) + n * u
            return _Unit(op.name, rrt, rrt.length, usage, frozenset(t.name for t in op.inputs),
                         frozenset(t.name for t in op.outputs), [(op.name, r, o, n) for r, o, n, u in rrt.spans])
        if isinstance(op, Graph):
            if op.launch:
                from perfcast.ir import cost as rolled

                if id(op) not in self._kernels:
                    self._kernels[id(op)] = (op, rolled(op))  # (keeps op alive: ids stay unique)
                kernel, in_kernel = self._kernels[id(op)][1], True
            children = [self._unit(c, here, kernel, in_kernel) for c in op.ops]
            return self._graph(op.name, children, in_kernel)
        if isinstance(op, Loop):
            n = self._trips(op)
            body = [self._unit(c, here, kernel, in_kernel) for c in op.body.ops]
            return self._loop(op, here, n, body, in_kernel)
        raise TypeError(f"not an op: {op!r}")

    def _trips(self, loop: Loop) -> int:
        v = self._value(loop.n_iter)
        if not float(v).is_integer() or v < 0:
            raise ValueError(f"loop {loop.name}: trip count {loop.n_iter} = {v} is not a whole number at the point")
        return int(v)

    def _edges(self, units: list[_Unit], in_kernel: bool) -> list[Edge]:
        """Dataflow inside a kernel; stream order between kernels (one after another)."""
        edges = []
        if not in_kernel:
            for a, b in zip(units, units[1:]):
                edges.append(Edge(a.name, b.name, a.rrt.result_latency))
            return edges
        producer: dict[str, _Unit] = {}
        for u in units:
            for t in u.inputs:
                if t in producer and producer[t] is not u:
                    edges.append(Edge(producer[t].name, u.name, producer[t].rrt.result_latency))
            for t in u.outputs:
                producer[t] = u
        return edges

    def _graph(self, name: str, units: list[_Unit], in_kernel: bool) -> _Unit:
        units = _unique(units)
        ops = {u.name: u.rrt for u in units}
        start, length = list_schedule(ops, self._edges(units, in_kernel), self.capacity)
        return self._merge(name, units, start, length, sum(u.serial for u in units), 1)

    def _loop(self, loop: Loop, path: str, n: int, body: list[_Unit], in_kernel: bool) -> _Unit:
        body = _unique(body)
        ops = {u.name: u.rrt for u in body}
        edges = self._edges(body, in_kernel)
        carried = dict(loop.carried) if loop.carried else {}  # result name → parameter name
        if carried:
            for u in body:
                for res, param in carried.items():
                    if res in u.outputs:
                        for v in body:
                            if param in v.inputs:
                                edges.append(Edge(u.name, v.name, u.rrt.result_latency, 1))
        elif not in_kernel and body:  # kernels on one stream: iteration i + 1 follows iteration i
            edges.append(Edge(body[-1].name, body[0].name, body[-1].rrt.result_latency, 1))
        serial_iter = sum(u.serial for u in body)
        if n == 0 or not body:
            return _Unit(loop.name, RRT(), 0, {}, frozenset(), frozenset())
        if n == 1:  # one iteration: nothing to pipeline
            return self._graph(loop.name, body, in_kernel)
        sched = modulo_schedule(ops, edges, self.capacity)
        modulo = sched.total(n)
        cycles = min(modulo, n * serial_iter)
        self.loops.append(LoopReport(path, n, sched.ii, sched.res_mii, sched.rec_mii,
                                     sched.limiter if modulo <= n * serial_iter else "serial (no overlap gained)",
                                     sched.length, cycles, n * serial_iter))
        return self._merge(loop.name, body, sched.start, cycles, serial_iter, n, sched.ii)

    def _merge(self, name, units, start, length, serial_iter, n, ii=0) -> _Unit:
        """``units`` scheduled at ``start`` (``n`` times, ``ii`` apart) as one unit of ``length``."""
        usage: dict[str, int] = {}
        for u in units:
            for r, c in u.usage.items():
                usage[r] = usage.get(r, 0) + c * n
        events = []
        shown = min(n, self.trace_iterations) if n > 1 else 1
        for i in range(shown):
            for u in units:
                events += [(ev, r, start[u.name] + i * ii + o, c) for ev, r, o, c in u.events]
        ins = frozenset().union(*(u.inputs for u in units)) - frozenset().union(*(u.outputs for u in units))
        outs = frozenset().union(*(u.outputs for u in units))
        return _Unit(name, _occupancy(usage, length, self.capacity), serial_iter * n, usage, ins, outs, events)


def table_symbols(op: Op) -> set[str]:
    """Design symbols that appear only in leaves' own reservation tables (a latency in cycles)."""
    from perfcast.ir import walk

    out: set[str] = set()
    for v in walk(op):
        rrt = getattr(v.op, "rrt", None)
        if rrt is not None:
            for _, o, n, _ in rrt.spans:
                out |= {s.name for x in (o, n) for s in sympy.sympify(x).free_symbols}
            if rrt.latency is not None:
                out |= {s.name for s in sympy.sympify(rrt.latency).free_symbols}
    return out


def _unique(units: list[_Unit]) -> list[_Unit]:
    seen: dict[str, int] = {}
    for u in units:
        if u.name in seen:
            seen[u.name] += 1
            u.name = f"{u.name}#{seen[u.name]}"
        else:
            seen[u.name] = 0
    return units


def _occupancy(usage: Mapping[str, int], length: int, capacity: Mapping[str, int]) -> RRT:
    """A scheduled block as one unit: each resource busy for its cycles from the block's start
    (spread over several units when it needs more than the block's length), the block's length
    as its latency."""
    spans = [("(in flight)", 0, length, 0)] if length else []
    for r, c in usage.items():
        if not c:
            continue
        if c <= length or length == 0:
            spans.append((r, 0, c, 1))
        else:
            units = min(capacity.get(r, 1), -(-c // length))
            spans.append((r, 0, -(-c // units), units))
    return RRT(spans=tuple(spans), latency=length)


def _capacities(device) -> dict[str, int]:
    """Units of each resource, from the device file (a resource it does not list, such as a
    hand-written table's, has one unit)."""
    return {str(r): int(u) for r, u in dict(getattr(device, "resources", None) or {}).items()}
