"""The operator tree: ``Op = Leaf | Loop | Graph``, frozen and recursive, and its one fold.

``cost(Leaf) = leaf.cost``, ``cost(Loop) = n_iter · cost(body)``, ``cost(Graph) = Σ cost(ops)``.
Every total and every per-leaf figure in perfcast is a view of :func:`walk`/:func:`fold`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Literal, Union

import sympy

from perfcast.ir.cost import Cost
from perfcast.ir.rrt import RRT
from perfcast.ir.tensor import Tensor, as_expr

LoopKind = Literal["reduce", "map"]


def _freeze_attrs(attrs) -> tuple[tuple[str, object], ...]:
    items = attrs.items() if isinstance(attrs, dict) else attrs
    return tuple(sorted((str(k), v) for k, v in items))


@dataclass(frozen=True)
class Leaf:
    """The boundary between algorithm and system: one tile/kernel-level operation.

    ``cost`` is the work the leaf does (FLOPs, bytes), computed by the leaf-kind rule book
    (:mod:`perfcast.ir.rules`); ``rrt`` is filled in by the system side for the slow roll-up.
    """

    name: str
    kind: str
    inputs: tuple[Tensor, ...]
    outputs: tuple[Tensor, ...]
    cost: Cost
    attrs: tuple[tuple[str, object], ...] = ()
    rrt: RRT | None = None

    def __post_init__(self):
        object.__setattr__(self, "inputs", tuple(self.inputs))
        object.__setattr__(self, "outputs", tuple(self.outputs))
        object.__setattr__(self, "attrs", _freeze_attrs(self.attrs))
        if not isinstance(self.cost, Cost):
            raise TypeError(f"leaf {self.name}: cost must be a Cost")

    def attr(self, key: str, default=None):
        return dict(self.attrs).get(key, default)

    @property
    def dtype(self) -> str:
        """The dtype that selects the compute rate: the ``compute_dtype`` attribute if set, else
        the first input's, else the first output's."""
        if self.attr("compute_dtype"):
            return str(self.attr("compute_dtype"))
        tensors = self.inputs or self.outputs
        return tensors[0].dtype if tensors else "fp32"


@dataclass(frozen=True)
class Graph:
    """A named sub-graph (a block, a layer, a kernel, a model). ``launch`` marks a kernel
    launch boundary: the per-kernel static latency is charged once per launch, not per leaf."""

    name: str
    ops: tuple["Op", ...] = ()
    launch: bool = False

    def __post_init__(self):
        ops = tuple(self.ops)
        for op in ops:
            if not isinstance(op, (Leaf, Loop, Graph)):
                raise TypeError(f"graph {self.name}: {op!r} is not an Op")
        object.__setattr__(self, "ops", ops)


@dataclass(frozen=True)
class Loop:
    """A loop nest level. ``reduce`` iterations carry accumulators (``carried``: pairs of
    (body result tensor, body input tensor) joined by a distance-1 dependence); ``map``
    iterations are independent and their results are gathered along ``gather_axis``."""

    name: str
    n_iter: sympy.Expr
    body: Graph
    kind: LoopKind = "map"
    carried: tuple[tuple[str, str], ...] = ()
    gather_axis: int | None = None

    def __post_init__(self):
        n = as_expr(self.n_iter)
        if n.is_positive is False:
            raise ValueError(f"loop {self.name}: trip count {n} is not positive")
        object.__setattr__(self, "n_iter", n)
        if self.kind not in ("reduce", "map"):
            raise ValueError(f"loop {self.name}: kind must be 'reduce' or 'map', not {self.kind!r}")
        if self.kind == "map" and self.carried:
            raise ValueError(f"loop {self.name}: a map loop carries nothing between iterations")
        if self.kind == "reduce" and self.gather_axis is not None:
            raise ValueError(f"loop {self.name}: a reduce loop has no gather axis")
        if not isinstance(self.body, Graph):
            raise TypeError(f"loop {self.name}: body must be a Graph")
        object.__setattr__(self, "carried", tuple(tuple(p) for p in self.carried))


Op = Union[Leaf, Loop, Graph]


@dataclass(frozen=True)
class Visit:
    """One node reached by :func:`walk`: its path from the root, the product of the trip
    counts of all loops enclosing it (the node's own trip count excluded), and the kernel it
    runs in — the outermost enclosing-or-self Graph marked ``launch``, or None."""

    op: Op
    path: tuple[str, ...]
    trips: sympy.Expr = field(default=sympy.Integer(1))
    kernel: Graph | None = None

    @property
    def is_launch(self) -> bool:
        """True once per kernel launch: at a launch graph, or at a leaf outside every launch
        graph (each such leaf is a kernel of its own)."""
        return self.op is self.kernel or (isinstance(self.op, Leaf) and self.kernel is None)


def walk(op: Op, path: tuple[str, ...] = (), trips: sympy.Expr = sympy.Integer(1),
         kernel: Graph | None = None) -> Iterator[Visit]:
    """Pre-order traversal carrying enclosing trip counts and the enclosing kernel."""
    here = path + (op.name,)
    if kernel is None and isinstance(op, Graph) and op.launch:
        kernel = op
    yield Visit(op, here, trips, kernel)
    if isinstance(op, Graph):
        for child in op.ops:
            yield from walk(child, here, trips, kernel)
    elif isinstance(op, Loop):
        yield from walk(op.body, here, trips * op.n_iter, kernel)


def fold(op: Op, leaf_value: Callable[[Leaf], object], zero=Cost()):
    """The one fold: Σ over leaves of (enclosing trip counts) · ``leaf_value(leaf)``."""
    total = zero
    for v in walk(op):
        if isinstance(v.op, Leaf):
            total = total + v.trips * leaf_value(v.op)
    return total


def cost(op: Op) -> Cost:
    """The rolled-up work of ``op``."""
    return fold(op, lambda leaf: leaf.cost)


def rolled_leaves(op: Op) -> dict[str, Cost]:
    """Leaf name → its rolled-up cost (its cost times its enclosing trip counts); a name met
    twice is keyed by its full path instead."""
    out: dict[str, Cost] = {}
    for v in walk(op):
        if isinstance(v.op, Leaf):
            out["/".join(v.path) if v.op.name in out else v.op.name] = v.op.cost * v.trips
    return out


def leaves(op: Op) -> list[Leaf]:
    return [v.op for v in walk(op) if isinstance(v.op, Leaf)]


def trip_counts(op: Op) -> list[tuple[str, sympy.Expr]]:
    """Every loop's (name, trip count) in the tree, for parameter guards."""
    return [(v.op.name, v.op.n_iter) for v in walk(op) if isinstance(v.op, Loop)]
