"""Recording: a ``TorchDispatchMode`` that appends one :class:`OpRecord` per dispatched op.

It records only — op name, input/output tensor metadata (shape, dtype, whether the tensor is a
model parameter or a view of one), scalar arguments, the module path and the layer index — and
never costs anything: mapping records to IR leaves is the lowering's job.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import sympy
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils._sympy import functions as shape_functions

from perfcast.capture.types import OpRecord, TensorMeta

_DTYPES = {
    torch.float64: "fp64", torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16",
    torch.float8_e4m3fn: "fp8", torch.float8_e5m2: "fp8", torch.int8: "int8", torch.uint8: "int8",
    torch.int32: "int32", torch.int64: "int64", torch.bool: "bool",
}


def dtype_name(dtype: torch.dtype) -> str:
    return _DTYPES.get(dtype, str(dtype).removeprefix("torch."))


#: torch's own SymPy functions in ShapeEnv expressions → SymPy's, equal on the integers the
#: ShapeEnv reasons about (``FloorDiv`` is Python's ``//``, ``PythonMod`` its ``%``; ``Mod`` is
#: ``%`` of non-negative operands; ``CleanDiv`` a ``//`` known to be exact)
_PLAIN = {
    shape_functions.Mod: sympy.Mod, shape_functions.PythonMod: sympy.Mod,
    shape_functions.FloorDiv: lambda a, b: sympy.floor(a / b),
    shape_functions.CleanDiv: lambda a, b: sympy.floor(a / b),
    shape_functions.CeilDiv: lambda a, b: sympy.ceiling(a / b),
    shape_functions.Max: sympy.Max, shape_functions.Min: sympy.Min,
    shape_functions.PowByNatural: sympy.Pow, shape_functions.Identity: lambda a: a,
}


def plain(e: sympy.Basic) -> sympy.Basic:
    """``e`` in SymPy's own functions only: a capture holds no torch types, so the capture cache
    can store it and a process without torch can read it."""
    if e.is_Atom:
        return e
    return e.replace(lambda x: type(x) in _PLAIN, lambda x: _PLAIN[type(x)](*x.args))


def size_expr(d) -> sympy.Expr:
    """A dim as a SymPy expression: an int, or a SymInt's expression over ShapeEnv symbols."""
    if isinstance(d, torch.SymInt):
        return plain(sympy.sympify(d.node.expr))
    return sympy.Integer(int(d))


@dataclass
class Recorder(TorchDispatchMode):
    """Appends records while active. ``params`` holds the ids of parameter tensors; views of
    a parameter are parameters too (a transposed weight is still weight traffic)."""

    params: set[int] = field(default_factory=set)
    records: list[OpRecord] = field(default_factory=list)
    module: str = ""
    layer: int | None = None
    _uids: dict[int, int] = field(default_factory=dict)
    _keep: list = field(default_factory=list)

    def __post_init__(self):
        super().__init__()

    def _meta(self, t: torch.Tensor) -> TensorMeta:
        key = id(t)
        if key not in self._uids:
            self._uids[key] = len(self._uids)
            self._keep.append(t)  # keep alive so ids are not reused during the capture
        broadcast = tuple(isinstance(s, int) and s == 0 and not (isinstance(d, int) and d == 1)
                          for s, d in zip(t.stride(), t.shape))
        return TensorMeta(tuple(size_expr(d) for d in t.shape), dtype_name(t.dtype),
                          key in self.params, self._uids[key], broadcast if any(broadcast) else ())

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        flat_in, _ = tree_flatten((args, kwargs))
        flat_out, _ = tree_flatten(out)
        tensors_in = [a for a in flat_in if isinstance(a, torch.Tensor)]
        if any(id(t) in self.params for t in tensors_in) and _carries_weight(func):
            self.params.update(id(o) for o in flat_out if isinstance(o, torch.Tensor))
        scalars = tuple(_scalar(a) for a in flat_in if not isinstance(a, torch.Tensor))
        self.records.append(OpRecord(
            op=str(func.overloadpacket._qualified_op_name).replace("::", ".") + "." + func._overloadname,
            inputs=tuple(self._meta(t) for t in tensors_in),
            outputs=tuple(self._meta(o) for o in flat_out if isinstance(o, torch.Tensor)),
            scalars=scalars, module=self.module, layer=self.layer))
        return out


def _carries_weight(func) -> bool:
    """Ops whose output is the weight itself in another form — a view, or a copy or cast of it
    (a router weight cast to fp32): reading that output is still weight traffic."""
    return bool(getattr(func, "is_view", False)) or func.overloadpacket.__name__ in (
        "t", "transpose", "permute", "view", "_unsafe_view", "reshape", "expand", "slice",
        "select", "unsqueeze", "squeeze", "split", "split_with_sizes", "chunk", "unbind",
        "as_strided", "alias", "detach", "_to_copy", "clone", "contiguous")


def _scalar(a):
    if isinstance(a, torch.SymInt):
        return size_expr(a)
    if isinstance(a, (int, float, bool, str)) or a is None:
        return a
    return str(a)

