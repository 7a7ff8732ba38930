"""The cost algebra: a frozen mapping from resource name to an exact SymPy expression.

Costs add (``a + b``), scale by a (symbolic) trip count (``n * c``) and substitute
(``c.subs({B: 8})``). A resource absent from a cost is used zero times; a cost never holds a
float (Rational and symbols only), so rolled-up totals are exact.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping

import sympy

from perfcast.ir.tensor import as_expr

FLOPS_MATRIX = "flops.matrix"
FLOPS_VECTOR = "flops.vector"
BYTES_HBM = "bytes.hbm"
BYTES_ONCHIP = "bytes.onchip"
LINK_PREFIX = "bytes.link:"

RESOURCES: tuple[str, ...] = (FLOPS_MATRIX, FLOPS_VECTOR, BYTES_HBM, BYTES_ONCHIP)
_LINK = re.compile(r"^bytes\.link:[A-Za-z_][A-Za-z0-9_]*$")


def check_resource(name: str) -> str:
    if name in RESOURCES or _LINK.match(name):
        return name
    raise ValueError(f"unknown resource {name!r}; expected one of {', '.join(RESOURCES)} "
                     f"or '{LINK_PREFIX}<axis>'")


def link(axis: str) -> str:
    """The resource name for bytes sent over mesh axis ``axis``."""
    return check_resource(LINK_PREFIX + axis)


class Cost(Mapping):
    """Immutable resource → expression mapping. Expressions are kept expanded (a canonical
    sum of products, so tile sizes cancel: ``T_q/q_blk · 2·q_blk·k`` is ``2·T_q·k``);
    zero entries are dropped."""

    __slots__ = ("_items", "_hash")

    def __init__(self, items: Mapping[str, object] | None = None, **kwargs):
        merged: dict[str, sympy.Expr] = {}
        for key, value in {**(items or {}), **kwargs}.items():
            expr = sympy.expand(as_expr(value))
            if expr != 0:
                merged[check_resource(key)] = expr
        self._items = dict(sorted(merged.items()))
        self._hash = None

    # Mapping protocol ---------------------------------------------------------------------
    def __getitem__(self, key: str) -> sympy.Expr:
        return self._items[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def get(self, key: str, default=sympy.Integer(0)) -> sympy.Expr:  # noqa: B008
        """A resource's expression, ``0`` when the cost does not use it."""
        return self._items.get(check_resource(key), default)

    # Algebra ------------------------------------------------------------------------------
    def __add__(self, other: "Cost") -> "Cost":
        if not isinstance(other, Cost):
            return NotImplemented
        keys = set(self) | set(other)
        return Cost({k: self.get(k) + other.get(k) for k in keys})

    def __radd__(self, other) -> "Cost":
        # ``sum(costs)`` starts from the integer 0.
        return self if isinstance(other, int) and other == 0 else self.__add__(other)

    def __mul__(self, factor) -> "Cost":
        factor = as_expr(factor)
        return Cost({k: factor * v for k, v in self._items.items()})

    __rmul__ = __mul__

    def subs(self, *args, **kwargs) -> "Cost":
        return Cost({k: v.subs(*args, **kwargs) for k, v in self._items.items()})

    @property
    def free_symbols(self) -> set[sympy.Symbol]:
        return set().union(*(v.free_symbols for v in self._items.values()))

    def __eq__(self, other) -> bool:
        if not isinstance(other, Cost):
            return NotImplemented
        keys = set(self) | set(other)
        return all(self.get(k) == other.get(k) for k in keys)

    def __hash__(self) -> int:
        if self._hash is None:
            self._hash = hash(tuple(self._items.items()))
        return self._hash

    def __repr__(self) -> str:
        inner = ", ".join(f"{k!r}: {v}" for k, v in self._items.items())
        return f"Cost({{{inner}}})"


ZERO = Cost()
