"""Tensors of the IR: a name, a symbolic shape and a dtype."""

from __future__ import annotations

from dataclasses import dataclass
from math import prod

import sympy

from perfcast.ir.dtypes import itemsize


def as_expr(value) -> sympy.Expr:
    """Sympify ``value``, refusing floats: costs and shapes are exact."""
    expr = sympy.sympify(value)
    if expr.atoms(sympy.Float):
        raise TypeError(f"{value!r} contains a float; use integers, Rational or symbols")
    return expr


@dataclass(frozen=True)
class Tensor:
    """A tensor: ``shape`` holds SymPy expressions; ``sharding`` (one tuple of mesh-axis names
    per dim, empty when replicated) is optional and used by the sharding layer."""

    name: str
    shape: tuple[sympy.Expr, ...]
    dtype: str
    sharding: tuple[tuple[str, ...], ...] | None = None

    def __post_init__(self):
        object.__setattr__(self, "shape", tuple(as_expr(d) for d in self.shape))
        itemsize(self.dtype)  # validates the dtype
        if self.sharding is not None and len(self.sharding) != len(self.shape):
            raise ValueError(f"tensor {self.name}: sharding has {len(self.sharding)} entries "
                             f"for {len(self.shape)} dims")

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def numel(self) -> sympy.Expr:
        return prod(self.shape, start=sympy.Integer(1))

    @property
    def nbytes(self) -> sympy.Expr:
        return self.numel * itemsize(self.dtype)

    def renamed(self, name: str) -> "Tensor":
        return Tensor(name, self.shape, self.dtype, self.sharding)
