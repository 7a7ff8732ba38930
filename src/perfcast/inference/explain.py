"""Symbolic capture of a text-generation step: closed forms in batch ``B``, new tokens ``S``
(prefill) and context ``C`` (decode, or prefill after a cached prefix). The capture comes from
the capture cache (:mod:`perfcast.capture.cache`), which captures it once per model and phase."""

from __future__ import annotations

from perfcast.capture import cache, lower
from perfcast.perf import AnalyticPerformanceModel
from perfcast.rollup import rollup

def symbolic_step(req):
    """(capture, lowered graph, fast roll-up) of the step with symbolic sizes."""
    req.validate()
    cap, _ = cache.symbolic_capture(req.model, dtype=req.dtype, decode=req.decode,
                                    context=bool(req.decode or req.context_length),
                                    reroll=req.reroll, use_cache=req.cache)
    low = lower(cap, quantize=req.quantize, model_dtype=req.dtype, kv_dtype=req.kv_dtype,
                fusion=req.fusion, name=req.model.name)
    return cap, low, rollup(low.graph, AnalyticPerformanceModel(req.device))


def explain(req) -> dict:
    cap, low, r = symbolic_step(req)
    meaning = {"B": "sequences in the batch", "S": "new tokens per sequence",
               "C": "tokens already in each sequence's KV cache"}
    symbols = {s.name: meaning.get(s.name, "") for s in r.free_symbols}
    symbolic = {k: str(v) for k, v in r.cost.items()}
    symbolic["time_s"] = str(r.time_s)
    notes = ["time_s uses eff_matrix(x)/eff_memory(x) for the device's efficiency curves "
             "(piecewise linear in the kernel's FLOPs/bytes)"]
    if low.unknown:
        notes.append(f"{sum(low.unknown.values())} op calls have no cost rule and are NOT priced")
    return {"model": req.model.name, "device": req.device.name,
            "phase": "decode" if req.decode else "prefill", "symbols": symbols,
            "symbolic": symbolic, "notes": notes}
