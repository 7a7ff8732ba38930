"""Serving semantics substituted into Hugging Face modules during capture.

- Attention: registered as a transformers attention implementation ("perfcast"); it calls
  ``perfcast.attention`` with the session's KV-cache context, causality and sliding window.
- Routed experts: registered as a transformers experts implementation ("perfcast"); it calls
  ``perfcast.moe_experts`` (one grouped GEMM; tokens per expert from the routing assumption).
- MLA (DeepSeek-V2/V3): the attention module's forward is replaced for the capture by the
  serving form — prefill expands the latent KV (``kv_b_proj``) and attends per head; decode
  absorbs ``W_UK``/``W_UV`` into the query/output and attends over the latent cache (one KV
  head of width ``kv_lora_rank + qk_rope_head_dim``), as in DeepSeek-V2 (arXiv:2405.04434) §2.1.2
  and vLLM/SGLang's MLA decode.
"""

from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass

import torch

from perfcast.capture import ops  # noqa: F401  (registers the perfcast.* custom ops)

IMPL = "perfcast"


@dataclass(frozen=True)
class Session:
    """What the substituted modules need to know about the step being captured."""

    past: int | torch.SymInt  # tokens already in the KV cache of each sequence
    decode: bool


_SESSION: contextvars.ContextVar[Session] = contextvars.ContextVar("perfcast_capture_session")


def session() -> Session:
    return _SESSION.get()


@contextlib.contextmanager
def serving(s: Session):
    token = _SESSION.set(s)
    try:
        yield
    finally:
        _SESSION.reset(token)


def attention_forward(module, query, key, value, attention_mask, scaling=None, dropout=0.0,
                      sliding_window=None, **kwargs):
    s = session()
    window = int(sliding_window or getattr(module, "sliding_window", None) or 0)
    out = torch.ops.perfcast.attention(query, key, value, s.past, True, window, False, 0)
    return out, None


def experts_forward(self, hidden_states, top_k_index, top_k_weights):
    out = torch.ops.perfcast.moe_experts(hidden_states, self.gate_up_proj, self.down_proj,
                                         top_k_index, int(top_k_index.shape[-1]),
                                         int(self.num_experts))
    return out


def mla_forward(self, hidden_states, position_embeddings, attention_mask=None, cache=None, **kwargs):
    """DeepSeek MLA in its serving form (see module docstring)."""
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import (
        apply_rotary_pos_emb,
        apply_rotary_pos_emb_interleave,
    )

    s = session()
    bsz, seq = hidden_states.shape[:-1]
    nope, rope, v_dim, rank = (self.qk_nope_head_dim, self.qk_rope_head_dim, self.v_head_dim,
                               self.kv_lora_rank)
    heads = self.num_heads
    if self.q_lora_rank is None:
        q = self.q_proj(hidden_states)
    else:
        q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(hidden_states)))
    q = q.view(bsz, seq, heads, nope + rope).transpose(1, 2)
    q_nope, q_rot = torch.split(q, [nope, rope], dim=-1)
    latent, k_rot = torch.split(self.kv_a_proj_with_mqa(hidden_states), [rank, rope], dim=-1)
    latent = self.kv_a_layernorm(latent).view(bsz, 1, seq, rank)
    k_rot = k_rot.view(bsz, 1, seq, rope)
    cos, sin = position_embeddings
    rotate = apply_rotary_pos_emb_interleave if self.config.rope_interleave else apply_rotary_pos_emb
    q_rot, k_rot = rotate(q_rot, k_rot, cos, sin)
    w = self.kv_b_proj.weight.view(heads, nope + v_dim, rank)
    w_uk, w_uv = torch.split(w, [nope, v_dim], dim=1)
    if s.decode:
        # Absorbed: q_latent = q_nope · W_UK per head (one batched GEMM over heads), attention
        # over the latent cache, then · W_UV per head.
        q_lat = torch.bmm(q_nope.transpose(0, 1).reshape(heads, bsz * seq, nope), w_uk)
        q_lat = q_lat.view(heads, bsz, seq, rank).transpose(0, 1)  # (B, H, S, rank)
        q_full = torch.cat((q_lat, q_rot), dim=-1)
        kv = torch.cat((latent, k_rot), dim=-1)  # (B, 1, S, rank + rope): the cache entry
        o_lat = torch.ops.perfcast.attention(q_full, kv, latent, s.past, True, 0, True, 0)  # (B,S,H,rank)
        o_lat = o_lat.permute(2, 0, 1, 3).reshape(heads, bsz * seq, rank)
        out = torch.bmm(o_lat, w_uv.transpose(1, 2))  # (H, B·S, v_dim)
        out = out.view(heads, bsz, seq, v_dim).permute(1, 2, 0, 3)  # (B, S, H, v_dim)
    else:
        # Prefill: expand the latent of the new tokens to per-head K/V (the cached prefix, if
        # any, is attended through the cache at the same per-head width).
        kv_full = self.kv_b_proj(latent.view(bsz, seq, rank)).view(bsz, seq, heads, nope + v_dim)
        k_nope, v = torch.split(kv_full.transpose(1, 2), [nope, v_dim], dim=-1)
        k = torch.cat((k_nope, k_rot.expand(bsz, heads, seq, rope)), dim=-1)
        q_full = torch.cat((q_nope, q_rot), dim=-1)
        out = torch.ops.perfcast.attention(q_full, k, v, s.past, True, 0, False, rank + rope)
    out = self.o_proj(out.reshape(bsz, seq, heads * v_dim))
    return out, None


def register() -> None:
    """Register the "perfcast" attention, mask and experts implementations (idempotent)."""
    from transformers import AttentionInterface
    from transformers.integrations.moe import ExpertsInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(IMPL, attention_forward)
    # The substituted attention derives causality and windows itself: no mask tensors.
    AttentionMaskInterface.register(IMPL, lambda *args, **kwargs: None)
    ExpertsInterface.register(IMPL, experts_forward)
