"""Sharding for the tracing DSL: a device mesh, per-dim shardings, and the collectives that a
sharded einsum implies (ARCHITECTURE.md §2; docs/design/sharding.md).

A *mesh* names the axes of the device grid and their sizes (``tp=8``, ``ep="EP"``). A tensor's
*sharding* gives, for each dim, the mesh axes that split it, major axis first: ``("ep", None)``
splits dim 0 over ``ep``; ``(("dp", "ep"), None)`` splits dim 0 into ``dp`` blocks and each of
those into ``ep`` blocks. DSL shapes are global; a dim split over axes whose sizes multiply to
``n`` holds ``dim/n`` per device (:meth:`perfcast.ir.Tensor.local`), and every leaf carries those
local buffers, so its cost is one device's work.

:func:`plan_einsum` turns an einsum's index strings and shardings into the collectives it needs.
It is pure (names in, plan out) and raises ValueError, which the builder reports as a one-line
TraceError naming the einsum. The rules, in the order the plan applies them:

1. a contracted index keeps the longest common prefix of the axes that shard it in the operands
   holding it; each operand **all-gathers** the rest of its axes (innermost first) just before
   the einsum — an index sharded on ``a`` in one operand and replicated in the other gathers
   the first over ``a``;
2. the axes kept on contracted indices leave **partial sums**: a **reduce-scatter** over ``a``
   when the requested output sharding ends some dim's axes with ``a``, else an **all-reduce**;
3. a kept index takes the longest of its operands' shardings, which must be prefixes of one
   another; an operand holding a shorter prefix (a replicated one included) slices its local
   block for free. A requested output sharding may extend that (a free slice of the operands)
   or drop a suffix (an **all-gather** of the result); anything else is an error.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import sympy

from perfcast.ir import dim, leaves, link
from perfcast.ir.rules import collective_message
from perfcast.ir.tensor import as_expr

Axes = tuple[str, ...]
Spec = tuple[Axes, ...]


@dataclass(frozen=True)
class Mesh:
    """The device grid: (axis name, size) pairs; sizes are positive integers or dims."""

    axes: tuple[tuple[str, sympy.Expr], ...]

    @property
    def sizes(self) -> dict[str, sympy.Expr]:
        return dict(self.axes)

    def size(self, axis: str) -> sympy.Expr:
        return self.sizes[axis]


def make_mesh(axes: Mapping[str, object]) -> Mesh:
    """A mesh from ``name=size`` pairs; a string size names a dim (``ep="EP"`` is ``dim("EP")``)."""
    if not axes:
        raise ValueError("a mesh needs at least one axis")
    out = []
    for name, size in axes.items():
        link(name)  # the axis names a link resource: bytes.link:<axis>
        try:
            expr = dim(size) if isinstance(size, str) else as_expr(size)
        except (TypeError, ValueError, sympy.SympifyError):
            raise ValueError(f"mesh axis {name}: size {size!r} is not a positive integer or dim") from None
        if not (expr.is_positive and expr.is_integer):
            raise ValueError(f"mesh axis {name}: size {size!r} is not a positive integer or dim")
        out.append((name, expr))
    return Mesh(tuple(out))


def fmt(axes: Axes) -> str:
    """How messages name a dim's sharding: ``replicated``, ``ep`` or ``dp+ep``."""
    return "+".join(axes) if axes else "replicated"


def normalize(spec, rank: int, mesh: Mesh | None) -> Spec | None:
    """A user's sharding (per dim: None, an axis name, or a tuple of names) as a tuple of
    tuples; unknown axes, an axis used twice and a wrong length raise."""
    if spec is None:
        return None
    if isinstance(spec, str) or len(spec) != rank:
        raise ValueError(f"sharding {spec!r} needs one entry per dim ({rank})")
    if mesh is None:
        raise ValueError("a sharding needs a mesh: declare one with b.mesh(axis=size, ...)")
    out = []
    for entry in spec:
        axes = () if entry is None else (entry,) if isinstance(entry, str) else entry
        if not isinstance(axes, (tuple, list)) or not all(isinstance(a, str) for a in axes):
            raise ValueError(f"sharding entry {entry!r} is not None, an axis name or a tuple of them")
        axes = tuple(axes)
        for a in axes:
            if a not in mesh.sizes:
                raise ValueError(f"unknown mesh axis {a!r}; the mesh has {', '.join(mesh.sizes)}")
        out.append(axes)
    check_unique(tuple(out), "the sharding")
    return tuple(out)


def check_unique(spec: Spec, what: str) -> None:
    seen: dict[str, int] = {}
    for i, axes in enumerate(spec):
        for a in axes:
            if a in seen:
                where = f"dim {i} twice" if seen[a] == i else f"both dim {seen[a]} and dim {i}"
                raise ValueError(f"mesh axis {a!r} shards {where} of {what}")
            seen[a] = i


def _prefix(a: Axes, b: Axes) -> bool:
    return b[: len(a)] == a


def _common_prefix(specs: Sequence[Axes]) -> Axes:
    first = specs[0]
    n = 0
    while n < len(first) and all(len(s) > n and s[n] == first[n] for s in specs):
        n += 1
    return first[:n]


def chain(label: str, held: Sequence[tuple[str, Axes]]) -> Axes:
    """The sharding of a dim shared by several tensors (``held``: (tensor name, axes) pairs):
    the longest, when every other is a prefix of it (a free local slice); else an error."""
    longest = max((axes for _, axes in held), key=len)
    owner = next(n for n, axes in held if axes == longest)
    for name, axes in held:
        if not _prefix(axes, longest):
            raise ValueError(f"{label} is sharded over {fmt(axes)} in {name} but over "
                             f"{fmt(longest)} in {owner}")
    return longest


class Step(NamedTuple):
    """One collective of a plan, over mesh ``axis``, and the name of its leaf: an all-gather of
    operand ``operand``'s dim ``dim`` before the einsum (``operand`` set), or a collective on
    its result after it (``dim`` is the dim gathered or scattered; None for an all-reduce)."""

    kind: str
    axis: str
    dim: int | None = None
    operand: int | None = None
    name: str = ""


@dataclass(frozen=True)
class EinsumPlan:
    before: tuple[Step, ...]  # all-gathers of operands
    operands: tuple[Spec, ...]  # the operands' shardings as the local einsum reads them
    result: Spec  # the local einsum's result (partial over ``partial``)
    partial: Axes
    after: tuple[Step, ...]  # reduce-scatters, all-reduces, then all-gathers of the result
    out: Spec


def plan_einsum(einsum: str, specs: Sequence[str], out: str, shardings: Sequence[Spec | None],
                names: Sequence[str], requested: Spec | None = None) -> EinsumPlan:
    """The collectives of the einsum called ``einsum``, ``specs -> out``, whose operands (called
    ``names``) are sharded as ``shardings``; ``requested`` is the wanted output sharding (None:
    inferred). Collective leaves are named ``<einsum>.all_gather.<operand>`` before it and
    ``<einsum>.<kind>`` after it, suffixed ``.<axis>`` where one name would serve twice."""
    shard = [list(s) if s is not None else [()] * len(spec) for s, spec in zip(shardings, specs)]

    def holders(c: str) -> list[tuple[int, int]]:
        return [(i, d) for i, spec in enumerate(specs) for d, ch in enumerate(spec) if ch == c]

    before: list[Step] = []
    partial: list[str] = []
    for c in dict.fromkeys("".join(specs)):
        if c in out:
            continue
        where = holders(c)
        common = _common_prefix([shard[i][d] for i, d in where])
        for i, d in where:
            while len(shard[i][d]) > len(common):
                before.append(Step("all_gather", shard[i][d][-1], d, i))
                shard[i][d] = shard[i][d][:-1]
        partial.extend(common)

    result: list[Axes] = []
    scatter_onto: dict[int, Axes] = {}
    gather_off: dict[int, Axes] = {}
    for pos, c in enumerate(out):
        where = holders(c)
        if not where:
            raise ValueError(f"output index {c} appears in no operand")
        kept = chain(f"index {c}", [(names[i], shard[i][d]) for i, d in where])
        target = kept
        if requested is not None:
            want = requested[pos]
            k = len(want)
            while k and want[k - 1] in partial:
                k -= 1
            base, onto = want[:k], want[k:]
            if any(a in partial for a in base):
                a = next(a for a in base if a in partial)
                raise ValueError(f"output index {c} asks for {fmt(want)}, but {a} holds partial sums "
                                 f"and can only be reduce-scattered as the innermost axis")
            if _prefix(kept, base):
                target = base
            elif _prefix(base, kept) and not onto:
                gather_off[pos] = kept[len(base):]
            else:
                raise ValueError(f"index {c} is sharded over {fmt(kept)} in the operands but the "
                                 f"output asks for {fmt(want)}")
            if onto:
                scatter_onto[pos] = onto
        result.append(target)
        for i, d in where:
            shard[i][d] = target

    for i, s in enumerate(shard):
        check_unique(tuple(s), f"operand {names[i]}")
    check_unique(tuple(result), "the result")
    for axes in result:
        for a in axes:
            if a in partial:
                raise ValueError(f"mesh axis {a!r} both shards the result and holds partial sums")

    after = [Step("reduce_scatter", a, pos) for pos, onto in scatter_onto.items() for a in onto]
    scattered = {a for onto in scatter_onto.values() for a in onto}
    after += [Step("all_reduce", a) for a in partial if a not in scattered]
    after += [Step("all_gather", a, pos) for pos, axes in gather_off.items() for a in reversed(axes)]
    final = tuple(requested) if requested is not None else tuple(result)
    return EinsumPlan(_named(einsum, before, names), tuple(tuple(s) for s in shard), tuple(result),
                      tuple(partial), _named(einsum, after, names), final)


def _named(einsum: str, steps: list[Step], names: Sequence[str]) -> tuple[Step, ...]:
    def base(s: Step) -> str:
        if s.operand is None:
            return f"{einsum}.{s.kind}"
        operand = names[s.operand] if list(names).count(names[s.operand]) == 1 else str(s.operand)
        return f"{einsum}.{s.kind}.{operand}"

    bases = [base(s) for s in steps]
    return tuple(s._replace(name=b + (f".{s.axis}" if bases.count(b) > 1 else ""))
                 for s, b in zip(steps, bases))


def broadcast(operands: Sequence[tuple[str, tuple, Spec | None]], rank: int) -> Spec:
    """The sharding of an elementwise op's result: per (right-aligned) dim, the chain of its
    operands' shardings (see :func:`chain`); a broadcast dim of size 1 must be replicated."""
    out = []
    for k in range(1, rank + 1):
        held = []
        for name, shape, spec in operands:
            if k > len(shape):
                continue
            axes = spec[-k] if spec else ()
            if axes and shape[-k] == 1:
                raise ValueError(f"dim {len(shape) - k} of {name} has size 1 but is sharded over {fmt(axes)}")
            held.append((name, axes))
        out.append(chain(f"dim {rank - k} of the result", held))
    spec = tuple(reversed(out))
    check_unique(spec, "the result")
    return spec


def moved(mesh: Mesh | None, spec: Spec, name: str, axis: str | None, src: int | None,
          dst: int | None) -> tuple[str, Spec]:
    """The layout change of a collective over ``axis`` on a tensor ``name`` sharded as ``spec``:
    ``axis`` taken off the end of dim ``src`` (an all-gather; None: that dim's innermost axis)
    and/or put at the end of dim ``dst`` (a reduce-scatter; both: an all-to-all). Returns the
    axis and the new sharding."""
    src, dst = (d % len(spec) if d is not None else None for d in (src, dst))
    if axis is None:
        if src is None or not spec[src]:
            raise ValueError(f"dim {src} of {name} is not sharded")
        axis = spec[src][-1]
    if mesh is None or axis not in mesh.sizes:
        known = ", ".join(mesh.sizes) if mesh else "none declared"
        raise ValueError(f"unknown mesh axis {axis!r} (mesh axes: {known})")
    if src is not None and src == dst:
        raise ValueError(f"it moves {axis} from dim {src} to itself")
    if src is not None:
        if axis not in spec[src]:
            raise ValueError(f"{name} is not sharded over {axis} on dim {src}")
        if spec[src][-1] != axis:
            raise ValueError(f"{axis} is not the innermost axis of {name}'s dim {src} ({fmt(spec[src])})")
    elif any(axis in axes for axes in spec):
        raise ValueError(f"{name} is already sharded over {axis}")
    new = list(spec)
    if src is not None:
        new[src] = new[src][:-1]
    if dst is not None:
        new[dst] = new[dst] + (axis,)
    return axis, tuple(new)


class Collective(NamedTuple):
    """One collective leaf as :func:`collectives` lists it; ``message_bytes`` is the per-device
    buffer nccl-tests reports (the larger of the leaf's first input and output)."""

    name: str
    kind: str
    axis: str
    group_size: sympy.Expr
    message_bytes: sympy.Expr
    inferred: bool


def collectives(op) -> list[Collective]:
    """Every collective leaf under ``op``, in trace order (per call: not multiplied by the trip
    counts of enclosing loops)."""
    return [Collective(leaf.name, leaf.kind, str(leaf.attr("axis")), sympy.sympify(leaf.attr("group_size")),
                       collective_message(leaf.inputs, leaf.outputs), bool(leaf.attr("inferred")))
            for leaf in leaves(op) if leaf.attr("collective")]
