"""The Pareto front of serving points: output tokens/s per device against tokens/s per user, both
maximised (the two axes of aiconfigurator's and InferenceMAX's throughput–interactivity plots).

A point is on the front when no other point is at least as good on both axes and better on one.
Sorted by the first axis descending (ties: the second descending), a point is on the front exactly
when its second coordinate beats every one before it — one running maximum after an ``O(n log n)`` sort
(Kung, Luccio and Preparata 1975, "On finding the maxima of a set of vectors", J. ACM 22(4)).
"""

from __future__ import annotations

import numpy as np


def front(x, y) -> np.ndarray:
    """Indices of the points ``(x[i], y[i])`` on the front (both maximised), ordered by ``y``
    ascending (along the curve from the most tokens/s per device to the most per user).
    Duplicates of a front point are kept once (the first index)."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if x.shape != y.shape or x.ndim != 1:
        raise ValueError("front: x and y must be 1-d and of one length")
    if x.size == 0:
        return np.zeros(0, dtype=int)
    order = np.lexsort((-y, -x))          # x descending, then y descending
    ys = y[order]
    before = np.concatenate(([-np.inf], np.maximum.accumulate(ys)[:-1]))
    keep = order[ys > before]
    return keep[np.argsort(y[keep], kind="stable")]
