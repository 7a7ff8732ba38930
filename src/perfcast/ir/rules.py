"""The leaf-kind rule book: what work (FLOPs, bytes) one leaf of each kind does.

One table, keyed by kind; a rule is a pure function ``(inputs, outputs, attrs) -> Cost``;
registering a kind twice raises; an unknown kind is an error, never a zero cost.
Kinds are grouped into named families so that a rule is written once per family.

Counting conventions (stated once, used everywhere):
- a matrix contraction costs 2 FLOPs (multiply + add) per point of its iteration space
  (PyTorch ``torch/utils/flop_counter.py``: ``mm_flop = 2 * m * n * k``);
- an elementwise vector op costs 1 FLOP per output element (``exp``, ``sigmoid`` and ``silu``
  included: one special-function-unit issue, as in the FlashAttention-2 paper's non-matmul FLOP
  count, §3.1);
- a reduction over ``n`` elements costs ``n`` vector FLOPs (one combine per input element);
- a tile load/store moves its tile's bytes across HBM; on-chip ops read their inputs and
  write their outputs in on-chip memory (``bytes.onchip``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from math import prod

import sympy

from perfcast.ir.cost import BYTES_HBM, BYTES_ONCHIP, FLOPS_MATRIX, FLOPS_VECTOR, Cost
from perfcast.ir.op import Leaf
from perfcast.ir.registry import Registry
from perfcast.ir.routing import active_experts
from perfcast.ir.dtypes import itemsize
from perfcast.ir.tensor import Tensor

Rule = Callable[[tuple[Tensor, ...], tuple[Tensor, ...], Mapping[str, object]], Cost]

MEMORY_KINDS = frozenset({"load", "store"})
MATRIX_KINDS = frozenset({"einsum"})
UNARY_KINDS = frozenset({"exp", "neg", "recip", "rsqrt", "sqrt", "log", "tanh", "cast", "sigmoid",
                         "silu"})
BINARY_KINDS = frozenset({"add", "sub", "mul", "div", "maximum", "minimum"})
REDUCTION_KINDS = frozenset({"sum", "max"})
FILL_KINDS = frozenset({"fill"})

RULES: Registry[Rule] = Registry("rule for leaf kind")
register = RULES.register


def kinds() -> tuple[str, ...]:
    return RULES.keys()


def work(kind: str, inputs, outputs, attrs: Mapping[str, object]) -> Cost:
    return RULES[kind](tuple(inputs), tuple(outputs), attrs)


def make_leaf(kind: str, name: str, inputs, outputs, **attrs) -> Leaf:
    """A leaf whose cost comes from the rule book."""
    if kind in COLLECTIVE_KINDS:
        attrs.setdefault("collective", kind)
    cost = work(kind, inputs, outputs, attrs)
    return Leaf(name=name, kind=kind, inputs=tuple(inputs), outputs=tuple(outputs),
                cost=cost, attrs=attrs)


def _bytes(tensors) -> sympy.Expr:
    return sum((t.nbytes for t in tensors), sympy.Integer(0))


@register(*MEMORY_KINDS)
def _memory(inputs, outputs, attrs) -> Cost:
    moved = outputs[0] if outputs else inputs[0]
    return Cost({BYTES_HBM: moved.nbytes})


def einsum_specs(equation: str) -> tuple[tuple[str, ...], str | None]:
    """The one parser of einsum equations: the operands' index strings and the output's (None
    when the equation has no ``->``), spaces removed."""
    parts = equation.replace(" ", "").split("->")
    if len(parts) > 2:
        raise ValueError(f"einsum {equation!r} has more than one '->'")
    return tuple(parts[0].split(",")), (parts[1] if len(parts) == 2 else None)


def einsum_sizes(equation: str, inputs) -> dict[str, sympy.Expr]:
    """Index letter → size, read from the operands' shapes; mismatches raise."""
    specs, _ = einsum_specs(equation)
    if len(specs) != len(inputs):
        raise ValueError(f"einsum {equation!r} names {len(specs)} operands, got {len(inputs)}")
    sizes: dict[str, sympy.Expr] = {}
    for spec, t in zip(specs, inputs):
        if len(spec) != t.rank:
            raise ValueError(f"einsum {equation!r}: operand {t.name} has rank {t.rank}, "
                             f"spec {spec!r} has {len(spec)} letters")
        for letter, size in zip(spec, t.shape):
            if letter in sizes and sympy.expand(sizes[letter] - size) != 0:
                raise ValueError(f"einsum {equation!r}: index {letter} is {sizes[letter]} "
                                 f"in one operand and {size} in {t.name}")
            sizes.setdefault(letter, size)
    return sizes


@register(*MATRIX_KINDS)
def _einsum(inputs, outputs, attrs) -> Cost:
    sizes = einsum_sizes(str(attrs["equation"]), inputs)
    points = prod(sizes.values(), start=sympy.Integer(1))
    return Cost({FLOPS_MATRIX: 2 * points, BYTES_ONCHIP: _bytes(inputs) + _bytes(outputs)})


@register(*(UNARY_KINDS | BINARY_KINDS))
def _elementwise(inputs, outputs, attrs) -> Cost:
    return Cost({FLOPS_VECTOR: outputs[0].numel, BYTES_ONCHIP: _bytes(inputs) + _bytes(outputs)})


@register(*REDUCTION_KINDS)
def _reduction(inputs, outputs, attrs) -> Cost:
    return Cost({FLOPS_VECTOR: inputs[0].numel, BYTES_ONCHIP: _bytes(inputs) + _bytes(outputs)})


@register(*FILL_KINDS)
def _fill(inputs, outputs, attrs) -> Cost:
    return Cost({BYTES_ONCHIP: _bytes(outputs)})


# Kernel-level kinds (one leaf = one kernel launch), used by model capture. Their tensors live
# in HBM: each kernel reads its inputs from and writes its outputs to HBM (no fusion assumed).
KERNEL_MATMUL = frozenset({"matmul"})
KERNEL_ELEMENTWISE = frozenset({"elementwise", "copy", "memset"})
KERNEL_REDUCTION = frozenset({"reduction", "softmax", "norm", "topk"})
KERNEL_INDEXING = frozenset({"gather", "scatter"})


@register("matmul")
def _matmul(inputs, outputs, attrs) -> Cost:
    """``out[..., m, n] = Σ_k a[..., m, k] · b[..., k, n]`` (+ bias): 2·numel(out)·k FLOPs."""
    k = inputs[0].shape[-1]
    return Cost({FLOPS_MATRIX: 2 * outputs[0].numel * k, BYTES_HBM: _bytes(inputs) + _bytes(outputs)})


@register("elementwise")
def _kernel_elementwise(inputs, outputs, attrs) -> Cost:
    per = attrs.get("flops_per_element", 1)
    return Cost({FLOPS_VECTOR: per * outputs[0].numel, BYTES_HBM: _bytes(inputs) + _bytes(outputs)})


@register("copy")
def _copy(inputs, outputs, attrs) -> Cost:
    """cat, clone, casts, copies: data movement only."""
    return Cost({BYTES_HBM: _bytes(inputs) + _bytes(outputs)})


@register("memset")
def _memset(inputs, outputs, attrs) -> Cost:
    return Cost({BYTES_HBM: _bytes(outputs)})


@register("reduction")
def _kernel_reduction(inputs, outputs, attrs) -> Cost:
    return Cost({FLOPS_VECTOR: inputs[0].numel, BYTES_HBM: _bytes(inputs) + _bytes(outputs)})


@register("softmax")
def _softmax(inputs, outputs, attrs) -> Cost:
    """max, subtract, exp, sum, divide: 5 FLOPs per element (the same five passes as the DSL's
    online-softmax kernel counts per score)."""
    return Cost({FLOPS_VECTOR: 5 * inputs[0].numel, BYTES_HBM: _bytes(inputs) + _bytes(outputs)})


@register("norm")
def _norm(inputs, outputs, attrs) -> Cost:
    """LayerNorm/RMSNorm: statistics, normalise, scale (and shift): 5 FLOPs per element."""
    return Cost({FLOPS_VECTOR: 5 * inputs[0].numel, BYTES_HBM: _bytes(inputs) + _bytes(outputs)})


@register("topk")
def _topk(inputs, outputs, attrs) -> Cost:
    """Selection of k of n per row: n·⌈log2 k⌉ comparisons (heap select); sort is k = n.
    ``k`` may be a symbol (the DSL keeps it symbolic)."""
    k = sympy.sympify(attrs.get("k", 2))
    passes = (max(1, (int(k) - 1).bit_length()) if k.is_Integer
              else sympy.Max(1, sympy.ceiling(sympy.log(k, 2))))
    return Cost({FLOPS_VECTOR: inputs[0].numel * passes,
                 BYTES_HBM: _bytes(inputs) + _bytes(outputs)})


@register("gather")
def _gather(inputs, outputs, attrs) -> Cost:
    """embedding, index, gather: reads the selected rows (as many bytes as the output), the
    indices, and writes the output — not the whole source table."""
    indices = sum((t.nbytes for t in inputs[1:]), sympy.Integer(0))
    return Cost({BYTES_HBM: 2 * _bytes(outputs) + indices})


@register("scatter")
def _scatter(inputs, outputs, attrs) -> Cost:
    """scatter/index_put/index_add: reads updates and indices, read-modify-writes the targets."""
    updates = sum((t.nbytes for t in inputs[1:]), sympy.Integer(0))
    flops = inputs[-1].numel if attrs.get("accumulate") else sympy.Integer(0)
    return Cost({FLOPS_VECTOR: flops, BYTES_HBM: 3 * updates})


def attended_pairs(s, past, causal: bool, window) -> sympy.Expr:
    """(query, key) pairs per sequence and head when ``s`` new tokens attend a cache holding
    ``past`` earlier tokens. Causal: query i (1-based) sees past + i keys; a sliding window
    ``window`` caps that at ``window``."""
    if not causal:
        keys = past + s if not window else sympy.Min(past + s, window)
        return s * keys
    full = s * past + s * (s + 1) / 2
    if not window:
        return full
    # Σ_i min(past + i, W): all capped once past ≥ W; none capped while past + s ≤ W.
    capped_from = sympy.Max(0, window - past)  # queries i ≤ capped_from are uncapped
    partial = capped_from * past + capped_from * (capped_from + 1) / 2 + (s - capped_from) * window
    return sympy.Piecewise((full, past + s <= window), (s * window, past >= window), (partial, True))


@register("attention")
def _attention(inputs, outputs, attrs) -> Cost:
    """Fused attention over a KV cache (FlashAttention-2 style: scores never reach HBM).
    FLOPs: 2·B·H·P·(d_qk + d_v) matrix, 5·B·H·P vector (scale, max, subtract-exp, sum,
    rescale per score, as the DSL online-softmax kernel counts), P = attended pairs.
    HBM: q and the output once; each attended key/value once per sequence and KV head; the new
    tokens' cache entries written once (the cache update is part of the step) — unless
    ``cache_write`` is false: an engine that writes them in a kernel of its own charges them there.
    Logit soft-capping (``softcap``: Gemma 2, cap·tanh(score/cap)) adds 3 vector FLOPs per pair;
    chunked local attention (``chunk``: Llama 4) counts the pairs within each query's chunk."""
    q, k, v = inputs[:3]
    b, h, s, d_qk = q.shape
    d_v = v.shape[-1]
    keys = attended_keys(s, attrs["past"], attrs.get("window", 0))
    if attrs.get("chunk"):
        pairs = chunked_pairs(s, attrs["past"], attrs["chunk"])
    else:
        pairs = attended_pairs(s, attrs["past"], bool(attrs.get("causal", True)), attrs.get("window", 0))
    read = b * k.shape[1] * keys * (d_qk if attrs.get("shared_kv") else d_qk + d_v) * itemsize(k.dtype)
    return Cost({
        FLOPS_MATRIX: 2 * b * h * pairs * (d_qk + d_v),
        FLOPS_VECTOR: (8 if attrs.get("softcap") else 5) * b * h * pairs,
        BYTES_HBM: q.nbytes + _bytes(outputs) + read
        + (b * s * cache_entry_bytes(inputs, attrs) if attrs.get("cache_write", True) else 0),
    })


def chunked_pairs(s, past, chunk) -> sympy.Expr:
    """Pairs per sequence and head of chunked local attention: the token at 1-based position j
    of the sequence sees the ((j − 1) mod c) + 1 tokens of its own c-token chunk, so
    F(N) = ⌊N/c⌋·c(c+1)/2 + r(r+1)/2 (r = N mod c) pairs cover N tokens; ``past`` is the
    tokens of the current chunk already cached."""
    def f(n):
        r = n - chunk * sympy.floor(n / chunk)
        return sympy.floor(n / chunk) * chunk * (chunk + 1) / 2 + r * (r + 1) / 2
    return f(past + s) - f(past)


def attended_keys(s, past, window) -> sympy.Expr:
    """Distinct cached tokens a sequence's queries read: all of them, or the last ``window``."""
    return past + s if not window else sympy.Min(past + s, window)


def cache_entry_bytes(inputs, attrs) -> sympy.Expr:
    """Bytes one token occupies in one layer's KV cache for one sequence."""
    q, k, v = inputs[:3]
    width = attrs.get("cache_width") or k.shape[1] * (
        k.shape[-1] if attrs.get("shared_kv") else k.shape[-1] + v.shape[-1])
    return width * itemsize(k.dtype)


@register("grouped_matmul")
def _grouped_matmul(inputs, outputs, attrs) -> Cost:
    """Routed experts as one grouped GEMM. T tokens each go to k of E experts; FLOPs are
    2·T·k·(per-expert gate/up + down weights); weights of the experts that receive tokens are
    read once — as many as the leaf's ``routing`` reaches (:mod:`perfcast.ir.routing`: E·(1 −
    (1 − k/E)^T) under random routing, min(E, T·k) balanced). Activations: tokens in, tokens
    out, routing indices.

    Under expert parallelism (``expert_shards`` = ep) a device holds E/ep experts and computes
    the share ``token_share`` of the T·k token-expert pairs (1/ep when every device of the group
    holds the same T tokens; 1/tp under attention data parallelism, where the ep devices pool
    their own tokens); when tokens are ``dispatched`` (all-to-all) it reads and writes its
    received copies instead of the T tokens."""
    hidden, gate_up, down, index = inputs[:4]
    experts, top_k = attrs["num_experts"], attrs["top_k"]
    shards, share = attrs.get("expert_shards", 1), sympy.sympify(attrs.get("token_share", 1))
    tokens = hidden.numel / hidden.shape[-1]
    pairs = tokens * top_k * share
    per_expert = (gate_up.numel + down.numel) / experts
    # the group's tokens (T·share·ep) reach this many of the device's E/ep experts (ir/routing.py)
    active = active_experts(sympy.Rational(experts, shards), tokens * share * shards, top_k, experts,
                            attrs.get("routing"))
    weight_bytes = active * (gate_up.nbytes + down.nbytes) / experts
    acts = (2 * pairs * hidden.shape[-1] * itemsize(hidden.dtype) if attrs.get("dispatched")
            else hidden.nbytes + _bytes(outputs))
    return Cost({FLOPS_MATRIX: 2 * pairs * per_expert, BYTES_HBM: weight_bytes + acts + index.nbytes})


@register("fused")
def _fused(inputs, outputs, attrs) -> Cost:
    """A run of memory-bound ops executed as one kernel: intermediates stay on chip, so HBM
    traffic is the run's external inputs and outputs; FLOPs are the members' sum (``flops``)."""
    return Cost({FLOPS_VECTOR: attrs.get("flops", 0), BYTES_HBM: _bytes(inputs) + _bytes(outputs)})


# Collectives over a group of ``group_size`` devices along mesh axis ``axis``. The message is the
# larger of the input and output buffers (the size nccl-tests reports: the gathered output of an
# all-gather, the scattered input of a reduce-scatter); each device sends message × the bus
# factor of the algorithm — 2(n−1)/n for all-reduce, (n−1)/n for all-gather, reduce-scatter and
# all-to-all, 1 for broadcast and send/recv (NVIDIA nccl-tests, doc/PERFORMANCE.md, "Bus
# bandwidth"). Their time needs a topology (link bandwidth and latency per axis).
COLLECTIVE_KINDS = frozenset({"all_reduce", "all_gather", "reduce_scatter", "all_to_all",
                              "broadcast", "send_recv"})


def collective_message(inputs, outputs) -> sympy.Expr:
    return sympy.Max(_bytes(inputs[:1]), _bytes(outputs[:1]))


@register(*COLLECTIVE_KINDS)
def _collective(inputs, outputs, attrs) -> Cost:
    n = sympy.sympify(attrs["group_size"])
    factor = {"all_reduce": 2 * (n - 1) / n, "broadcast": sympy.Integer(1),
              "send_recv": sympy.Integer(1)}.get(str(attrs.get("collective")), (n - 1) / n)
    return Cost({f"bytes.link:{attrs['axis']}": collective_message(inputs, outputs) * factor})
from perfcast.ir import rules_mixers as _mixers  # noqa: E402,F401  (registers the mixer kinds)
