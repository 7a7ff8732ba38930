"""Op roles: what a captured op does in a decoder, read off its module path, op name and leaf
kind — the vocabulary the rewrite rules of an engine profile are written in.

Hugging Face decoders share their module naming (``model.layers.N.self_attn.q_proj``,
``…input_layernorm``, ``…mlp.gate``, ``…mlp.experts``, ``…mlp.shared_experts.up_proj``,
``model.rotary_emb``, ``lm_head``) across llama, qwen2/3, qwen3_moe, mistral, mixtral,
deepseek_v3 and gpt_oss, so one table of path patterns gives every op a role; the rules never
name a model. An op no pattern covers has the role ``other`` and runs as a kernel of its own.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from perfcast.capture.types import OpRecord
from perfcast.ir.rules import COLLECTIVE_KINDS

#: Leaf kinds of memory-bound glue (what fusion rules may merge).
MEMORY_KINDS = frozenset({"elementwise", "copy", "memset", "reduction", "softmax", "norm", "topk",
                          "gather", "scatter"})
#: Every role a record can have, with what it stands for (docs/design/engines.md lists them).
ROLES = {
    "embedding": "token embedding lookup",
    "rope_table": "the rotary cos/sin table, computed per step by Hugging Face",
    "norm": "a hidden-size RMSNorm/LayerNorm (input, post-attention, final)",
    "qk_norm": "per-head query/key norms (Qwen3)",
    "latent_norm": "MLA's latent norms (q_a_layernorm, kv_a_layernorm)",
    "residual_add": "the decoder layer's residual additions",
    "layer_glue": "other ops at the decoder-layer level",
    "attn_gemm": "q/k/v/o and MLA projections (weights are parameters)",
    "mla_absorb": "MLA decode's absorbed per-head projections (batched GEMMs with weights)",
    "attn_prologue": "memory-bound ops between the projections and attention (rotary, concat)",
    "attention": "the attention kernel over the KV cache",
    "indexer": "a sparse attention's indexer: scores the cached index keys and picks the top-k (DSA)",
    "sparse_attention": "attention over the indexer's selected cache entries (DSA)",
    "linear_attention": "a linear-attention recurrence over its state (the gated delta rule)",
    "short_conv": "a linear-attention layer's causal depthwise convolution",
    "attn_epilogue": "memory-bound ops after attention (layout copies)",
    "attn_glue": "activation-by-activation products inside attention",
    "router_gemm": "the MoE router's logits GEMM",
    "router": "router softmax/sigmoid, top-k, renormalisation",
    "experts": "the routed experts' grouped GEMMs",
    "mlp_gemm": "gate/up/down projections (dense MLP or shared experts)",
    "act": "the MLP activation (act_fn)",
    "gate_mul": "activation times up-projection",
    "moe_add": "shared-expert plus routed-expert outputs",
    "mlp_glue": "other memory-bound ops in the MLP block",
    "collective": "a collective the parallel plan inserted",
    "lm_head": "the logits GEMM",
    "other": "an op no role pattern covers",
}

#: leaf kinds of the mixers beyond dense attention, and their roles
_MIXER_ROLES = {"sparse_indexer": "indexer", "sparse_attention": "sparse_attention",
                "gated_delta_rule": "linear_attention", "causal_conv1d": "short_conv"}
_LAYER = re.compile(r"^model\.layers\.\d+$")
_ATTN = re.compile(r"^model\.layers\.\d+\.self_attn(\.|$)")
_MLP = re.compile(r"^model\.layers\.\d+\.(mlp|block_sparse_moe|feed_forward)(\.|$)")
_MLP_BLOCK = re.compile(r"^model\.layers\.\d+\.(mlp|block_sparse_moe|feed_forward)(\.shared_experts?)?$")


def packet(op: str) -> str:
    parts = op.split(".")
    return parts[1] if len(parts) >= 2 else op


def _norm_role(module: str) -> str | None:
    last = module.rsplit(".", 1)[-1]
    if "norm" not in last:
        return None
    if last in ("q_norm", "k_norm"):
        return "qk_norm"
    if last in ("q_a_layernorm", "kv_a_layernorm"):
        return "latent_norm"
    return "norm"


def _has_weight(rec: OpRecord) -> bool:
    return any(t.is_param for t in rec.inputs)


def assign(records: list[OpRecord], kind_of: Callable[[OpRecord], str | None]) -> list[str | None]:
    """The role of each record (None for a record with no leaf: a view, or an op with no rule).
    Memory-bound ops of an attention module are its prologue before the attention op and its
    epilogue after it."""
    out: list[str | None] = []
    attended: set[str] = set()  # attention modules whose attention op has been seen
    for rec in records:
        kind, m, p = kind_of(rec), rec.module or "", packet(rec.op)
        if kind is None:
            out.append(None)
        elif kind in COLLECTIVE_KINDS:
            out.append("collective")
        elif m == "lm_head":
            out.append("lm_head")
        elif m.endswith("embed_tokens"):
            out.append("embedding")
        elif m.endswith("rotary_emb"):
            out.append("rope_table")
        elif (norm := _norm_role(m)) is not None:
            out.append(norm)
        elif _LAYER.match(m):
            out.append("residual_add" if p in ("add", "add_") else "layer_glue")
        elif _ATTN.match(m):
            block = m.split(".self_attn")[0] + ".self_attn"
            if kind == "attention" or kind in _MIXER_ROLES:
                attended.add(block)
                out.append(_MIXER_ROLES.get(kind, "attention"))
            elif kind == "matmul":
                out.append(("mla_absorb" if p == "bmm" else "attn_gemm") if _has_weight(rec) else "attn_glue")
            else:
                out.append("attn_epilogue" if block in attended else "attn_prologue")
        elif _MLP.match(m):
            out.append(_mlp_role(rec, kind, m, p))
        else:
            out.append("other")
    return out


def _mlp_role(rec: OpRecord, kind: str, m: str, p: str) -> str:
    last = m.rsplit(".", 1)[-1]
    if last in ("gate", "router"):
        return "router_gemm" if kind == "matmul" else "router"
    if kind == "grouped_matmul":
        return "experts"
    if kind == "matmul":
        return "mlp_gemm" if _has_weight(rec) else "mlp_glue"
    if last == "act_fn":
        return "act"
    if _MLP_BLOCK.match(m):
        if p in ("mul", "mul_"):
            return "gate_mul"
        if p in ("add", "add_"):
            return "moe_add"
    return "mlp_glue"
