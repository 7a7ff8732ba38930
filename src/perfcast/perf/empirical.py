"""The empirical performance model: measured kernel latencies, with an explicit fallback.

``EmpiricalPerformanceModel(device, data_source, fallback=None)`` asks its data source for each
leaf; a hit is priced at the measured (or interpolated, or partially measured) latency, labelled
so; a miss goes to the fallback — the analytic model unless another is given, created on first
use — and is recorded with its reason, so reports can list the missed ops by time. Nothing is
ever priced at zero silently: a leaf the source does not know is a miss, not a free op.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field

import sympy

from perfcast.hardware.device import Device, exact
from perfcast.ir import Cost, Leaf, UserError
from perfcast.perf.model import PerformanceModel, Provenance, Result


@dataclass(frozen=True)
class QueryResult:
    """A data source's answer: latency in µs, how it was obtained, and a note (which rows, which
    interpolation, which derivation)."""

    latency_us: float
    source: Provenance
    note: str = ""
    remainder: tuple = ()  # PARTIAL: the sub-kernels the data did not cover (priced by the fallback)

    def __post_init__(self):
        if self.source is Provenance.ANALYTIC:
            raise ValueError("a data source answers MEASURED, INTERPOLATED or PARTIAL, never ANALYTIC")
        if not self.latency_us >= 0:
            raise ValueError(f"latency must be non-negative, got {self.latency_us}")


@dataclass(frozen=True)
class Miss:
    """Why a data source could not price a leaf (reported, never silent)."""

    reason: str


class DataSource(ABC):
    @abstractmethod
    def lookup(self, op: Leaf) -> QueryResult | Miss:
        """Price ``op`` from data, or say why not."""


@dataclass
class MissRecord:
    leaf: str
    op: str
    reason: str


@dataclass
class EmpiricalPerformanceModel(PerformanceModel):
    device: Device
    data_source: DataSource
    fallback: PerformanceModel | None = None
    name: str = "profiling"
    falls_back = True  # class attribute (no annotation): not a dataclass field
    mesh: object = None  # a hardware.topology.Mesh: collectives' groups and the fallback's topology
    misses: list[MissRecord] = field(default_factory=list)
    notes: tuple[str, ...] = ()  # what pricing from this data source assumes (another engine version's tables)

    def _fallback(self) -> PerformanceModel:
        if self.fallback is None:
            from perfcast.perf.analytic import AnalyticPerformanceModel

            self.fallback = AnalyticPerformanceModel(self.device, mesh=self.mesh)
        return self.fallback

    def resource_times(self, op: Leaf, kernel: Cost | None = None) -> dict[str, sympy.Expr]:
        """The fallback's terms, scaled so that one stream of them takes the priced time (a
        measured kernel holds its resources in the analytic proportion, for its measured time)."""
        busy = self._fallback().resource_times(op, kernel)
        priced = self.process_op(op, kernel).time_s
        serial = sympy.Max(busy.get("matrix", 0) + busy.get("vector", 0),
                           *(t for r, t in busy.items() if r not in ("matrix", "vector")))
        scale = priced / serial if serial != 0 else 1
        return {r: t * scale for r, t in busy.items()}

    def process_op(self, op: Leaf, kernel: Cost | None = None) -> Result:
        if _symbolic(op):
            answer: QueryResult | Miss = Miss("symbolic shapes: a table holds concrete sizes")
        elif len(tiers := self._tiers(op)) > 1 or tiers and tiers[0] != self.mesh.topology.tiers[0].name:
            answer = Miss(f"the group crosses {' and '.join(tiers)}; the measured collectives are "
                          f"within one {self.mesh.topology.tiers[0].name} domain")
        else:
            answer = self.data_source.lookup(op)
        try:
            analytic = self._fallback().process_op(op, kernel)
        except ValueError as e:  # e.g. a collective: the fallback needs a topology
            if isinstance(answer, Miss):
                raise UserError(f"{op.name}: {answer.reason}; and the fallback cannot price it: {e}") from None
            t = exact(answer.latency_us) / 10**6
            return Result(t, answer.source, {"comm": t}, (answer.note,) if answer.note else (),
                          includes_launch=True)
        if isinstance(answer, Miss):
            self.misses.append(MissRecord(op.name, str(op.attr("op") or op.kind), answer.reason))
            return Result(analytic.time_s, Provenance.ANALYTIC, analytic.breakdown,
                          (*analytic.notes, f"fallback: {answer.reason}"), includes_launch=analytic.includes_launch)
        t = exact(answer.latency_us) / 10**6
        for part in answer.remainder:
            t += self._fallback().process_op(part).time_s
        # The bound label comes from the analytic terms, scaled so the largest equals the
        # measured time: which resource limits the kernel, at the measured speed.
        scale = t / analytic.time_s if analytic.time_s else sympy.Integer(1)
        breakdown = {k: v * scale for k, v in analytic.breakdown.items()} or {"latency.measured": t}
        return Result(t, answer.source, breakdown, (answer.note,) if answer.note else (),
                      includes_launch=True)

    def _tiers(self, op: Leaf) -> list[str]:
        """The topology tiers a collective leaf's group crosses (none for other leaves)."""
        if self.mesh is None or op.attr("axis") is None:
            return []
        from perfcast.perf.analytic import AnalyticPerformanceModel

        model = self._fallback()
        return model.crosses_tiers(op) if isinstance(model, AnalyticPerformanceModel) else []

    def launch_overhead(self) -> Result:
        return self._fallback().launch_overhead()

    def realize(self, expr):
        return self._fallback().realize(expr)

    def numpy_functions(self):
        return self._fallback().numpy_functions()


def _symbolic(op: Leaf) -> bool:
    return any(not sympy.sympify(d).is_number for t in (*op.inputs, *op.outputs) for d in t.shape)
