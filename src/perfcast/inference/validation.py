"""``perfcast validate``: measured serving runs against perfcast's steps, per population.

Two mappings of the measured TPOT to perfcast's steps, both reported (docs/design/validation.md
derives them):

- **decode step**: one decode step of the whole batch at the mean context ``isl + osl/2``;
- **steady state**: with continuous batching every request's prefill runs once while the other
  requests decode (Orca, Yu et al., OSDI '22, §3 iteration-level scheduling; vLLM's scheduler
  admits waiting prompts between decode iterations), so in steady state each of the ``B``
  sequences of a rank is replaced once per ``osl`` tokens (Little's law: ``B`` in flight, each
  for ``osl`` tokens) and a decode interval also pays ``B / osl`` prefills of one prompt:
  ``TPOT ≈ t_decode(B, isl + osl/2) + (B / osl) · t_prefill(1 × isl)``. Disaggregated decode
  workers run no prefills: their steady state is the decode step.

TTFT, secondary: one prefill of ``isl`` tokens (no queueing), aggregated runs only.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field, replace

import numpy as np

from perfcast.inference.multinode import WORKERS_NOTE
from perfcast.inference.silicon import ONE_DECODE_WORKER, Case, phases
from perfcast.inference.steps import BASELINE, Prices, StepTime
from perfcast.inference.validation_stats import Population, by_key, llama_8b_h100_trtllm, stats, stratified
from perfcast.ir import UserError

MAPPINGS = ("decode-step", "steady-state", "serving", "closed-form")
#: The TTFT statistic beside each serving mapping.
SERVING_TTFT = {"serving": "ttft-serving", "closed-form": "ttft-closed-form"}
#: What each figure of the report is, as the report and the JSON state it.
MAPPING_TEXT = {
    "decode-step": "one decode step of the whole batch (batch_size × attention_dp sequences) at context "
                   "isl + osl/2",
    "steady-state": "aggregated: the decode step + (batch per rank / osl) × one prefill of isl tokens per rank "
                    "(continuous batching in steady state); disaggregated: the decode step",
    "serving": "with --serving: the row replayed by `perfcast serve` — its deployment, the engine's scheduler and KV "
               "cache, its benchmark client's closed loop at the row's concurrency (InferenceX rows: lengths uniform "
               "in [0.8·L, L], 10 × concurrency requests); the mean TPOT and TTFT over the requests "
               "(perfcast.serving.replay)",
    "closed-form": "with --serving: the same deployment and load priced by the serving closed form (mean field: "
                   "continuous batching in steady state, the tier `perfcast optimize` screens with) — the mean TPOT "
                   "and TTFT it gives; aggregated rows only (the disaggregated closed form takes a request rate)",
    "ttft": "secondary, aggregated rows: one prefill of isl tokens (no queueing); static rows: the prefill of the "
            "whole batch (the first-token tables: batch 1)",
    "static": "static batch (mode static): steady-state = (one prefill of the batch + (osl − 1) decode steps at "
              "isl + osl/2) / osl, against batch / (measured output tokens/s per GPU × GPUs)",
    "assumptions": "a row whose model path names a shipped quantized checkpoint is priced as that checkpoint's "
                   "quantization_config says (its KV-cache dtype included), any other in the formats its "
                   "gemm_quant_mode / moe_quant_mode name, its KV cache in the model dtype where the row does not "
                   "state it (silicon_sample.csv does not; the static tables do) — but an InferenceX row whose "
                   "launch script perfcast transcribes (data/validation/inferencex_recipes.yaml) takes that "
                   "script's KV-cache dtype, step token budget, memory fraction and TensorRT-LLM batch "
                   "waiting; int4_wo's group size is assumed "
                   "(128) and labelled approximate; each row is priced as its backend runs it (--engine trtllm, "
                   "vllm or sglang: that engine's kernels, launches and kernel fits)",
}

#: The split the issue's targets use: at low concurrency a decode step is latency-bound.
LOW_CONCURRENCY = 16


def tpot_decode_step(t_decode_s: float) -> float:
    """Mapping (a): the measured TPOT is one decode step of the batch."""
    return t_decode_s


def tpot_steady_state(t_decode_s: float, t_prefill_s: float, batch: int, osl: int) -> float:
    """Mapping (b): a decode step plus the ``batch / osl`` prefills of one prompt that continuous
    batching interleaves per output token (``batch``: sequences per data-parallel rank)."""
    return t_decode_s + batch / osl * t_prefill_s


@dataclass(frozen=True)
class Prediction:
    """One case under one performance model: TPOT per mapping and TTFT in ms, or the reason."""

    case: Case
    model: str
    tpot_ms: dict[str, float] = field(default_factory=dict)
    ttft_ms: float | None = None
    reason: str | None = None
    measured_share: float | None = None
    unpriced: int = 0
    ttft_serving_ms: float | None = None
    serving_reason: str | None = None  # why the serving replay gave no figure (validate --serving)
    ttft_closed_form_ms: float | None = None
    closed_form_reason: str | None = None  # why the replay's closed form gave no figure

    def error(self, mapping: str) -> float | None:
        """Signed relative error of TPOT, (predicted − measured) / measured."""
        p = self.tpot_ms.get(mapping)
        return None if p is None else p / self.case.tpot_ms - 1


def tpot_static(t_decode_s: float, t_prefill_s: float, osl: int) -> float:
    """A static batch's time per output token: one prefill of the whole batch gives the first
    token, ``osl − 1`` decode steps the rest (TensorRT-LLM gptSessionBenchmark: throughput =
    batch · osl / the generation's latency), each decode step priced at the mean context."""
    return (t_prefill_s + (osl - 1) * t_decode_s) / osl


def predict(cases: list[Case], prices: Prices, models: tuple[str, ...]) -> dict[str, list[Prediction]]:
    """Per performance model (and the baseline), a prediction for every predictable case."""
    out: dict[str, list[Prediction]] = {m: [] for m in models}
    for c in cases:
        if not c.predictable:
            continue
        need = phases(c)
        decode = prices.of(c, True) if True in need else {}
        prefill = prices.of(c, False) if False in need else {}
        for m in models:
            d, p = decode.get(m), prefill.get(m)
            why = ((_missing(d, "decode step") if True in need else None)
                   or (_missing(p, "prefill") if False in need else None))
            if why:
                out[m].append(Prediction(c, m, reason=why))
                continue
            tpot = {}
            if d is not None:
                tpot["decode-step"] = tpot_decode_step(d.seconds) * 1e3
                if c.mode == "agg":
                    tpot["steady-state"] = tpot_steady_state(d.seconds, p.seconds, c.batch, c.osl) * 1e3
                elif c.mode == "static":
                    tpot["steady-state"] = tpot_static(d.seconds, p.seconds, c.osl) * 1e3
                else:
                    tpot["steady-state"] = tpot["decode-step"]
            out[m].append(Prediction(c, m, tpot, p.seconds * 1e3 if p is not None else None,
                                     measured_share=d.measured_share if d else None,
                                     unpriced=max(d.unpriced if d else 0, p.unpriced if p else 0)))
    return out


def _missing(t: StepTime | None, what: str) -> str | None:
    if t is None:
        return f"{what} not priced"
    return t.reason if t.seconds is None else None


def serving_ttft_ms(p: Prediction, mapping: str) -> float | None:
    """The TTFT (ms) a serving mapping (``serving``: the event simulation, ``closed-form``) predicts."""
    return p.ttft_serving_ms if mapping == "serving" else p.ttft_closed_form_ms


def _ttft_stats(preds: list[Prediction], mapping: str):
    return stats(serving_ttft_ms(p, mapping) / p.case.ttft_ms - 1 for p in preds
                 if serving_ttft_ms(p, mapping) is not None and math.isfinite(p.case.ttft_ms))


def summarize(pop: Population, cases: list[Case], predictions: dict[str, list[Prediction]],
              split: bool = False) -> dict:
    """Rows, coverage by reason, and per model and mapping the error statistics (with the
    concurrency split when ``split``)."""
    members = [c for c in cases if c.id in pop.ids]
    reasons = Counter(c.reason for c in members if not c.predictable)
    out = {"population": pop.name, "key": pop.key, "named": bool(pop.key), "description": pop.description,
           "rows": len(members),
           "mappable": sum(c.predictable for c in members),
           "approximate": sum(bool(c.approximate) for c in members if c.predictable),
           "refused": dict(reasons.most_common()), "models": {}}
    for m, preds in predictions.items():
        mine = [p for p in preds if p.case.id in pop.ids]
        ok = [p for p in mine if p.reason is None]
        entry = {"predicted": len(ok), "not_priced": dict(Counter(p.reason for p in mine if p.reason).most_common()),
                 "unpriced_op_rows": sum(p.unpriced > 0 for p in ok)}
        shares = [p.measured_share for p in ok if p.measured_share is not None]
        if shares:
            entry["median_measured_share_decode"] = float(np.median(shares))
        s = stats(p.ttft_ms / p.case.ttft_ms - 1 for p in ok if p.ttft_ms is not None and math.isfinite(p.case.ttft_ms))
        entry["ttft"] = s.as_dict() if s else None
        for mapping, key in SERVING_TTFT.items():
            s = _ttft_stats(ok, mapping)
            entry[key] = s.as_dict() if s else None
        for mapping in MAPPINGS:
            s = stats(p.error(mapping) for p in ok)
            entry[mapping] = s.as_dict() if s else None
            if split:
                for label, keep in ((f"concurrency<={LOW_CONCURRENCY}", lambda c: c.concurrency <= LOW_CONCURRENCY),
                                    (f"concurrency>{LOW_CONCURRENCY}", lambda c: c.concurrency > LOW_CONCURRENCY)):
                    s = stats(p.error(mapping) for p in ok if keep(p.case))
                    entry[f"{mapping} {label}"] = s.as_dict() if s else None
                    if mapping in SERVING_TTFT:
                        s = _ttft_stats([p for p in ok if keep(p.case)], mapping)
                        entry[f"{SERVING_TTFT[mapping]} {label}"] = s.as_dict() if s else None
        out["models"][m] = entry
    return out


# --- the application: select, price, summarize -------------------------------------------


NAMED = ("llama-3.1-8b-h100-trtllm", "stratified", "published", "published-static")
_PUBLISHED = "published:"  # the id prefix of published rows
SUBSETS = ("ci",)


@dataclass(frozen=True)
class ValidationRequest:
    """What ``perfcast validate`` runs. Filters match the data's own names (``system``
    h100_sxm, ``backend`` trtllm, ``mode`` agg) or perfcast's (a device h100-sxm, a catalog
    model llama-3.1-8b); ``population`` restricts the run to one named population."""

    silicon_sample: str | None = None
    published: str | None = None
    systems: tuple[str, ...] = ()
    models: tuple[str, ...] = ()
    backends: tuple[str, ...] = ()
    modes: tuple[str, ...] = ()
    population: str | None = None
    subset: str | None = None
    limit: int | None = None
    seed: int = 0
    performance_models: tuple[str, ...] = ("analytic",)
    baseline: bool = True
    strict: bool = False


def _strictly(c: Case) -> Case:
    if c.predictable and c.approximate:
        return replace(c, reason=f"approximate mapping refused (--strict): {c.approximate[0].split(':')[0]}")
    return c


def _filter(cases: list[Case], values: tuple[str, ...], flag: str, keys) -> list[Case]:
    if not values:
        return cases
    known = sorted({k for c in cases for k in keys(c) if k})
    wanted = {v.lower() for v in values}
    for v in values:
        if v.lower() not in {k.lower() for k in known}:
            raise UserError(f"{flag} {v}: no row has it (known: {', '.join(known)})")
    return [c for c in cases if any(k and k.lower() in wanted for k in keys(c))]


def select(req: ValidationRequest, cases: list[Case]) -> tuple[list[Case], list[Population]]:
    """The rows to price and the named populations over them."""
    if req.population is not None and req.population not in NAMED:
        raise UserError(f"--population {req.population!r}: expected one of {', '.join(NAMED)}")
    if req.subset is not None and req.subset not in SUBSETS:
        raise UserError(f"--subset {req.subset!r}: expected one of {', '.join(SUBSETS)}")
    if req.limit is not None and req.limit < 1:
        raise UserError(f"--limit must be at least 1 (got {req.limit})")
    silicon = [c for c in cases if not c.id.startswith(_PUBLISHED)]
    named = [llama_8b_h100_trtllm(silicon), stratified(silicon, req.seed)]
    if len(silicon) != len(cases):
        pub = [c for c in cases if c.id.startswith(_PUBLISHED)]
        named.append(Population("published", frozenset(c.id for c in pub),
                                "published measurements (perfcast/data/validation/published.yaml)", "published"))
        named.append(Population("published static batches", frozenset(c.id for c in pub if c.mode == "static"),
                                "TensorRT-LLM 0.9.0's static-batch tables (gptSessionBenchmark): the time per "
                                "output token of the whole generation, and the first-token latency of batch 1",
                                "published-static"))
    chosen = cases
    chosen = _filter(chosen, req.systems, "--system", lambda c: (c.system, c.device))
    chosen = _filter(chosen, req.models, "--model", lambda c: (c.model_path, c.family))
    chosen = _filter(chosen, req.backends, "--backend", lambda c: (c.backend,))
    chosen = _filter(chosen, req.modes, "--mode", lambda c: (c.mode,))
    if req.subset == "ci":
        keep = ci_subset(silicon)
        chosen = [c for c in chosen if c.id in keep or (c.id.startswith(_PUBLISHED)
                                                        and (c.mode != "static" or c.family == "llama-2-7b"))]
    if req.population is not None:
        pop = next((p for p in named if p.key == req.population), None)
        chosen = [c for c in chosen if pop is not None and c.id in pop.ids]
        named = [p for p in named if p is pop]
    if req.limit is not None:
        chosen = chosen[:req.limit]
    return chosen, named


def ci_subset(cases: list[Case]) -> frozenset[str]:
    """The fast subset CI runs: the stratified sample (seed 0) restricted to the dense catalog
    models llama-3.1-8b and qwen3-32b (single-device and tensor-parallel, aggregated and
    disaggregated, bf16 and fp8 rows), plus every refused row of the sample (each refusal
    reason is exercised; refusals cost no pricing)."""
    sample = stratified(cases, 0).ids
    return frozenset(c.id for c in cases if c.id in sample
                     and (not c.predictable or c.family in ("llama-3.1-8b", "qwen3-32b")))


def _default_engine(device: str) -> str:
    from perfcast import engines
    from perfcast.hardware import get_device

    return engines.resolve(None, get_device(device)).name


def command(case: Case) -> str:
    """The ``perfcast text-generate`` line of the case's decode step (of its prefill for a
    first-token measurement)."""
    if not case.predictable and case.layout is None:
        return ""
    lay = case.layout
    if True in phases(case):
        parts = ["perfcast text-generate", case.model, "--device", case.device, "--decode",
                 "--num-queries", str(case.num_queries), "--context-length", str(case.context)]
    else:
        parts = ["perfcast text-generate", case.model, "--device", case.device,
                 "--num-queries", str(case.num_queries), "--query-length", str(case.isl)]
    for flag, v in (("--tp-size", lay.tp), ("--ep-size", lay.ep), ("--dp-size", lay.dp), ("--pp-size", lay.pp)):
        if v > 1:
            parts += [flag, str(v)]
    if lay.attention_dp:
        parts.append("--attention-dp")
    if case.engine and case.engine != _default_engine(case.device):
        parts += ["--engine", case.engine]
    if case.dtype != "bf16":
        parts += ["--dtype", case.dtype]
    if case.quantize:
        parts += ["--quantize", case.quantize]
    if case.kv_dtype:
        parts += ["--kv-cache-dtype", case.kv_dtype]
    for k, v in case.engine_options:
        parts += ["--engine-option", f"{k}={v}"]
    if case.cuda_graph_max is not None:
        parts += ["--cuda-graph-max-batch-size", str(case.cuda_graph_max)]
    return " ".join(parts)


def load_cases(req: ValidationRequest) -> tuple[list[Case], dict]:
    """Every row mapped (the silicon sample, then the published tables), and where they came from."""
    from perfcast.inference import published, silicon

    frame, where = silicon.read(req.silicon_sample)
    cases = silicon.map_frame(frame)
    pub_frame, sources = published.read(req.published)
    pub = [replace(c, id=f"{_PUBLISHED} {c.id}") for c in silicon.map_frame(pub_frame)]
    if req.strict:
        cases, pub = [_strictly(c) for c in cases], [_strictly(c) for c in pub]
    return cases + pub, {"silicon_sample": where, "published": str(req.published or published.shipped_path()),
                         "published_sources": sources}


def run(req: ValidationRequest, augment=None) -> dict:
    """The whole validation as one document (see docs/design/validation.md for its keys).
    ``augment(predictions)``: a later layer's predictions added before the summaries (the
    serving replay, :mod:`perfcast.serving.validation`)."""
    import time

    from perfcast.inference.steps import price

    t0 = time.perf_counter()
    cases, sources = load_cases(req)
    chosen, named = select(req, cases)
    t1 = time.perf_counter()
    models = tuple(dict.fromkeys(req.performance_models)) + ((BASELINE,) if req.baseline else ())
    prices = price(chosen, tuple(dict.fromkeys(req.performance_models)), req.baseline)
    t2 = time.perf_counter()
    preds = predict(chosen, prices, models)
    t3 = time.perf_counter()
    if augment is not None:
        preds = augment(preds)
    t4 = time.perf_counter()
    silicon = [c for c in chosen if not c.id.startswith(_PUBLISHED)]
    everything = Population("all selected silicon rows", frozenset(c.id for c in silicon),
                            "every selected row of the silicon sample", "selected")
    assumed = frozenset(c.id for c in silicon if ONE_DECODE_WORKER in c.approximate)
    configured = frozenset(c.id for c in silicon if any(n.startswith(WORKERS_NOTE) for n in c.notes))
    # the rows whose decode batch perfcast had to assume, apart: their error is the assumption's; and
    # those whose workers the campaign's config gives (perfcast.inference.multinode), apart from both
    split_by_batch = [
        Population("… with a stated batch", everything.ids - assumed - configured,
                   "the selected silicon rows whose step batch the row states", "stated-batch"),
        Population("… with the workers of the campaign's config", configured,
                   "the selected disaggregated rows whose worker counts and layouts come from the campaign's "
                   "multi-node config (perfcast.inference.multinode)", "config-workers"),
        Population("… with an assumed decode batch", assumed,
                   f"the selected disaggregated rows priced on an assumed batch ({ONE_DECODE_WORKER})",
                   "assumed-decode-batch")]
    pops = ([summarize(p, chosen, preds, split=True) for p in [everything, *split_by_batch, *named]]
            + ([] if req.population else [summarize(p, chosen, preds)
                                           for p in by_key(silicon)]))
    return {"sources": sources, "mapping": dict(MAPPING_TEXT), "seed": req.seed,
            "performance_models": list(req.performance_models),
            "baseline": BASELINE if req.baseline else None,
            "rows": {"read": len(cases), "selected": len(chosen), "mappable": sum(c.predictable for c in chosen),
                     "approximate": sum(bool(c.approximate) for c in chosen if c.predictable)},
            "refused": dict(Counter(c.reason for c in chosen if not c.predictable).most_common()),
            "populations": pops, "predictions": preds, "cases": chosen, "named": named,
            "timings_s": {"read_and_map": t1 - t0, "price": t2 - t1, **dict(prices.timings_s),
                          **({"serving": t4 - t3} if augment is not None else {})},
            "points": dict(prices.counts)}
