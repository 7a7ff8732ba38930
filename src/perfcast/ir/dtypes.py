"""Element types and their sizes in bytes (exact rationals: fp4 is half a byte).

A *scaled* storage type names its element type and, after ``+``, each side tensor stored with
it as ``DTYPE/GROUP`` — one ``DTYPE`` element per ``GROUP`` elements — so its size per element
includes the scales (and zero points) a quantized checkpoint carries:

- ``fp4+fp8/16``: NVFP4, E2M1 values with one E4M3 scale per 16 (NVIDIA Technical Blog,
  "Introducing NVFP4 for Efficient and Accurate Low-Precision Inference", 2025): 9/16 byte;
- ``fp4+e8m0/32``: MXFP4, one 8-bit power-of-two scale per 32 (OCP Microscaling Formats
  Specification v1.0, §5): 17/32 byte;
- ``fp8+fp32/16384``: FP8 weights with one fp32 scale per 128×128 block (DeepSeek-V3 report,
  arXiv:2412.19437, §3.3.2);
- ``int4+fp16/128+int4/128``: AWQ int4 with an fp16 scale and a 4-bit zero point per group of
  128.

A per-tensor or per-channel scale (one number per tensor or per row) is left out: it is not a
per-element cost.
"""

from __future__ import annotations

import re
from functools import lru_cache

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
    # OCP MX v1.0 §5.4: the shared scale is an 8-bit exponent (E8M0)
    "e8m0": sympy.Integer(1),
    "complex64": sympy.Integer(8),  # two fp32: Llama 4's rotary tables and rotations (torch.polar)
}

DTYPES: tuple[str, ...] = tuple(_BYTES)
_SIDE = re.compile(r"^([a-z0-9]+)/([1-9][0-9]*)$")


@lru_cache(maxsize=None)
def itemsize(dtype: str) -> sympy.Rational:
    """Bytes per element of ``dtype``, side tensors of a scaled type included."""
    head, *sides = str(dtype).split("+")
    try:
        size = _BYTES[head]
    except KeyError:
        raise ValueError(f"unknown dtype {dtype!r}; known: {', '.join(_BYTES)} "
                         f"(or a scaled type such as fp4+fp8/16)") from None
    for side in sides:
        m = _SIDE.match(side)
        if m is None or m.group(1) not in _BYTES:
            raise ValueError(f"dtype {dtype!r}: side tensor {side!r} is not DTYPE/GROUP (e.g. fp8/16)")
        size += _BYTES[m.group(1)] / int(m.group(2))
    return size


def element(dtype: str) -> str:
    """The element type of a (scaled) storage type: ``fp4+fp8/16`` → ``fp4``."""
    return str(dtype).split("+", 1)[0]
