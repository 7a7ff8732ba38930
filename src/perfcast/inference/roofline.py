"""The naive datasheet roofline: what a spreadsheet gives, as a baseline in the same run.

Each kernel takes ``max(FLOPs / peak, HBM bytes / HBM peak)`` at the device's datasheet rates
(Williams, Waterman, Patterson, "Roofline", CACM 52(4), 2009) — no efficiency curves, no
per-kernel static latency, no launch cost. A collective moves its per-device link bytes (the
leaf's ``bytes.link`` cost: ``2(N−1)/N·V`` for all-reduce, ``(N−1)/N·V`` for the gathers,
scatters and all-to-all) over all of the device's links of the slowest tier its group spans,
at their datasheet bandwidth, with no latency. It shares everything else with perfcast (the
captured graph, the layout, the fusion), so the difference between the two is the pricing alone.
"""

from __future__ import annotations

import sympy

from perfcast.hardware.device import Device
from perfcast.hardware.topology import Mesh
from perfcast.ir import BYTES_HBM, FLOPS_MATRIX, FLOPS_VECTOR, Cost, Leaf, UserError
from perfcast.ir.cost import LINK_PREFIX
from perfcast.perf import PerformanceModel, Provenance, Result


class DatasheetRoofline(PerformanceModel):
    name = "roofline"

    def __init__(self, device: Device, mesh: Mesh | None = None):
        self.device = device
        self.mesh = mesh

    def process_op(self, op: Leaf, kernel: Cost | None = None) -> Result:
        links = [r for r in op.cost if r.startswith(LINK_PREFIX)]
        if links:
            return self._collective(op, links[0])
        busy = self.resource_times(op, kernel)
        terms: dict[str, sympy.Expr] = {}
        compute = busy.get("matrix", 0) + busy.get("vector", 0)
        if compute != 0:
            terms["compute"] = compute
        if "hbm" in busy:
            terms["memory.hbm"] = busy["hbm"]
        time = sympy.Max(*terms.values()) if terms else sympy.Integer(0)
        return Result(time, Provenance.ANALYTIC, terms)

    def resource_times(self, op: Leaf, kernel: Cost | None = None) -> dict[str, sympy.Expr]:
        """How long the leaf keeps each resource busy at datasheet rates (``matrix``, ``vector``,
        ``hbm``, ``link:<axis>``) — the terms of :meth:`process_op` before the max, for the slow
        roll-up's schedule (as :meth:`perfcast.perf.analytic.AnalyticPerformanceModel.resource_times`)."""
        links = [r for r in op.cost if r.startswith(LINK_PREFIX)]
        if links:
            return {f"link:{op.attr('axis')}": self._collective(op, links[0]).time_s}
        c, d = op.cost, self.device
        busy: dict[str, sympy.Expr] = {}
        if FLOPS_MATRIX in c:
            rates = d.spec.datasheet.matrix_flops_per_s
            rate = d.matrix_flops_per_s(op.dtype) if op.dtype in rates else d.vector_flops_per_s(op.dtype)
            busy["matrix"] = c[FLOPS_MATRIX] / rate
        if FLOPS_VECTOR in c:
            busy["vector"] = c[FLOPS_VECTOR] / d.vector_flops_per_s(op.dtype)
        if BYTES_HBM in c:
            busy["hbm"] = c[BYTES_HBM] / d.hbm_bandwidth_bytes_per_s
        return busy

    def _collective(self, op: Leaf, resource: str) -> Result:
        axis = op.attr("axis")
        group = sympy.sympify(op.attr("group_size"))
        if group == 1:
            return Result(sympy.Integer(0), Provenance.ANALYTIC, {f"comm.{axis}": sympy.Integer(0)})
        if self.mesh is None:
            raise UserError(f"{op.name}: a {op.kind} over mesh axis {axis!r} needs a topology to be priced")
        tiers = [t for t, k in self.mesh.span(axis, int(group) if group.is_Integer else None) if k > 1]
        bandwidth = min(t.link_bandwidth_bytes_per_s * t.links_per_device for t in tiers)
        time = op.cost[resource] / bandwidth
        return Result(time, Provenance.ANALYTIC, {f"comm.{axis}": time})

    def launch_overhead(self) -> Result:
        return Result(sympy.Integer(0), Provenance.ANALYTIC, {"latency.launch": sympy.Integer(0)})
