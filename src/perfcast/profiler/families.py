"""Kernel families: one coarse class per kernel, the same for a measured kernel and for the leaf
perfcast priced, so that their totals can be compared family by family.

A predicted leaf's family follows from its leaf kind. A measured kernel's comes from the aten op
that launched it, looked up in the lowering's own op → leaf-kind table (the table that made the
leaf, so the two sides cannot drift apart), then from op-name patterns for the kernels behind
composite ops (``aten::_efficient_attention_forward`` under ``scaled_dot_product_attention``),
and last — for a kernel linked to no op, e.g. inside a CUDA-graph replay — from the kernel's own
name (cuBLAS/CUTLASS GEMMs, flash/memory-efficient attention, PyTorch's elementwise and
reduction kernels).
"""

from __future__ import annotations

import re

from perfcast.capture.lower import _TABLE as OP_KINDS
from perfcast.capture.lower import op_packet as ir_packet

GEMM, ATTENTION, ELEMENTWISE, OTHER = "GEMM", "attention", "norm/elementwise", "other"
FAMILIES = (GEMM, ATTENTION, ELEMENTWISE, OTHER)

#: leaf kind → family (kinds not listed: other — gathers, scatters, top-k, collectives).
LEAF_FAMILY = {
    "matmul": GEMM, "grouped_matmul": GEMM, "attention": ATTENTION,
    **{k: ELEMENTWISE for k in ("elementwise", "fused", "norm", "softmax", "reduction", "copy", "memset")},
}

#: op-name patterns for ops the lowering never sees (they sit below a composite op), in order.
_OP_PATTERNS = (
    (ATTENTION, re.compile(r"attention|flash|scaled_dot_product|sdpa")),
    (GEMM, re.compile(r"^_?(grouped_mm|scaled_grouped_mm|linear|matmul|addmv|mv|dot|scaled_mm|int_mm)$")),
)

#: kernel-name patterns, in order (attention first: flash kernels are CUTLASS templates too).
_KERNEL_PATTERNS = (
    (ATTENTION, re.compile(r"flash|fmha|attention|attn|sdpa|mem_eff", re.I)),
    (GEMM, re.compile(r"gemm|nvjet|cutlass|xmma|wgmma|cublas|splitk|s16816|s1688|grouped_mm", re.I)),
    (ELEMENTWISE, re.compile(r"elementwise|vectorized|unrolled|reduce|norm|copy|cat|fill|softmax|memset|memcpy"
                             r"|triton_(poi|red|per)", re.I)),
)


def leaf_family(kind: str) -> str:
    return LEAF_FAMILY.get(kind, OTHER)


def packet(op: str) -> str:
    """``aten::mm`` (profiler) and ``aten.mm.default`` (capture) → ``mm``."""
    return op.split("::", 1)[1] if "::" in op else ir_packet(op)


def op_family(op: str | None) -> str | None:
    """The family of the kernels an aten op launches, or None when the op says nothing."""
    if not op:
        return None
    name = packet(op)
    kind = OP_KINDS.get(name) or OP_KINDS.get(name.rstrip("_"))
    if kind is not None:
        return leaf_family(kind)
    for family, pattern in _OP_PATTERNS:
        if pattern.search(name):
            return family
    return None


def kernel_family(name: str) -> str:
    for family, pattern in _KERNEL_PATTERNS:
        if pattern.search(name):
            return family
    return OTHER


def measured_family(op: str | None, kernel: str) -> str:
    """A measured kernel's family: by its launching op when known, else by its name."""
    return op_family(op) or kernel_family(kernel)
