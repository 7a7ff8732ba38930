"""What a measured table can be keyed on, read off a leaf: one feature function per leaf kind.

Feature names are the column names a profiling database may use (``M``, ``N``, ``K``,
``batch``, ``kv_len``, ``shape``, ``dtype``, …); a table's key is the tuple of its key columns'
features. A feature a leaf kind does not have is absent, and a table that needs it misses.
"""

from __future__ import annotations

from collections.abc import Callable

import sympy


from perfcast.ir import Leaf
from perfcast.ir.registry import Registry

Features = dict[str, object]
#: Features with a neutral value: a leaf that departs from it (an expert-parallel grouped GEMM,
#: skewed expert routing) misses a table that is not keyed on the feature, since the table's rows
#: were all measured at the neutral value. ``moe_tp`` is not one: ``inter`` is already the
#: per-device width, so a single-device row of that width runs the same GEMMs. Nor is
#: ``shared_kv``: a latent-attention leaf's widths (one KV head of rank + rope, V the latent)
#: already tell its rows apart, and a table ``perfcast profile`` measured for that very leaf
#: is not keyed on it.
NEUTRAL = {"moe_ep": 1, "routing": "balanced"}

#: Weight-only GEMM formats, keyed (weight dtype, activation dtype): the weights are stored
#: narrow and widened to the activation dtype inside the kernel (TensorRT-LLM's
#: WeightOnlyQuantMatmul, vLLM/SGLang Marlin), a kernel of its own — not a 16-bit GEMM.
WEIGHT_ONLY = {("int4", "bf16"): "w4a16", ("int4", "fp16"): "w4a16",
               ("int8", "bf16"): "w8a16", ("int8", "fp16"): "w8a16"}
_FEATURES: Registry[Callable[[Leaf], Features]] = Registry("features for leaf kind")
register = _FEATURES.register


def _int(e) -> int:
    if type(e) is int:
        return e
    if getattr(e, "is_Integer", False):
        return int(e)
    raise ValueError(f"size {e} is not a concrete integer")


def _prod(dims) -> int:
    n = 1
    for d in dims:
        n *= _int(d)
    return n


def features(leaf: Leaf) -> Features:
    fn = _FEATURES.get(leaf.kind, _elementwise)
    return fn(leaf)


def gemm_dtype(leaf: Leaf, weights) -> str:
    """The GEMM format a table row is keyed on: the one a quantized leaf states (``quant_format``:
    ``fp8_block``, ``fp4``, ``w4a16_mxfp4`` …, see :mod:`perfcast.capture.quant`), else the compute
    dtype (``bf16``, ``fp8``, ``int8`` …), or a weight-only format (``w4a16``, ``w8a16``) when
    ``weights`` are stored narrower than the activations the kernel computes in."""
    if leaf.attr("quant_format"):
        return str(leaf.attr("quant_format"))
    compute = leaf.dtype
    for w in weights:
        if (w.dtype, compute) in WEIGHT_ONLY:
            return WEIGHT_ONLY[(w.dtype, compute)]
    return compute


#: Matmul ops whose first input is the added term (``addmm(bias, a, b)``, ``baddbmm(c, a, b)``,
#: ATen's native_functions.yaml): the reduction width is the next input's.
_ADDED_FIRST = ("addmm", "baddbmm")


@register("matmul")
def _matmul(leaf: Leaf) -> Features:
    out = leaf.outputs[0]
    packet = str(leaf.attr("op") or "").removeprefix("torch.ops.").split(".")
    a = leaf.inputs[1] if len(packet) > 1 and packet[1] in _ADDED_FIRST else leaf.inputs[0]
    return {"M": _prod(out.shape[:-1]), "N": _int(out.shape[-1]), "K": _int(a.shape[-1]),
            "dtype": gemm_dtype(leaf, leaf.inputs[1:])}


@register("attention")
def _attention(leaf: Leaf) -> Features:
    q, k, v = leaf.inputs[:3]
    if leaf.attr("causal") is False:
        raise ValueError("non-causal attention (a vision encoder's): the measured tables hold causal prefill")
    s, past = _int(q.shape[2]), _int(leaf.attr("past"))
    return {"batch": _int(q.shape[0]), "heads": _int(q.shape[1]), "kv_heads": _int(k.shape[1]),
            "q_len": s, "kv_len": past + s, "head_dim": _int(q.shape[-1]),
            "v_head_dim": _int(v.shape[-1]), "window": int(leaf.attr("window") or 0),
            "dtype": leaf.dtype, "kv_dtype": k.dtype, "shared_kv": int(bool(leaf.attr("shared_kv")))}


@register("grouped_matmul")
def _grouped(leaf: Leaf) -> Features:
    """Keyed as a measured MoE row is (:func:`perfcast.db.aiconfigurator._moe`): the device holds
    ``E/moe_ep`` of the ``experts`` (E, global) at width ``inter`` (per device: the leaf's
    weights are its slices) and computes ``tokens·top_k/moe_ep`` token-expert pairs, where
    ``tokens`` is the MoE group's input every device routes over all experts.

    The leaf's pairs are ``T·top_k·token_share`` for its ``T`` rows, so ``tokens`` =
    ``T·token_share·moe_ep``: ``T`` when every device of the group holds the same tokens (share
    1/ep); with attention data parallelism (share 1/tp, ``ep = tp·dp``) ``T·dp``, the tokens of
    all data-parallel ranks — what TensorRT-LLM's MoE gets after gathering them, and what
    aiconfigurator prices an attention-DP MoE at. ``token_share`` is thereby folded into
    ``tokens`` rather than being a key of its own. ``routing`` is the leaf's routing assumption
    (``balanced`` unless it says otherwise), matched against the measured token distribution."""
    hidden, gate_up = leaf.inputs[:2]
    experts, d = int(leaf.attr("num_experts")), _int(hidden.shape[-1])
    ep = int(leaf.attr("expert_shards") or 1)
    rows = _int(hidden.numel) // d
    tokens = rows * sympy.sympify(leaf.attr("token_share") or 1) * ep
    if not tokens.is_Integer:
        raise ValueError(f"{rows} tokens x token share {leaf.attr('token_share')} x {ep} expert shards = "
                         f"{tokens} is not a whole number of routed tokens")
    return {"tokens": int(tokens), "hidden": d, "inter": _int(gate_up.numel) // experts // d // 2,
            "experts": experts, "top_k": int(leaf.attr("top_k")), "dtype": gemm_dtype(leaf, leaf.inputs[1:3]),
            "moe_tp": int(leaf.attr("expert_tp") or 1), "moe_ep": ep,
            "routing": str(leaf.attr("routing") or "balanced")}


@register("gated_delta_rule")
def _gated_delta_rule(leaf: Leaf) -> Features:
    """Keyed as a measured Gated DeltaNet row is (:func:`perfcast.db.aic_tables.gdn`): q/k (B, S, H_k,
    d_k), v (B, S, H_v, d_v); ``decode`` tells the one-token recurrence from a one-token prefill scan."""
    q, k, v = leaf.inputs[:3]
    return {"batch": _int(v.shape[0]), "seq_len": _int(v.shape[1]), "k_heads": _int(k.shape[2]),
            "v_heads": _int(v.shape[2]), "head_k": _int(k.shape[3]), "head_v": _int(v.shape[3]),
            "decode": int(bool(leaf.attr("decode"))), "dtype": leaf.dtype}


def _elementwise(leaf: Leaf) -> Features:
    out = (leaf.outputs or leaf.inputs)[0]
    return {"shape": "x".join(str(_int(d)) for d in out.shape), "numel": _int(out.numel),
            "dtype": out.dtype}


@register("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "send_recv")
def _collective(leaf: Leaf) -> Features:
    from perfcast.ir.rules import collective_message

    return {"bytes": _int(collective_message(leaf.inputs, leaf.outputs)),
            "devices": _int(sympy.sympify(leaf.attr("group_size"))), "dtype": leaf.inputs[0].dtype,
            "tier": int(leaf.attr("tier") or 0)}
