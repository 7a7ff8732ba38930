"""Parameter guards: a design point must make every trip count a positive integer.

A tiled kernel traced with exact tiling has trip counts such as ``T_q/q_blk``; evaluating it
where ``q_blk`` does not divide ``T_q`` would silently price a fraction of a tile. The guard
refuses such points and names the loop and the symbols; a kernel traced with padded tiling has
``ceiling`` trip counts and always passes.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import sympy

from perfcast.ir.errors import UserError


class GuardError(UserError):
    """A design point violates the kernel's parameter guard."""


def check_values(free: set[sympy.Symbol], values: Mapping[sympy.Symbol, object]) -> dict:
    """Exact SymPy numbers for every free symbol; missing, unknown, non-integer (for integer
    symbols) and non-positive values are errors naming the symbol."""
    names = {s.name: s for s in free}
    unknown = sorted(str(s) for s in values if s not in free)
    if unknown:
        raise GuardError(f"unknown symbol {unknown[0]!r}; the free symbols are {', '.join(sorted(names))}")
    missing = sorted(s.name for s in free if s not in values)
    if missing:
        raise GuardError(f"no value for {', '.join(missing)}")
    out = {}
    for s, v in values.items():
        num = sympy.Rational(repr(v)) if isinstance(v, float) else sympy.sympify(v)
        if not num.is_number or not num.is_real:
            raise GuardError(f"{s} = {v!r} is not a number")
        if num <= 0:
            raise GuardError(f"{s} = {v} must be positive")
        if s.is_integer and not num.is_integer:
            raise GuardError(f"{s} = {v} must be an integer")
        out[s] = num
    return out


def check_point(trips: list[tuple[str, sympy.Expr]], values: Mapping[sympy.Symbol, sympy.Expr]) -> None:
    """Every trip count is a positive integer at ``values`` (exact check)."""
    for loop, n in trips:
        v = n.xreplace(dict(values))
        if not (v.is_Integer and v > 0):
            used = ", ".join(f"{s}={values[s]}" for s in sorted(n.free_symbols, key=str))
            raise GuardError(f"loop {loop}: trip count {n} = {v} is not a positive integer at "
                             f"{used}; choose values that divide, or trace the kernel with padded (ceil) tiling")


def check_grid(trips: list[tuple[str, sympy.Expr]], symbols: list[sympy.Symbol],
               columns: list[np.ndarray]) -> None:
    """Vectorised :func:`check_point` over NumPy columns (one per symbol)."""
    for loop, n in trips:
        f = sympy.lambdify(symbols, n, modules="numpy")
        v = np.broadcast_to(np.asarray(f(*columns), dtype=float), np.broadcast(*columns).shape)
        bad = np.flatnonzero((np.mod(v, 1) != 0) | (v <= 0))
        if bad.size:
            i = int(bad[0])
            used = ", ".join(f"{s}={np.broadcast_to(c, v.shape).flat[i]:g}"
                             for s, c in zip(symbols, columns) if s in n.free_symbols)
            raise GuardError(f"loop {loop}: trip count {n} = {v.flat[i]:g} is not a positive "
                             f"integer at {used} ({bad.size} grid points fail)")
