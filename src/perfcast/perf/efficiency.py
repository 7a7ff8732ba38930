"""Efficiency curves: achieved/peak as a function of a kernel's size.

A curve's points ``(size, efficiency)`` are joined by straight lines and held flat beyond the
first and last point: a size below the smallest measurement gets the smallest measured
efficiency (never an extrapolated one), a size above the largest gets the largest.

In closed forms a curve appears as an opaque function application, ``eff_matrix(size)``, which
keeps formulas readable; numbers replace it exactly at one point (:meth:`Efficiency.at`) or
vectorised (``numpy.interp``, the same piecewise-linear, flat-ended rule) in lambdified grids.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import sympy

from perfcast.hardware.device import exact
from perfcast.hardware.spec import Curve


@dataclass(frozen=True)
class Efficiency:
    unit: str  # matrix | vector | memory
    curve: Curve | None

    @property
    def func(self) -> type[sympy.Function]:
        return sympy.Function(f"eff_{self.unit}", positive=True)

    def __call__(self, size: sympy.Expr) -> sympy.Expr:
        """The efficiency at ``size``: a number when ``size`` is one, else ``eff_<unit>(size)``;
        ``1`` (peak) when the device has no curve for this unit."""
        if self.curve is None:
            return sympy.Integer(1)
        size = sympy.sympify(size)
        return self.at(size) if size.is_number else self.func(size)

    def at(self, size: sympy.Expr) -> sympy.Rational:
        """Exact piecewise-linear value at a numeric ``size``."""
        pts = [(exact(x), exact(e)) for x, e in self.curve.points]
        if size <= pts[0][0]:
            return pts[0][1]
        for (x0, e0), (x1, e1) in zip(pts, pts[1:]):
            if size <= x1:
                return e0 + (e1 - e0) * (sympy.Rational(size) - x0) / (x1 - x0)
        return pts[-1][1]

    def numpy(self):
        """Vectorised value (float), for ``lambdify`` modules."""
        xs = np.array([x for x, _ in self.curve.points], dtype=float)
        es = np.array([e for _, e in self.curve.points], dtype=float)
        return lambda size: np.interp(size, xs, es)

    def realize(self, expr: sympy.Expr) -> sympy.Expr:
        """Replace ``eff_<unit>(n)`` applications whose argument is a number by exact values."""
        if self.curve is None:
            return expr
        return expr.replace(self.func, lambda size: self.at(size) if size.is_number else self.func(size))
