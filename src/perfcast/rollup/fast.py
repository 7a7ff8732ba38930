"""The fast roll-up: every leaf's priced time times the trip counts of its enclosing loops,
summed, plus the per-kernel static latency once per launch — a closed-form SymPy expression
in the free design variables. Numbers enter once per design point (:meth:`FastRollup.evaluate`)
or vectorised over whole grids (:meth:`FastRollup.lambdify`).

Leaves are assumed not to overlap each other (the sum of per-leaf roofline times); the overlap
transforms of :mod:`perfcast.rollup.overlap` rewrite parts of this sum into ``Max``/``Min`` forms.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import sympy

from perfcast.ir import Cost, Leaf, Op, cost, trip_counts, walk
from perfcast.perf import PerformanceModel, Result, bound_of
from perfcast.rollup.guard import check_grid, check_point, check_values


@dataclass(frozen=True)
class LeafTotal:
    """One leaf's share of the roll-up: ``trips`` = enclosing trip counts; ``cost`` and
    ``time_s`` are rolled up (per-iteration figures times ``trips``)."""

    path: tuple[str, ...]
    leaf: Leaf
    trips: sympy.Expr
    result: Result

    @property
    def name(self) -> str:
        return self.leaf.name

    @property
    def cost(self) -> Cost:
        return self.leaf.cost * self.trips

    @property
    def time_s(self) -> sympy.Expr:
        return self.trips * self.result.time_s


@dataclass(frozen=True)
class Evaluation:
    """Numbers at one design point."""

    point: dict[str, float]
    time_s: float
    totals: dict[str, float]
    leaves: dict[str, dict[str, float | str]]
    launch_time_s: float

    def _shares(self, column: str, launch_label: str) -> dict[str, float]:
        shares: dict[str, float] = {}
        for row in self.leaves.values():
            shares[row[column]] = shares.get(row[column], 0.0) + row["time_s"]
        if self.launch_time_s:
            shares[launch_label] = shares.get(launch_label, 0.0) + self.launch_time_s
        return {k: v / self.time_s for k, v in shares.items()} if self.time_s else shares

    def bound_shares(self) -> dict[str, float]:
        """Share of total time spent in leaves of each bound (launch latency: ``latency``)."""
        return self._shares("bound", "latency")

    def provenance_shares(self) -> dict[str, float]:
        """Share of total time by provenance (launch latency is analytic)."""
        return self._shares("source", "analytic")


class FastRollup:
    def __init__(self, op: Op, model: PerformanceModel):
        self.op = op
        self.model = model
        rows, launches, kernel_cost = [], sympy.Integer(0), {}
        for v in walk(op):
            if isinstance(v.op, Leaf):
                if v.kernel is not None and id(v.kernel) not in kernel_cost:
                    kernel_cost[id(v.kernel)] = cost(v.kernel)
                size = kernel_cost[id(v.kernel)] if v.kernel is not None else None
                result = model.process_op(v.op, kernel=size)
                rows.append(LeafTotal(v.path, v.op, v.trips, result))
                if v.is_launch and result.includes_launch:
                    continue  # measured: the launch is inside the measurement
            if v.is_launch:
                launches += v.trips
        self.leaves: list[LeafTotal] = rows
        self.launches: sympy.Expr = launches
        self.launch: Result = model.launch_overhead()
        self.trips = trip_counts(op)

    @cached_property
    def cost(self) -> Cost:
        return sum((r.cost for r in self.leaves), Cost())

    @cached_property
    def launch_time_s(self) -> sympy.Expr:
        return self.launches * self.launch.time_s

    @cached_property
    def time_s(self) -> sympy.Expr:
        return sympy.Add(*(r.time_s for r in self.leaves), self.launch_time_s)

    @cached_property
    def free_symbols(self) -> list[sympy.Symbol]:
        syms = set(self.time_s.free_symbols) | self.cost.free_symbols
        for _, n in self.trips:
            syms |= n.free_symbols
        return sorted(syms, key=str)

    def symbol(self, name: str) -> sympy.Symbol:
        for s in self.free_symbols:
            if s.name == name:
                return s
        raise KeyError(name)

    # One point ---------------------------------------------------------------------------
    def exact_point(self, values: Mapping[str, object]) -> dict[sympy.Symbol, sympy.Expr]:
        """``{name: number}`` → ``{symbol: exact number}``, checked by the parameter guard."""
        by_name = {s.name: s for s in self.free_symbols}
        point = check_values(set(self.free_symbols),
                             {by_name.get(k, sympy.Symbol(k)): v for k, v in values.items()})
        check_point(self.trips, point)
        return point

    def evaluate(self, values: Mapping[str, object]) -> Evaluation:
        """Exact substitution at one point (checked by the guard), then floats."""
        point = self.exact_point(values)

        def num(e):
            return float(self.model.realize(sympy.sympify(e).xreplace(point)))

        leaves = {}
        for r in self.leaves:
            terms = {k: num(r.trips * t) for k, t in r.result.breakdown.items()}
            row: dict[str, float | str] = {k: num(v) for k, v in r.cost.items()}
            row["time_s"] = num(r.time_s)
            limiter = max(terms, key=terms.get) if terms else "none"
            row["bound"] = bound_of(limiter) if terms else "none"
            row["limiter"] = limiter  # the term itself: compute, memory.hbm, memory.onchip
            row["source"] = r.result.source.value
            key = r.name if r.name not in leaves else "/".join(r.path)
            leaves[key] = row
        totals = {k: num(v) for k, v in self.cost.items()}
        launch = num(self.launch_time_s)
        return Evaluation(point={s.name: float(v) for s, v in point.items()},
                          time_s=sum(r["time_s"] for r in leaves.values()) + launch,
                          totals=totals, leaves=leaves, launch_time_s=launch)

    # Grids -------------------------------------------------------------------------------
    def lambdify(self, names: Sequence[str] | None = None, expr: sympy.Expr | None = None):
        """A NumPy function of the free symbols (in ``names`` order, default sorted) that
        returns the total time (or ``expr``, an expression in the same symbols); it checks the
        parameter guard on every call."""
        symbols = [self.symbol(n) for n in names] if names is not None else self.free_symbols
        missing = set(self.free_symbols) - set(symbols)
        if missing:
            raise KeyError(f"lambdify needs every free symbol; missing {sorted(map(str, missing))}")
        f = sympy.lambdify(symbols, self.time_s if expr is None else expr, modules=[self.model.numpy_functions(), "numpy"], cse=True)
        trips = self.trips

        def time_s(*columns):
            cols = [np.asarray(c, dtype=float) for c in columns]
            check_grid(trips, symbols, cols)
            return f(*cols)

        time_s.symbols = tuple(s.name for s in symbols)
        return time_s


def rollup(op: Op, model: PerformanceModel) -> FastRollup:
    return FastRollup(op, model)
