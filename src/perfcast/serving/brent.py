"""Brent's method for a bracketed root, as ``scipy.optimize.brentq`` computes it.

The closed forms find every steady state by one scalar root (:mod:`perfcast.serving.meanfield`,
:mod:`perfcast.serving.meanfield_disagg`). SciPy's ``brentq`` is a small C loop
(``scipy/optimize/Zeros/brentq.c``, Charles Harris); importing ``scipy.optimize`` for it costs a
new process more than the rest of the serving layer's imports, so the loop is written here
statement for statement: the same IEEE double operations in the same order give the same iterates
and the same root bit for bit (``tests/test_brent.py`` compares it with SciPy's on random
brackets). The wrapper's checks are kept: a NaN value raises ``ValueError`` (SciPy's
``_wrap_nan_raise``), as do equal signs at the ends; no convergence in ``maxiter`` steps raises
``RuntimeError`` (SciPy's ``disp=True``).

Brent, R. P. 1973, *Algorithms for Minimization Without Derivatives*, ch. 3–4.
"""

from __future__ import annotations

import math

_EPS_RTOL = 4 * 2.220446049250313e-16   # SciPy's smallest rtol: 4 · machine epsilon


def brentq(f, a: float, b: float, *, xtol: float = 2e-12, rtol: float = _EPS_RTOL, maxiter: int = 100) -> float:
    """A root of ``f`` in ``[a, b]`` (``f(a)`` and ``f(b)`` of opposite signs, or one zero)."""
    if xtol <= 0:
        raise ValueError(f"xtol too small ({xtol:g} <= 0)")
    if rtol < _EPS_RTOL:
        raise ValueError(f"rtol too small ({rtol:g} < {_EPS_RTOL:g})")

    def value(x: float) -> float:
        fx = float(f(x))
        if math.isnan(fx):
            raise ValueError(f"The function value at x={x} is NaN; solver cannot continue.")
        return fx

    xpre, xcur = float(a), float(b)
    xblk = fblk = spre = scur = 0.0
    fpre, fcur = value(xpre), value(xcur)
    if fpre == 0:
        return xpre
    if fcur == 0:
        return xcur
    if _negative(fpre) == _negative(fcur):
        raise ValueError("f(a) and f(b) must have different signs")
    for _ in range(maxiter):
        if fpre != 0 and fcur != 0 and _negative(fpre) != _negative(fcur):
            xblk, fblk = xpre, fpre
            spre = scur = xcur - xpre
        if abs(fblk) < abs(fcur):
            xpre, xcur, xblk = xcur, xblk, xcur
            fpre, fcur, fblk = fcur, fblk, fcur
        delta = (xtol + rtol * abs(xcur)) / 2
        sbis = (xblk - xcur) / 2
        if fcur == 0 or abs(sbis) < delta:
            return xcur
        if abs(spre) > delta and abs(fcur) < abs(fpre):
            try:
                if xpre == xblk:   # interpolate
                    stry = -fcur * (xcur - xpre) / (fcur - fpre)
                else:              # extrapolate (inverse quadratic)
                    dpre = (fpre - fcur) / (xpre - xcur)
                    dblk = (fblk - fcur) / (xblk - xcur)
                    stry = -fcur * (fblk * dblk - fpre * dpre) / (dblk * dpre * (fblk - fpre))
            except ZeroDivisionError:   # C's division gives ±inf or NaN: no short step, a bisection
                stry = math.inf
            bound = abs(spre) if abs(spre) < 3 * abs(sbis) - delta else 3 * abs(sbis) - delta
            if 2 * abs(stry) < bound:   # a good short step
                spre, scur = scur, stry
            else:
                spre = scur = sbis
        else:
            spre = scur = sbis
        xpre, fpre = xcur, fcur
        xcur += scur if abs(scur) > delta else (delta if sbis > 0 else -delta)
        fcur = value(xcur)
    raise RuntimeError(f"Failed to converge after {maxiter} iterations, value is {xcur}")


def _negative(x: float) -> bool:
    """C's ``signbit``: the sign, not the product's (which underflows to zero for tiny values)."""
    return math.copysign(1.0, x) < 0
