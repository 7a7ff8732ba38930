"""Benchmark: profiling-database lookups per second (indexed, not scanned).

Builds a MatMul table of 20 × 20 × 20 shapes (8,000 rows) in memory, then times
``KernelTable.lookup`` for exact hits and for 1-D interpolated queries (M between two measured
rows), next to a linear scan over the same rows measured in the same run (what an unindexed
lookup costs). Targets: ≥ 100,000 exact lookups/s and ≥ 10,000 interpolated lookups/s.

Run: ``make bench`` (or ``.venv/bin/python benchmarks/lookup_speed.py``).
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import numpy as np

from perfcast.ir import Tensor, make_leaf
from perfcast.perf.profiling import ProfilingDataSource
from perfcast.perf.tables import KernelTable

TARGET_EXACT, TARGET_INTERP = 100_000, 10_000


def main() -> None:
    sizes = [int(x) for x in np.geomspace(16, 16384, 20).round()]
    rows = {(m, k, n, "bf16"): 1.0 + m * k * n * 1e-9 for m in sizes for k in sizes for n in sizes}
    table = KernelTable("MatMul", ("M", "K", "N", "dtype"), ("M",), rows)
    keys = list(rows)
    rng = np.random.default_rng(0)
    exact = [keys[i] for i in rng.integers(0, len(keys), 50_000)]
    between = []
    for i in rng.integers(0, len(keys), 20_000):
        m, k, n, d = keys[i]
        j = sizes.index(m)
        if j + 1 < len(sizes):
            between.append(((m + sizes[j + 1]) // 2, k, n, d))
    table.lookup(between[0])  # build the index once

    t0 = time.perf_counter()
    for key in exact:
        table.lookup(key)
    exact_rate = len(exact) / (time.perf_counter() - t0)
    t0 = time.perf_counter()
    for key in between:
        assert not isinstance(table.lookup(key), str)
    interp_rate = len(between) / (time.perf_counter() - t0)
    items = list(rows.items())
    t0 = time.perf_counter()
    for key in exact[:200]:
        next(v for k, v in items if k == key)
    scan_rate = 200 / (time.perf_counter() - t0)

    # The same through ProfilingDataSource.lookup(leaf): op mapping, features, table.
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        (root / "op_mapping.yaml").write_text(
            "schema: 1\ndevice: x\nframework: bench\nversion: '0'\n"
            "kernels:\n  MatMul: {file: MatMul.csv, keys: [M, K, N, dtype], axes: [M]}\n"
            "ops:\n  aten.mm.default: {category: compute, kernel_type: MatMul}\n")
        (root / "MatMul.csv").write_text("M,K,N,dtype,latency_us\n" + "".join(
            f"{m},{k},{n},{dt},{v}\n" for (m, k, n, dt), v in rows.items()))
        src = ProfilingDataSource(root)

        def leaf(m, k, n, dt):
            a, b, c = Tensor("a", (m, k), dt), Tensor("b", (k, n), dt), Tensor("c", (m, n), dt)
            return make_leaf("matmul", "mm", (a, b), (c,), op="aten.mm.default")

        exact_leaves = [leaf(*key) for key in exact[:20_000]]
        between_leaves = [leaf(*key) for key in between[:10_000]]
        src.lookup(between_leaves[0])
        t0 = time.perf_counter()
        for x in exact_leaves:
            src.lookup(x)
        leaf_exact = len(exact_leaves) / (time.perf_counter() - t0)
        t0 = time.perf_counter()
        for x in between_leaves:
            src.lookup(x)
        leaf_interp = len(between_leaves) / (time.perf_counter() - t0)

    print(f"MatMul table: {len(rows):,} rows")
    print(f"  KernelTable.lookup, exact:        {exact_rate:12,.0f} lookups/s  (target ≥ {TARGET_EXACT:,}: "
          f"{'met' if exact_rate >= TARGET_EXACT else 'NOT met'})")
    print(f"  KernelTable.lookup, interpolated: {interp_rate:12,.0f} lookups/s  (target ≥ {TARGET_INTERP:,}: "
          f"{'met' if interp_rate >= TARGET_INTERP else 'NOT met'})")
    print(f"  ProfilingDataSource.lookup(leaf), exact:        {leaf_exact:10,.0f} lookups/s  (target ≥ "
          f"{TARGET_EXACT:,}: {'met' if leaf_exact >= TARGET_EXACT else 'NOT met'})")
    print(f"  ProfilingDataSource.lookup(leaf), interpolated: {leaf_interp:10,.0f} lookups/s  (target ≥ "
          f"{TARGET_INTERP:,}: {'met' if leaf_interp >= TARGET_INTERP else 'NOT met'})")
    print(f"  baseline, linear scan: {scan_rate:10,.0f} lookups/s  (indexed exact is {exact_rate / scan_rate:,.0f}× faster)")


if __name__ == "__main__":
    main()
