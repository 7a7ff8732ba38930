"""The closed loop's bookkeeping: which steps to run, what perfcast predicts for them, and how a
measured step and its kernels compare with the prediction. No torch here: the measuring side is
:mod:`perfcast.profiler.timing` and :mod:`perfcast.profiler.steps`; the script that joins them is
``benchmarks/gpu_closed_loop.py``.

A **point** is one step: ``prefill:BxS`` (``B`` sequences of ``S`` new tokens, empty cache) or
``decode:B@C`` (one new token for each of ``B`` sequences after ``C`` cached tokens) — exactly
``perfcast text-generate --num-queries B --query-length S`` and ``--decode --num-queries B
--context-length C``.

Kernels are compared per family (:mod:`perfcast.profiler.families`) and per *kernel key*: the
family, the aten op and a shape — ``M×K×N`` for a GEMM, the first input's shape otherwise, none
for attention and grouped expert GEMMs (whose measured launching op differs from the captured
one), nor for ``cat`` and ``index_copy_`` (whose captured and traced first inputs differ). A cast
captured as ``_to_copy`` is keyed as the ``aten::copy_`` the profiler links its kernel to.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from perfcast.ir import UserError
from perfcast.profiler.families import ATTENTION, FAMILIES, GEMM, leaf_family, measured_family, packet
from perfcast.profiler.timing import CUPTI_OVERHEAD

#: The engines perfcast prices the measured eager steps with, by the transformers cache the step
#: runs — the one place to change them. Both are PyTorch as Hugging Face runs it (one kernel per
#: aten op, one host launch each): ``eager`` with generate()'s default DynamicCache (the loop's
#: prefills fill one), ``eager-static`` with the StaticCache a CUDA-graph replay needs.
ENGINES = {"dynamic": "eager", "static": "eager-static"}


def engine_options(point: Point | None = None, cache: str = "static") -> tuple[dict, str]:
    """The :class:`~perfcast.inference.textgen.Request` keywords that select the engine of a
    step (a prefill fills a DynamicCache; a decode runs over ``cache``), and how the report
    names it; without a point, the decode's."""
    name = ENGINES["dynamic" if point is not None and not point.decode else cache]
    return {"engine": name}, f"--engine {name}"


@dataclass(frozen=True)
class Point:
    phase: str  # "prefill" or "decode"
    batch: int
    tokens: int  # new tokens per sequence (1 in decode)
    context: int  # cached tokens per sequence before the step

    @property
    def decode(self) -> bool:
        return self.phase == "decode"

    @property
    def label(self) -> str:
        return f"decode:{self.batch}@{self.context}" if self.decode else f"prefill:{self.batch}x{self.tokens}"


DEFAULT_POINTS = ("prefill:1x512,prefill:1x2048,decode:1@1024,decode:8@1024,decode:64@1024,"
                  "decode:1@4096,decode:8@4096,decode:64@4096")
_POINT = re.compile(r"^(?:prefill:(\d+)x(\d+)|decode:(\d+)@(\d+))$")


def parse_points(text: str, flag: str = "--points") -> list[Point]:
    """``prefill:1x512,decode:8@4096`` → points; a malformed or repeated one is a UserError."""
    points: list[Point] = []
    for part in (p.strip() for p in text.split(",")):
        m = _POINT.match(part)
        if not m:
            raise UserError(f"{flag} {part!r}: expected prefill:BATCHxTOKENS or decode:BATCH@CONTEXT "
                            f"(e.g. prefill:1x512, decode:8@4096)")
        nums = [int(g) for g in m.groups() if g is not None]
        if min(nums) < 1:
            raise UserError(f"{flag} {part!r}: batch, tokens and context must be at least 1")
        p = Point("prefill", nums[0], nums[1], 0) if part.startswith("prefill") else Point("decode", nums[0], 1, nums[1])
        if p in points:
            raise UserError(f"{flag} {part!r}: given twice")
        points.append(p)
    return points


#: torch.cuda.get_device_name → the perfcast device of that exact part (PCIe and NVL variants
#: have other memory and clocks, so they map to nothing rather than to the SXM part).
GPU_DEVICES = ((re.compile(r"^NVIDIA H100 80GB HBM3$"), "h100-sxm"), (re.compile(r"^NVIDIA H200$"), "h200-sxm"),
               (re.compile(r"^NVIDIA B200$"), "b200-sxm"))


def perfcast_device_for(gpu_name: str, given: str | None = None, flag: str = "--perfcast-device") -> str:
    if given:
        return given
    for pattern, device in GPU_DEVICES:
        if pattern.match(gpu_name.strip()):
            return device
    raise UserError(f"{flag}: no perfcast device is known to be a {gpu_name!r}; name the closest one "
                    f"(see `perfcast devices`)")


@dataclass(frozen=True)
class Budget:
    """Wall-clock budget of a run; ``allows(s)``: can work expected to take ``s`` seconds start?"""

    limit_s: float
    clock: Callable[[], float] = time.monotonic
    start: float = field(default=0.0)

    def __post_init__(self):
        object.__setattr__(self, "start", self.clock())

    def elapsed(self) -> float:
        return self.clock() - self.start

    def left(self) -> float:
        return self.limit_s - self.elapsed()

    def allows(self, need_s: float) -> bool:
        return self.left() >= need_s


# Kernel keys ----------------------------------------------------------------------------------
_GEMM_OPERANDS = {"mm": (0, 1), "addmm": (1, 2), "bmm": (0, 1), "baddbmm": (1, 2)}
_GROUPED = {"grouped_mm", "_grouped_mm", "scaled_grouped_mm", "_scaled_grouped_mm", "moe_experts"}


#: One kernel under two op names: a captured ``_to_copy`` (a cast) launches its kernel from the
#: ``aten::copy_`` inside it, which is the op the profiler links the kernel to.
_SAME_KERNEL = {"_to_copy": "copy_"}
#: Ops whose captured and traced first inputs differ (a tensor list the profiler records without
#: shapes; the cache a traced ``index_copy_`` writes into against the new entries a cache-write
#: leaf reads): keyed by op alone.
_UNSHAPED = {"cat", "index_copy_"}


def _keyed(family: str, op: str, shape: str) -> tuple[str, str, str]:
    """A key under the op name the profiler links the kernel to, without a shape where the
    captured and traced shapes differ (:data:`_SAME_KERNEL`, :data:`_UNSHAPED`)."""
    op = _SAME_KERNEL.get(op, op)
    return family, op, "" if op in _UNSHAPED else shape


def kernel_key(family: str, op: str, shapes) -> tuple[str, str, str]:
    """(family, op, shape) — see the module docstring."""
    if family == ATTENTION:
        return ATTENTION, "attention", ""
    if op in _GROUPED:
        return GEMM, "grouped_mm", ""
    if op in _GEMM_OPERANDS and len(shapes) > max(_GEMM_OPERANDS[op]):
        a, b = (shapes[i] for i in _GEMM_OPERANDS[op])
        if a and b:
            return family, op, f"{math.prod(a[:-1])}x{a[-1]}x{b[-1]}"
    return _keyed(family, op, "x".join(str(d) for d in shapes[0]) if shapes else "")


def measured_key(record) -> tuple[str, str, str]:
    """The key of a :class:`~perfcast.profiler.timing.KernelRecord`."""
    family = measured_family(record.op, record.name)
    return kernel_key(family, packet(record.op) if record.op else "(no op)", record.shapes)


def leaf_key(leaf) -> tuple[str, str, str]:
    shapes = tuple(tuple(int(d) for d in t.shape) for t in leaf.inputs)
    return kernel_key(leaf_family(leaf.kind), packet(str(leaf.attr("op") or leaf.kind)), shapes)


# Predictions ----------------------------------------------------------------------------------
@dataclass
class Prediction:
    """One performance model's price of a step: the step, its host launches, its kernels
    (key → [calls, µs], launches excluded) and where the numbers came from."""

    performance_model: str
    step_s: float
    launch_s: float
    launches: int
    kernels: dict[tuple[str, str, str], list] = field(default_factory=dict)
    provenance: dict[str, float] = field(default_factory=dict)

    @property
    def kernels_s(self) -> float:
        """The step without host launches: what a CUDA-graph replay would leave."""
        return self.step_s - self.launch_s

    def to_json(self) -> dict:
        return {"step_s": self.step_s, "kernels_s": self.kernels_s, "launch_s": self.launch_s,
                "launches": self.launches, "provenance": self.provenance}


def from_rollup(name: str, step_s: float, rollup, evaluation) -> Prediction:
    """A :class:`Prediction` from a fast roll-up evaluated at its (concrete) point. Its launch
    time is the host's part alone (eager launches); a kernel's own launch latency, where the
    performance model charges one outside the kernel's time, is part of that kernel on the device
    (:class:`perfcast.rollup.fast.LeafTotal`), so it stays in the kernel's time and in a replay.
    ``launches`` counts the kernels the step runs (:attr:`FastRollup.kernels`)."""
    pred = Prediction(name, step_s, float(evaluation.host_launch_s), int(rollup.kernels),
                      provenance=evaluation.provenance_shares())
    for lt in rollup.leaves:
        row = pred.kernels.setdefault(leaf_key(lt.leaf), [0, 0.0])
        row[0] += int(lt.trips)
        row[1] += float(rollup.model.realize(lt.time_s + lt.trips * lt.launch_s)) * 1e6
    return pred


def engines_label(cache: str = "static") -> str:
    """How a run's report names its engines: the decodes' and, where they differ, the prefills'
    (and the DynamicCache decodes' timed beside static ones)."""
    decode, prefill = ENGINES[cache], ENGINES["dynamic"]
    return f"--engine {decode}" if decode == prefill else \
        f"--engine {decode} (decodes), --engine {prefill} (prefills and DynamicCache decodes)"


def predict(model, device, point: Point, dtype: str, profiling_database: str | None = None,
            cache: str = "static"):
    """perfcast's eager price of ``point`` (its engine: :func:`engine_options`): the analytic
    model, the naive datasheet roofline as the same-run baseline
    (:mod:`perfcast.inference.roofline`), and the profiling model over ``profiling_database``
    when given. Returns (predictions by model, the simulation's notes, how the engine was
    selected)."""
    from perfcast.inference.textgen import Request, simulate

    options, how = engine_options(point, cache)
    models = ("analytic", "roofline") + (("profiling",) if profiling_database else ())
    res = simulate(Request(model, device, num_queries=point.batch, query_length=point.tokens,
                           context_length=point.context, decode=point.decode, dtype=dtype,
                           performance_models=models, profiling_database=profiling_database, **options))
    preds = {m: from_rollup(m, res.step_time_s(m), res.rollups[m], res.evaluations[m]) for m in models}
    return preds, list(res.notes), how


# Comparison -----------------------------------------------------------------------------------
def _error(predicted: float | None, measured: float | None) -> float | None:
    """Signed relative error of a prediction, ``predicted / measured − 1``."""
    return predicted / measured - 1 if predicted is not None and measured else None


def measured_kernels(records) -> dict[tuple[str, str, str], list]:
    """Kernel key → [kernels, µs of device time] of traced records; a dict already so keyed
    (as :func:`keys_from_json` reads it back from a results file) is returned as it is."""
    if isinstance(records, dict):
        return records
    out: dict[tuple[str, str, str], list] = {}
    for r in records:
        row = out.setdefault(measured_key(r), [0, 0.0])
        row[0] += 1
        row[1] += r.duration_us
    return out


def keys_to_json(measured: dict) -> list[list]:
    """Measured kernel keys as ``[family, op, shape, kernels, µs]`` rows (results.json)."""
    return [[*k, n, us] for k, (n, us) in measured.items()]


def keys_from_json(rows) -> dict[tuple[str, str, str], list]:
    """Measured kernel keys as a results file keeps them, keyed as :func:`kernel_key` keys today
    (a run kept before an op was keyed by op alone has its shapes merged)."""
    out: dict[tuple[str, str, str], list] = {}
    for f, op, shape, n, us in rows:
        row = out.setdefault(_keyed(f, op, shape), [0, 0.0])
        row[0] += n
        row[1] += us
    return out


def family_rows(records, prediction: Prediction) -> list[dict]:
    """Per family and in total: measured kernels (count, µs of device time) against the
    prediction's (calls, µs without launches)."""
    measured = measured_kernels(records)
    rows = []
    for fam in (*FAMILIES, "total"):
        def pick(d):
            picked = [v for k, v in d.items() if fam == "total" or k[0] == fam]
            return sum(v[0] for v in picked), sum(v[1] for v in picked)
        mn, mus = pick(measured)
        pn, pus = pick(prediction.kernels)
        rows.append({"family": fam, "measured_count": mn, "measured_us": mus, "predicted_count": pn,
                     "predicted_us": pus, "error": _error(pus, mus)})
    return rows


def kernel_rows(records, prediction: Prediction) -> list[dict]:
    """Per kernel key: measured against predicted, largest first; a key seen on one side only
    has zeros on the other."""
    measured = measured_kernels(records)
    rows = []
    for key in dict.fromkeys([*measured, *prediction.kernels]):
        mn, mus = measured.get(key, (0, 0.0))
        pn, pus = prediction.kernels.get(key, (0, 0.0))
        rows.append({"family": key[0], "op": key[1], "shape": key[2], "measured_count": mn,
                     "measured_us": mus, "predicted_count": pn, "predicted_us": pus,
                     "error": _error(pus, mus)})
    rows.sort(key=lambda r: -max(r["measured_us"], r["predicted_us"]))
    return rows


def step_row(eager_s: float | None, graph_s: float | None, prediction: Prediction,
             kernels_us: float | None) -> dict:
    """The step: measured eager and graph-replay times against the prediction with and without
    its host launches; the measured time outside kernels (eager or replay minus the traced
    kernels' device time) against the predicted launch time."""
    def gap(t):
        return t - kernels_us * 1e-6 if t is not None and kernels_us is not None else None

    return {"measured_eager_s": eager_s, "measured_graph_s": graph_s, "predicted_s": prediction.step_s,
            "predicted_kernels_s": prediction.kernels_s, "predicted_launch_s": prediction.launch_s,
            "error_eager": _error(prediction.step_s, eager_s),
            "error_graph": _error(prediction.kernels_s, graph_s),
            "measured_gap_eager_s": gap(eager_s), "measured_gap_graph_s": gap(graph_s)}


# A step's record (results.json) ----------------------------------------------------------------
def drop_overhead(meas: dict) -> dict:
    """A traced step's kernel summary (``kernels``, ``kernels_us``, ``kernel_keys``) without
    CUPTI's overhead activities, which a run traced before they were left out
    (:data:`~perfcast.profiler.timing.CUPTI_OVERHEAD`) counted as kernels; what is taken out is
    kept under ``cupti_overhead`` as ``[activities, µs]``. The DynamicCache step likewise."""
    for m in (meas, meas.get("dynamic") or {}):
        keys = m.get("kernel_keys") or []
        stalls = [k for k in keys if k[1] in CUPTI_OVERHEAD]
        if stalls:
            n, us = sum(k[3] for k in stalls), sum(k[4] for k in stalls)
            m["kernel_keys"] = [k for k in keys if k[1] not in CUPTI_OVERHEAD]
            m["kernels"], m["kernels_us"] = m["kernels"] - n, m["kernels_us"] - us
            m["cupti_overhead"] = [n, us]
    return meas


def dynamic_row(measured: dict, prediction: Prediction) -> dict:
    """A decode with generate()'s DynamicCache (timed eagerly and traced; it cannot be replayed)
    against its prediction: the step against the eager time, the prediction less its host
    launches against the traced kernels' device time."""
    kernels_s = measured["kernels_us"] * 1e-6 if measured.get("kernels_us") else None
    return {"measured_eager_s": measured.get("eager_s"), "measured_kernels_s": kernels_s,
            "predicted_s": prediction.step_s, "predicted_kernels_s": prediction.kernels_s,
            "error_eager": _error(prediction.step_s, measured.get("eager_s")),
            "error_kernels": _error(prediction.kernels_s, kernels_s)}


def compare(rec: dict, preds: dict, dynamic: dict | None = None) -> dict:
    """Fill ``rec``'s step, family and kernel rows from its measurements and ``preds``; with
    ``dynamic`` (the predictions of the same decode over a DynamicCache) and a DynamicCache
    measurement, its rows too (``rec["dynamic"]``)."""
    meas = drop_overhead(rec["measured"])
    rec["predicted"] = {m: p.to_json() for m, p in preds.items()}
    rec["step"], rec["families"], rec["kernels"] = {}, {}, {}
    measured = keys_from_json(meas["kernel_keys"]) if "kernel_keys" in meas else None
    for m, p in preds.items():
        rec["step"][m] = step_row(meas.get("eager_s"), meas.get("graph_s"), p, meas.get("kernels_us"))
        if measured is not None:
            rec["families"][m] = family_rows(measured, p)
            rec["kernels"][m] = kernel_rows(measured, p)
    rec.pop("dynamic", None)
    if dynamic and meas.get("dynamic", {}).get("eager_s"):
        rec["predicted_dynamic"] = {m: p.to_json() for m, p in dynamic.items()}
        rec["dynamic"] = {m: dynamic_row(meas["dynamic"], p) for m, p in dynamic.items()}
    rec["status"] = "ok" if not rec["errors"] else "error"
    return rec


def accuracy(doc: dict) -> list[dict]:
    """Per performance model and measurement (eager, graph): how many steps it priced, of those
    measured, and the median, p90 and signed median of its error."""
    import numpy as np

    def row(m, against, errs, of):
        e = np.array(errs)
        return {"performance_model": m, "against": against, "steps": len(e), "of": of,
                "median": float(np.median(abs(e))), "p90": float(np.percentile(abs(e), 90)),
                "signed_median": float(np.median(e))}

    out = []
    models = list(dict.fromkeys(m for r in doc["steps"] for m in r.get("step", {})))
    for m in models:
        for against in ("eager", "graph"):
            measured = [r for r in doc["steps"] if r.get("measured", {}).get(f"{against}_s")]
            errs = [r["step"][m][f"error_{against}"] for r in measured if m in r.get("step", {})]
            if errs:
                out.append(row(m, against, errs, len(measured)))
        # the DynamicCache decodes: their eager time, and their kernels' device time
        dyn = [r for r in doc["steps"] if r.get("measured", {}).get("dynamic", {}).get("eager_s")]
        for against in ("eager", "kernels"):
            errs = [r["dynamic"][m][f"error_{against}"] for r in dyn if m in r.get("dynamic", {})
                    and r["dynamic"][m][f"error_{against}"] is not None]
            if errs:
                out.append(row(m, f"{against} (DynamicCache)", errs, len(dyn)))
    return out
