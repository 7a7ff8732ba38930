"""``perfcast sensitivity``: how a deployment's TTFT, TPOT and throughput move with the hardware and the
load, and the inverse questions — the lowest HBM bandwidth (matrix rate, link bandwidth) or the
fewest devices for a TPOT or TTFT objective — on the closed form, checked by the event simulation
(docs/design/search.md, "Sensitivities").

- **Hardware**: the device's datasheet scaled (:func:`perfcast.hardware.device.scaled`; the
  engine's calibrated kernel fits take the datasheet rates as parameters, so a what-if moves every
  kernel it should) and the step model compiled again at ``1 ± h`` (``h`` = 5 %); the central
  difference gives the elasticity ``∂ ln f / ∂ ln x`` (−1: the figure halves when the parameter
  doubles) and the derivative in the parameter's units.
- **Load**: the closed form at the batch (clients, or the request rate) and the input length
  ``× (1 ± h)``, the same way.
- **Inverse**: the smallest multiplier ``s`` of one parameter (in ``[1/16, 16]``) whose closed-form
  mean meets the objective (bisection in ``log s``: the figure falls as the parameter grows), or
  the fewest tensor-parallel devices; the answer is then simulated and both are reported.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from scipy.optimize import brentq

from perfcast.hardware import get_device
from perfcast.hardware.device import WHAT_IF
from perfcast.ir import UserError
from perfcast.serving.serve import ServeSpec, serve
from perfcast.serving.step import Deployment
from perfcast.serving.types import ServingResult
from perfcast.serving.workload import Lengths, Workload

#: Relative step of the central differences.
STEP = 0.05
METRICS = ("ttft_s", "tpot_s", "output_tokens_per_s_per_device")
SOLVABLE = (*WHAT_IF, "devices")
#: The datasheet figure each what-if multiplies, for derivatives in its units.
UNITS = {"hbm_bandwidth": ("hbm_bandwidth_bytes_per_s", "B/s"), "matrix_rate": ("matrix_flops_per_s", "FLOP/s"),
         "link_bandwidth": ("links", "B/s")}


@dataclass(frozen=True)
class SensitivitySpec:
    deployment: Deployment
    isl: int
    osl: int
    concurrency: int | None = None
    rate: float | None = None
    max_batch_size: int | None = None
    solve: str | None = None
    ttft_s: float | None = None
    tpot_s: float | None = None
    seed: int = 0

    def __post_init__(self):
        if (self.concurrency is None) == (self.rate is None):
            raise UserError("give one load: --concurrency C or --request-rate R")
        if self.osl < 2:
            raise UserError(f"--osl {self.osl}: needs at least 2 output tokens")
        if self.solve is not None:
            if self.solve not in SOLVABLE:
                raise UserError(f"--solve {self.solve!r}: expected one of {', '.join(SOLVABLE)}")
            if (self.ttft_s is None) == (self.tpot_s is None):
                raise UserError("--solve needs one objective: --tpot S or --ttft S")


@dataclass
class Sensitivity:
    spec: SensitivitySpec
    base: dict
    rows: list[dict]
    solution: dict | None
    notes: tuple[str, ...] = field(default_factory=tuple)


def _figures(r: ServingResult) -> dict | None:
    if not r.stable or r.ttft_s is None:
        return None
    return {"ttft_s": r.ttft_s.mean, "tpot_s": r.tpot_s.mean,
            "output_tokens_per_s_per_device": r.output_tokens_per_s_per_device}


def _serve(spec: SensitivitySpec, dep: Deployment, tier: str = "closed-form", *, isl: int | None = None,
           concurrency: int | None = None, rate: float | None = None) -> ServingResult:
    isl = isl or spec.isl
    c = concurrency if concurrency is not None else spec.concurrency
    r = rate if rate is not None else spec.rate
    n = max(200, 4 * (c or 1)) if tier == "simulation" else 1000
    w = Workload(Lengths("fixed", isl), Lengths("fixed", spec.osl), num_requests=n,
                 concurrency=c if spec.rate is None else None, rate=r if spec.rate is not None else None,
                 seed=spec.seed)
    rep = serve(ServeSpec(dep, w, max_batch_size=spec.max_batch_size, tier=tier))
    return rep.results["closed form" if tier == "closed-form" else "simulation"]


def _with(dep: Deployment, name: str, factor: float) -> Deployment:
    what = dict(dep.what_if)
    what[name] = what.get(name, 1.0) * factor
    return replace(dep, what_if=tuple(sorted(what.items())))


def _datasheet_value(dep: Deployment, name: str) -> float:
    sheet = get_device(dep.device).spec.datasheet
    if name == "hbm_bandwidth":
        return float(sheet.hbm_bandwidth_bytes_per_s)
    if name == "matrix_rate":
        return float(sheet.matrix_flops_per_s.get(dep.dtype, next(iter(sheet.matrix_flops_per_s.values()))))
    links = list(sheet.links.values())
    return float(links[0].bandwidth_bytes_per_s * links[0].count) if links else float("nan")


def _row(name: str, unit: str, value: float, lo: dict | None, hi: dict | None, base: dict) -> dict:
    row = {"parameter": name, "unit": unit, "value": value, "elasticity": {}, "derivative": {}}
    for m in METRICS:
        if lo is None or hi is None or base[m] <= 0:
            row["elasticity"][m] = row["derivative"][m] = None
            continue
        d = (hi[m] - lo[m]) / (2 * STEP)              # per unit of relative change
        row["elasticity"][m] = d / base[m]
        row["derivative"][m] = d / value if value and math.isfinite(value) else None
    return row


def sensitivity(spec: SensitivitySpec) -> Sensitivity:
    dep = spec.deployment
    base_r = _serve(spec, dep)
    base = _figures(base_r)
    if base is None:
        raise UserError("the load is beyond what the deployment sustains (closed form): lower it for derivatives "
                        f"(sustainable: {base_r.sustainable_rate:.4g} requests/s)")
    rows, notes = [], []
    for name in WHAT_IF:
        if name == "link_bandwidth" and dep.layout.trivial:
            notes.append("link bandwidth: one device, no collective: its derivatives are zero")
        lo = _figures(_serve(spec, _with(dep, name, 1 - STEP)))
        hi = _figures(_serve(spec, _with(dep, name, 1 + STEP)))
        rows.append(_row(name, UNITS[name][1], _datasheet_value(dep, name), lo, hi, base))
    if spec.concurrency is not None:
        c = spec.concurrency
        k = max(1, round(c * STEP))
        lo = _figures(_serve(spec, dep, concurrency=max(1, c - k)))
        hi = _figures(_serve(spec, dep, concurrency=c + k))
        row = _row("concurrency", "clients", c, lo, hi, base)
        _rescale(row, (k if c - k >= 1 else (c + k - max(1, c - k)) / 2) / c)
        rows.append(row)
    else:
        lo = _figures(_serve(spec, dep, rate=spec.rate * (1 - STEP)))
        hi = _figures(_serve(spec, dep, rate=spec.rate * (1 + STEP)))
        rows.append(_row("request_rate", "requests/s", spec.rate, lo, hi, base))
    k = max(1, round(spec.isl * STEP))
    lo = _figures(_serve(spec, dep, isl=max(1, spec.isl - k)))
    hi = _figures(_serve(spec, dep, isl=spec.isl + k))
    row = _row("input_length", "tokens", spec.isl, lo, hi, base)
    _rescale(row, k / spec.isl)
    rows.append(row)
    solution = _solve(spec) if spec.solve else None
    return Sensitivity(spec, base, rows, solution, tuple(notes))


def _rescale(row: dict, rel: float) -> None:
    """A discrete load's difference was over ``±rel`` (not ±STEP): rescale to per-unit change."""
    for m in METRICS:
        for key in ("elasticity", "derivative"):
            if row[key][m] is not None:
                row[key][m] *= STEP / rel


def _objective(spec: SensitivitySpec) -> tuple[str, float]:
    return ("tpot_s", spec.tpot_s) if spec.tpot_s is not None else ("ttft_s", spec.ttft_s)


def _solve(spec: SensitivitySpec) -> dict:
    metric, bound = _objective(spec)
    dep = spec.deployment
    if spec.solve == "devices":
        return _fewest_devices(spec, metric, bound)

    def gap(log_s: float) -> float:
        f = _figures(_serve(spec, _with(dep, spec.solve, math.exp(log_s))))
        return 1.0 if f is None else f[metric] / bound - 1.0

    lo, hi = math.log(1 / 16), math.log(16)
    out = {"parameter": spec.solve, "metric": metric, "bound": bound}
    if gap(hi) > 0:
        return {**out, "found": False, "reason": f"{metric} stays above {bound:g} s even at 16 × the datasheet's"}
    if gap(lo) <= 0:
        s = 1 / 16
    else:
        s = math.exp(brentq(gap, lo, hi, xtol=1e-4))
    at = _with(dep, spec.solve, s * (1 + 1e-6))
    cf, sim = _figures(_serve(spec, at)), _figures(_serve(spec, at, "simulation"))
    return {**out, "found": True, "multiplier": s, "value": s * _datasheet_value(dep, spec.solve),
            "unit": UNITS[spec.solve][1], "closed_form": cf, "simulation": sim,
            "simulation_meets": sim is not None and sim[metric] <= bound * (1 + 1e-9)}


def _fewest_devices(spec: SensitivitySpec, metric: str, bound: float) -> dict:
    """The fewest tensor-parallel devices (powers of two up to 64) whose closed-form mean meets
    the objective, then simulated."""
    dep = spec.deployment
    out = {"parameter": "devices", "metric": metric, "bound": bound}
    for tp in (1, 2, 4, 8, 16, 32, 64):
        cand = replace(dep, layout=replace(dep.layout, tp=tp, ep=1, dp=1, attention_dp=False))
        try:
            cand.request(decode=True, batch=2, length=2).validate()
            f = _figures(_serve(spec, cand))
        except UserError:
            continue
        if f is not None and f[metric] <= bound:
            sim = _figures(_serve(spec, cand, "simulation"))
            return {**out, "found": True, "value": tp, "unit": "devices (tensor parallel)", "multiplier": None,
                    "closed_form": f, "simulation": sim,
                    "simulation_meets": sim is not None and sim[metric] <= bound * (1 + 1e-9)}
    return {**out, "found": False, "reason": f"no tensor-parallel size up to 64 meets {metric} ≤ {bound:g} s"}
