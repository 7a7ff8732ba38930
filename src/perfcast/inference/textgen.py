"""Text generation, one step: capture the model, lower it, price it, track its memory.

Prefill: ``num_queries`` sequences of ``query_length`` new tokens (after ``context_length``
cached ones, 0 by default); logits for the last position only. Decode: one new token per
sequence with ``context_length`` tokens in the KV cache.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from perfcast.capture import QUANTIZATION, Capture, cache, lower
from perfcast.hardware import Device
from perfcast.inference import memory
from perfcast.ir import UserError, dim
from perfcast.models import ModelConfig
from perfcast.perf import AnalyticPerformanceModel, EmpiricalPerformanceModel
from perfcast.rollup import Evaluation, FastRollup, rollup

PERFORMANCE_MODELS = ("analytic", "profiling")


@dataclass(frozen=True)
class Request:
    model: ModelConfig
    device: Device
    num_queries: int = 1
    query_length: int = 1024
    context_length: int = 0
    decode: bool = False
    dtype: str = "bf16"
    quantize: str | None = None
    kv_dtype: str | None = None
    performance_models: tuple[str, ...] = ("analytic",)
    profiling_database: str | None = None
    reroll: bool = True
    fusion: bool = True
    cache: bool = True
    memory_utilization: float = 0.9

    def validate(self) -> None:
        for flag, v in (("--num-queries", self.num_queries), ("--query-length", self.query_length)):
            if v < 1:
                raise UserError(f"{flag} must be at least 1 (got {v})")
        if self.context_length < 0:
            raise UserError(f"--context-length must be non-negative (got {self.context_length})")
        if self.decode and self.context_length < 1:
            raise UserError("--decode needs --context-length ≥ 1 (the tokens already in the KV cache)")
        if not 0 < self.memory_utilization <= 1:
            raise UserError(f"--memory-utilization must be in (0, 1] (got {self.memory_utilization})")
        if self.quantize is not None and self.quantize not in QUANTIZATION:
            raise UserError(f"--quantize {self.quantize!r}: expected one of {', '.join(QUANTIZATION)}")
        for m in self.performance_models:
            if m not in PERFORMANCE_MODELS:
                raise UserError(f"--performance-model {m!r}: expected one of {', '.join(PERFORMANCE_MODELS)}")
        for dt in filter(None, (self.kv_dtype,)):
            if dt not in ("bf16", "fp16", "fp32", "fp8", "int8"):
                raise UserError(f"--kv-cache-dtype {dt!r}: expected bf16, fp16, fp32, fp8 or int8")
        compute = (QUANTIZATION[self.quantize][1] if self.quantize else None) or self.dtype
        if compute not in (*self.device.spec.datasheet.matrix_flops_per_s, "fp32"):
            raise UserError(f"device {self.device.name} has no {compute} matrix rate "
                            f"(has {', '.join(self.device.spec.datasheet.matrix_flops_per_s)}); "
                            f"choose another --dtype/--quantize")

    @property
    def new_tokens(self) -> int:
        return 1 if self.decode else self.query_length

    @property
    def tokens(self) -> int:
        """Tokens produced (decode) or processed (prefill) by the step, all sequences."""
        return self.num_queries * self.new_tokens


@dataclass
class Result:
    request: Request
    lowered: object
    rollups: dict[str, FastRollup]
    evaluations: dict[str, Evaluation]
    memory: memory.MemoryReport
    timings_s: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    capture_source: str = "concrete capture"

    def tokens_per_s_per_device(self, name: str) -> float:
        t = self.evaluations[name].time_s
        return self.request.tokens / t if t else float("inf")


def make_model(name: str, device: Device, database: str | None = None):
    if name == "analytic":
        return AnalyticPerformanceModel(device)
    if name == "profiling":
        from perfcast.perf.profiling import find_database, load_database

        return EmpiricalPerformanceModel(device, load_database(find_database(device.name, database)))
    raise UserError(f"--performance-model {name!r}: expected one of {', '.join(PERFORMANCE_MODELS)}")


def point(req: Request) -> dict:
    return {dim("B"): req.num_queries, dim("S"): req.new_tokens, dim("C"): req.context_length}


def step_capture(req: Request) -> tuple[Capture, dict | None, str]:
    """The capture for the request: the cached symbolic capture evaluated at the request's
    point when it is exact there, else a fresh concrete capture. Returns (capture, the point to
    lower it at or None, how it was obtained)."""
    pt = point(req)
    context = req.decode or req.context_length > 0
    symbolic_dims = [dim("B")] + ([] if req.decode else [dim("S")]) + ([dim("C")] if context else [])
    if req.cache and all(pt[d] >= 2 for d in symbolic_dims):
        sym, hit = cache.symbolic_capture(req.model, dtype=req.dtype, decode=req.decode,
                                          context=context, reroll=req.reroll)
        if cache.valid_at(sym, pt):
            return sym, pt, "symbolic capture (cached)" if hit else "symbolic capture"
    from perfcast.capture import capture, hf_config

    cap = capture(hf_config(req.model), dtype=req.dtype, batch=req.num_queries,
                  new_tokens=req.new_tokens, past=req.context_length, decode=req.decode,
                  reroll=req.reroll)
    return cap, None, "concrete capture"


def simulate(req: Request) -> Result:
    req.validate()
    t0 = time.perf_counter()
    cap, at, how = step_capture(req)
    t1 = time.perf_counter()
    low = lower(cap, quantize=req.quantize, model_dtype=req.dtype, kv_dtype=req.kv_dtype,
                fusion=req.fusion, point=at, name=req.model.name)
    rollups, evals = {}, {}
    for name in req.performance_models:
        r = rollup(low.graph, make_model(name, req.device, req.profiling_database))
        rollups[name] = r
        evals[name] = r.evaluate({})
    t2 = time.perf_counter()
    params, wbytes = memory.weights(cap, req.quantize)
    kv, kv_per_token = memory.kv_cache(low, {})
    capacity = int(req.device.hbm_capacity_bytes)
    mem = memory.MemoryReport(
        capacity_bytes=capacity, weights_bytes=wbytes, kv_cache_bytes=kv,
        kv_cache_bytes_per_token=kv_per_token, activation_peak_bytes=memory.activation_peak(cap, at),
        reserved_bytes=int(round(capacity * (1 - req.memory_utilization))), parameters=params)
    notes = _notes(req, low) + _pricing_notes(rollups)
    return Result(req, low, rollups, evals, mem,
                  {"capture_s": t1 - t0, "lower_and_price_s": t2 - t1}, notes, how)


def _pricing_notes(rollups: dict[str, FastRollup]) -> list[str]:
    """What each performance model assumed on the way (uncalibrated units, rate fallbacks)."""
    notes: list[str] = []
    for name, r in rollups.items():
        model = r.model
        for unit in getattr(model, "uncalibrated", lambda: [])():
            notes.append(f"{name}: no {unit} efficiency curve for {model.device.name}; "
                         f"{unit} work priced at datasheet peak")
        seen: dict[str, int] = {}
        for lt in r.leaves:
            for n in lt.result.notes:
                seen[n] = seen.get(n, 0) + 1
        notes.extend(f"{name}: {n} ({k} kernels)" for n, k in seen.items())
    return notes


def _notes(req: Request, low) -> list[str]:
    notes = []
    cfg = req.model.data
    experts = cfg.get("num_local_experts") or cfg.get("num_experts") or cfg.get("n_routed_experts")
    if experts:
        k = cfg.get("num_experts_per_tok")
        notes.append(f"MoE routing: balanced — each of {experts} experts receives tokens·{k}/{experts} "
                     f"tokens; the weights of min({experts}, tokens·{k}) experts are read per layer")
    qc = req.model.data.get("quantization_config")
    if qc and req.quantize is None:
        notes.append(f"the published checkpoint is quantized ({qc.get('quant_method', '?')}); priced in "
                     f"{req.dtype} — pass --quantize to price a quantized deployment")
    if low.unknown:
        notes.append(f"{sum(low.unknown.values())} op calls have no cost rule and are NOT priced: "
                     + ", ".join(f"{op} ×{n}" for (op, _), n in low.unknown.most_common(5)))
    notes.append("runs of memory-bound ops between GEMMs are fused into one kernel each"
                 if req.fusion else "each captured op is one kernel (--no-fusion)")
    notes.append("kernels run one after another: no overlap between them is assumed")
    return notes
