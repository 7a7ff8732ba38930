"""Calibrated kernel time: a roofline with a soft knee and kernel-launch granularity, fitted per
kernel class on measured kernels.

A kernel of class *c* (a GEMM of one dtype, decode attention, a fused MoE, ...) with matrix work
``W`` FLOPs, ``Q`` bytes of HBM traffic and ``n_i`` units of serial work of each kind *i* takes

    t = s + (T_c^p + T_m^p + Σ_i T_i^p)^(1/p) · exp(r(x₁, x₂))
    T_c = W / (R · e_c(W)),     T_m = Q / (B · e_m(Q)),     T_i = n_i · τ_i
    e(x) = f / (1 + (x₀ / x)^a)

- ``R``, ``B``: the device's datasheet matrix rate (for the class's dtype) and HBM bandwidth, so
  every fitted figure is a fraction of a datasheet peak and carries over to a device of the same
  architecture with other peaks (an H200 is an H100 with faster HBM).
- ``e``: the share of peak a kernel of that size reaches, rising from 0 to ``f`` around
  ``x₀ = t½ · peak`` with steepness ``a`` — the ramp-up and tail of a kernel over the machine
  (Williams et al., "Roofline", CACM 2009, §5 on ceilings below the peak). The half size is
  fitted as a time ``t½``: the work in flight a kernel needs to cover the machine's latency
  (Little's law), which scales with the peak rate across devices of one architecture.
- ``p``: how well a kernel overlaps its loads with its math. The p-norm is the generalized mean
  that joins the two classical limits: ``p → ∞`` is the roofline's ``max`` (perfect overlap),
  ``p = 1`` their sum (none); the fitted ``p`` is the kernel family's knee.
- ``T_i``: work that does not parallelise over the machine — the K loop of a GEMM that has fewer
  output tiles than SMs, per-CTA set-up of attention over many short sequences — each count
  ``n_i`` with a fitted time per unit ``τ_i``.
- ``s``: the fixed time of one kernel as measured (the tables are timed as CUDA-graph replays
  of repeated kernels, so ``s`` holds the in-graph launch gap and nothing is added per launch).
- ``r``: an optional residual, the median log-ratio of measured to fitted time on a coarse grid of
  two log₂ shape axes, bilinear between cell centres and flat beyond them: it keeps what the
  smooth form cannot express (kernel selection switching tiles or split-K at some sizes).

All numbers are floats here: this is the numeric edge where a fitted curve is evaluated; the
analytic model turns results into exact rationals or opaque functions of symbolic sizes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np


@dataclass(frozen=True)
class Ramp:
    """``e(x) = peak_fraction / (1 + (half_time_s · peak / x) ** slope)``: the half size is the
    work the peak rate does in ``half_time_s``, so the ramp is a time — work in flight over a
    latency (Little's law) — and carries over to a device with another peak (an H200 keeps an
    H100's memory latency at 1.43 times its bandwidth)."""

    peak_fraction: float
    half_time_s: float
    slope: float

    def __call__(self, x, peak: float):
        x = np.maximum(np.asarray(x, dtype=float), 1e-300)
        return self.peak_fraction / (1.0 + (self.half_time_s * peak / x) ** self.slope)


@dataclass(frozen=True)
class Residual:
    """Median log-ratio (measured / fitted) on cell centres of two log₂ axes."""

    axes: tuple[str, str]
    centres: tuple[tuple[float, ...], tuple[float, ...]]
    log_ratio: tuple[tuple[float, ...], ...]  # [i][j] at (centres[0][i], centres[1][j])

    def __call__(self, x1, x2):
        # Bilinear on the rectilinear grid of cell centres — what scipy's RegularGridInterpolator
        # (method="linear") computes, written out with NumPy because importing scipy.interpolate
        # (with scipy.special and scipy.optimize) costs a new process a quarter of a second, on the
        # path of every priced step (issue 13's cold start). tests/test_kernel_calibration.py checks
        # it against RegularGridInterpolator. The clamps are ``np.minimum(np.maximum(…))``, which
        # give ``np.clip``'s values without its Python dispatch, and the indexing and arithmetic
        # broadcast a scalar axis against an array one: a step model's attention rows call this once
        # per kernel per row (benchmarks/step_speed.py).
        c1, c2, grid = self._arrays
        a = np.minimum(np.maximum(np.log2(np.maximum(np.asarray(x1, dtype=float), 1e-300)), c1[0]), c1[-1])
        b = np.minimum(np.maximum(np.log2(np.maximum(np.asarray(x2, dtype=float), 1e-300)), c2[0]), c2[-1])
        i = np.minimum(np.maximum(np.searchsorted(c1, a, side="right") - 1, 0), len(c1) - 2)
        j = np.minimum(np.maximum(np.searchsorted(c2, b, side="right") - 1, 0), len(c2) - 2)
        u = (a - c1[i]) / (c1[i + 1] - c1[i])
        v = (b - c2[j]) / (c2[j + 1] - c2[j])
        return ((1 - u) * (1 - v) * grid[i, j] + u * (1 - v) * grid[i + 1, j]
                + (1 - u) * v * grid[i, j + 1] + u * v * grid[i + 1, j + 1])

    @cached_property
    def _arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The centres and the grid as arrays, converted once."""
        return (np.asarray(self.centres[0], dtype=float), np.asarray(self.centres[1], dtype=float),
                np.asarray(self.log_ratio, dtype=float))


@dataclass(frozen=True)
class KernelWork:
    """What a kernel does, in the terms the fitted form prices: matrix FLOPs, HBM bytes, serial
    work counts by name, and the residual's shape axes by name. Values are NumPy arrays (fitting
    and grids) or SymPy expressions (a leaf's closed form)."""

    flops: object
    bytes: object
    items: Mapping[str, object] = field(default_factory=dict)
    axes: Mapping[str, object] = field(default_factory=dict)


@dataclass(frozen=True)
class KernelFit:
    static_s: float
    overlap: float  # p
    compute: Ramp | None = None
    memory: Ramp | None = None
    item_s: Mapping[str, float] = field(default_factory=dict)
    residual: Residual | None = None

    def terms(self, work: KernelWork, rate: float, bandwidth: float) -> dict[str, np.ndarray]:
        """The competing times before the p-norm: ``compute``, ``memory`` and one per item."""
        out: dict[str, np.ndarray] = {}
        if self.compute is not None:
            w = np.asarray(work.flops, dtype=float)
            out["compute"] = w / (rate * self.compute(w, rate))
        if self.memory is not None:
            q = np.asarray(work.bytes, dtype=float)
            out["memory"] = q / (bandwidth * self.memory(q, bandwidth))
        for name, tau in self.item_s.items():
            out[f"items.{name}"] = np.asarray(work.items[name], dtype=float) * tau
        return out

    def time(self, work: KernelWork, rate: float, bandwidth: float) -> np.ndarray:
        terms = self.terms(work, rate, bandwidth)
        p = self.overlap
        body = sum(t ** p for t in terms.values()) ** (1.0 / p) if terms else 0.0
        if self.residual is not None:
            a, b = self.residual.axes
            body = body * np.exp(self.residual(work.axes[a], work.axes[b]))
        return self.static_s + body
