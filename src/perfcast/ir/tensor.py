"""Tensors of the IR: a name, a symbolic shape, a dtype and, optionally, a sharding."""

from __future__ import annotations

from collections.abc import Mapping
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
    per dim, empty when replicated; None for an unsharded trace) says which mesh axes split
    each dim, major axis first.

    ``shape`` is the extent of the buffer the tensor stands for. The DSL hands out *global*
    tensors (the logical shape plus its sharding); the tensors inside a leaf are the per-device
    buffers (:meth:`local`), so every rule of the rule book sees local shapes and counts
    per-device work. A local tensor keeps its sharding as a record of where it came from.
    """

    name: str
    shape: tuple[sympy.Expr, ...]
    dtype: str
    sharding: tuple[tuple[str, ...], ...] | None = None

    def __post_init__(self):
        object.__setattr__(self, "shape", tuple(as_expr(d) for d in self.shape))
        itemsize(self.dtype)  # validates the dtype
        if self.sharding is not None:
            object.__setattr__(self, "sharding", tuple(tuple(axes) for axes in self.sharding))
            if len(self.sharding) != len(self.shape):
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

    def local_shape(self, sizes: Mapping[str, object]) -> tuple[sympy.Expr, ...]:
        """Per-device extents of this global tensor: a dim sharded over mesh axes whose sizes
        (``sizes``: axis name → size) multiply to ``n`` has extent ``dim/n``."""
        if not self.sharding:
            return self.shape
        out = []
        for d, axes in zip(self.shape, self.sharding):
            try:
                n = prod((as_expr(sizes[a]) for a in axes), start=sympy.Integer(1))
            except KeyError as e:
                raise ValueError(f"tensor {self.name}: unknown mesh axis {e.args[0]!r}") from None
            out.append(d / n)
        return tuple(out)

    def local(self, sizes: Mapping[str, object]) -> "Tensor":
        """The per-device buffer of this global tensor (same name, dtype and sharding)."""
        if not self.sharding:
            return self
        return Tensor(self.name, self.local_shape(sizes), self.dtype, self.sharding)
