"""Element types and their sizes in bytes (exact rationals: fp4 is half a byte)."""

from __future__ import annotations

import sympy

_BYTES: dict[str, sympy.Rational] = {
    "fp64": sympy.Integer(8),
    "fp32": sympy.Integer(4),
    "tf32": sympy.Integer(4),
    "bf16": sympy.Integer(2),
    "fp16": sympy.Integer(2),
    "fp8": sympy.Integer(1),
    "int8": sympy.Integer(1),
    "int32": sympy.Integer(4),
    "int64": sympy.Integer(8),
    "bool": sympy.Integer(1),
    "fp4": sympy.Rational(1, 2),
    "int4": sympy.Rational(1, 2),
    "complex64": sympy.Integer(8),  # two fp32: Llama 4's rotary tables and rotations (torch.polar)
}

DTYPES: tuple[str, ...] = tuple(_BYTES)


def itemsize(dtype: str) -> sympy.Rational:
    """Bytes per element of ``dtype``."""
    try:
        return _BYTES[dtype]
    except KeyError:
        raise ValueError(f"unknown dtype {dtype!r}; known: {', '.join(_BYTES)}") from None
