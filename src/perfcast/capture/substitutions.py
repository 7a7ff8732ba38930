"""Serving forms of the sequence mixers and experts that transformers' interfaces do not reach.

An architecture row (``src/perfcast/models/architectures.yaml``) names each of its attention /
mixer / expert module classes and the kind that captures it; one handler per kind, in one
table. ``attention`` and ``experts`` modules already call the "perfcast" attention and experts
implementations (:mod:`perfcast.capture.serving`), so their handlers change nothing; the
others replace the module's forward, for the capture only, by the computation a serving engine
runs:

- ``mla`` (DeepSeek-V2/V3, Kimi-K2): prefill expands the latent KV (``kv_b_proj``) and attends
  per head; decode absorbs ``W_UK``/``W_UV`` into the query/output and attends over the latent
  cache (one KV head of width ``kv_lora_rank + qk_rope_head_dim``): DeepSeek-V2 (arXiv:2405.04434)
  §2.1.2, vLLM/SGLang's MLA decode.
- ``dsa`` (GLM-5, DeepSeek-V3.2 sparse attention): MLA in its absorbed (MQA) form in both phases,
  as DeepSeek-V3.2's report (§2.1, "we implement DSA based on the MQA mode of MLA") and vLLM's
  FlashMLA sparse kernels run it; the lightning indexer scores the cached index keys and picks
  ``index_topk`` of them (``perfcast.sparse_indexer``), the attention reads only those
  (``perfcast.sparse_attention``). The transformers forward builds a dense O(S·T) mask instead.
- ``gated_delta_net`` (Qwen3.5, Qwen3-Next): the projections and gated RMSNorm as transformers
  runs them; the short causal convolution and the gated delta rule as one kernel each
  (``perfcast.causal_conv1d``, ``perfcast.gated_delta_rule``: FLA's chunked prefill and
  recurrent decode kernels), never the torch reference loop over chunks.

- ``falcon`` (Falcon): the fused ``query_key_value`` split into queries and the model's KV heads
  (1 for multi-query, ``num_kv_heads`` groups for the new decoder architecture, every head
  otherwise), RoPE unless the config uses ALiBi, then one ``perfcast.attention`` over a cache of
  those KV heads. transformers broadcasts the grouped K/V to every query head and calls SDPA
  with a dense mask; serving engines cache the KV heads only (vLLM falcon.py: FalconAttention,
  ``num_kv_heads``). ALiBi's bias is applied in the kernel's scale-and-mask step
  (FlashAttention's ``alibi_slopes``), which the attention rule's per-score vector FLOPs count.

- ``llama4_moe`` (Llama 4): transformers runs every token through every expert, scaled by a
  dense score matrix (``Llama4TextMoe.forward``); vLLM's Llama4MoE runs FusedMoE with a custom
  routing function — the top-k router logits, their sigmoid applied to the expert input
  (``apply_router_weight_on_input``) — plus the shared expert: one ``perfcast.moe_experts`` of
  ``num_experts_per_tok`` experts per token, and the shared MLP as transformers runs it.

A module of a mixer-like class (its name ends in Attention, DeltaNet, Mixer, Experts …) that the
row does not list is refused by name: its cost would otherwise be the torch fallback's.
"""

from __future__ import annotations

import inspect
import re
import sys
import types
from collections.abc import Callable

import torch

from perfcast.capture.record import dtype_name
from perfcast.capture.serving import session
from perfcast.ir import UserError
from perfcast.ir.registry import Registry
from perfcast.models.architecture import KINDS, Architecture

HANDLERS: Registry[Callable] = Registry("capture kind")
#: class names that make a sequence mixer or an expert block (checked against the row's parts)
_PART = re.compile(r"(Attention|Attn|DeltaNet|Mamba\w*|Mixer|Experts|SSM|Retention)$")


def apply(model: torch.nn.Module, arch: Architecture) -> None:
    """Install the serving forms of ``arch``'s parts in the built ``model``; refuse a module of
    a mixer-like class the row does not list. A part whose forward is replaced owns its
    submodules (Llama 4's experts run inside its MoE block's serving form)."""
    owned: list[str] = []
    for name, mod in model.named_modules():
        cls = type(mod).__name__
        kind = arch.parts.get(cls)
        if any(name.startswith(p + ".") for p in owned):
            continue
        if kind is not None:
            HANDLERS[kind](mod, model.config)
            if kind not in ("attention", "experts"):
                owned.append(name)
        elif _PART.search(cls):
            raise UserError(f"model_type {arch.model_type!r}: its module {cls} is not one perfcast knows "
                            f"(known kinds: {', '.join(KINDS)}; add it to src/perfcast/models/architectures.yaml)")


def resize_heads(model: torch.nn.Module, arch: Architecture, head_dim: int) -> None:
    """One tensor-parallel rank of an attention that sizes its heads as hidden / heads (GPT-J,
    Falcon): the config holds the rank's heads, so transformers built every head ``r`` times too
    wide (``r`` = the rank's hidden / heads over ``head_dim``, the whole model's head size). The
    row's ``head_projections`` are rebuilt (on the meta device) ``r`` times narrower on their
    ``in`` or ``out`` side — heads × head size, or Falcon's fused (heads + 2 · KV heads) × head
    size — as Megatron's column/row-parallel split leaves them on each rank; a model-level rotary
    table (Falcon's) is rebuilt at the head size."""
    for mod in model.modules():
        if arch.parts.get(type(mod).__name__) not in ("attention", "falcon"):
            continue
        ratio = int(mod.head_dim) // head_dim
        mod.head_dim = head_dim
        for name, side in arch.head_projections.items():
            lin = getattr(mod, name)
            shape = (lin.in_features // ratio, lin.out_features) if side == "in" else \
                (lin.in_features, lin.out_features // ratio)
            setattr(mod, name, torch.nn.Linear(*shape, bias=lin.bias is not None, device="meta",
                                               dtype=lin.weight.dtype))
    for mod in model.modules():
        freq = getattr(mod, "inv_freq", None)
        if type(mod).__name__.endswith("RotaryEmbedding") and freq is not None and freq.numel() > head_dim // 2:
            for buf in ("inv_freq", "original_inv_freq"):  # one frequency per rotated pair
                if getattr(mod, buf, None) is not None:
                    setattr(mod, buf, torch.empty(head_dim // 2, dtype=freq.dtype, device=freq.device))


def _forward(fn):
    def install(mod, config):
        mod.forward = types.MethodType(fn, mod)
        mod.perfcast_config = config  # the model's config (not every module keeps one)
    return install


HANDLERS.register("attention")(lambda mod, config: None)  # calls ALL_ATTENTION_FUNCTIONS["perfcast"]
HANDLERS.register("experts")(lambda mod, config: None)  # under @use_experts_implementation


def _rope(mod):
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import (
        apply_rotary_pos_emb,
        apply_rotary_pos_emb_interleave,
    )

    return apply_rotary_pos_emb_interleave if getattr(mod.config, "rope_interleave", True) else apply_rotary_pos_emb


def _latent(self, hidden_states, position_embeddings):
    """MLA's projections: per-head queries (nope, rope), the normed latent and the rotated rope
    key of the new tokens, and ``q_a_layernorm``'s output (the DSA indexer reads it)."""
    bsz, seq = hidden_states.shape[:-1]
    nope, rope, rank = self.qk_nope_head_dim, self.qk_rope_head_dim, self.kv_lora_rank
    if self.q_lora_rank is None:
        q_resid, q = None, self.q_proj(hidden_states)
    else:
        q_resid = self.q_a_layernorm(self.q_a_proj(hidden_states))
        q = self.q_b_proj(q_resid)
    q = q.view(bsz, seq, self.num_heads, nope + rope).transpose(1, 2)
    q_nope, q_rot = torch.split(q, [nope, rope], dim=-1)
    latent, k_rot = torch.split(self.kv_a_proj_with_mqa(hidden_states), [rank, rope], dim=-1)
    latent = self.kv_a_layernorm(latent).view(bsz, 1, seq, rank)
    k_rot = k_rot.view(bsz, 1, seq, rope)
    cos, sin = position_embeddings
    q_rot, k_rot = _rope(self)(q_rot, k_rot, cos, sin)
    return q_nope, q_rot, latent, k_rot, q_resid


def _absorbed(self, q_nope, q_rot, latent, k_rot, attend):
    """Absorbed MLA: q_latent = q_nope · W_UK per head (one batched GEMM over heads), attention
    over the latent cache (``attend(q, kv, latent)``), then · W_UV per head; returns (B, S, H·d_v)."""
    bsz, heads, seq, nope = q_nope.shape
    v_dim, rank = self.v_head_dim, self.kv_lora_rank
    w = self.kv_b_proj.weight.view(heads, nope + v_dim, rank)
    w_uk, w_uv = torch.split(w, [nope, v_dim], dim=1)
    q_lat = torch.bmm(q_nope.transpose(0, 1).reshape(heads, bsz * seq, nope), w_uk)
    q_lat = q_lat.view(heads, bsz, seq, rank).transpose(0, 1)  # (B, H, S, rank)
    q_full = torch.cat((q_lat, q_rot), dim=-1)
    kv = torch.cat((latent, k_rot), dim=-1)  # (B, 1, S, rank + rope): the cache entry
    o_lat = attend(q_full, kv, latent)  # (B, S, H, rank)
    o_lat = o_lat.permute(2, 0, 1, 3).reshape(heads, bsz * seq, rank)
    out = torch.bmm(o_lat, w_uv.transpose(1, 2))  # (H, B·S, v_dim)
    return out.view(heads, bsz, seq, v_dim).permute(1, 2, 0, 3).reshape(bsz, seq, heads * v_dim)


def mla_forward(self, hidden_states, position_embeddings, attention_mask=None, cache=None, **kwargs):
    s = session()
    bsz, seq = hidden_states.shape[:-1]
    q_nope, q_rot, latent, k_rot, _ = _latent(self, hidden_states, position_embeddings)
    heads, nope, rope, rank, v_dim = (self.num_heads, self.qk_nope_head_dim, self.qk_rope_head_dim,
                                      self.kv_lora_rank, self.v_head_dim)
    if s.decode:
        out = _absorbed(self, q_nope, q_rot, latent, k_rot,
                        lambda q, kv, lat: torch.ops.perfcast.attention(q, kv, lat, s.past, True, 0, True, 0, 0, 0.0))
    else:
        # Prefill: expand the latent of the new tokens to per-head K/V (the cached prefix, if
        # any, is attended through the cache at the same per-head width).
        kv_full = self.kv_b_proj(latent.view(bsz, seq, rank)).view(bsz, seq, heads, nope + v_dim)
        k_nope, v = torch.split(kv_full.transpose(1, 2), [nope, v_dim], dim=-1)
        k = torch.cat((k_nope, k_rot.expand(bsz, heads, seq, rope)), dim=-1)
        q_full = torch.cat((q_nope, q_rot), dim=-1)
        out = torch.ops.perfcast.attention(q_full, k, v, s.past, True, 0, False, rank + rope, 0, 0.0)
        out = out.reshape(bsz, seq, heads * v_dim)
    return self.o_proj(out), None


#: the rotary embedding each indexer class applies to its rope slice, a function of its own module:
#: GLM-5's interleaved pairs, DeepSeek-V3.2's half-split (modeling_glm_moe_dsa.py /
#: modeling_deepseek_v32.py, ``Indexer.forward``)
_INDEXER_ROPE = {"GlmMoeDsaIndexer": "apply_rotary_pos_emb_interleave", "DeepseekV32Indexer": "apply_rotary_pos_emb"}


def _indexer(ix, hidden_states, q_resid, position_embeddings, past):
    """The lightning indexer's projections as transformers runs them (``wq_b``, ``wk`` +
    LayerNorm, rotary on the rope slice, ``weights_proj``), then one scoring + top-k kernel."""
    name = type(ix).__name__
    if name not in _INDEXER_ROPE:
        raise UserError(f"{name}: a DSA indexer perfcast does not know (known: {', '.join(sorted(_INDEXER_ROPE))})")
    rope = getattr(sys.modules[type(ix).__module__], _INDEXER_ROPE[name])
    bsz, seq, _ = hidden_states.shape
    cos, sin = position_embeddings
    q = ix.wq_b(q_resid).view(bsz, seq, ix.n_heads, ix.head_dim)
    q_rot, q_pass = torch.split(q, [ix.qk_rope_head_dim, ix.head_dim - ix.qk_rope_head_dim], dim=-1)
    k = ix.k_norm(ix.wk(hidden_states)).unsqueeze(2)
    k_rot, k_pass = torch.split(k, [ix.qk_rope_head_dim, ix.head_dim - ix.qk_rope_head_dim], dim=-1)
    q_rot, k_rot = rope(q_rot, k_rot, cos, sin, unsqueeze_dim=2)
    q = torch.cat([q_rot, q_pass], dim=-1)
    k = torch.cat([k_rot, k_pass], dim=-1).squeeze(2)
    weights = ix.weights_proj(hidden_states)
    return torch.ops.perfcast.sparse_indexer(q, k, weights, past, int(ix.index_topk))


def dsa_forward(self, hidden_states, position_embeddings, attention_mask=None, cache=None,
                position_ids=None, prev_topk_indices=None, **kwargs):
    """DeepSeek sparse attention (module docstring); a layer whose ``indexer_types`` entry is
    "shared" reuses the previous indexer layer's selection (no indexer kernel of its own). Returns
    what the class's own forward does: GLM-5's passes its selection on (its decoder layer takes
    ``prev_topk_indices``), DeepSeek-V3.2's does not."""
    s = session()
    bsz, seq = hidden_states.shape[:-1]
    q_nope, q_rot, latent, k_rot, q_resid = _latent(self, hidden_states, position_embeddings)
    topk = int(self.config.index_topk)
    if self.indexer is not None:
        indices = _indexer(self.indexer, hidden_states, q_resid, position_embeddings, s.past)
    elif prev_topk_indices is not None:
        indices = prev_topk_indices
    else:  # a shared layer captured on its own: the selection exists, computed by an earlier layer
        indices = hidden_states.new_empty((bsz, seq, topk), dtype=torch.int32)
    out = _absorbed(self, q_nope, q_rot, latent, k_rot,
                    lambda q, kv, lat: torch.ops.perfcast.sparse_attention(q, kv, lat, indices, s.past, True, 0, topk))
    if "prev_topk_indices" in inspect.signature(type(self).forward).parameters:
        return self.o_proj(out), None, indices
    return self.o_proj(out), None


def gdn_forward(self, hidden_states, cache=None, attention_mask=None, **kwargs):
    """Gated DeltaNet (module docstring): ``in_proj_qkv``/``z``/``b``/``a``, the causal conv,
    the decay g = −exp(A_log)·softplus(a + dt_bias) and β = sigmoid(b) (transformers'
    Qwen3_5MoeGatedDeltaNet.forward), the delta rule with its recurrent state, the gated norm and
    ``out_proj``."""
    import torch.nn.functional as F

    s = session()
    bsz, seq, _ = hidden_states.shape
    mixed = self.in_proj_qkv(hidden_states).transpose(1, 2)  # (B, C, S)
    z = self.in_proj_z(hidden_states).reshape(bsz, seq, -1, self.head_v_dim)
    b, a = self.in_proj_b(hidden_states), self.in_proj_a(hidden_states)
    mixed = torch.ops.perfcast.causal_conv1d(mixed, self.conv1d.weight.squeeze(1), s.past, s.decode)
    query, key, value = torch.split(mixed.transpose(1, 2), [self.key_dim, self.key_dim, self.value_dim], dim=-1)
    query = query.reshape(bsz, seq, -1, self.head_k_dim)
    key = key.reshape(bsz, seq, -1, self.head_k_dim)
    value = value.reshape(bsz, seq, -1, self.head_v_dim)
    beta = b.sigmoid()
    g = -self.A_log.float().exp() * F.softplus(a.float() + self.dt_bias)
    state = dtype_name(getattr(torch, str(getattr(self.perfcast_config, "mamba_ssm_dtype", None) or "float32").removeprefix("torch.")))
    out = torch.ops.perfcast.gated_delta_rule(query, key, value, g, beta, s.past, s.decode, state)
    out = self.norm(out.reshape(-1, self.head_v_dim), z.reshape(-1, self.head_v_dim))
    return self.out_proj(out.reshape(bsz, seq, -1))


def falcon_forward(self, hidden_states, alibi=None, attention_mask=None, position_ids=None, layer_past=None,
                   use_cache=False, output_attentions=False, position_embeddings=None, **kwargs):
    """Falcon's attention (module docstring)."""
    from transformers.models.falcon.modeling_falcon import apply_rotary_pos_emb

    s = session()
    bsz, seq, _ = hidden_states.shape
    heads, kv, hd = self.num_heads, self.num_kv_heads, self.head_dim
    fused = self.query_key_value(hidden_states)
    if self.new_decoder_architecture:  # per KV group: its queries, then one key and one value
        qkv = fused.view(bsz, seq, kv, heads // kv + 2, hd)
        q, k, v = qkv[:, :, :, :-2].reshape(bsz, seq, heads, hd), qkv[:, :, :, -2], qkv[:, :, :, -1]
    elif self.multi_query:
        qkv = fused.view(bsz, seq, heads + 2, hd)
        q, k, v = qkv[:, :, :-2], qkv[:, :, -2:-1], qkv[:, :, -1:]
    else:
        qkv = fused.view(bsz, seq, heads, 3, hd)
        q, k, v = qkv[..., 0, :], qkv[..., 1, :], qkv[..., 2, :]
    q, k, v = (x.transpose(1, 2) for x in (q, k, v))
    if not self.config.alibi:
        cos, sin = position_embeddings
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
    out = torch.ops.perfcast.attention(q, k, v, s.past, True, 0, False, 0, 0, 0.0)
    return self.dense(out.reshape(bsz, seq, heads * hd)), None


def _llama4_router(self, x):
    """Top-k router logits and their sigmoid (vllm/model_executor/models/llama4.py:
    Llama4MoE.custom_routing_function)."""
    logits = torch.nn.functional.linear(x, self.weight)
    top, index = torch.topk(logits, self.top_k, dim=1)
    return torch.sigmoid(top.float()).to(x.dtype), index


def llama4_moe_forward(self, hidden_states):
    """Llama 4's MoE block (module docstring); the router weight scales the expert input inside
    the fused kernel, as vLLM applies it."""
    x = hidden_states.reshape(-1, self.hidden_dim)
    _, index = self.router(x)
    routed = torch.ops.perfcast.moe_experts(x, self.experts.gate_up_proj, self.experts.down_proj, index,
                                            int(self.top_k), int(self.num_experts))
    return self.shared_expert(x) + routed, None


def _install_llama4_moe(mod, config):
    _forward(llama4_moe_forward)(mod, config)
    _forward(_llama4_router)(mod.router, config)


HANDLERS.register("mla")(_forward(mla_forward))
HANDLERS.register("dsa")(_forward(dsa_forward))
HANDLERS.register("gated_delta_net")(_forward(gdn_forward))
HANDLERS.register("falcon")(_forward(falcon_forward))
HANDLERS.register("llama4_moe")(_install_llama4_moe)
