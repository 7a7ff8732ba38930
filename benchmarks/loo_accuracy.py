"""Benchmark: leave-one-out accuracy of the interpolating lookup on measured tables.

For each table of a profiling database (default: the H200 database shipped with perfcast,
converted from aiconfigurator-core's measurements), sample rows, hide each one, predict it
from the rest exactly as a lookup would (only rows sharing the hidden row's non-axis keys can
take part, so the sub-table of those rows reproduces the full lookup), and print the median and
p90 relative error, and the share of hidden rows that could not be predicted (outside the
measured range once hidden: a miss, never an extrapolation). Target: median ≤ 5 %.

Run: ``make bench`` (or ``.venv/bin/python benchmarks/loo_accuracy.py [--database DIR]``).
"""

from __future__ import annotations

import argparse
import random

import numpy as np

from perfcast.perf.profiling import ProfilingDataSource, find_database
from perfcast.perf.tables import KernelTable

TARGET_MEDIAN = 0.05


def loo(table: KernelTable, samples: int, rng: random.Random) -> tuple[list[float], int, int]:
    axis_idx = [table.keys.index(a) for a in table.axes]
    groups: dict[tuple, dict] = {}
    for key, lat in table.rows.items():
        rest = tuple(v for i, v in enumerate(key) if i not in axis_idx)
        groups.setdefault(rest, {})[key] = lat
    keys = list(table.rows)
    picked = rng.sample(keys, min(samples, len(keys)))
    errors, misses = [], 0
    for key in picked:
        rest = tuple(v for i, v in enumerate(key) if i not in axis_idx)
        others = {k: v for k, v in groups[rest].items() if k != key}
        sub = KernelTable(table.name, table.keys, table.axes, others, table.transform)
        got = sub.lookup(key) if others else "empty"
        if isinstance(got, str):
            misses += 1
            continue
        errors.append(abs(got[0] - table.rows[key]) / table.rows[key])
    return errors, misses, len(picked)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--database", help="a database directory (default: shipped h200-sxm)")
    ap.add_argument("--samples", type=int, default=300)
    args = ap.parse_args()
    src = ProfilingDataSource(find_database("h200-sxm", args.database))
    rng = random.Random(0)
    print(f"leave-one-out on {src.root} ({args.samples} sampled rows per table)")
    print(f"  {'table':22s} {'rows':>8s} {'predicted':>10s} {'median':>8s} {'p90':>8s}  target median ≤ 5 %")
    for name, table in sorted(src.tables.items()):
        if not table.axes:
            continue
        errors, misses, n = loo(table, args.samples, rng)
        if not errors:
            print(f"  {name:22s} {len(table.rows):8,d} {0:>10d}        —        —  (every hidden row misses)")
            continue
        med, p90 = float(np.median(errors)), float(np.percentile(errors, 90))
        print(f"  {name:22s} {len(table.rows):8,d} {n - misses:>4d}/{n:<5d} {100 * med:7.2f}% {100 * p90:7.2f}%  "
              f"{'met' if med <= TARGET_MEDIAN else 'NOT met'}")


if __name__ == "__main__":
    main()
