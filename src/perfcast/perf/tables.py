"""Measured kernel tables: exact lookup by key, then interpolation that never extrapolates.

A table holds one kernel type's measurements: key columns (sizes, dtype, …) and ``latency_us``.
Lookup order: the exact key (a dict: O(1)); then 1-D linear interpolation along one continuous
axis among rows that match every other key; then N-D linear interpolation over all axes inside
the convex hull of the measured points (``scipy.interpolate.LinearNDInterpolator``). Outside
the measured range it misses, with the reason — it never extrapolates. An axis can be
interpolated in a transformed space (``sqrt`` for attention lengths, ``log``), per table.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

_TRANSFORMS = {"linear": lambda x: x, "sqrt": math.sqrt, "log": math.log}


@dataclass
class KernelTable:
    name: str
    keys: tuple[str, ...]
    axes: tuple[str, ...]
    rows: dict[tuple, float]
    transform: dict[str, str] = field(default_factory=dict)
    source: str = ""

    def __post_init__(self):
        for a in self.axes:
            if a not in self.keys:
                raise ValueError(f"table {self.name}: axis {a!r} is not a key column")
        for a, t in self.transform.items():
            if t not in _TRANSFORMS:
                raise ValueError(f"table {self.name}: unknown transform {t!r} for {a!r}")

    def _t(self, axis: str, x: float) -> float:
        return _TRANSFORMS[self.transform.get(axis, "linear")](float(x))

    @cached_property
    def _lines(self) -> dict[tuple[str, tuple], tuple[np.ndarray, np.ndarray]]:
        """(axis, the other keys' values) → sorted axis values and latencies."""
        lines: dict[tuple[str, tuple], list] = {}
        for key, lat in self.rows.items():
            for a in self.axes:
                i = self.keys.index(a)
                lines.setdefault((a, key[:i] + key[i + 1:]), []).append((float(key[i]), lat))
        return {k: (np.array([p[0] for p in sorted(v)]), np.array([p[1] for p in sorted(v)]))
                for k, v in lines.items()}

    @cached_property
    def _hulls(self) -> dict[tuple, object]:
        """The non-axis keys' values → an N-D interpolator over the axes."""
        from scipy.interpolate import LinearNDInterpolator

        groups: dict[tuple, list] = {}
        axis_idx = [self.keys.index(a) for a in self.axes]
        for key, lat in self.rows.items():
            rest = tuple(v for i, v in enumerate(key) if i not in axis_idx)
            groups.setdefault(rest, []).append(([self._t(a, key[i]) for a, i in zip(self.axes, axis_idx)], lat))
        out = {}
        for rest, pts in groups.items():
            if len(pts) > len(self.axes):
                try:
                    out[rest] = LinearNDInterpolator(np.array([p for p, _ in pts]), np.array([v for _, v in pts]))
                except Exception:  # degenerate point sets (collinear): no hull to interpolate in
                    continue
        return out

    @cached_property
    def _text_values(self) -> dict[str, set]:
        """A text key's measured values (a dtype, a routing), to name a value no row has."""
        return {k: {key[i] for key in self.rows} for i, k in enumerate(self.keys)
                if self.rows and all(isinstance(key[i], str) for key in self.rows)}

    def lookup(self, key: tuple) -> tuple[float, str] | str:
        """(latency µs, how) or the reason for a miss."""
        if key in self.rows:
            return self.rows[key], "exact"
        described = ", ".join(f"{k}={v}" for k, v in zip(self.keys, key))
        reasons = []
        for a in self.axes:
            i = self.keys.index(a)
            line = self._lines.get((a, key[:i] + key[i + 1:]))
            if line is None:
                continue
            xs, ys = line
            x = float(key[i])
            if xs[0] <= x <= xs[-1] and len(xs) >= 2:
                j = int(np.searchsorted(xs, x))
                x0, x1, y0, y1 = xs[j - 1], xs[j], ys[j - 1], ys[j]
                tx, t0, t1 = self._t(a, x), self._t(a, x0), self._t(a, x1)
                y = y0 + (y1 - y0) * (tx - t0) / (t1 - t0)
                return float(y), f"1-D in {a} between {a}={x0:g} and {a}={x1:g}"
            reasons.append(f"{a}={x:g} outside the measured range [{xs[0]:g}, {xs[-1]:g}]")
        if len(self.axes) > 1:
            axis_idx = [self.keys.index(a) for a in self.axes]
            rest = tuple(v for i, v in enumerate(key) if i not in axis_idx)
            interp = self._hulls.get(rest)
            if interp is not None:
                y = float(interp([[self._t(a, key[i]) for a, i in zip(self.axes, axis_idx)]])[0])
                if not math.isnan(y):
                    return y, f"N-D in ({', '.join(self.axes)}) inside the measured hull"
                reasons.append("outside the convex hull of the measured points")
        if not reasons:
            unmeasured = [f"{k}={v} (measured: {', '.join(sorted(self._text_values[k]))})"
                          for k, v in zip(self.keys, key) if k in self._text_values and v not in self._text_values[k]]
            reasons.append(f"no measurement at {'; '.join(unmeasured)}" if unmeasured
                           else "no measurement with these other keys")
        return f"{self.name}[{described}]: " + "; ".join(reasons)
