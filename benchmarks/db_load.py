"""Benchmark: loading the shipped profiling databases, and what they weigh.

A database is loaded once per process (``perfcast.perf.profiling.load_database`` is cached), so
its load time is paid by every command that prices with ``--performance-model profiling``.
For each shipped database this prints the rows, the compressed (``.csv.gz``, as shipped) and raw
(decompressed) sizes and the time to load it; then, in the same run, the biggest one loaded
again from a plain-CSV copy (the baseline the gzip tables replace). pandas' own import is timed
apart: any command that loads a table pays it once, database or not. Target: the biggest
database loads in ≤ 2 s.

Run: ``make bench`` (or ``.venv/bin/python benchmarks/db_load.py``).
"""

from __future__ import annotations

import gzip
import shutil
import tempfile
import time
from pathlib import Path

TARGET_S = 2.0


def _load_s(root: Path) -> tuple[float, int]:
    from perfcast.perf.profiling import ProfilingDataSource

    t0 = time.perf_counter()
    src = ProfilingDataSource(root)  # uncached: a fresh load
    return time.perf_counter() - t0, sum(len(t.rows) for t in src.tables.values())


def _sizes(root: Path) -> tuple[int, int]:
    packed = raw = 0
    for path in root.glob("*.csv.gz"):
        packed += path.stat().st_size
        raw += len(gzip.decompress(path.read_bytes()))
    return packed, raw


def main() -> None:
    t0 = time.perf_counter()
    import pandas  # noqa: F401

    pandas_s = time.perf_counter() - t0
    from perfcast.perf.databases import databases, shipped_root

    print(f"import pandas: {pandas_s:.2f} s (once per process, not counted below)")
    print(f"  {'database':34s} {'rows':>9s} {'gzip MB':>8s} {'raw MB':>8s} {'load s':>7s}")
    total_packed = total_raw = 0
    biggest = None
    for db in databases():
        seconds, rows = _load_s(db.path)
        packed, raw = _sizes(db.path)
        total_packed, total_raw = total_packed + packed, total_raw + raw
        print(f"  {f'{db.device}/{db.framework}/{db.version}':34s} {rows:9,d} {packed / 1e6:8.2f} {raw / 1e6:8.2f} "
              f"{seconds:7.2f}")
        if biggest is None or rows > biggest[1]:
            biggest = (db, rows, seconds)
    comm = sum(p.stat().st_size for p in shipped_root().glob("*/nccl/*/*.csv.gz"))
    print(f"  all tables: {total_packed / 1e6:.1f} MB gzip (and {comm / 1e3:.0f} kB of NCCL tables), "
          f"{total_raw / 1e6:.1f} MB raw")
    db, rows, seconds = biggest
    with tempfile.TemporaryDirectory() as d:
        plain = Path(d) / db.device / db.framework / db.version
        shutil.copytree(db.path, plain)
        shutil.copytree(db.path.parent.parent / "nccl", plain.parent.parent / "nccl")
        for path in plain.glob("*.csv.gz"):
            path.with_name(path.name[:-3]).write_bytes(gzip.decompress(path.read_bytes()))
            path.unlink()
        mapping = plain / "op_mapping.yaml"
        mapping.write_text(mapping.read_text().replace(".csv.gz", ".csv"))
        baseline, _ = _load_s(plain)
    verdict = "met" if seconds <= TARGET_S else "NOT met"
    print(f"biggest: {db.device}/{db.framework}/{db.version}, {rows:,} rows: {seconds:.2f} s from .csv.gz, "
          f"{baseline:.2f} s from plain .csv in the same run (target ≤ {TARGET_S:g} s: {verdict})")


if __name__ == "__main__":
    main()
