"""Benchmark: the deployment search's screening on Ray — design points per second with 1, 2 and all
local workers, next to the local executor, in the same run (issue 14).

The space: Llama-3.1-8B on H100 and H200, 8 devices, aggregated and disaggregated, every layout and
batch limit (each group — one deployment's sweep of batch limits — is one Ray task; each worker
compiles the step models of the groups it gets). Every executor's result must equal the local one's
(the front, the best, the rejected counts); the run fails otherwise.

Run: ``.venv/bin/python benchmarks/sweep_ray.py`` (part of ``make bench``).
"""

from __future__ import annotations

import os
import time

from perfcast.search.executor import LocalExecutor, RayExecutor
from perfcast.search.optimize import SearchSpec, optimize
from perfcast.serving.types import SLO

SPEC = SearchSpec("llama-3.1-8b", ("h100-sxm", "h200-sxm"), 8, 2000, 200, SLO(ttft_s=1.0, tpot_s=0.02),
                  modes=("agg", "disagg"), confirm=0)


def _key(r):
    return ([p.candidate for p in r.front], r.best and r.best.candidate, r.rejected, len(r.points))


def main() -> None:
    runs = []
    t0 = time.perf_counter()
    local = optimize(SPEC, executor=LocalExecutor())
    runs.append(("local executor (this process)", time.perf_counter() - t0, local))
    cpus = os.cpu_count() or 1
    for workers in sorted({1, 2, cpus}):
        ex = RayExecutor(workers)
        try:
            t0 = time.perf_counter()
            r = optimize(SPEC, executor=ex)
            runs.append((f"ray, {workers} worker(s)", time.perf_counter() - t0, r))
        finally:
            ex.close()
        assert _key(r) == _key(local), f"ray with {workers} workers differs from the local executor"
    n = local.candidates_evaluated
    print(f"perfcast optimize {SPEC.model} on {SPEC.total_devices} × {{{', '.join(SPEC.devices)}}}, agg + disagg: "
          f"{n} design points ({len(local.front)} on the front); results identical across executors")
    base = runs[0][2].timings_s["screen"]
    for label, wall, r in runs:
        s = r.timings_s["screen"]
        print(f"  {label:34s} screen {s:7.2f} s = {n / s:8.1f} points/s ({base / s:4.2f}× local)   total {wall:6.2f} s")


if __name__ == "__main__":
    main()
