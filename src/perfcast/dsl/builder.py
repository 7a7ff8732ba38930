"""The tracing DSL: kernels and blocks are Python functions that call a :class:`Builder`.

Builder calls create leaves (through the leaf-kind rule book); decorators create structure:
``@b.block`` a named sub-graph, ``@b.reduce_loop(n, init=[acc])`` a reduction loop whose body
receives and returns the accumulators, ``@b.parallel_map(n, gather_axis=d)`` a map over
independent iterations whose result is gathered along dim ``d``. A decorated function runs once,
at decoration, inside its own scope: the trace is the program's structure, not its execution.
Every dim is a SymPy symbol, so trip counts such as ``T_q/q_blk`` stay symbolic.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence

import sympy

from perfcast.ir import Graph, Loop, Tensor, dims, make_leaf
from perfcast.ir.errors import UserError
from perfcast.ir.rules import einsum_sizes
from perfcast.ir.tensor import as_expr


class TraceError(UserError):
    """A kernel or block was written inconsistently (shape mismatch, duplicate name…)."""


def _broadcast(a: Sequence[sympy.Expr], b: Sequence[sympy.Expr], where: str) -> tuple:
    """NumPy broadcasting over symbolic shapes: trailing dims equal, or one of them 1."""
    out = []
    for i in range(1, max(len(a), len(b)) + 1):
        x = a[-i] if i <= len(a) else sympy.Integer(1)
        y = b[-i] if i <= len(b) else sympy.Integer(1)
        if x == 1:
            out.append(y)
        elif y == 1 or sympy.expand(x - y) == 0:
            out.append(x)
        else:
            raise TraceError(f"{where}: shapes {tuple(a)} and {tuple(b)} do not broadcast")
    return tuple(reversed(out))


class Builder:
    """Records leaves and structure for one trace. ``padded=True`` declares ceil tiling:
    :meth:`tiles` then rounds trip counts up instead of requiring exact division."""

    def __init__(self, name: str, *, dtype: str = "bf16", padded: bool = False):
        self.name = name
        self.dtype = dtype
        self.padded = padded
        self._scopes: list[list] = [[]]
        self._names: set[str] = set()

    # Dimensions and tensors ---------------------------------------------------------------
    @staticmethod
    def dims(names: str) -> tuple[sympy.Symbol, ...]:
        return dims(names)

    def tiles(self, extent, tile) -> sympy.Expr:
        """Trip count of a loop over ``extent`` in steps of ``tile``."""
        ratio = as_expr(extent) / as_expr(tile)
        return sympy.ceiling(ratio) if self.padded else ratio

    def hbm(self, name: str, shape, dtype: str | None = None) -> Tensor:
        """A kernel argument resident in HBM (no leaf: it exists before the kernel runs)."""
        return Tensor(self._claim(name), tuple(shape), dtype or self.dtype)

    def _claim(self, name: str) -> str:
        if name in self._names:
            raise TraceError(f"trace {self.name}: the name {name!r} is used twice")
        self._names.add(name)
        return name

    def _emit(self, kind: str, name: str, inputs, out_shape, out_dtype, **attrs) -> Tensor:
        out = Tensor(self._claim(name), tuple(out_shape), out_dtype)
        self._scopes[-1].append(make_leaf(kind, name, inputs, (out,), **attrs))
        return out

    # Memory -------------------------------------------------------------------------------
    def load_tile(self, name: str, src: Tensor, shape) -> Tensor:
        """Copy a tile of ``src`` (in HBM) into on-chip memory."""
        if len(shape) != src.rank:
            raise TraceError(f"load_tile {name}: tile rank {len(shape)} ≠ {src.name} rank {src.rank}")
        return self._emit("load", name, (src,), shape, src.dtype, source=src.name)

    def store_tile(self, name: str, value: Tensor, dst: Tensor) -> Tensor:
        """Write on-chip ``value`` into a tile of ``dst`` (in HBM)."""
        if value.rank != dst.rank:
            raise TraceError(f"store_tile {name}: {value.name} rank {value.rank} ≠ {dst.name} rank {dst.rank}")
        return self._emit("store", name, (value,), value.shape, dst.dtype, destination=dst.name)

    def fill(self, name: str, shape, dtype: str | None = None, value=0) -> Tensor:
        """A tile initialised on chip to a constant."""
        return self._emit("fill", name, (), shape, dtype or self.dtype, value=value)

    # Matrix unit --------------------------------------------------------------------------
    def einsum(self, name: str, equation: str, *operands: Tensor, dtype: str | None = None) -> Tensor:
        try:
            sizes = einsum_sizes(equation, operands)
        except ValueError as e:
            raise TraceError(f"einsum {name}: {e}") from None
        rhs = equation.replace(" ", "").split("->")
        if len(rhs) != 2:
            raise TraceError(f"einsum {name}: equation {equation!r} needs an explicit '->' output")
        shape = tuple(sizes[c] for c in rhs[1])
        return self._emit("einsum", name, operands, shape, dtype or operands[0].dtype,
                          equation=equation.replace(" ", ""))

    def matmul(self, name: str, a: Tensor, b: Tensor, dtype: str | None = None) -> Tensor:
        """``a @ b`` over the last two dims, leading dims batched."""
        batch = "abcdefgh"[: a.rank - 2]
        return self.einsum(name, f"{batch}mk,{batch}kn->{batch}mn", a, b, dtype=dtype)

    # Vector unit --------------------------------------------------------------------------
    def _binary(self, kind: str, name: str, a: Tensor, b: Tensor) -> Tensor:
        shape = _broadcast(a.shape, b.shape, f"{kind} {name}")
        return self._emit(kind, name, (a, b), shape, a.dtype)

    def tensor_add(self, name, a, b):
        return self._binary("add", name, a, b)

    def tensor_sub(self, name, a, b):
        return self._binary("sub", name, a, b)

    def tensor_mul(self, name, a, b):
        return self._binary("mul", name, a, b)

    def tensor_div(self, name, a, b):
        return self._binary("div", name, a, b)

    def tensor_max(self, name, a, b):
        """Elementwise maximum."""
        return self._binary("maximum", name, a, b)

    def exp(self, name: str, x: Tensor) -> Tensor:
        return self._emit("exp", name, (x,), x.shape, x.dtype)

    def _reduce(self, kind: str, name: str, x: Tensor, axis: int) -> Tensor:
        axis = axis % x.rank
        shape = tuple(sympy.Integer(1) if i == axis else d for i, d in enumerate(x.shape))
        return self._emit(kind, name, (x,), shape, x.dtype, axis=axis)

    def reduce_sum(self, name: str, x: Tensor, axis: int = -1) -> Tensor:
        """Sum along ``axis``, keeping it with size 1."""
        return self._reduce("sum", name, x, axis)

    def reduce_max(self, name: str, x: Tensor, axis: int = -1) -> Tensor:
        """Maximum along ``axis``, keeping it with size 1."""
        return self._reduce("max", name, x, axis)

    # Structure ----------------------------------------------------------------------------
    def _scoped(self, fn: Callable, args=()):
        self._scopes.append([])
        try:
            result = fn(*args)
        finally:
            ops = self._scopes.pop()
        return result, ops

    def block(self, fn: Callable | None = None, *, name: str | None = None):
        """Decorator: trace ``fn()`` as a named sub-graph; evaluates to ``fn``'s result."""

        def deco(f):
            result, ops = self._scoped(f)
            self._scopes[-1].append(Graph(self._claim(name or f.__name__), tuple(ops)))
            return result

        return deco(fn) if fn is not None else deco

    def reduce_loop(self, n_iter, *, init: Sequence[Tensor], name: str | None = None):
        """Decorator: a reduction loop. The body receives one tensor per accumulator in
        ``init`` and returns their updated values (same shapes); the loop evaluates to the
        final accumulators (a tuple)."""

        def deco(f):
            params = list(inspect.signature(f).parameters)
            if len(params) != len(init):
                raise TraceError(f"reduce_loop {f.__name__}: {len(init)} accumulators but "
                                 f"the body takes {len(params)} arguments")
            carried_in = [Tensor(self._claim(p), t.shape, t.dtype) for p, t in zip(params, init)]
            result, ops = self._scoped(f, carried_in)
            results = result if isinstance(result, (tuple, list)) else (result,)
            if len(results) != len(init):
                raise TraceError(f"reduce_loop {f.__name__}: the body returns {len(results)} "
                                 f"values for {len(init)} accumulators")
            for r, c in zip(results, carried_in):
                if r.shape != c.shape:
                    raise TraceError(f"reduce_loop {f.__name__}: accumulator {c.name} has shape "
                                     f"{c.shape} but the body returns {r.name} of shape {r.shape}")
            loop = Loop(self._claim(name or f.__name__), n_iter, Graph(f.__name__ + ".body", tuple(ops)),
                        kind="reduce", carried=tuple((r.name, c.name) for r, c in zip(results, carried_in)))
            self._scopes[-1].append(loop)
            return tuple(results)

        return deco

    def parallel_map(self, n_iter, *, gather_axis: int | None = None, name: str | None = None):
        """Decorator: a map over ``n_iter`` independent iterations. If the body returns a
        tensor and ``gather_axis`` is given, the map evaluates to the gathered tensor (that
        dim multiplied by ``n_iter``)."""

        def deco(f):
            result, ops = self._scoped(f)
            loop_name = self._claim(name or f.__name__)
            loop = Loop(loop_name, n_iter, Graph(f.__name__ + ".body", tuple(ops)),
                        kind="map", gather_axis=gather_axis)
            self._scopes[-1].append(loop)
            if result is None or gather_axis is None:
                return result
            shape = list(result.shape)
            shape[gather_axis] = shape[gather_axis] * loop.n_iter
            return Tensor(loop_name + ".gathered", tuple(shape), result.dtype)

        return deco

    def build(self) -> Graph:
        if len(self._scopes) != 1:
            raise TraceError(f"trace {self.name}: build() called inside an open scope")
        return Graph(self.name, tuple(self._scopes[0]), launch=True)


def trace(fn: Callable[[Builder], object], name: str | None = None, *, dtype: str = "bf16",
          padded: bool = False) -> Graph:
    """Trace ``fn(builder)`` into a kernel graph (one launch)."""
    b = Builder(name or fn.__name__, dtype=dtype, padded=padded)
    fn(b)
    return b.build()
