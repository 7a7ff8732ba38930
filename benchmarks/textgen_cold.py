"""Benchmark: one cold ``perfcast text-generate`` run, as a new process.

Runs ``perfcast text-generate deepseek-v3 --device h200-sxm --decode --num-queries 64
--context-length 4096`` (re-roll on, the default), the same with ``--no-reroll`` (every one of
the 61 decoder layers captured), and a bare ``python -c "import torch"`` — each ``--repeats``
times, in this run — and prints median wall times and the ratios. Target: ≤ 4 s wall.

Run: ``make bench`` (or ``.venv/bin/python benchmarks/textgen_cold.py``).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

COMMAND = ["text-generate", "deepseek-v3", "--device", "h200-sxm", "--decode", "--num-queries", "64",
           "--context-length", "4096", "--json"]
TARGET_S = 4.0


def wall(argv: list[str], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    perfcast = [sys.executable, "-m", "perfcast.cli.main"]
    torch_s = wall([sys.executable, "-c", "import torch"], args.repeats)
    run_s = wall(perfcast + COMMAND, args.repeats)
    unrolled_s = wall(perfcast + COMMAND + ["--no-reroll"], args.repeats)
    print(f"perfcast {' '.join(COMMAND[:-1])}  (median of {args.repeats} cold runs)")
    print(f"  baseline: python -c 'import torch'        {torch_s:6.2f} s")
    print(f"  re-roll (default)                          {run_s:6.2f} s  = {run_s / torch_s:.2f}× import torch")
    print(f"  --no-reroll (all 61 layers captured)       {unrolled_s:6.2f} s  = {unrolled_s / torch_s:.2f}× import torch")
    print(f"  target ≤ {TARGET_S:.0f} s wall: {'met' if run_s <= TARGET_S else 'NOT met'}")


if __name__ == "__main__":
    main()
