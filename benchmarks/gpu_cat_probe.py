"""Per-op probe of the KV-cache copies Hugging Face transformers' caches run in a decode step, on
a CUDA GPU: ``DynamicLayer.update``'s ``torch.cat([cache, new], dim=-2)`` (transformers
``cache_utils.py``), the whole layer's keys or values copied with one new token each step, next
to a plain copy of the same bytes (``clone``) and ``StaticLayer.update``'s ``index_copy_`` of the
new token into a preallocated cache. Each op is timed as the median of CUDA-event samples of 20
back-to-back calls after a warm-up; bytes moved are what the op must read and write.

    python benchmarks/gpu_cat_probe.py --out DIR        # writes DIR/cat_probe.csv, prints it

Per-op calibration data (docs/design/validation.md, "GPU closed loop"): nothing here is priced.
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="gpu_cat_probe")
    p.add_argument("--out", required=True)
    p.add_argument("--calls", type=int, default=20)
    p.add_argument("--samples", type=int, default=7)
    args = p.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        sys.stderr.write("gpu_cat_probe: needs a CUDA GPU\n")
        return 2
    dev, dt = torch.device("cuda"), torch.bfloat16
    rows = []

    def timed(fn) -> float:
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        out = []
        for _ in range(args.samples):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            for _ in range(args.calls):
                fn()
            b.record()
            b.synchronize()
            out.append(a.elapsed_time(b) * 1e3 / args.calls)  # µs per call
        return sorted(out)[len(out) // 2]

    for heads in (8, 4, 2):
        for batch in (1, 8, 64):
            for ctx in (256, 1024, 4096, 16384):
                if batch * heads * ctx * 128 * 2 > 2 ** 31:  # keep each tensor under 2 GiB
                    continue
                cache = torch.randn(batch, heads, ctx, 128, device=dev, dtype=dt)
                new = torch.randn(batch, heads, 1, 128, device=dev, dtype=dt)
                full = torch.empty(batch, heads, ctx + 1, 128, device=dev, dtype=dt)
                pos = torch.tensor([ctx], device=dev)
                moved = 2 * batch * heads * (ctx + 1) * 128 * 2  # read cache + new, write the result
                for op, fn, nbytes in (
                        ("cat", lambda: torch.cat([cache, new], dim=-2), moved),
                        ("clone", lambda: full.clone(), moved),
                        ("index_copy_", lambda: full.index_copy_(2, pos, new), 2 * batch * heads * 128 * 2)):
                    us = timed(fn)
                    rows.append({"op": op, "batch": batch, "kv_heads": heads, "context": ctx, "head_dim": 128,
                                 "dtype": "bf16", "bytes": nbytes, "us": round(us, 3),
                                 "gb_per_s": round(nbytes / us / 1e3, 1)})
                    print(f"{op:12} b{batch:<3} h{heads} c{ctx:<6} {us:10.2f} µs {nbytes / us / 1e3:8.1f} GB/s", flush=True)
                del cache, new, full
                torch.cuda.empty_cache()
    write_csv(Path(args.out) / "cat_probe.csv", rows)
    return 0


def write_csv(path: Path, rows: list[dict]) -> None:
    """A probe's rows as one CSV (its folder created): the file the device run brings back."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


if __name__ == "__main__":
    raise SystemExit(main())
