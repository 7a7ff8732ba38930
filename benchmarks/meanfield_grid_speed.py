"""Benchmark: closed-loop design points per second of the grid form, one core.

Qwen3-32B on H200 SXM under vLLM at TP 1, 2, 4 and 8 (one compiled step model per layout, its
KV capacity from the memory model at 0.9 of the memory), 64 prompt lengths from 128 to 8192
tokens, osl 1024, batch limits 1, 2, 4 … 512 and concurrencies 1 … 512: 4 × 64 × 10 × 512 =
1,310,720 points, priced by :func:`perfcast.serving.meanfield_grid.closed_loop_grid` (one call
per layout; the families' tables, segments and roots included in the time). Next to it, in the
same run: the grid with one point per family (what the tables, segments and one root cost), the
grid at the search's operating point (concurrency = batch limit: 10 points per family), and the
scalar :func:`perfcast.serving.meanfield.closed_loop` on a random subset of the points, whose
figures the grid must match (relative difference ≤ 1e-9 on TTFT, TPOT, requests/s, mean batch).

Every measurement follows one untimed warm-up pass (the step models' first calls, the scalar
path's attention rows). The process is pinned to its first allowed CPU
(``os.sched_setaffinity``): one core. Compiling the step models is not counted (both forms
need them; ``benchmarks/step_speed.py`` times it).

Run: ``PYTHONPATH=src .venv/bin/python benchmarks/meanfield_grid_speed.py [--subset N]``.
"""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import replace

import numpy as np

from perfcast.capture.parallel import Layout
from perfcast.serving.meanfield import EngineConfig, Workload, closed_loop
from perfcast.serving.meanfield_grid import closed_loop_grid
from perfcast.serving.memory import kv_capacity_tokens, memory_of
from perfcast.serving.step import Deployment, compile_step

MODEL, DEVICE, ENGINE = "qwen3-32b", "h200-sxm", "vllm"
TPS = (1, 2, 4, 8)
ISL = np.linspace(128, 8192, 64).astype(np.int64)
OSL = 1024
BATCHES = 2 ** np.arange(10)
CONCURRENCY = np.arange(1, 513)
BUDGET = 8192
FIGURES = ("ttft_s", "tpot_s", "requests_per_s", "mean_batch")


def layouts() -> list[tuple[object, EngineConfig]]:
    """(step model, engine) per layout: the step compiled for the budget plus a full decode batch."""
    out = []
    for tp in TPS:
        dep = Deployment(MODEL, DEVICE, ENGINE, Layout(tp=tp))
        kv = kv_capacity_tokens(memory_of(dep, BUDGET), 0.9, "total", 16)
        out.append((compile_step(dep, max_tokens=BUDGET + int(BATCHES.max())),
                    EngineConfig(policy=ENGINE, max_num_tokens=BUDGET, kv_capacity_tokens=kv, devices=tp)))
    return out


def timed(fn) -> float:
    fn()
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--subset", type=int, default=2000, help="points priced by the scalar closed form too")
    args = parser.parse_args()
    cpu = min(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpu})
    steps = layouts()
    isl, mb, c = ISL[:, None, None], BATCHES[None, :, None], CONCURRENCY[None, None, :]
    points = len(steps) * ISL.size * BATCHES.size * CONCURRENCY.size
    grids: list = []

    def full():
        grids[:] = [closed_loop_grid(s, e, isl, OSL, c, max_batch=mb) for s, e in steps]

    t_full = timed(full)
    top = BATCHES.max()
    t_tables = timed(lambda: [closed_loop_grid(s, e, ISL, OSL, top, max_batch=top) for s, e in steps])
    t_search = timed(lambda: [closed_loop_grid(s, e, ISL[:, None], OSL, BATCHES, max_batch=BATCHES) for s, e in steps])
    states = sum(g.states for g in grids)

    rng = np.random.default_rng(0)
    pick = [(int(rng.integers(len(steps))), int(rng.integers(ISL.size)), int(rng.integers(BATCHES.size)),
             int(rng.integers(CONCURRENCY.size))) for _ in range(args.subset)]
    scalar: list = []

    def one_by_one():
        scalar[:] = [closed_loop(steps[l][0], replace(steps[l][1], max_batch=int(BATCHES[b])),
                                 Workload(int(ISL[i]), OSL, concurrency=int(CONCURRENCY[j]))) for l, i, b, j in pick]

    t_scalar = timed(one_by_one)
    worst = max(abs(float(getattr(grids[l], name)[i, b, j]) / value - 1)
                for (l, i, b, j), r in zip(pick, scalar)
                for name, value in zip(FIGURES, (r.ttft_s.mean, r.tpot_s.mean, r.requests_per_s, r.mean_batch)))
    bound = sum(int(g.budget_bound.sum()) for g in grids)

    grid_rate, scalar_rate = points / t_full, len(pick) / t_scalar
    families = len(steps) * ISL.size
    print(f"one core (cpu {cpu}); {MODEL} on {DEVICE}, {ENGINE}, TP {', '.join(map(str, TPS))}; "
          f"{ISL.size} prompt lengths × {BATCHES.size} batch limits × {CONCURRENCY.size} concurrencies")
    print(f"grid:   {points:,} points in {t_full:.3f} s = {grid_rate:,.0f} points/s "
          f"({states:,} engine states solved, {bound:,} points bound by the token budget)")
    print(f"        of which the {families} families' tables, segments and one root each: {t_tables:.3f} s "
          f"({t_tables / families * 1e3:.2f} ms a family); "
          f"the rest {(t_full - t_tables) / points * 1e9:.0f} ns a point")
    print(f"        at the search's operating point (concurrency = batch limit): {families * BATCHES.size:,} points "
          f"in {t_search:.3f} s = {families * BATCHES.size / t_search:,.0f} points/s")
    print(f"scalar: {len(pick):,} points in {t_scalar:.3f} s = {scalar_rate:,.0f} points/s")
    print(f"grid ÷ scalar: {grid_rate / scalar_rate:,.0f}×; largest relative difference over "
          f"{', '.join(FIGURES)} on the subset: {worst:.1e}")
    assert worst <= 1e-9, worst


if __name__ == "__main__":
    main()
