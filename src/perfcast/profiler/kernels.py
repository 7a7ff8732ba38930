"""One runnable torch kernel per IR leaf, with real random tensors at the leaf's shapes.

Why: the collector measures what the captured model needs on the local torch device; each leaf
kind gets the torch call that an eager Hugging Face forward runs for it:

- ``matmul`` (mm/addmm/bmm): ``torch.mm(a, w.t())`` with ``a`` (M, K) and ``w`` (N, K) — the
  layout ``F.linear`` uses for a weight;
- ``attention``: ``F.scaled_dot_product_attention`` with q (B, H, q_len, d) and k/v
  (B, H_kv, kv_len, d), ``enable_gqa`` when H_kv < H, ``is_causal`` when q_len == kv_len > 1;
  a chunked prefill after a cache (1 < q_len < kv_len) is run without a mask (an upper bound);
- ``grouped_matmul`` (MoE experts): balanced routing, ``ceil(tokens·top_k/experts)`` rows per
  expert. On a CUDA GPU, the form transformers runs by default (``experts_implementation=
  "grouped_mm"``, ``transformers/integrations/moe.py``, ``grouped_mm_experts_forward``): gather
  the rows in expert order, one grouped GEMM for gate_up, SiLU·up, one grouped GEMM for down,
  weighted ``index_add_``. On a CPU (and where grouped GEMMs are unavailable), the per-expert
  loop of the eager experts module: gather, gate_up linear, SiLU·up, down linear, weighted
  ``index_add_`` per expert;
- a plain aten op (``aten.add.Tensor``…): the op itself on random inputs of the leaf's input
  shapes (int inputs drawn in [0, 2) so index ops stay in range), when the result has the
  leaf's output shape;
- otherwise (fused runs, ops whose scalar arguments the leaf does not keep, such as
  ``aten.pow.Tensor_Scalar``): an *eager chain* that reads and writes the run's bytes the way
  eager torch does: every input read once (``sum``), ``members`` passes of
  ``mul`` over the largest output (one per op of the run, each into a new tensor), other
  outputs written once (``full_like``).

``rotate_bytes`` > 0 gives the weight-like operands (GEMM weights, attention K/V, expert
weights) ``ceil(rotate_bytes / their bytes)`` distinct copies (at most :data:`MAX_COPIES`), used in
turn call after call, so that repeated calls read them from memory rather than from a cache
that holds them from the call before (see :mod:`perfcast.profiler.collect`).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable

import torch
import torch.nn.functional as F

from perfcast.ir import Leaf
from perfcast.perf.features import features

MAX_COPIES = 4096
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


def copies_for(set_bytes: int, rotate_bytes: int) -> int:
    """Distinct copies of a weight set of ``set_bytes`` so that at least ``rotate_bytes`` are
    cycled through: ``ceil(rotate_bytes / set_bytes)``, at least 1, at most :data:`MAX_COPIES`."""
    if rotate_bytes <= 0 or set_bytes <= 0:
        return 1
    return max(1, min(MAX_COPIES, math.ceil(rotate_bytes / set_bytes)))


def _nbytes(*tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _cycle(make, rotate_bytes: int):
    """An iterator over copies of the tuple of tensors ``make()`` returns (see :func:`copies_for`),
    and the number of copies."""
    first = make()
    n = copies_for(_nbytes(*first), rotate_bytes)
    return itertools.cycle([first] + [make() for _ in range(n - 1)]), n


def build(leaf: Leaf, device, rotate_bytes: int = 0) -> tuple[Callable[[], object], str]:
    """A no-argument callable running the leaf's representative kernel on ``device``, and how
    it is run (``matmul``, ``attention``, ``grouped_matmul``, ``grouped_mm``, ``aten`` or
    ``eager-chain``, with the number of weight copies when there are several)."""
    with torch.no_grad():
        if leaf.kind in _BUILDERS:
            fn, how, n = _BUILDERS[leaf.kind](leaf, device, rotate_bytes)
            return fn, how + (f", {n} weight copies" if n > 1 else "")
        direct = _direct(leaf, device)
        return (direct, "aten") if direct else (_eager_chain(leaf, device), "eager-chain")


def _matmul(leaf: Leaf, device, rotate_bytes: int):
    f = features(leaf)
    dt = leaf.inputs[0].dtype
    a = random((f["M"], f["K"]), dt, device)
    ws, n = _cycle(lambda: (random((f["N"], f["K"]), dt, device),), rotate_bytes)
    return (lambda: torch.mm(a, next(ws)[0].t())), "matmul", n


def _attention(leaf: Leaf, device, rotate_bytes: int):
    f = features(leaf)
    dt = leaf.inputs[0].dtype
    q = random((f["batch"], f["heads"], f["q_len"], f["head_dim"]), dt, device)
    kvs, n = _cycle(lambda: (random((f["batch"], f["kv_heads"], f["kv_len"], f["head_dim"]), dt, device),
                             random((f["batch"], f["kv_heads"], f["kv_len"], f["v_head_dim"]), dt, device)),
                    rotate_bytes)
    causal = f["q_len"] > 1 and f["q_len"] == f["kv_len"]
    gqa = f["kv_heads"] != f["heads"]

    def run():
        k, v = next(kvs)
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)

    return run, "attention", n


def _grouped_gemm():
    """The grouped GEMM torch offers (``F.grouped_mm``, torch ≥ 2.10; ``torch._grouped_mm``
    before), or None."""
    return getattr(F, "grouped_mm", None) or getattr(torch, "_grouped_mm", None)


def _grouped(leaf: Leaf, device, rotate_bytes: int):
    f = features(leaf)
    dt = leaf.inputs[0].dtype
    t, d, inter, e, k = f["tokens"], f["hidden"], f["inter"], f["experts"], f["top_k"]
    x = random((t, d), dt, device)
    weights, n = _cycle(lambda: (random((e, 2 * inter, d), dt, device), random((e, d, inter), dt, device)),
                        rotate_bytes)
    rows = min(t, math.ceil(t * k / e))
    # Balanced routing: expert i takes ``rows`` consecutive tokens (wrapping around).
    index = [torch.arange(i * rows, (i + 1) * rows, device=device) % t for i in range(e)]
    weight = torch.rand((rows, 1), dtype=x.dtype, device=device)
    grouped = _grouped_gemm() if torch.device(device).type == "cuda" else None
    if grouped is not None:
        order = torch.cat(index)
        offsets = torch.arange(1, e + 1, device=device, dtype=torch.int32) * rows
        pair_weight = weight.repeat(e, 1)

        def run_grouped():
            gate_up, down = next(weights)
            g, u = grouped(x.index_select(0, order), gate_up.transpose(-2, -1), offs=offsets).chunk(2, dim=-1)
            y = grouped(F.silu(g) * u, down.transpose(-2, -1), offs=offsets)
            return torch.zeros_like(x).index_add_(0, order, y * pair_weight)

        try:
            run_grouped()
            return run_grouped, "grouped_mm", n
        except (RuntimeError, TypeError) as err:  # this GPU or dtype has no grouped GEMM kernel
            unavailable = f" (no grouped_mm: {str(err).splitlines()[0][:80]})"
    else:
        unavailable = ""

    def run():
        gate_up, down = next(weights)
        out = torch.zeros_like(x)
        for i in range(e):
            xe = x.index_select(0, index[i])
            g, u = F.linear(xe, gate_up[i]).chunk(2, dim=-1)
            out.index_add_(0, index[i], F.linear(F.silu(g) * u, down[i]) * weight)
        return out

    return run, "grouped_matmul" + unavailable, n


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
