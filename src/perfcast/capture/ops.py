"""Serving-semantics operators, as torch custom ops with fake (shape-only) implementations.

The plain Hugging Face forward has no KV cache of a given context length, no routing
assumption for MoE, and no absorbed MLA decode. Capture substitutes those pieces at module
level with calls to the ops below, so that each appears in the record stream as one op whose
meaning is explicit (``perfcast.attention``, ``perfcast.moe_experts``) and whose cost the lowering
computes from its arguments — never from a data-dependent execution path.
"""

from __future__ import annotations

import torch

_LIB = "perfcast"


@torch.library.custom_op(f"{_LIB}::attention", mutates_args=())
def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, past: int, causal: bool,
              window: int, shared_kv: bool, cache_width: int, chunk: int, softcap: float) -> torch.Tensor:
    """Attention of ``q`` (B, H, S, d_qk) over a KV cache holding ``past`` earlier tokens plus the
    new ``k``/``v`` (B, H_kv, S, d): reads the attended keys/values, writes the new tokens' cache
    entries, returns (B, S, H, d_v). ``window`` > 0 limits each query to its last ``window``
    keys; ``chunk`` > 0 to the keys of its own ``chunk``-token block (chunked local attention,
    with ``past`` the tokens of the current block already cached); ``shared_kv`` means K and V
    are one latent (absorbed MLA), so V costs no extra bytes; ``cache_width`` is the elements
    cached per token when the cache layout differs from K/V (MLA prefill caches the latent), 0
    meaning H_kv·(d_qk + d_v) (or H_kv·d_qk when shared); ``softcap`` > 0 caps every score with
    ``softcap·tanh(score/softcap)``."""
    raise NotImplementedError("perfcast.attention is priced, never executed")


@attention.register_fake
def _attention_fake(q, k, v, past, causal, window, shared_kv, cache_width, chunk, softcap):
    b, h, s, _ = q.shape
    return q.new_empty((b, s, h, v.shape[-1]))


@torch.library.custom_op(f"{_LIB}::sparse_attention", mutates_args=())
def sparse_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, indices: torch.Tensor, past: int,
                     shared_kv: bool, cache_width: int, topk: int) -> torch.Tensor:
    """Token-sparse attention (DeepSeek sparse attention): each query attends only the ``topk``
    cached keys ``indices`` (B, S, topk) selects, gathered from a cache laid out as for
    :func:`attention`; returns (B, S, H, d_v)."""
    raise NotImplementedError("perfcast.sparse_attention is priced, never executed")


@sparse_attention.register_fake
def _sparse_attention_fake(q, k, v, indices, past, shared_kv, cache_width, topk):
    b, h, s, _ = q.shape
    return q.new_empty((b, s, h, v.shape[-1]))


@torch.library.custom_op(f"{_LIB}::sparse_indexer", mutates_args=())
def sparse_indexer(q: torch.Tensor, k: torch.Tensor, weights: torch.Tensor, past: int, topk: int) -> torch.Tensor:
    """The lightning indexer of DeepSeek sparse attention: scores every cached key for every query
    (``q`` (B, S, H_I, d_I), the new tokens' index keys ``k`` (B, S, d_I) appended to an index-key
    cache of ``past`` tokens, per-head ``weights`` (B, S, H_I)) and returns the ``topk`` best keys'
    positions (B, S, topk), int32."""
    raise NotImplementedError("perfcast.sparse_indexer is priced, never executed")


@sparse_indexer.register_fake
def _sparse_indexer_fake(q, k, weights, past, topk):
    b, s = q.shape[:2]
    return q.new_empty((b, s, topk), dtype=torch.int32)


@torch.library.custom_op(f"{_LIB}::gated_delta_rule", mutates_args=())
def gated_delta_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                     past: int, decode: bool, state_dtype: str) -> torch.Tensor:
    """Gated DeltaNet linear attention over a recurrent state: ``q``/``k`` (B, S, H_k, d_k), ``v``
    (B, S, H_v, d_v), decay ``g`` and learning rate ``beta`` (B, S, H_v); prefill runs the chunked
    form (from the zero state, or the state the ``past`` tokens left), decode the recurrent update
    of one token; the state (B, H_v, d_k, d_v) is kept in ``state_dtype`` (``float32``:
    Qwen3.5's ``mamba_ssm_dtype``); returns (B, S, H_v, d_v)."""
    raise NotImplementedError("perfcast.gated_delta_rule is priced, never executed")


@gated_delta_rule.register_fake
def _gated_delta_rule_fake(q, k, v, g, beta, past, decode, state_dtype):
    return torch.empty_like(v)


@torch.library.custom_op(f"{_LIB}::causal_conv1d", mutates_args=())
def causal_conv1d(x: torch.Tensor, weight: torch.Tensor, past: int, decode: bool) -> torch.Tensor:
    """A depthwise causal convolution over time with its SiLU: ``x`` (B, C, S), ``weight`` (C, K);
    each sequence keeps the last K − 1 inputs as its convolution state; returns (B, C, S)."""
    raise NotImplementedError("perfcast.causal_conv1d is priced, never executed")


@causal_conv1d.register_fake
def _causal_conv1d_fake(x, weight, past, decode):
    return torch.empty_like(x)


@torch.library.custom_op(f"{_LIB}::moe_experts", mutates_args=())
def moe_experts(hidden: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor,
                top_k_index: torch.Tensor, top_k: int, num_experts: int) -> torch.Tensor:
    """A routed-experts layer as one grouped GEMM: ``hidden`` (T, D) tokens, each sent to
    ``top_k`` of ``num_experts`` experts; ``gate_up``/``down`` hold all experts' weights.
    Tokens per expert follow the capture's routing assumption (see the lowering)."""
    raise NotImplementedError("perfcast.moe_experts is priced, never executed")


@moe_experts.register_fake
def _moe_experts_fake(hidden, gate_up, down, top_k_index, top_k, num_experts):
    return torch.empty_like(hidden)
