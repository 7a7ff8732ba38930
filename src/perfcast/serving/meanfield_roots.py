"""The grid form's root search (:mod:`perfcast.serving.meanfield_grid`, step 3): on a segment of
prompt rates where every interpolant is linear in ``r``, the in-flight count (plus the requests on
their way in) reaching a target is a polynomial equation of degree at most three, solved by
Newton's method safeguarded by bisection (Press et al., Numerical Recipes, 3rd ed., §9.4,
``rtsafe``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from perfcast.serving.meanfield_grid import _Tables

_ITERATIONS = 100  # safeguarded Newton: quadratic near the root, bisection at worst (2^-100 of a segment)


def _linear(table: np.ndarray, fam: np.ndarray, x: np.ndarray, per_r: float) -> tuple[np.ndarray, np.ndarray]:
    """The interpolant of ``table`` at ``max(x, 1)`` on the integer segment holding ``x``, as
    ``c0 + c1 · r`` where ``x = per_r · r`` (constant below 1, where the count is held at 1)."""
    i = np.floor(np.maximum(x, 1.0))
    y = table[fam, i.astype(np.int64)]
    dy = np.where(x >= 1.0, table[fam, i.astype(np.int64) + 1] - y, 0.0)
    return y - i * dy, per_r * dy


def _roots(tb: _Tables, ends: tuple[np.ndarray, np.ndarray, np.ndarray], fam: np.ndarray,
           held: np.ndarray, lag: int = 0) -> np.ndarray:
    """The first ``r`` where the in-flight count (plus ``lag · r``; ``ends`` hold that sum) reaches
    ``held``, for each (family, held)."""
    efam, er, einf = ends
    # one sorted key over all families: family · span + running maximum of the in-flight count
    span = float(einf.max(initial=0.0)) + float(held.max(initial=0.0)) + 1.0
    run = np.maximum.accumulate(efam * span + einf)
    k = np.searchsorted(run, fam * span + held)
    last = np.searchsorted(efam, fam, side="right") - 1
    k = np.clip(k, 1, last)
    lo, hi, flo, fhi = er[k - 1], er[k], einf[k - 1], einf[k]
    poly = _polynomial(tb, fam, (lo + hi) / 2)
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.clip(lo + (held - flo) / (fhi - flo) * (hi - lo), lo, hi)
    r = np.where(np.isnan(r), lo, r)
    return _newton(poly, tb.a + lag, held, lo, hi, r)


def _polynomial(tb: _Tables, fam: np.ndarray, mid: np.ndarray) -> tuple[np.ndarray, ...]:
    """Coefficients ``(A0, A1, A2, B0, B1, B2)`` of a segment, with ``(in flight(r) − held) · A(r) =
    (a r − held) · A(r) + r · B(r)``: ``A = τ`` and ``B`` the TTFT service where a prompt rides
    fewer than one chunk step per step (``m r < 1``), else ``A = 1``, ``B = m`` (then ``TTFT = m τ``)."""
    f0, f1 = _linear(tb.decode, fam, mid * tb.a, tb.a)
    zero = np.zeros(len(mid))
    if tb.sglang:
        q = tb.q[fam]
        below, above = mid < 1.0, mid > q
        # b = clamp(r, 1, q): P(1) below 1, P(q) above q (the column past q, the last tabulated
        # count there, repeats it: slope 0), P(r) between; τ = f + (r / b) · P(b)
        p0, p1 = _linear(tb.prefill, fam, np.minimum(mid, q), 1.0)
        a0 = f0 + np.where(below | above, 0.0, p0)
        a1 = f1 + np.where(below, p0, np.where(above, p0 / q, p1))
        return a0, a1, zero, p0, p1, zero
    e0, e1 = _linear(tb.extra, fam, mid * tb.a, tb.a)
    s0, s1 = _linear(tb.steps, fam, mid * tb.a, tb.a)
    # τ = f + r ΔP; TTFT = m f + ΔP · max(1, m r): below the kink m f + ΔP, above it m τ
    under = (s0 + s1 * mid) * mid < 1.0
    return (np.where(under, f0, 1.0), np.where(under, f1 + e0, 0.0), np.where(under, e1, 0.0),
            np.where(under, s0 * f0 + e0, s0), np.where(under, s0 * f1 + s1 * f0 + e1, s1),
            np.where(under, s1 * f1, 0.0))


def _newton(poly: tuple[np.ndarray, ...], a: float, held: np.ndarray, lo: np.ndarray, hi: np.ndarray,
            r: np.ndarray) -> np.ndarray:
    """The root of ``P(r) = (a r − held) A(r) + r B(r)`` in ``[lo, hi]`` (``P(lo) < 0 ≤ P(hi)``):
    Newton steps that stay in the bracket, else bisection, the bracket shrunk at every step."""
    a0, a1, a2, b0, b1, b2 = poly
    for _ in range(_ITERATIONS):
        big_a = a0 + r * (a1 + r * a2)
        p = (a * r - held) * big_a + r * (b0 + r * (b1 + r * b2))
        dp = a * big_a + (a * r - held) * (a1 + 2 * r * a2) + b0 + r * (2 * b1 + 3 * r * b2)
        below = p < 0
        lo, hi = np.where(below, r, lo), np.where(below, hi, r)
        with np.errstate(divide="ignore", invalid="ignore"):
            step = r - p / dp
        step = np.where((step >= lo) & (step <= hi), step, (lo + hi) / 2)
        done = np.abs(step - r) <= 1e-15 * r
        r = step
        if done.all():
            break
    return r
