"""The tracing DSL: kernels and blocks are Python functions that call a :class:`Builder`.

Builder calls create leaves (through the leaf-kind rule book); decorators create structure:
``@b.block`` a named sub-graph, ``@b.reduce_loop(n, init=[acc])`` a reduction loop whose body
receives and returns the accumulators, ``@b.parallel_map(n, gather_axis=d)`` a map over
independent iterations whose result is gathered along dim ``d``. A decorated function runs once,
at decoration, inside its own scope: the trace is the program's structure, not its execution.
Every dim is a SymPy symbol, so trip counts such as ``T_q/q_blk`` stay symbolic.

A trace may declare a device mesh (``b.mesh(tp=8)``) and shard its tensors over it
(``b.hbm(name, shape, sharding=("tp", None))``). Shapes stay global; leaves carry the per-device
buffers; a sharded einsum infers the collectives it needs (:mod:`perfcast.dsl.sharding`), and
only layout changes such as an all-to-all are written by hand.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence

import sympy

from perfcast.dsl import sharding as sh
from perfcast.dsl.shapes import broadcast
from perfcast.ir import Graph, Leaf, Loop, Tensor, dims, make_leaf, walk
from perfcast.ir.errors import UserError
from perfcast.ir.rules import einsum_sizes, einsum_specs
from perfcast.ir.tensor import as_expr


class TraceError(UserError):
    """A kernel or block was written inconsistently (shape mismatch, duplicate name…)."""


class Builder:
    """Records leaves and structure for one trace. ``padded=True`` declares ceil tiling:
    :meth:`tiles` then rounds trip counts up instead of requiring exact division."""

    def __init__(self, name: str, *, dtype: str = "bf16", padded: bool = False):
        self.name = name
        self.dtype = dtype
        self.padded = padded
        self._scopes: list[list] = [[]]
        self._names: set[str] = set()
        self._mesh: sh.Mesh | None = None

    # Dimensions and tensors ---------------------------------------------------------------
    @staticmethod
    def dims(names: str) -> tuple[sympy.Symbol, ...]:
        return dims(names)

    def tiles(self, extent, tile) -> sympy.Expr:
        """Trip count of a loop over ``extent`` in steps of ``tile``."""
        ratio = as_expr(extent) / as_expr(tile)
        return sympy.ceiling(ratio) if self.padded else ratio

    def hbm(self, name: str, shape, dtype: str | None = None, *, sharding=None) -> Tensor:
        """A kernel argument resident in HBM (no leaf: it exists before the kernel runs).
        ``shape`` is global; ``sharding`` gives per dim None, a mesh axis or a tuple of axes."""
        shape = tuple(shape)
        spec = self._spec(f"hbm {name}", sharding, len(shape))
        t = Tensor(self._claim(name), shape, dtype or self.dtype, spec)
        self._local(t, f"hbm {name}")
        return t

    # Sharding -----------------------------------------------------------------------------
    def mesh(self, **axes) -> sh.Mesh:
        """Declare the device mesh: axis name → size (an int, a dim, or a dim's name)."""
        if self._mesh is not None:
            raise TraceError(f"trace {self.name}: the mesh is already declared")
        try:
            self._mesh = sh.make_mesh(axes)
        except ValueError as e:
            raise TraceError(f"trace {self.name}: {e}") from None
        return self._mesh

    def _spec(self, where: str, sharding, rank: int) -> sh.Spec | None:
        try:
            return sh.normalize(sharding, rank, self._mesh)
        except ValueError as e:
            raise TraceError(f"{where}: {e}") from None

    def _local(self, t: Tensor, where: str) -> Tensor:
        """``t``'s per-device buffer; a numeric dim that its axes do not divide is an error."""
        if not t.sharding:
            return t
        if self._mesh is None:
            raise TraceError(f"{where}: {t.name} is sharded but the trace declares no mesh")
        try:
            local = t.local(self._mesh.sizes)
        except ValueError as e:
            raise TraceError(f"{where}: {e}") from None
        for i, (g, n) in enumerate(zip(t.shape, local.shape)):
            if n.is_number and not n.is_integer:
                raise TraceError(f"{where}: dim {i} of {t.name} ({g}) does not divide over "
                                 f"{sh.fmt(t.sharding[i])} ({g / n})")
        return local

    def _full(self, t: Tensor) -> sh.Spec:
        return t.sharding or ((),) * t.rank

    def _collective(self, kind: str, name: str, x: Tensor, axis: str | None, src=None, dst=None,
                    inferred: bool = False) -> Tensor:
        """A collective leaf on ``x``'s local buffer; the result is ``x`` with mesh axis ``axis``
        taken off the end of dim ``src`` and put at the end of dim ``dst`` (if given)."""
        where = f"{kind} {name}"
        try:
            axis, spec = sh.moved(self._mesh, self._full(x), x.name, axis, src, dst)
        except ValueError as e:
            raise TraceError(f"{where}: {e}") from None
        out = Tensor(self._claim(name), x.shape, x.dtype, spec)
        attrs = dict(collective=kind, axis=axis, group_size=self._mesh.size(axis))
        if inferred:
            attrs["inferred"] = True
        self._scopes[-1].append(make_leaf(kind, name, (self._local(x, where),),
                                          (self._local(out, where),), **attrs))
        return out

    def all_to_all(self, name: str, x: Tensor, *, from_dim: int, to_dim: int, axis: str) -> Tensor:
        """Move mesh axis ``axis`` from dim ``from_dim`` (its innermost axis) to ``to_dim``."""
        return self._collective("all_to_all", name, x, axis, from_dim, to_dim)

    def all_gather(self, name: str, x: Tensor, *, dim: int, axis: str | None = None) -> Tensor:
        """Gather dim ``dim`` of ``x`` over ``axis`` (default: that dim's innermost axis)."""
        return self._collective("all_gather", name, x, axis, dim, None)

    def reduce_scatter(self, name: str, x: Tensor, *, dim: int, axis: str) -> Tensor:
        """Sum ``x``'s partial values over ``axis`` and scatter the result's dim ``dim``."""
        return self._collective("reduce_scatter", name, x, axis, None, dim)

    def all_reduce(self, name: str, x: Tensor, *, axis: str) -> Tensor:
        """Sum ``x``'s partial values over ``axis``."""
        return self._collective("all_reduce", name, x, axis)

    def _claim(self, name: str) -> str:
        if name in self._names:
            raise TraceError(f"trace {self.name}: the name {name!r} is used twice")
        self._names.add(name)
        return name

    def _emit(self, kind: str, name: str, inputs, out_shape, out_dtype, *, sharding=None,
              **attrs) -> Tensor:
        out = Tensor(self._claim(name), tuple(out_shape), out_dtype, sharding)
        where = f"{kind} {name}"
        self._scopes[-1].append(make_leaf(kind, name, [self._local(t, where) for t in inputs],
                                          (self._local(out, where),), **attrs))
        return out

    def reserve(self, name: str, rrt) -> None:
        """Give the leaf ``name`` (emitted in the current scope) its own resource reservation
        table (:class:`perfcast.ir.RRT`, cycles may be design symbols): the slow roll-up then
        schedules it with this table instead of one derived from its pricing."""
        from dataclasses import replace

        scope = self._scopes[-1]
        for i, op in enumerate(scope):
            if isinstance(op, Leaf) and op.name == name:
                scope[i] = replace(op, rrt=rrt)
                return
        raise TraceError(f"trace {self.name}: no leaf named {name!r} in the current scope to reserve")

    # Memory -------------------------------------------------------------------------------
    def load_tile(self, name: str, src: Tensor, shape) -> Tensor:
        """Copy a tile of ``src`` (in HBM) into on-chip memory. A tile of a sharded tensor is
        sharded like it: ``shape`` is global and each device loads its own part."""
        if len(shape) != src.rank:
            raise TraceError(f"load_tile {name}: tile rank {len(shape)} ≠ {src.name} rank {src.rank}")
        return self._emit("load", name, (src,), shape, src.dtype, sharding=src.sharding, source=src.name)

    def store_tile(self, name: str, value: Tensor, dst: Tensor) -> Tensor:
        """Write on-chip ``value`` into a tile of ``dst`` (in HBM)."""
        if value.rank != dst.rank:
            raise TraceError(f"store_tile {name}: {value.name} rank {value.rank} ≠ {dst.name} rank {dst.rank}")
        return self._emit("store", name, (value,), value.shape, dst.dtype, sharding=value.sharding,
                          destination=dst.name)

    def fill(self, name: str, shape, dtype: str | None = None, value=0) -> Tensor:
        """A tile initialised on chip to a constant."""
        return self._emit("fill", name, (), shape, dtype or self.dtype, value=value)

    # Matrix unit --------------------------------------------------------------------------
    def einsum(self, name: str, equation: str, *operands: Tensor, dtype: str | None = None,
               out_sharding=None) -> Tensor:
        """Explicit-output einsum. With sharded operands (or ``out_sharding``, default: inferred)
        it emits the collectives that the shardings imply around the einsum leaf."""
        where = f"einsum {name}"
        try:
            sizes = einsum_sizes(equation, operands)
            specs, out = einsum_specs(equation)
        except ValueError as e:
            raise TraceError(f"{where}: {e}") from None
        if out is None:
            raise TraceError(f"{where}: equation {equation!r} needs an explicit '->' output")
        if any(c not in sizes for c in out):
            raise TraceError(f"{where}: output index {next(c for c in out if c not in sizes)} "
                             f"appears in no operand")
        shape = tuple(sizes[c] for c in out)
        dtype, eq = dtype or operands[0].dtype, "".join(equation.split())
        if out_sharding is None and all(t.sharding is None for t in operands):
            return self._emit("einsum", name, operands, shape, dtype, equation=eq)
        requested = self._spec(where, out_sharding, len(out))
        try:
                plan = sh.plan_einsum(name, specs, out, [t.sharding for t in operands],
                                  [t.name for t in operands], requested)
        except ValueError as e:
            raise TraceError(f"{where}: {e}") from None
        ops = list(operands)
        for step in plan.before:  # all-gathers of operands
            ops[step.operand] = self._collective(step.kind, step.name, ops[step.operand], step.axis,
                                                 step.dim, None, inferred=True)
        ops = [Tensor(t.name, t.shape, t.dtype, spec) for t, spec in zip(ops, plan.operands)]
        result = self._emit("einsum", name, ops, shape, dtype, sharding=plan.result, equation=eq)
        for step in plan.after:  # reductions of partial sums, then all-gathers of the result
            src, dst = {"all_gather": (step.dim, None), "reduce_scatter": (None, step.dim)}.get(
                step.kind, (None, None))
            result = self._collective(step.kind, step.name, result, step.axis, src, dst, inferred=True)
        return result

    def matmul(self, name: str, a: Tensor, b: Tensor, dtype: str | None = None) -> Tensor:
        """``a @ b`` over the last two dims, leading dims batched."""
        batch = "abcdefgh"[: a.rank - 2]
        return self.einsum(name, f"{batch}mk,{batch}kn->{batch}mn", a, b, dtype=dtype)

    # Vector unit --------------------------------------------------------------------------
    def _binary(self, kind: str, name: str, a: Tensor, b: Tensor) -> Tensor:
        try:
            shape = broadcast(a.shape, b.shape)
        except ValueError as e:
            raise TraceError(f"{kind} {name}: {e}") from None
        spec = None
        if a.sharding is not None or b.sharding is not None:
            try:
                spec = sh.broadcast([(t.name, t.shape, t.sharding) for t in (a, b)], len(shape))
            except ValueError as e:
                raise TraceError(f"{kind} {name}: {e}") from None
            # each operand read as the result's blocks (a free slice); broadcast dims stay whole
            a, b = (Tensor(t.name, t.shape, t.dtype, tuple(() if d == 1 else axes for d, axes in
                                                           zip(t.shape, spec[len(spec) - t.rank:])))
                    for t in (a, b))
        return self._emit(kind, name, (a, b), shape, a.dtype, sharding=spec)

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
        return self._emit("exp", name, (x,), x.shape, x.dtype, sharding=x.sharding)

    def sigmoid(self, name: str, x: Tensor) -> Tensor:
        return self._emit("sigmoid", name, (x,), x.shape, x.dtype, sharding=x.sharding)

    def silu(self, name: str, x: Tensor) -> Tensor:
        """``x·sigmoid(x)`` (SiLU / Swish), the activation of SwiGLU MLPs."""
        return self._emit("silu", name, (x,), x.shape, x.dtype, sharding=x.sharding)

    def tanh(self, name: str, x: Tensor) -> Tensor:
        return self._emit("tanh", name, (x,), x.shape, x.dtype, sharding=x.sharding)

    def rsqrt(self, name: str, x: Tensor) -> Tensor:
        """``1/sqrt(x)``, the normalisation of RMSNorm and LayerNorm."""
        return self._emit("rsqrt", name, (x,), x.shape, x.dtype, sharding=x.sharding)

    def _reduce(self, kind: str, name: str, x: Tensor, axis: int) -> Tensor:
        axis = axis % x.rank
        if x.sharding and x.sharding[axis]:
            raise TraceError(f"{kind} {name}: dim {axis} of {x.name} is sharded over "
                             f"{sh.fmt(x.sharding[axis])}; all_gather it first")
        shape = tuple(sympy.Integer(1) if i == axis else d for i, d in enumerate(x.shape))
        return self._emit(kind, name, (x,), shape, x.dtype, sharding=x.sharding, axis=axis)

    def reduce_sum(self, name: str, x: Tensor, axis: int = -1) -> Tensor:
        """Sum along ``axis``, keeping it with size 1."""
        return self._reduce("sum", name, x, axis)

    def reduce_max(self, name: str, x: Tensor, axis: int = -1) -> Tensor:
        """Maximum along ``axis``, keeping it with size 1."""
        return self._reduce("max", name, x, axis)

    # Routing ------------------------------------------------------------------------------
    def top_k(self, name: str, x: Tensor, k) -> tuple[Tensor, Tensor]:
        """The ``k`` largest entries along the last dim and their int32 indices (kind ``topk``)."""
        if x.sharding and x.sharding[-1]:
            raise TraceError(f"top_k {name}: the last dim of {x.name} is sharded over "
                             f"{sh.fmt(x.sharding[-1])}; all_gather it first")
        shape = x.shape[:-1] + (as_expr(k),)
        values = Tensor(self._claim(name), shape, x.dtype, x.sharding)
        index = Tensor(self._claim(name + ".index"), shape, "int32", x.sharding)
        where = f"top_k {name}"
        self._scopes[-1].append(make_leaf("topk", name, (self._local(x, where),), (
            self._local(values, where), self._local(index, where)), k=as_expr(k)))
        return values, index

    def gather(self, name: str, src: Tensor, index: Tensor, shape, *, sharding=None) -> Tensor:
        """Rows of ``src`` picked by ``index`` and laid out as ``shape`` (global, sharded as
        ``sharding``), kind ``gather``: each device picks from its own shard (no communication)."""
        spec = self._spec(f"gather {name}", sharding, len(shape))
        return self._emit("gather", name, (src, index), shape, src.dtype, sharding=spec)

    # Structure ----------------------------------------------------------------------------
    def _scoped(self, fn: Callable, args=()):
        self._scopes.append([])
        try:
            result = fn(*args)
        finally:
            ops = self._scopes.pop()
        return result, ops

    def block(self, fn: Callable | None = None, *, name: str | None = None, launch: bool = False):
        """Decorator: trace ``fn()`` as a named sub-graph; evaluates to ``fn``'s result.
        ``launch=True`` makes the block one kernel launch (see :meth:`build`)."""

        def deco(f):
            result, ops = self._scoped(f)
            self._scopes[-1].append(Graph(self._claim(name or f.__name__), tuple(ops), launch=launch))
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
            carried_in = [Tensor(self._claim(p), t.shape, t.dtype, t.sharding) for p, t in zip(params, init)]
            result, ops = self._scoped(f, carried_in)
            results = result if isinstance(result, (tuple, list)) else (result,)
            if len(results) != len(init):
                raise TraceError(f"reduce_loop {f.__name__}: the body returns {len(results)} "
                                 f"values for {len(init)} accumulators")
            for r, c in zip(results, carried_in):
                if r.shape != c.shape:
                    raise TraceError(f"reduce_loop {f.__name__}: accumulator {c.name} has shape "
                                     f"{c.shape} but the body returns {r.name} of shape {r.shape}")
                if r.sharding != c.sharding:
                    raise TraceError(f"reduce_loop {f.__name__}: accumulator {c.name} is sharded "
                                     f"{c.sharding} but the body returns {r.name} sharded {r.sharding}")
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
            return Tensor(loop_name + ".gathered", tuple(shape), result.dtype, result.sharding)

        return deco

    @property
    def declared_mesh(self) -> "sh.Mesh | None":
        """The mesh the trace declared (axes in declaration order), if any."""
        return self._mesh

    def build(self) -> Graph:
        """The trace as one kernel launch — unless it declares its own kernels (``launch``
        blocks): it is then a program of them, run one after another."""
        if len(self._scopes) != 1:
            raise TraceError(f"trace {self.name}: build() called inside an open scope")
        ops = tuple(self._scopes[0])
        program = any(isinstance(v.op, Graph) and v.op.launch for op in ops for v in walk(op))
        return Graph(self.name, ops, launch=not program)


def trace(fn: Callable[[Builder], object], name: str | None = None, *, dtype: str = "bf16",
          padded: bool = False) -> Graph:
    """Trace ``fn(builder)`` into a kernel graph: one launch, or a program of launch blocks."""
    b = Builder(name or fn.__name__, dtype=dtype, padded=padded)
    fn(b)
    return b.build()
