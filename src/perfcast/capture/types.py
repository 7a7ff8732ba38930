"""Capture data: what a capture produces, in plain Python (no torch), so that captures can be
cached, loaded and lowered by processes that never import torch."""

from __future__ import annotations

from dataclasses import dataclass, field

import sympy

#: Marks a collective record (scalars after axis and group) as the all-gather of a MoE group's
#: tokens: the parallel plan writes it, the lowering gives it the experts' activation format.
MOE_DISPATCH = "moe_dispatch"
#: Mark a MoE layer's dispatch and combine all-to-alls (scalars after axis and group: the mark, then the
#: top-k): an engine profile that runs them as kernels of its own (DeepEP) names them by these.
MOE_A2A_DISPATCH, MOE_A2A_COMBINE = "moe_a2a_dispatch", "moe_a2a_combine"


def moe_a2a_side(scalars: tuple) -> str | None:
    """``dispatch`` or ``combine`` for a MoE layer's all-to-all record (its scalars), else None."""
    mark = scalars[2] if len(scalars) > 2 else None
    return {MOE_A2A_DISPATCH: "dispatch", MOE_A2A_COMBINE: "combine"}.get(mark) if isinstance(mark, str) else None


@dataclass(frozen=True)
class TensorMeta:
    shape: tuple[sympy.Expr, ...]
    dtype: str
    is_param: bool
    uid: int  # identity of the tensor's storage within one capture (for liveness)
    broadcast: tuple[bool, ...] = ()  # dims with stride 0 (an expanded view repeats its data)

    @property
    def stored_shape(self) -> tuple[sympy.Expr, ...]:
        """The shape of the data actually stored: broadcast dims count once."""
        if not any(self.broadcast):
            return self.shape
        return tuple(sympy.Integer(1) if b else d for d, b in zip(self.shape, self.broadcast))

    @property
    def numel(self) -> sympy.Expr:
        n = sympy.Integer(1)
        for d in self.shape:
            n *= d
        return n


@dataclass(frozen=True)
class OpRecord:
    op: str  # e.g. "aten.mm.default", "perfcast.attention.default"
    inputs: tuple[TensorMeta, ...]
    outputs: tuple[TensorMeta, ...]
    scalars: tuple[object, ...]
    module: str
    layer: int | None


@dataclass(frozen=True)
class LayerGroup:
    """Decoder layers that share one structure: ``indices`` in model order, captured once as
    ``representative``."""

    signature: tuple
    indices: tuple[int, ...]

    @property
    def representative(self) -> int:
        return self.indices[0]

    @property
    def count(self) -> int:
        return len(self.indices)


@dataclass
class Capture:
    records: list[OpRecord]
    groups: list[LayerGroup]
    params: dict[str, TensorMeta]  # parameter name → metadata (all layers, not only captured ones)
    linear_params: set[str]  # parameters that are matmul weights (quantizable)
    symbols: dict[str, sympy.Symbol] = field(default_factory=dict)  # ShapeEnv name → dim
    guards: tuple = ()  # conditions on the dims under which a symbolic capture is valid

    def at(self, expr, point: dict | None = None) -> sympy.Expr:
        """``expr`` with ShapeEnv symbols (``s0``, …) renamed to the capture's dims (B, S, C),
        then evaluated at ``point`` (dim → value) if given."""
        e = sympy.sympify(expr)
        if not self.symbols or not e.free_symbols:
            return e
        e = e.xreplace({s: self.symbols[str(s)] for s in e.free_symbols if str(s) in self.symbols})
        return e.xreplace(point) if point else e


def storage_roots(records: list[OpRecord], free: frozenset[str]) -> dict[int, int]:
    """Tensor uid → uid of the tensor whose storage it shares: a view op's (an op in ``free``)
    output aliases its first non-parameter input."""
    root: dict[int, int] = {}
    for r in records:
        ins = [t for t in r.inputs if not t.is_param]
        for t in ins:
            root.setdefault(t.uid, t.uid)
        view = r.op.split(".")[1] in free if "." in r.op else False
        for o in r.outputs:
            root[o.uid] = root[ins[0].uid] if view and ins else root.get(o.uid, o.uid)
    return root
