"""Cost rules of the sequence mixers beyond dense attention: DeepSeek sparse attention (the
lightning indexer and the top-k sparse attention) and Gated DeltaNet (its short causal
convolution and the gated delta rule). Counting conventions as in :mod:`perfcast.ir.rules`.

Each rule also says what the mixer keeps between steps (:func:`cache_bytes`): bytes per cached
token (a KV cache) and bytes per sequence (a recurrent state), which the memory report sums.
"""

from __future__ import annotations

import sympy

from perfcast.ir.cost import BYTES_HBM, FLOPS_MATRIX, FLOPS_VECTOR, Cost
from perfcast.ir.dtypes import itemsize
from perfcast.ir.rules import _bytes, attended_pairs, cache_entry_bytes, register

#: FLA's chunk size for the chunked gated delta rule (fla/ops/gated_delta_rule/chunk.py:
#: chunk_gated_delta_rule, BT = 64), the form vLLM and SGLang run for Qwen3-Next / Qwen3.5 prefill.
GDN_CHUNK = 64


@register("sparse_indexer")
def _sparse_indexer(inputs, outputs, attrs) -> Cost:
    """DeepSeek-V3.2's lightning indexer (DeepSeek-V3.2-Exp report, §2.1, eq. 1): every query
    scores every earlier key, I_t,s = Σ_j w_t,j · ReLU(q_t,j · k_s), with H_I index heads of
    width d_I, then keeps the top-k. Matrix FLOPs 2·B·H_I·P·d_I (P causal query-key pairs);
    vector FLOPs per pair and head: ReLU, the weight multiply and the head sum (3), plus one
    compare per pair for the top-k selection. HBM: queries, weights and the selected indices
    once; the index-key cache of each sequence read once (past + S keys of width d_I) and the
    new tokens' keys written."""
    q, k, w = inputs[:3]
    b, s, heads, d = q.shape
    past = attrs["past"]
    pairs = attended_pairs(s, past, True, 0)
    keys = b * (past + s) * d * itemsize(k.dtype)
    return Cost({FLOPS_MATRIX: 2 * b * heads * pairs * d,
                 FLOPS_VECTOR: 3 * b * heads * pairs + b * pairs,
                 BYTES_HBM: q.nbytes + w.nbytes + _bytes(outputs) + keys + k.nbytes})


@register("sparse_attention")
def _sparse_attention(inputs, outputs, attrs) -> Cost:
    """Token-sparse MLA (DeepSeek-V3.2-Exp report §2.1; FlashMLA's sparse kernels): query i
    attends min(past + i, k) selected latent entries — the attended-pairs count of a window of
    k. FLOPs as dense attention over those pairs (2·B·H·P·(d_qk + d_v) matrix, 5·B·H·P
    vector). HBM: q, the output and the indices once; each sequence's selected entries, at most
    min(past + S, S·k) distinct ones, read once (selections overlap between neighbouring
    queries and are served from L2); the new tokens' cache entries written."""
    q, k, v, idx = inputs[:4]
    b, h, s, d_qk = q.shape
    d_v, topk, past = v.shape[-1], attrs["topk"], attrs["past"]
    pairs = attended_pairs(s, past, True, topk)
    entry = cache_entry_bytes(inputs, attrs)
    read = b * sympy.Min(past + s, s * topk) * entry
    return Cost({FLOPS_MATRIX: 2 * b * h * pairs * (d_qk + d_v), FLOPS_VECTOR: 5 * b * h * pairs,
                 BYTES_HBM: q.nbytes + _bytes(outputs) + idx.nbytes + read + b * s * entry})


def gdn_state_bytes(inputs, attrs) -> sympy.Expr:
    """One sequence's recurrent state: H_v · d_k · d_v elements of the state dtype."""
    q, k, v = inputs[:3]
    return v.shape[2] * k.shape[-1] * v.shape[-1] * itemsize(str(attrs.get("state_dtype", "fp32")))


@register("gated_delta_rule")
def _gated_delta_rule(inputs, outputs, attrs) -> Cost:
    """The gated delta rule S_t = α_t S_{t−1}(I − β_t k_t k_tᵀ) + β_t v_t k_tᵀ, o_t = S_t q_t
    (Yang, Kautz, Hatamizadeh, "Gated Delta Networks", arXiv:2412.06464, eq. 10).

    Decode (one token, recurrent form: FLA fused_recurrent_gated_delta_rule): per value head
    the decay (d_k·d_v), kᵀS (2·d_k·d_v), the rank-1 update (2·d_k·d_v) and Sq (2·d_k·d_v):
    7·d_k·d_v vector FLOPs; the state is read and written once.

    Prefill (chunked form, chunk C = :data:`GDN_CHUNK`; Yang et al., "Parallelizing Linear
    Transformers with the Delta Rule over Sequence Length", arXiv:2406.06484, §3.3): per chunk
    and head KKᵀ (2C²d_k), the WY factors W = TK, U = TV (2C²d_k + 2C²d_v), QKᵀ (2C²d_k), the
    intra-chunk output (2C²d_v), Q·S and W·S (4C·d_k·d_v) and the state update (2C·d_k·d_v):
    per token 2C·(3d_k + 2d_v) + 6·d_k·d_v matrix FLOPs. The state is read when the sequence has
    a past and written once. HBM also holds q, k, v, g, β and the output once."""
    q, k, v, g, beta = inputs[:5]
    b, s, hv, dv = v.shape
    dk = k.shape[-1]
    state = b * gdn_state_bytes(inputs, attrs)
    io = _bytes(inputs[:5]) + _bytes(outputs)
    if attrs.get("decode"):
        return Cost({FLOPS_VECTOR: 7 * b * s * hv * dk * dv, BYTES_HBM: io + 2 * state})
    past = sympy.sympify(attrs["past"])
    reads_state = state if not (past.is_number and past == 0) else 0
    c = GDN_CHUNK
    return Cost({FLOPS_MATRIX: b * s * hv * (2 * c * (3 * dk + 2 * dv) + 6 * dk * dv),
                 FLOPS_VECTOR: 4 * b * s * hv * (dk + dv),
                 BYTES_HBM: io + state + reads_state})


def conv_state_bytes(inputs) -> sympy.Expr:
    """One sequence's convolution state: the last K − 1 inputs of every channel."""
    x, w = inputs[:2]
    return x.shape[1] * (w.shape[-1] - 1) * itemsize(x.dtype)


@register("causal_conv1d")
def _causal_conv1d(inputs, outputs, attrs) -> Cost:
    """Depthwise causal conv1d + SiLU (Dao-AILab causal-conv1d: causal_conv1d_fn in prefill,
    causal_conv1d_update in decode): 2·K FLOPs per output element for the taps, one for the
    SiLU; HBM: input, weights and output once, and the convolution state read and written."""
    x, w = inputs[:2]
    taps = w.shape[-1]
    state = x.shape[0] * conv_state_bytes(inputs)
    return Cost({FLOPS_VECTOR: (2 * taps + 1) * x.numel,
                 BYTES_HBM: x.nbytes + w.nbytes + _bytes(outputs) + 2 * state})


def cache_bytes(leaf) -> tuple[sympy.Expr, sympy.Expr, sympy.Expr, sympy.Expr]:
    """What a mixer leaf keeps between steps in one layer: (bytes per cached token, bytes per
    sequence, sequences, tokens cached per sequence after the step); zeros for another kind."""
    attrs, zero = dict(leaf.attrs), sympy.Integer(0)
    x = leaf.inputs[0]
    if leaf.kind == "sparse_attention":  # q (B, H, S, d)
        return cache_entry_bytes(leaf.inputs, attrs), zero, x.shape[0], attrs["past"] + x.shape[2]
    if leaf.kind == "sparse_indexer":  # q (B, S, H_I, d_I); one index key per token
        k = leaf.inputs[1]
        return k.shape[-1] * itemsize(k.dtype), zero, x.shape[0], attrs["past"] + x.shape[1]
    if leaf.kind == "gated_delta_rule":
        return zero, gdn_state_bytes(leaf.inputs, attrs), x.shape[0], zero
    if leaf.kind == "causal_conv1d":
        return zero, conv_state_bytes(leaf.inputs), x.shape[0], zero
    return zero, zero, zero, zero
