"""Analytic (roofline) pricing of leaves.

Roofline (Williams, Waterman, Patterson, "Roofline", CACM 52(4), 2009): a kernel takes at least
its work divided by each resource's rate, and the slowest resource bounds it. Per leaf:

    compute = flops.matrix / (R_matrix[dtype] · e_matrix(flops.matrix))
            + flops.vector / (R_vector · e_vector(flops.vector))
    memory  = bytes.hbm / (BW_hbm · e_memory(bytes.hbm)),   onchip = bytes.onchip / BW_onchip
    time    = max(compute, memory, onchip)

Rates are the device's datasheet peaks; the efficiencies ``e`` are its calibration curves
(achieved/peak as a function of size). The size is the whole kernel's work — the leaf's own for
a leaf that is a kernel by itself, the enclosing kernel's rolled-up total for a tile inside a
traced kernel — because the curves are measured on whole kernels: a 1 MiB tile load inside a
2 GiB flash-attention kernel streams at the 2 GiB kernel's efficiency, not a 1 MiB kernel's.
Matrix and vector work on one leaf are added: both issue from the same cores. The per-kernel static latency is charged once per kernel launch
(:meth:`launch_overhead`), not per tile. Any hardware parameter can be kept symbolic so that the
time is a closed form in it too.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

import sympy

from perfcast.hardware.device import Device, exact
from perfcast.hardware.topology import Mesh
from perfcast.ir import BYTES_HBM, BYTES_ONCHIP, FLOPS_MATRIX, FLOPS_VECTOR, Cost, Leaf, UserError, hw
from perfcast.ir.cost import LINK_PREFIX
from perfcast.ir.rules import collective_message
from perfcast.perf.collectives import span_costs
from perfcast.ir.symbols import HARDWARE
from perfcast.perf.calibrated import KernelCalibration
from perfcast.perf.efficiency import Efficiency
from perfcast.perf.model import PerformanceModel, Provenance, Result


class AnalyticPerformanceModel(PerformanceModel):
    name = "analytic"

    def __init__(self, device: Device, symbolic: Iterable[str] = (), mesh: Mesh | None = None,
                 calibration: KernelCalibration | None = None):
        self.device = device
        self.mesh = mesh
        self.symbolic = frozenset(symbolic)
        self.calibration = calibration
        self.efficiencies = {u: Efficiency(u, device.efficiency(u)) for u in ("matrix", "vector", "memory")}
        unknown = self.symbolic - set(HARDWARE)
        if unknown:
            raise ValueError(f"unknown hardware parameter {sorted(unknown)[0]!r}; "
                             f"known: {', '.join(HARDWARE)}")

    def _param(self, name: str, value: sympy.Expr) -> sympy.Expr:
        return hw(name) if name in self.symbolic else value

    def process_op(self, op: Leaf, kernel: Cost | None = None) -> Result:
        link = any(r.startswith(LINK_PREFIX) for r in op.cost)
        found = self._fitted(op, kernel, link)
        if found is not None:
            return found
        if link:
            return self.collective(op)
        return self._roofline(op, kernel)

    def _fitted(self, op: Leaf, kernel: Cost | None, link: bool) -> Result | None:
        """The leaf priced by its kernel class's fit, or None where no fit covers it. A class that
        runs only for some shapes (``KernelClass.applies``: SGLang's sparse DSA prefill above
        ``topk`` cached tokens) prices the others by the roofline, as a piecewise closed form
        where the shape is symbolic."""
        if kernel is not None or self.calibration is None:
            return None
        found = self.calibration.lookup(op)
        if found is None:
            return None
        # an engine's own collective (all-reduce, DeepEP's all-to-all) was measured inside one NVLink domain
        if link and not self._within_first_tier(op):
            r = self.collective(op)
            spans = " and ".join(self.crosses_tiers(op)) or "no topology tier"
            return replace(r, notes=(*r.notes, f"{found[1].name}: its fit was measured within one NVLink domain "
                                               f"and this group spans {spans}: priced on the topology"))
        cls, shape = found[1], found[2]
        when = sympy.true if cls.applies is None else sympy.sympify(cls.applies(shape))
        if when == sympy.false:
            r = self._roofline(op, None)
            return replace(r, notes=(*r.notes, cls.otherwise))
        fitted = self._calibrated(op, *found)
        if when == sympy.true:
            return fitted
        other = self._roofline(op, None)
        launch = self.launch_overhead().time_s
        terms = set(fitted.breakdown) | set(other.breakdown)
        return Result(sympy.Piecewise((fitted.time_s, when), (other.time_s + launch, True)), fitted.source,
                      {t: sympy.Piecewise((fitted.breakdown.get(t, 0), when), (other.breakdown.get(t, 0), True))
                       for t in sorted(terms)},
                      (*fitted.notes, f"{cls.name} where {when}; elsewhere {cls.otherwise}", *other.notes),
                      includes_launch=True)

    def _roofline(self, op: Leaf, kernel: Cost | None) -> Result:
        busy, notes = self._busy(op, kernel)
        terms: dict[str, sympy.Expr] = {}
        if "matrix" in busy or "vector" in busy:
            terms["compute"] = busy.get("matrix", 0) + busy.get("vector", 0)
        if "hbm" in busy:
            terms["memory.hbm"] = busy["hbm"]
        if "onchip" in busy:
            terms["memory.onchip"] = busy["onchip"]
        time = sympy.Max(*terms.values()) if terms else sympy.Integer(0)
        return Result(time, Provenance.ANALYTIC, terms, tuple(notes))

    def _calibrated(self, op: Leaf, key: str, cls, shape, fit, fit_key: str) -> Result:
        """A whole kernel priced by its class's fit; the fit's fixed time is the measured
        kernel's own (launch gap included), so no launch is added for it. A fit borrowed from
        another format (``fit_key`` ≠ ``key``) prices the leaf's own bytes at its own rate."""
        d = self.device
        rate_dtype = cls.rate_dtype(key.split("/", 1)[1])
        rate = self._param("matrix_flops_per_s", d.matrix_flops_per_s(rate_dtype)) if rate_dtype else sympy.Integer(1)
        bw = self._param("hbm_bandwidth_bytes_per_s", d.hbm_bandwidth_bytes_per_s) if cls.bandwidth == "hbm" \
            else exact(cls.bandwidth_of(d))
        time, breakdown = self.calibration.price(fit_key, cls, shape, fit, rate, bw)
        label = key if fit_key == key else f"{key} derived from {fit_key}"
        # another format's fit, or another device's fit of a class this device's tables lack
        own = fit_key == key and not self.calibration.borrowed(fit_key)
        source = Provenance.ANALYTIC if own else Provenance.DERIVED
        return Result(time, source, breakdown, (f"calibrated {label} ({self.calibration.source_of(fit_key)})",),
                      includes_launch=True)

    def resource_times(self, op: Leaf, kernel: Cost | None = None) -> dict[str, sympy.Expr]:
        """How long the leaf keeps each of the device's resources busy (``matrix``, ``vector``,
        ``hbm``, ``onchip``, ``link:<axis>``): the terms of its roofline, before the max. Matrix
        and vector work issue from the same cores, one after the other."""
        link = any(r.startswith(LINK_PREFIX) for r in op.cost)
        r = self._fitted(op, kernel, link)
        if link:  # a fit, or the topology (priced once: where no fit applies, _fitted already did)
            return {f"link:{op.attr('axis')}": (r if r is not None else self.collective(op)).time_s}
        if r is not None and r.includes_launch:  # a fit (or a fit switched by shape) priced it
            return self._calibrated_busy(r)
        return self._busy(op, kernel)[0]

    @staticmethod
    def _calibrated_busy(r: Result) -> dict[str, sympy.Expr]:
        """A calibrated kernel holds the matrix units and HBM in the proportion of its fitted
        terms, the larger for the kernel's whole fitted time (its fixed and serial parts
        included), so a schedule of calibrated kernels on one stream sums to their times."""
        terms = {res: r.breakdown[t] for t, res in (("compute", "matrix"), ("memory.hbm", "hbm")) if t in r.breakdown}
        if not terms:
            return {"hbm": r.time_s}
        top = sympy.Max(*terms.values())
        return {res: v * r.time_s / top if top != 0 else r.time_s for res, v in terms.items()}

    def _busy(self, op: Leaf, kernel: Cost | None) -> tuple[dict[str, sympy.Expr], list[str]]:
        c, d, notes = op.cost, self.device, []
        size = kernel if kernel is not None else c
        busy: dict[str, sympy.Expr] = {}
        if FLOPS_MATRIX in c:
            if op.dtype in ("fp32", "fp64") and op.dtype not in d.spec.datasheet.matrix_flops_per_s:
                # No matrix-unit rate for this type (e.g. fp32 without TF32, PyTorch's default
                # for matmuls): the work runs on the vector units.
                notes.append(f"{op.dtype} matmul priced at the vector {op.dtype} rate")
                rate = self._param("matrix_flops_per_s", d.vector_flops_per_s(op.dtype))
            else:
                rate = self._param("matrix_flops_per_s", d.matrix_flops_per_s(op.dtype))
            busy["matrix"] = c[FLOPS_MATRIX] / (rate * self.efficiencies["matrix"](size.get(FLOPS_MATRIX)))
        if FLOPS_VECTOR in c:
            vdtype = d.vector_dtype(op.dtype)
            if vdtype != op.dtype:
                notes.append(f"vector rate for {op.dtype} taken from {vdtype}")
            rate = self._param("vector_flops_per_s", d.vector_flops_per_s(op.dtype))
            busy["vector"] = c[FLOPS_VECTOR] / (rate * self.efficiencies["vector"](size.get(FLOPS_VECTOR)))
        if BYTES_HBM in c:
            bw = self._param("hbm_bandwidth_bytes_per_s", d.hbm_bandwidth_bytes_per_s)
            busy["hbm"] = c[BYTES_HBM] / (bw * self.efficiencies["memory"](size.get(BYTES_HBM)))
        if BYTES_ONCHIP in c:
            bw = self._param("onchip_bandwidth_bytes_per_s", d.onchip_bandwidth_bytes_per_s)
            busy["onchip"] = c[BYTES_ONCHIP] / bw
        return busy, notes

    def collective(self, op: Leaf) -> Result:
        """A collective leaf on the mesh: the cheapest algorithm over the tiers its group spans."""
        axis, group = op.attr("axis"), self._group(op)
        if group == 1:
            return Result(sympy.Integer(0), Provenance.ANALYTIC, {f"comm.{axis}": sympy.Integer(0)},
                          (f"{op.kind} over {axis}(1): a group of one moves nothing",))
        if self.mesh is None:
            raise UserError(f"{op.name}: a {op.kind} over mesh axis {axis!r} needs a topology to be "
                            f"priced (pass --topology)")
        group = group or self.mesh.size(axis)
        options = span_costs(op.kind, collective_message(op.inputs, op.outputs), self.mesh.span(axis, group))
        if all(o.time_s.is_number for o in options):
            best = min(options, key=lambda o: float(o.time_s))
            time, note = best.time_s, f"{op.kind} over {axis}({group}): {best.algorithm} — {best.formula}"
        else:
            time = sympy.Min(*(o.time_s for o in options))
            note = f"{op.kind} over {axis}({group}): cheapest of {', '.join(o.algorithm for o in options)}"
        return Result(time, Provenance.ANALYTIC, {f"comm.{axis}": time}, (note,))

    def _within_first_tier(self, op: Leaf) -> bool:
        if self.mesh is None:
            return False
        tiers = self.crosses_tiers(op)
        return tiers in ([], [self.mesh.topology.tiers[0].name])

    def crosses_tiers(self, op: Leaf) -> list[str]:
        """The topology tiers a collective leaf's group spans (empty without a mesh)."""
        if self.mesh is None:
            return []
        return [t.name for t, k in self.mesh.span(op.attr("axis"), self._group(op)) if k > 1]

    @staticmethod
    def _group(op: Leaf) -> int | None:
        """A collective leaf's group size, or None when it is symbolic (a DSL mesh axis of size
        EP): the mesh's size of the axis at the design point then serves."""
        group = sympy.sympify(op.attr("group_size"))
        return int(group) if group.is_Integer else None

    def launch_overhead(self) -> Result:
        t = self._param("kernel_static_latency_s", self.device.kernel_static_latency_s)
        return Result(t, Provenance.ANALYTIC, {"latency.launch": t})

    def uncalibrated(self) -> list[str]:
        """Units priced at datasheet peak because the device has no efficiency curve for them."""
        return [u for u, e in self.efficiencies.items() if e.curve is None]

    def realize(self, expr: sympy.Expr) -> sympy.Expr:
        """``expr`` with every efficiency (and calibrated kernel time) applied at a numeric size
        replaced by its value."""
        for e in self.efficiencies.values():
            expr = e.realize(expr)
        if self.calibration is not None:
            expr = self.calibration.realize(expr)
        return expr

    def numpy_functions(self) -> dict[str, object]:
        """``lambdify`` modules entry for the efficiency functions."""
        funcs = {e.func.__name__: e.numpy() for e in self.efficiencies.values() if e.curve is not None}
        if self.calibration is not None:
            funcs.update(self.calibration.numpy_functions())
        return funcs
