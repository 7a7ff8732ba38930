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
              window: int, shared_kv: bool, cache_width: int) -> torch.Tensor:
    """Attention of ``q`` (B, H, S, d_qk) over a KV cache holding ``past`` earlier tokens plus the
    new ``k``/``v`` (B, H_kv, S, d): reads the attended keys/values, writes the new tokens' cache
    entries, returns (B, S, H, d_v). ``window`` > 0 limits each query to its last ``window``
    keys; ``shared_kv`` means K and V are one latent (absorbed MLA), so V costs no extra bytes;
    ``cache_width`` is the elements cached per token when the cache layout differs from K/V
    (MLA prefill caches the latent), 0 meaning H_kv·(d_qk + d_v) (or H_kv·d_qk when shared)."""
    raise NotImplementedError("perfcast.attention is priced, never executed")


@attention.register_fake
def _attention_fake(q, k, v, past, causal, window, shared_kv, cache_width):
    b, h, s, _ = q.shape
    return q.new_empty((b, s, h, v.shape[-1]))


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
