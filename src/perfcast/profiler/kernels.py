"""One runnable torch kernel per IR leaf, with real random tensors at the leaf's shapes.

Why: the collector measures what the captured model needs on the local torch device; each leaf
kind gets the torch call that an eager Hugging Face forward runs for it:

- ``matmul`` (mm/addmm/bmm): ``torch.mm(a, w.t())`` with ``a`` (M, K) and ``w`` (N, K) — the
  layout ``F.linear`` uses for a weight;
- ``attention``: ``F.scaled_dot_product_attention`` with q (B, H, q_len, d) and k/v
  (B, H_kv, kv_len, d), ``enable_gqa`` when H_kv < H, ``is_causal`` when q_len == kv_len > 1;
  a chunked prefill after a cache (1 < q_len < kv_len) is run without a mask (an upper bound);
- ``grouped_matmul`` (MoE experts): balanced routing, ``ceil(tokens·top_k/experts)`` rows per
  expert; per expert: gather the rows, gate_up linear, SiLU·up, down linear, weighted index_add
  — the loop the eager experts module runs;
- a plain aten op (``aten.add.Tensor``…): the op itself on random inputs of the leaf's input
  shapes (int inputs drawn in [0, 2) so index ops stay in range), when the result has the
  leaf's output shape;
- otherwise (fused runs, ops whose scalar arguments the leaf does not keep, such as
  ``aten.pow.Tensor_Scalar``): an *eager chain* that reads and writes the run's bytes the way
  eager torch does: every input read once (``sum``), ``members`` passes of
  ``mul`` over the largest output (one per op of the run, each into a new tensor), other
  outputs written once (``full_like``).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F

from perfcast.ir import Leaf
from perfcast.perf.features import features

TORCH = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16, "fp64": torch.float64,
         "int64": torch.int64, "int32": torch.int32, "int8": torch.int8, "bool": torch.bool}


def _dtype(name: str) -> torch.dtype:
    if name not in TORCH:
        raise ValueError(f"dtype {name} cannot be run by the profiler")
    return TORCH[name]


def random(shape, dtype: str, device) -> torch.Tensor:
    shape = tuple(int(d) for d in shape)
    dt = _dtype(dtype)
    if dt.is_floating_point:
        return torch.randn(shape, dtype=dt, device=device)
    if dt == torch.bool:
        return torch.rand(shape, device=device) > 0.5
    return torch.randint(0, 2, shape, dtype=dt, device=device)


def build(leaf: Leaf, device) -> tuple[Callable[[], object], str]:
    """A no-argument callable running the leaf's representative kernel on ``device``, and how
    it is run (``matmul``, ``attention``, ``grouped_matmul``, ``aten`` or ``eager-chain``)."""
    with torch.no_grad():
        if leaf.kind in _BUILDERS:
            return _BUILDERS[leaf.kind](leaf, device), leaf.kind
        direct = _direct(leaf, device)
        return (direct, "aten") if direct else (_eager_chain(leaf, device), "eager-chain")


def _matmul(leaf: Leaf, device):
    f = features(leaf)
    dt = leaf.inputs[0].dtype
    a, w = random((f["M"], f["K"]), dt, device), random((f["N"], f["K"]), dt, device)
    return lambda: torch.mm(a, w.t())


def _attention(leaf: Leaf, device):
    f = features(leaf)
    dt = leaf.inputs[0].dtype
    q = random((f["batch"], f["heads"], f["q_len"], f["head_dim"]), dt, device)
    k = random((f["batch"], f["kv_heads"], f["kv_len"], f["head_dim"]), dt, device)
    v = random((f["batch"], f["kv_heads"], f["kv_len"], f["v_head_dim"]), dt, device)
    causal = f["q_len"] > 1 and f["q_len"] == f["kv_len"]
    gqa = f["kv_heads"] != f["heads"]
    return lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)


def _grouped(leaf: Leaf, device):
    f = features(leaf)
    dt = leaf.inputs[0].dtype
    t, d, inter, e, k = f["tokens"], f["hidden"], f["inter"], f["experts"], f["top_k"]
    x = random((t, d), dt, device)
    gate_up, down = random((e, 2 * inter, d), dt, device), random((e, d, inter), dt, device)
    rows = min(t, math.ceil(t * k / e))
    # Balanced routing: expert i takes ``rows`` consecutive tokens (wrapping around).
    index = [torch.arange(i * rows, (i + 1) * rows, device=device) % t for i in range(e)]
    weight = torch.rand((rows, 1), dtype=x.dtype, device=device)

    def run():
        out = torch.zeros_like(x)
        for i in range(e):
            xe = x.index_select(0, index[i])
            g, u = F.linear(xe, gate_up[i]).chunk(2, dim=-1)
            out.index_add_(0, index[i], F.linear(F.silu(g) * u, down[i]) * weight)
        return out

    return run


_BUILDERS = {"matmul": _matmul, "attention": _attention, "grouped_matmul": _grouped}


def _aten_op(leaf: Leaf):
    name = str(leaf.attr("op") or "").removeprefix("torch.ops.")
    parts = name.split(".")
    if len(parts) != 3 or parts[0] != "aten":
        return None
    try:
        return getattr(getattr(torch.ops.aten, parts[1]), parts[2])
    except AttributeError:
        return None


def _direct(leaf: Leaf, device):
    op = _aten_op(leaf)
    if op is None or not leaf.outputs:
        return None
    try:
        args = [random(t.shape, t.dtype, device) for t in leaf.inputs]
        with torch.no_grad():
            out = op(*args)
    except Exception:  # the leaf lacks the op's scalar arguments: not runnable as-is
        return None
    first = out[0] if isinstance(out, (tuple, list)) else out
    want = tuple(int(d) for d in leaf.outputs[0].shape)
    if not isinstance(first, torch.Tensor) or tuple(first.shape) != want:
        return None
    return lambda: op(*args)


def _eager_chain(leaf: Leaf, device):
    ins = [random(t.shape, t.dtype, device) for t in leaf.inputs]
    outs = [random(t.shape, t.dtype, device) for t in leaf.outputs] or [ins[0].clone()]
    outs = [o if o.is_floating_point() else o.float() for o in outs]
    big = max(outs, key=lambda o: o.numel())
    passes = max(1, len(leaf.attr("members") or ()))
    rest = [o for o in outs if o is not big]

    def run():
        for x in ins:
            x.sum()
        y = big
        for _ in range(passes):
            y = torch.mul(y, 1.0)  # a new output per op, as eager torch allocates
        for o in rest:
            torch.full_like(o, 1.0)

    return run
