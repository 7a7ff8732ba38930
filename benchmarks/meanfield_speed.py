"""Benchmark: closed-form serving points per second.

Prices closed-loop points (vLLM policy, AffineStep, isl 1000, osl 200, concurrency 1…256, 512
slots) with :func:`perfcast.serving.meanfield.closed_loop`, next to a naive baseline measured in
the same run: the same steady state found by 200 halvings of the prompt rate (bisection instead
of Brent's method, and no memoised step prices). Both must agree; the script prints points/s and
microseconds per point for each.

Run: ``PYTHONPATH=src .venv/bin/python benchmarks/meanfield_speed.py``.
"""

from __future__ import annotations

import time

from perfcast.serving.meanfield import EngineConfig, Workload, _Model, _state, closed_loop
from perfcast.serving.types import AffineStep

STEP = AffineStep(0.008, 5e-5, 1e-8)
ENGINE = EngineConfig(policy="vllm", max_batch=512)


def naive_x(c: int) -> float:
    """Requests/s at concurrency c by bisection on the prompt rate, 200 halvings, fresh memo each."""
    load = Workload(1000, 200, concurrency=c)
    lo, hi = 0.0, min(c, 512) * 1.0 / 199
    for _ in range(200):
        mid = (lo + hi) / 2
        if _state(_Model(STEP, ENGINE, load), mid).inflight < min(c, 512):
            lo = mid
        else:
            hi = mid
    return _state(_Model(STEP, ENGINE, load), lo).x


def rate(fn, points: list[int]) -> tuple[float, list[float]]:
    t0 = time.perf_counter()
    out = [fn(c) for c in points]
    return len(points) / (time.perf_counter() - t0), out


def main() -> None:
    points = list(range(1, 257)) * 4
    fast, xs = rate(lambda c: closed_loop(STEP, ENGINE, Workload(1000, 200, concurrency=c)).requests_per_s, points)
    slow, ys = rate(naive_x, points[:256])
    worst = max(abs(x - y) / y for x, y in zip(xs, ys))
    print(f"closed form: {fast:,.0f} points/s ({1e6 / fast:.0f} µs/point)")
    print(f"naive bisection baseline: {slow:,.0f} points/s ({1e6 / slow:.0f} µs/point)")
    print(f"speed-up {fast / slow:.1f}×; largest relative difference in X {worst:.1e}")


if __name__ == "__main__":
    main()
