"""The leaf-kind rule book: what work (FLOPs, bytes) one leaf of each kind does.

One table, keyed by kind; a rule is a pure function ``(inputs, outputs, attrs) -> Cost``;
registering a kind twice raises; an unknown kind is an error, never a zero cost.
Kinds are grouped into named families so that a rule is written once per family.

Counting conventions (stated once, used everywhere):
- a matrix contraction costs 2 FLOPs (multiply + add) per point of its iteration space
  (PyTorch ``torch/utils/flop_counter.py``: ``mm_flop = 2 * m * n * k``);
- an elementwise vector op costs 1 FLOP per output element (``exp`` included: one
  special-function-unit issue, as in the FlashAttention-2 paper's non-matmul FLOP count, §3.1);
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
from perfcast.ir.tensor import Tensor

Rule = Callable[[tuple[Tensor, ...], tuple[Tensor, ...], Mapping[str, object]], Cost]

MEMORY_KINDS = frozenset({"load", "store"})
MATRIX_KINDS = frozenset({"einsum"})
UNARY_KINDS = frozenset({"exp", "neg", "recip", "rsqrt", "sqrt", "log", "tanh", "cast"})
BINARY_KINDS = frozenset({"add", "sub", "mul", "div", "maximum", "minimum"})
REDUCTION_KINDS = frozenset({"sum", "max"})
FILL_KINDS = frozenset({"fill"})

_RULES: dict[str, Rule] = {}


def register(*kinds: str) -> Callable[[Rule], Rule]:
    """Register ``rule`` for each of ``kinds``; a kind registered twice raises."""

    def deco(rule: Rule) -> Rule:
        for kind in kinds:
            if kind in _RULES:
                raise ValueError(f"leaf kind {kind!r} already has a rule ({_RULES[kind].__name__})")
            _RULES[kind] = rule
        return rule

    return deco


def kinds() -> tuple[str, ...]:
    return tuple(sorted(_RULES))


def work(kind: str, inputs, outputs, attrs: Mapping[str, object]) -> Cost:
    try:
        rule = _RULES[kind]
    except KeyError:
        raise KeyError(f"no rule for leaf kind {kind!r}; known kinds: {', '.join(kinds())}") from None
    return rule(tuple(inputs), tuple(outputs), attrs)


def make_leaf(kind: str, name: str, inputs, outputs, **attrs) -> Leaf:
    """A leaf whose cost comes from the rule book."""
    cost = work(kind, inputs, outputs, attrs)
    return Leaf(name=name, kind=kind, inputs=tuple(inputs), outputs=tuple(outputs),
                cost=cost, attrs=attrs)


def _bytes(tensors) -> sympy.Expr:
    return sum((t.nbytes for t in tensors), sympy.Integer(0))


@register(*MEMORY_KINDS)
def _memory(inputs, outputs, attrs) -> Cost:
    moved = outputs[0] if outputs else inputs[0]
    return Cost({BYTES_HBM: moved.nbytes})


def einsum_sizes(equation: str, inputs) -> dict[str, sympy.Expr]:
    """Index letter → size, read from the operands' shapes; mismatches raise."""
    lhs = equation.replace(" ", "").split("->")[0]
    specs = lhs.split(",")
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
