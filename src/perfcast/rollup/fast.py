"""The fast roll-up: every leaf's priced time times the trip counts of its enclosing loops,
summed, plus each kernel launch's cost — a closed-form SymPy expression in the free design
variables. Numbers enter once per design point (:meth:`FastRollup.evaluate`) or vectorised over
whole grids (:meth:`FastRollup.lambdify`).

The launch cost follows the :class:`LaunchModel`:

- ``cuda_graph`` (and ``compiled``, one XLA program per step): no host launch per kernel. Each
  kernel pays the model's per-kernel static latency (``launch_overhead()``: the device's
  ``kernel_static_latency_s``, itself the minimum latency of the measured GEMM tables, which were
  timed as CUDA-graph replays of repeated kernels — ai-dynamo/aiconfigurator collector/helper.py
  ``benchmark_with_power`` — so it already holds the in-graph gap between kernels). A measured
  kernel pays nothing more: its measurement includes that gap; charging it again would count it
  twice.
- ``eager``: the host issues every kernel, one host interval each, and runs ahead of the GPU
  (CUDA's launch queue holds the kernels issued but not yet run), so the step takes
  ``Max(its GPU time, launches × host interval)`` — not their sum: the GPU time of long kernels
  hides the host's issue of the launches queued behind them, and a step whose kernels are shorter
  than the interval waits on the host. A leaf's ``launches`` attribute counts the kernels one op
  launches. The step is one ``Max`` in the closed form (``host_launch_s`` its excess over the GPU
  time). Taken per kernel instead (each kernel ``Max(its GPU time, host interval)``) it would charge
  every short kernel the whole interval even where long kernels before it had let the host run
  ahead — with the tens of microseconds the serving engines' Python forward spends per kernel,
  an overcharge of a fifth of an eagerly launched decode step (docs/design/engines.md).

Leaves are assumed not to overlap each other (the sum of per-leaf roofline times), except where the
engine runs part of a block on a second stream (:mod:`perfcast.rollup.streams`: the plan marks both
sides, and under a launch mode in which the engine switches streams the block's two sides take
``conc(main, aux)``; ``stream_overlap_s`` is what that hides, taken off the sum); the overlap
transforms of :mod:`perfcast.rollup.overlap` rewrite parts of this sum into ``Max``/``Min`` forms.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
import sympy

from perfcast.ir import Cost, Leaf, Op, cost, trip_counts, walk
from perfcast.perf import PerformanceModel, Result, bound_of
from perfcast.rollup.guard import check_grid, check_point, check_values
from perfcast.rollup.streams import hidden, on_stream, serial, stream_groups, timing


@dataclass(frozen=True)
class LaunchModel:
    """How kernels reach the device: ``cuda_graph``, ``compiled`` or ``eager`` (see the module
    docstring); ``host_interval_s`` is the host's time per kernel launch (eager only)."""

    mode: str = "cuda_graph"
    host_interval_s: sympy.Expr = sympy.Integer(0)

    def __post_init__(self):
        if self.mode not in ("cuda_graph", "compiled", "eager"):
            raise ValueError(f"launch mode {self.mode!r}: expected cuda_graph, compiled or eager")
        object.__setattr__(self, "host_interval_s", sympy.nsimplify(self.host_interval_s))


@dataclass(frozen=True)
class LeafTotal:
    """One leaf's share of the roll-up: ``trips`` = enclosing trip counts; ``cost`` and
    ``time_s`` are rolled up (per-iteration figures times ``trips``). ``launch_s`` is the launch
    cost of the kernel the leaf opens, per execution (0 for a leaf inside a kernel, or measured
    under a CUDA graph); the host's eager launches are the step's, not a leaf's
    (:attr:`FastRollup.host_launch_s`)."""

    path: tuple[str, ...]
    leaf: Leaf
    trips: sympy.Expr
    result: Result
    launch_s: sympy.Expr = sympy.Integer(0)

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
    host_launch_s: float = 0.0  # the part of launch_time_s the host's eager launches add
    stream_overlap_s: float = 0.0  # what the engine's second stream hides (taken off the leaves' sum)
    stream_blocks_s: dict = field(default_factory=dict)  # (block, trips) → what it hides per execution

    def _shares(self, column: str, launch_label: str) -> dict[str, float]:
        """Shares of the kernels' serial time (the step's time plus what a second stream hides)."""
        shares: dict[str, float] = {}
        for row in self.leaves.values():
            shares[row[column]] = shares.get(row[column], 0.0) + row["time_s"]
        if self.launch_time_s:
            shares[launch_label] = shares.get(launch_label, 0.0) + self.launch_time_s
        whole = self.time_s + self.stream_overlap_s
        return {k: v / whole for k, v in shares.items()} if whole else shares

    def bound_shares(self) -> dict[str, float]:
        """Share of total time spent in leaves of each bound (launch latency: ``latency``)."""
        return self._shares("bound", "latency")

    def provenance_shares(self) -> dict[str, float]:
        """Share of total time by provenance (launch latency is analytic)."""
        return self._shares("source", "analytic")


class FastRollup:
    def __init__(self, op: Op, model: PerformanceModel, launch: LaunchModel | None = None):
        self.op = op
        self.model = model
        self.launch_model = launch or LaunchModel()
        self.launch: Result = model.launch_overhead()
        static = self.launch.time_s
        rows, launches, kernels, kernel_cost, units, unit_trips = [], sympy.Integer(0), sympy.Integer(0), {}, {}, {}
        issue = sympy.Integer(0)
        for v in walk(op):
            if isinstance(v.op, Leaf):
                if v.kernel is not None and id(v.kernel) not in kernel_cost:
                    kernel_cost[id(v.kernel)] = cost(v.kernel)
                size = kernel_cost[id(v.kernel)] if v.kernel is not None else None
                result = model.process_op(v.op, kernel=size)
                rows.append(LeafTotal(v.path, v.op, v.trips, result))
                if v.kernel is not None:  # a tile of a traced kernel: the kernel is the unit
                    units.setdefault(id(v.kernel), []).append(len(rows) - 1)
                else:
                    units[("leaf", len(rows) - 1)] = [len(rows) - 1]
            if v.is_launch:
                n = sympy.sympify(v.op.attr("launches") or 1) if isinstance(v.op, Leaf) else sympy.Integer(1)
                kernels += v.trips * n
                if not isinstance(v.op, Leaf):
                    unit_trips[id(v.op)] = v.trips
        for key, idx in units.items():
            first = rows[idx[0]]
            measured = all(rows[i].result.includes_launch for i in idx)
            own = sympy.Integer(0) if measured else static  # measured: the gap is inside the measurement
            trips = unit_trips.get(key, first.trips)  # a traced kernel launches once per its own visit
            if not measured:
                launches += trips
            if self.launch_model.mode == "eager":
                n = sympy.sympify(first.leaf.attr("launches") or 1) if len(idx) == 1 else sympy.Integer(1)
                issue += trips * n * self.launch_model.host_interval_s
            scale = trips / first.trips  # launch_s is per execution of the unit's first leaf
            rows[idx[0]] = LeafTotal(first.path, first.leaf, first.trips, first.result, own * scale)
        self.leaves: list[LeafTotal] = rows
        #: the host's time to issue every launch of the step (0 unless eager)
        self.host_issue_s: sympy.Expr = issue
        self.launches: sympy.Expr = launches
        self.kernels: sympy.Expr = kernels  # kernels the step runs (launches of multi-kernel ops counted)
        self.trips = trip_counts(op)
        #: the time the engine's second stream hides, per block × its executions (:mod:`perfcast.rollup.streams`)
        self.stream_blocks: dict[tuple, sympy.Expr] = {}
        for (join, trips), g in stream_groups(rows, self.launch_model.mode).items():
            main, aux = (serial(on_stream(r.leaf, timing(r.result.breakdown, r.result.time_s)) for r in g[side])
                         for side in ("main", "aux"))
            self.stream_blocks[(join, trips)] = trips * hidden(main, aux)
        self.stream_overlap_s: sympy.Expr = sympy.Add(*self.stream_blocks.values())

    @cached_property
    def cost(self) -> Cost:
        return sum((r.cost for r in self.leaves), Cost())

    @cached_property
    def device_time_s(self) -> sympy.Expr:
        """The step's time on the device: its kernels and their static launch latencies, less what
        the engine's second stream hides."""
        return sympy.Add(*(r.time_s + r.trips * r.launch_s for r in self.leaves)) - self.stream_overlap_s

    @cached_property
    def host_launch_s(self) -> sympy.Expr:
        """What the host's eager launches add to the step: their issue time beyond the device
        time, ``Max(0, host_issue_s − device_time_s)`` (0 under a CUDA graph)."""
        if self.host_issue_s == 0:
            return sympy.Integer(0)
        return sympy.Max(0, self.host_issue_s - self.device_time_s)

    @cached_property
    def launch_time_s(self) -> sympy.Expr:
        return sympy.Add(*(r.trips * r.launch_s for r in self.leaves), self.host_launch_s)

    def launch_time_of(self, root: Op) -> sympy.Expr:
        """The launch time of the kernels under ``root`` (a node of the rolled-up tree), for one
        execution of ``root``; the whole step's includes the host's eager excess, a subtree's
        does not (the host's issue and the device overlap over the step, not within a part)."""
        if root is self.op:
            return self.launch_time_s
        ids = {id(v.op): v.trips for v in walk(root) if isinstance(v.op, Leaf)}
        base = next((v.trips for v in walk(self.op) if v.op is root), sympy.Integer(1))
        return sympy.Add(*(r.trips / base * r.launch_s for r in self.leaves if id(r.leaf) in ids))

    @cached_property
    def time_s(self) -> sympy.Expr:
        """``device_time_s``, or under eager launches ``Max(device_time_s, host_issue_s)``."""
        if self.host_issue_s == 0:
            return self.device_time_s
        return sympy.Max(self.device_time_s, self.host_issue_s)

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
            row["launch_s"] = num(r.trips * r.launch_s)  # the launch cost of the kernel it opens
            key = r.name if r.name not in leaves else "/".join(r.path)
            leaves[key] = row
        totals = {k: num(v) for k, v in self.cost.items()}
        launch = num(self.launch_time_s)
        hid = num(self.stream_overlap_s)
        blocks = {key: num(h / key[1]) for key, h in self.stream_blocks.items()}
        return Evaluation(point={s.name: float(v) for s, v in point.items()},
                          time_s=sum(r["time_s"] for r in leaves.values()) + launch - hid,
                          totals=totals, leaves=leaves, launch_time_s=launch,
                          host_launch_s=num(self.host_launch_s), stream_overlap_s=hid, stream_blocks_s=blocks)

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


def rollup(op: Op, model: PerformanceModel, launch: LaunchModel | None = None) -> FastRollup:
    return FastRollup(op, model, launch)
