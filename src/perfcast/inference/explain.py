"""Symbolic capture of a text-generation step: closed forms in batch ``B``, new tokens ``S``
(prefill) and context ``C`` (decode, or prefill after a cached prefix).

The hints given to the ShapeEnv (3 sequences, 5 new tokens, 7 cached) are distinct and above 1
so that no two sizes share a symbol and no size is specialised to 0 or 1."""

from __future__ import annotations

from perfcast.capture import capture, hf_config, lower
from perfcast.perf import AnalyticPerformanceModel
from perfcast.rollup import rollup

HINTS = {"batch": 3, "new_tokens": 5, "past": 7}


def symbolic_step(req):
    """(lowered graph, fast roll-up) of the step with symbolic sizes."""
    req.validate()
    cap = capture(hf_config(req.model), dtype=req.dtype, batch=HINTS["batch"],
                  new_tokens=1 if req.decode else HINTS["new_tokens"],
                  past=HINTS["past"] if (req.decode or req.context_length) else 0,
                  decode=req.decode, symbolic=True, reroll=req.reroll)
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
