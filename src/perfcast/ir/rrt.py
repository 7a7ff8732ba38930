"""Resource reservation tables (Rau, "Iterative Modulo Scheduling", MICRO-27, 1994, §2).

An RRT says, for one operation, how many units of each resource it holds in each cycle after it
issues: rows are resources, columns are cycles. The slow roll-up folds RRTs into a modulo
reservation table to find the resource-constrained initiation interval (ResMII).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RRT:
    """``rows``: (resource, units used in cycle 0, 1, …) pairs; ``latency``: cycles until the
    result is available to a dependent op (defaults to the table's length)."""

    rows: tuple[tuple[str, tuple[int, ...]], ...]
    latency: int | None = None

    def __post_init__(self):
        rows = tuple((str(r), tuple(int(u) for u in units)) for r, units in self.rows)
        names = [r for r, _ in rows]
        if len(set(names)) != len(names):
            raise ValueError(f"RRT lists a resource twice: {names}")
        for r, units in rows:
            if any(u < 0 for u in units):
                raise ValueError(f"RRT row {r!r} has a negative unit count")
        object.__setattr__(self, "rows", rows)
        if self.latency is not None and self.latency < 0:
            raise ValueError("RRT latency must be non-negative")

    @classmethod
    def single(cls, resource: str, cycles: int, units: int = 1) -> "RRT":
        """An op that holds ``units`` of ``resource`` for ``cycles`` consecutive cycles."""
        return cls(((resource, (units,) * cycles),))

    @property
    def length(self) -> int:
        return max((len(units) for _, units in self.rows), default=0)

    @property
    def result_latency(self) -> int:
        return self.length if self.latency is None else self.latency

    def usage(self, resource: str) -> int:
        """Total unit-cycles of ``resource`` this op reserves."""
        return sum(sum(units) for r, units in self.rows if r == resource)

    @property
    def resources(self) -> tuple[str, ...]:
        return tuple(r for r, _ in self.rows)
