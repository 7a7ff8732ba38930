"""Resource reservation tables (Rau, "Iterative Modulo Scheduling", MICRO-27, 1994, §2).

An RRT says, for one operation, how many units of each resource it holds in each cycle after it
issues: rows are resources, columns are cycles. The slow roll-up folds RRTs into a modulo
reservation table to find the resource-constrained initiation interval (ResMII).

A table is stored as *spans* — (resource, first cycle, cycles, units) runs — because a kernel
priced at a device clock holds its resources for thousands to millions of cycles; the per-cycle
``rows`` form (small hand-written tables) is accepted and turned into spans. Span offsets and
lengths (and the latency) may be SymPy expressions in design symbols; :meth:`RRT.at` makes them
numbers at a design point.
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy

Span = tuple[str, object, object, int]  # (resource, offset, cycles, units)


def _runs(resource: str, units: tuple[int, ...]) -> list[Span]:
    out: list[Span] = []
    for c, u in enumerate(units):
        if u and out and out[-1][3] == u and out[-1][1] + out[-1][2] == c:
            r, off, n, _ = out[-1]
            out[-1] = (r, off, n + 1, u)
        elif u:
            out.append((resource, c, 1, u))
    return out


@dataclass(frozen=True)
class RRT:
    """``rows``: (resource, units used in cycle 0, 1, …) pairs, or ``spans``: (resource, first
    cycle, cycles, units) runs; ``latency``: cycles until the result is available to a dependent
    op (defaults to the table's length)."""

    rows: tuple[tuple[str, tuple[int, ...]], ...] = ()
    latency: object = None
    spans: tuple[Span, ...] = ()

    def __post_init__(self):
        rows = tuple((str(r), tuple(int(u) for u in units)) for r, units in self.rows)
        names = [r for r, _ in rows]
        if len(set(names)) != len(names):
            raise ValueError(f"RRT lists a resource twice: {names}")
        for r, units in rows:
            if any(u < 0 for u in units):
                raise ValueError(f"RRT row {r!r} has a negative unit count")
        object.__setattr__(self, "rows", rows)
        spans = [(str(r), _expr(o), _expr(n), int(u)) for r, o, n, u in self.spans]
        for r, units in rows:
            spans.extend(_runs(r, units))
        for r, o, n, u in spans:
            if u < 0 or _negative(o) or _negative(n):
                raise ValueError(f"RRT span of {r!r} is negative: offset {o}, cycles {n}, units {u}")
        object.__setattr__(self, "spans", tuple(spans))
        if self.latency is not None:
            lat = _expr(self.latency)
            if _negative(lat):
                raise ValueError("RRT latency must be non-negative")
            object.__setattr__(self, "latency", lat)

    @classmethod
    def single(cls, resource: str, cycles, units: int = 1, latency=None) -> "RRT":
        """An op that holds ``units`` of ``resource`` for ``cycles`` consecutive cycles."""
        return cls(spans=((resource, 0, cycles, units),), latency=latency)

    @property
    def length(self):
        """Cycles from issue to the end of the last span (a span of zero units marks time the
        op is in flight without holding anything, e.g. a scheduled block's tail)."""
        ends = [o + n for _, o, n, u in self.spans]
        return sympy.Max(*ends) if ends and any(not _number(e) for e in ends) else max(ends, default=0)

    @property
    def result_latency(self):
        return self.length if self.latency is None else self.latency

    def usage(self, resource: str):
        """Total unit-cycles of ``resource`` this op reserves."""
        return sum((n * u for r, _, n, u in self.spans if r == resource), 0)

    @property
    def resources(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(r for r, _, _, u in self.spans if u))

    @property
    def symbolic(self) -> bool:
        return any(not _number(x) for _, o, n, _ in self.spans for x in (o, n)) or (
            self.latency is not None and not _number(self.latency))

    def at(self, point: dict) -> "RRT":
        """The table with its design symbols set (``point``: symbol or name → value); every
        offset, length and latency must come out a non-negative integer."""
        subs = {s: v for s, v in point.items()} if point else {}

        def num(e, what):
            v = sympy.sympify(e)
            if not v.is_number:
                by_name = {k.name if hasattr(k, "name") else str(k): val for k, val in subs.items()}
                v = v.subs({s: by_name[s.name] for s in v.free_symbols if s.name in by_name})
            if not (v.is_Integer and v >= 0):
                raise ValueError(f"RRT {what} is {v} at the design point; expected a non-negative integer")
            return int(v)

        spans = tuple((r, num(o, f"offset of {r}"), num(n, f"length of {r}"), u) for r, o, n, u in self.spans)
        lat = None if self.latency is None else num(self.latency, "latency")
        return RRT(spans=spans, latency=lat)


def _expr(x):
    if isinstance(x, (int, sympy.Integer)):
        return int(x)
    return sympy.sympify(x)


def _number(x) -> bool:
    return isinstance(x, int) or sympy.sympify(x).is_number


def _negative(x) -> bool:
    return _number(x) and x < 0
