"""Benchmark: one cold ``perfcast text-generate`` run, as a new process.

Runs ``perfcast text-generate deepseek-v3 --device h200-sxm --decode --num-queries 64
--context-length 4096`` as a new process: with an empty capture cache (the model is captured),
with the cache the first run left (the symbolic capture is reused: no torch import), and with
``--no-reroll --no-cache`` (every one of the 61 decoder layers captured); and a bare
``python -c "import torch"`` — each ``--repeats`` times, in this run — and prints median wall
times and the ratios. Target: ≤ 4 s wall.

Run: ``make bench`` (or ``.venv/bin/python benchmarks/textgen_cold.py``).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

COMMAND = ["text-generate", "deepseek-v3", "--device", "h200-sxm", "--decode", "--num-queries", "64",
           "--context-length", "4096", "--json"]
TARGET_S = 4.0


def wall(argv: list[str], repeats: int, cache: str | None = None, fresh: bool = False) -> float:
    """Median wall time; ``cache`` is the XDG cache home, emptied before each run if ``fresh``."""
    env = dict(os.environ, XDG_CACHE_HOME=cache) if cache else None
    times = []
    for _ in range(repeats):
        if fresh and cache:
            shutil.rmtree(cache, ignore_errors=True)
        t0 = time.perf_counter()
        subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, env=env)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    perfcast = [sys.executable, "-m", "perfcast.cli.main"]
    cache = tempfile.mkdtemp(prefix="perfcast-bench-cache-")
    torch_s = wall([sys.executable, "-c", "import torch"], args.repeats)
    empty_s = wall(perfcast + COMMAND, args.repeats, cache, fresh=True)
    cached_s = wall(perfcast + COMMAND, args.repeats, cache)
    unrolled_s = wall(perfcast + COMMAND + ["--no-reroll", "--no-cache"], args.repeats, cache)
    shutil.rmtree(cache, ignore_errors=True)
    print(f"perfcast {' '.join(COMMAND[:-1])}  (median of {args.repeats} new processes)")
    print(f"  baseline: python -c 'import torch'          {torch_s:6.2f} s")
    print(f"  empty capture cache (captures the model)     {empty_s:6.2f} s  = {empty_s / torch_s:.2f}× import torch")
    print(f"  capture cache from an earlier run            {cached_s:6.2f} s  = {cached_s / torch_s:.2f}× import torch")
    print(f"  --no-reroll --no-cache (61 layers captured)  {unrolled_s:6.2f} s  = {unrolled_s / torch_s:.2f}× import torch")
    print(f"  target ≤ {TARGET_S:.0f} s wall: empty cache {'met' if empty_s <= TARGET_S else 'NOT met'}, "
          f"cached {'met' if cached_s <= TARGET_S else 'NOT met'}")


if __name__ == "__main__":
    main()
