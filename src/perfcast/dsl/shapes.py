"""Shape rules of the DSL's vector ops, over symbolic dims."""

from __future__ import annotations

from collections.abc import Sequence

import sympy


def broadcast(a: Sequence[sympy.Expr], b: Sequence[sympy.Expr]) -> tuple:
    """NumPy broadcasting over symbolic shapes: trailing dims equal, or one of them 1
    (numpy.org/doc/stable/user/basics.broadcasting.html, "General broadcasting rules").
    Shapes that do not broadcast raise ``ValueError``."""
    out = []
    for i in range(1, max(len(a), len(b)) + 1):
        x = a[-i] if i <= len(a) else sympy.Integer(1)
        y = b[-i] if i <= len(b) else sympy.Integer(1)
        if x == 1:
            out.append(y)
        elif y == 1 or sympy.expand(x - y) == 0:
            out.append(x)
        else:
            raise ValueError(f"shapes {tuple(a)} and {tuple(b)} do not broadcast")
    return tuple(reversed(out))
