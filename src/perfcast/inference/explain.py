"""Symbolic capture of a text-generation step: closed forms in batch ``B``, new tokens ``S``
(prefill) and context ``C`` (decode, or prefill after a cached prefix). The capture comes from
the capture cache (:mod:`perfcast.capture.cache`), which captures it once per model and phase."""

from __future__ import annotations

from perfcast import engines
from perfcast.capture import cache, lower
from perfcast.engines.launch import launch_for
from perfcast.inference.quantization import resolve
from perfcast.rollup import LaunchModel, rollup


def symbolic_step(req):
    """(capture, lowered graph, fast roll-up) of the step with symbolic sizes, as the request's
    engine runs it. The launch mode is the engine's for the request's own batch (a CUDA-graph
    decode holds for batches up to the engine's largest captured graph)."""
    req = language_model(req)
    req.validate()
    cap, _ = cache.symbolic_capture(req.model, dtype=req.dtype, decode=req.decode,
                                    context=bool(req.decode or req.context_length),
                                    reroll=req.reroll, use_cache=req.cache)
    profile = req.profile()
    applied = engines.apply(profile, cap, decode=req.decode, device=req.device.name,
                            hidden_size=int(req.model.data["hidden_size"]))
    quant = resolve(req)
    low = lower(applied.capture, quantize=quant.plan, model_dtype=req.dtype,
                kv_dtype=quant.kv_override,
                name=req.model.name, plan=applied.plan, engine=profile.name, moe_routing=req.moe_routing)
    launch = launch_for(profile, decode=req.decode, tokens=req.device_tokens, device=req.device)
    from perfcast.inference.textgen import make_model

    return cap, low, rollup(low.graph, make_model("analytic", req.device, None, None, profile),
                            LaunchModel(launch.mode, launch.host_interval_s))


def language_model(req):
    """A vision-language model's closed forms are its language model's (a text prompt): the
    encoder's cost depends on the image sizes through the processor's resize, not on B, S, C."""
    from dataclasses import replace

    from perfcast.models import vision

    return replace(req, model=vision.language_model(req.model)) if vision.is_vision_language(req.model) else req


def weights_memory(req, cap, plan) -> dict:
    """What a closed form cannot hide: whether the model's weights fit on the device at all. The
    weights and the engine's reserve do not depend on B, S or C; the KV cache and activations
    come on top (``perfcast text-generate`` sizes them for a concrete batch)."""
    from perfcast.inference import memory

    params, weights = memory.weights(cap, plan)
    capacity = int(req.device.hbm_capacity_bytes)
    reserved = int(round(capacity * (1 - req.memory_utilization)))
    short = weights + reserved - capacity
    return {"capacity_bytes": capacity, "weights_bytes": weights, "reserved_bytes": reserved,
            "free_bytes_before_kv_cache": max(0, -short), "fits": short <= 0, "shortfall_bytes": max(0, short),
            "parameters": params}


def explain(req) -> dict:
    cap, low, r = symbolic_step(req)
    meaning = {"B": "sequences in the batch", "S": "new tokens per sequence",
               "C": "tokens already in each sequence's KV cache"}
    symbols = {s.name: meaning.get(s.name, "") for s in r.free_symbols}
    symbolic = {k: str(v) for k, v in r.cost.items()}
    symbolic["time_s"] = str(r.time_s)
    mem = weights_memory(req, cap, resolve(language_model(req)).plan)
    notes = []
    if not mem["fits"]:
        notes.append(f"DOES NOT FIT: the weights alone need {mem['weights_bytes']:,} bytes of the "
                     f"{mem['capacity_bytes'] - mem['reserved_bytes']:,} the engine may use on {req.device.name} "
                     f"(short by {mem['shortfall_bytes']:,}); these closed forms are not deployable")
    notes.append("time_s uses eff_matrix(x)/eff_memory(x) for the device's efficiency curves "
                 "(piecewise linear in the kernel's FLOPs/bytes)")
    if low.unknown:
        notes.append(f"{sum(low.unknown.values())} op calls have no cost rule and are NOT priced")
    if language_model(req) is not req:
        notes.append(f"{req.model.name} is a vision-language model: these are its language model's closed forms "
                     f"for a text prompt; `perfcast text-generate … --image-batch-size N --image-height H "
                     f"--image-width W` prices the vision encoder and the image tokens")
    profile = req.profile()
    return {"model": req.model.name, "device": req.device.name,
            "engine": {"name": profile.name, "framework": profile.framework, "version": profile.version},
            "phase": "decode" if req.decode else "prefill", "symbols": symbols,
            "symbolic": symbolic, "deployable": mem["fits"], "memory": mem, "notes": notes}
