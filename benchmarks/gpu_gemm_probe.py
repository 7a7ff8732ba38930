"""Per-op probe of decode-sized GEMMs on a CUDA GPU, in the formats the serving engines run: bf16
(``torch.mm``, cuBLAS), FP8 with one scale per tensor, per row and per 128-block
(``torch._scaled_mm``; block scales 1 x 128 on the activations, 128 x 128 on the weights, as
DeepSeek-V3-style checkpoints carry them), each timed as a CUDA-graph replay of back-to-back calls
over enough weight copies that the weights come from HBM, not L2 — the way a decode step's
kernels run under CUDA graphs (aiconfigurator's collectors time their tables the same way).

It is the measured side of perfcast's rule that a quantized GEMM table much slower than the same
table's bf16 GEMMs is not the engine's kernel (docs/design/calibration.md): a block-scaled FP8
GEMM of a decode batch on this GPU, next to the bf16 one of the same shape.

    python benchmarks/gpu_gemm_probe.py --out DIR     # writes DIR/gemm_probe.csv, prints it

A format this torch build cannot run is a row with its error, never a silent gap. Nothing here
is priced or fitted.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from gpu_cat_probe import write_csv  # benchmarks/ is the script's folder, first on sys.path

SHAPES = ((4096, 4096), (2048, 3072), (6144, 4096), (4096, 14336), (28672, 4096))  # (N, K)
TOKENS = (16, 64, 256, 1024)  # _scaled_mm needs multiples of 16


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="gpu_gemm_probe")
    p.add_argument("--out", required=True)
    p.add_argument("--calls", type=int, default=40, help="calls captured in one CUDA graph")
    p.add_argument("--samples", type=int, default=7)
    args = p.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        sys.stderr.write("gpu_gemm_probe: needs a CUDA GPU\n")
        return 2
    dev = torch.device("cuda")
    l2 = torch.cuda.get_device_properties(dev).L2_cache_size
    f8 = torch.float8_e4m3fn
    rows = []

    def graph_us(fns) -> float:
        """Median µs per call of ``fns`` (one callable per weight copy) replayed from a CUDA graph."""
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for fn in fns:
                fn()
        torch.cuda.current_stream().wait_stream(stream)
        g = torch.cuda.CUDAGraph()
        n = max(1, args.calls // len(fns)) * len(fns)
        with torch.cuda.graph(g):
            for i in range(n):
                fns[i % len(fns)]()
        for _ in range(3):
            g.replay()
        torch.cuda.synchronize()
        out = []
        for _ in range(args.samples):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            g.replay()
            b.record()
            b.synchronize()
            out.append(a.elapsed_time(b) * 1e3 / n)
        return sorted(out)[len(out) // 2]

    def formats(m, n, k, copies):
        x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
        ws = [torch.randn(n, k, device=dev, dtype=torch.bfloat16) for _ in range(copies)]
        yield "bf16", [lambda w=w: torch.mm(x, w.t()) for w in ws], 2 * (m * k + n * k + m * n)
        del ws
        xq = x.to(f8)
        wq = [torch.randn(n, k, device=dev, dtype=torch.bfloat16).to(f8) for _ in range(copies)]
        one = torch.ones((), device=dev, dtype=torch.float32)
        nbytes = m * k + n * k + 2 * m * n
        yield "fp8 per-tensor", [lambda w=w: torch._scaled_mm(xq, w.t(), scale_a=one, scale_b=one,
                                                              out_dtype=torch.bfloat16) for w in wq], nbytes
        sa, sb = torch.ones(m, 1, device=dev), torch.ones(1, n, device=dev)
        yield "fp8 per-row", [lambda w=w: torch._scaled_mm(xq, w.t(), scale_a=sa, scale_b=sb,
                                                           out_dtype=torch.bfloat16) for w in wq], nbytes
        # block scales: 1 x 128 on the activations, 128 x 128 on the weights; the layouts torch's
        # blockwise _scaled_mm accepts differ between releases, so the first that runs is kept
        ba = torch.ones(k // 128, m, device=dev).t()  # (M, K/128), outer-dim-major
        nb, kb = math.ceil(n / 128), k // 128
        layouts = ((ba, torch.ones(kb, nb, device=dev)), (ba, torch.ones(nb, kb, device=dev).t()),
                   (ba, torch.ones(nb, kb, device=dev)), (ba.contiguous(), torch.ones(kb, nb, device=dev)))
        errors = []
        for sa_, sb_ in layouts:
            try:
                torch._scaled_mm(xq, wq[0].t(), scale_a=sa_, scale_b=sb_, out_dtype=torch.bfloat16)
                torch.cuda.synchronize()
            except Exception as e:
                errors.append(str(e).splitlines()[0][:120])
                continue
            yield "fp8 block 1x128/128x128", [lambda w=w, a=sa_, b=sb_: torch._scaled_mm(
                xq, w.t(), scale_a=a, scale_b=b, out_dtype=torch.bfloat16) for w in wq], nbytes + 4 * (m * kb + kb * nb)
            return
        yield "fp8 block 1x128/128x128", [lambda: (_ for _ in ()).throw(RuntimeError(" | ".join(errors)))], nbytes

    for n, k in SHAPES:
        for m in TOKENS:
            copies = max(1, min(8, math.ceil(2 * l2 / (n * k))))  # fp8 weights: 2 x L2 at least
            for name, fns, nbytes in formats(m, n, k, copies):
                row = {"format": name, "M": m, "N": n, "K": k, "weight_copies": len(fns), "bytes": nbytes}
                try:
                    us = graph_us(fns)
                    row.update(us=round(us, 3), gb_per_s=round(nbytes / us / 1e3, 1),
                               tflops=round(2 * m * n * k / us / 1e6, 1), error="")
                    print(f"{name:24} {m:5} x {n:5} x {k:5} {us:9.2f} µs {nbytes / us / 1e3:7.0f} GB/s", flush=True)
                except Exception as e:  # this build cannot run the format: a row that says so
                    why = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
                    row.update(us="", gb_per_s="", tflops="", error=why)
                    print(f"{name:24} {m:5} x {n:5} x {k:5} not run: {row['error']}", flush=True)
                rows.append(row)
                del fns
            torch.cuda.empty_cache()
    write_csv(Path(args.out) / "gemm_probe.csv", rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
