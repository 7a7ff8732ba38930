"""Benchmark: evaluate the flash-attention closed-form time over a design-space grid.

Prints points per second for the lambdified closed form (NumPy, vectorised, parameter guard
included) next to the baseline measured in the same run: substituting points one by one into
the same SymPy expression (``xreplace`` + exact efficiency values + ``float``). Target: at least
1,000,000 points/s on one core.

Run: ``make bench`` (or ``.venv/bin/python benchmarks/flash_attention_grid.py``).
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402

from perfcast.hardware import get_device  # noqa: E402
from perfcast.kernels import get_kernel  # noqa: E402
from perfcast.perf import AnalyticPerformanceModel  # noqa: E402
from perfcast.rollup import rollup  # noqa: E402

TARGET = 1_000_000


def grid():
    axes = {
        "B": np.arange(1, 17),
        "H": np.arange(8, 136, 8),
        "T_q": np.arange(256, 2816, 256),
        "T_kv": np.arange(1024, 11264, 1024),
        "q_blk": 2 ** np.arange(0, 9),
        "kv_blk": 2 ** np.arange(2, 11),
    }
    mesh = np.meshgrid(*axes.values(), indexing="ij")
    return {k: m.ravel().astype(float) for k, m in zip(axes, mesh)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="h100-sxm")
    ap.add_argument("--baseline-points", type=int, default=300)
    args = ap.parse_args()

    spec = get_kernel("flash-attention")
    model = AnalyticPerformanceModel(get_device(args.device))
    t0 = time.perf_counter()
    r = rollup(spec.graph, model)
    f = r.lambdify()
    build_s = time.perf_counter() - t0

    g = grid()
    fixed = {"hd_qk": 128.0, "hd_v": 128.0}
    n = len(g["B"])
    cols = [g[s] if s in g else np.full(n, fixed[s]) for s in f.symbols]
    f(*[c[:1000] for c in cols])  # warm-up
    t0 = time.perf_counter()
    times = f(*cols)
    fast_s = time.perf_counter() - t0
    fast_rate = n / fast_s

    rng = np.random.default_rng(0)
    idx = rng.choice(n, size=args.baseline_points, replace=False)
    t0 = time.perf_counter()
    slow = []
    for i in idx:
        point = {r.symbol(s): int(c[i]) for s, c in zip(f.symbols, cols)}
        slow.append(float(model.realize(r.time_s.xreplace(point))))
    subs_s = time.perf_counter() - t0
    subs_rate = len(idx) / subs_s
    assert np.allclose(times[idx], slow, rtol=1e-9), "lambdify and subs disagree"

    print(f"flash-attention closed form on {args.device}: {n:,} design points "
          f"(B, H, T_q, T_kv, q_blk, kv_blk), rollup+lambdify built in {build_s:.2f} s")
    print(f"  lambdify (NumPy, guard included): {fast_s:.3f} s  → {fast_rate:,.0f} points/s")
    print(f"  baseline, SymPy xreplace one by one ({len(idx)} points): {subs_s:.3f} s  → {subs_rate:,.0f} points/s")
    print(f"  ratio lambdify / subs: {fast_rate / subs_rate:,.0f}×")
    print(f"  target ≥ {TARGET:,} points/s: {'met' if fast_rate >= TARGET else 'NOT met'}")


if __name__ == "__main__":
    main()
