"""Which kernel class prices a capture-level leaf, and its shape in that class's terms (the keys a
measured table of the kernel has): the one place a leaf kind meets :mod:`perfcast.perf.kernel_classes`."""

from __future__ import annotations

from math import prod

import sympy

from perfcast.ir import BYTES_HBM, Leaf, itemsize
from perfcast.ir.rules import collective_message
from perfcast.perf.kernel_classes import (ALLREDUCE, CONTEXT, CUSTOM_ALLREDUCE_OPS, DEEPEP_LL_OP, GEMM, GENERATION,
                                          MLA_CONTEXT, MLA_GENERATION, MOE, MOE_A2A, MOE_DEEPEP, MOE_TRTLLM_GEN,
                                          VECTOR, VECTOR_KINDS, KernelClass, Shape)
from perfcast.perf.kernel_classes_dsa import dsa_shape
from perfcast.perf.kernel_classes_gdn import gdn_shape


#: the MoE classes an engine profile names for its own expert kernels (the leaf's ``kernel_class``); else ``moe``
ENGINE_MOE_CLASSES = {c.name: c for c in (MOE_TRTLLM_GEN, MOE_DEEPEP)}


def _gemm_variant(leaf: Leaf, act, weight) -> str:
    """The GEMM format: the one a quantized leaf states (``quant_format``), else its
    ``compute_dtype`` where set (a GEMM that casts its 16-bit operands up inside the kernel),
    weight-only int4/int8 for narrow integer weights with 16-bit activations, else the common dtype
    (the compute dtype when they differ)."""
    if leaf.attr("quant_format"):
        return str(leaf.attr("quant_format"))
    if leaf.attr("compute_dtype"):  # an unquantized GEMM that computes in its operands' 16-bit sources
        return str(leaf.attr("compute_dtype"))
    if weight.dtype in ("int4", "int8") and act.dtype in ("bf16", "fp16"):
        return f"w{itemsize(weight.dtype) * 8}a16"
    return weight.dtype if weight.dtype == act.dtype else leaf.dtype


def _operand_bytes(leaf: Leaf, act, weight) -> dict:
    """A quantized leaf's own bytes per element (its scales as its checkpoint stores them)."""
    if not leaf.attr("quant_format"):
        return {}
    return {"bytes_per_element": (itemsize(act.dtype), itemsize(weight.dtype), itemsize(leaf.outputs[0].dtype))}


def classify(leaf: Leaf) -> tuple[KernelClass, Shape] | None:
    """The kernel class of a capture-level leaf and its shape, or None when no class covers it
    (a tile of a DSL kernel, a collective priced on the topology, a memory-bound kernel)."""
    if leaf.kind == "matmul" and len(leaf.inputs) >= 2:
        out = leaf.outputs[0]
        # (x, W), or (x, bias, W) for addmm as the lowering orders them
        act, weight = leaf.inputs[0], leaf.inputs[-1]
        return GEMM, {"M": prod(out.shape[:-1], start=sympy.Integer(1)), "N": out.shape[-1],
                      "K": act.shape[-1], "dtype": _gemm_variant(leaf, act, weight),
                      **_operand_bytes(leaf, act, weight)}
    if leaf.kind == "attention":
        q, k, v = leaf.inputs[:3]
        s = sympy.sympify(q.shape[2])
        shape = {"batch": q.shape[0], "heads": q.shape[1], "kv_heads": k.shape[1], "q_len": s,
                 "kv_len": sympy.sympify(leaf.attr("past")) + s, "head_dim": q.shape[-1],
                 "v_head_dim": v.shape[-1], "window": int(leaf.attr("window") or 0),
                 "dtype": leaf.dtype, "kv_dtype": k.dtype}
        if leaf.attr("causal") is False:  # priced by the causal fit at its own (full) work
            shape["causal"] = False
        if leaf.attr("shared_kv"):
            return MLA_GENERATION, shape
        if leaf.attr("cache_width"):
            return MLA_CONTEXT, shape
        return (GENERATION if s == 1 else CONTEXT), shape
    if leaf.kind == "grouped_matmul":
        hidden, gate_up = leaf.inputs[:2]
        e, d = int(leaf.attr("num_experts")), hidden.shape[-1]
        ep = int(leaf.attr("expert_shards") or 1)
        tokens = hidden.numel / d * sympy.sympify(leaf.attr("token_share") or 1) * ep
        cls = ENGINE_MOE_CLASSES.get(str(leaf.attr("kernel_class")), MOE)
        return cls, {"tokens": tokens, "hidden": d, "inter": gate_up.numel / e / d / 2, "experts": e,
                     "top_k": int(leaf.attr("top_k")), "moe_tp": int(leaf.attr("expert_tp") or 1),
                     "moe_ep": ep, "dtype": _gemm_variant(leaf, hidden, gate_up), "routing": leaf.attr("routing"),
                     **_operand_bytes(leaf, hidden, gate_up)}
    if leaf.kind == "gated_delta_rule":
        return gdn_shape(leaf)
    if leaf.kind == "sparse_attention":
        return dsa_shape(leaf)
    if leaf.kind in VECTOR_KINDS:
        return VECTOR, {"bytes": leaf.cost.get(BYTES_HBM)}
    if leaf.kind == "all_to_all" and str(leaf.attr("op")) == DEEPEP_LL_OP:
        width = leaf.inputs[0].shape[-1]
        top_k = int(leaf.attr("top_k"))
        return MOE_A2A, {"devices": sympy.sympify(leaf.attr("group_size")), "dtype": str(leaf.attr("wire_dtype")),
                         "tokens": leaf.inputs[0].numel / width / top_k, "top_k": top_k, "hidden": width}
    if leaf.kind == "all_reduce" and str(leaf.attr("op")) in CUSTOM_ALLREDUCE_OPS:
        return ALLREDUCE, {"devices": sympy.sympify(leaf.attr("group_size")), "dtype": leaf.inputs[0].dtype,
                           "bytes": collective_message(leaf.inputs, leaf.outputs)}
    return None
