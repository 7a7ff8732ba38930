"""Benchmark: step prices per second of the serving step model, one core.

For Llama-3.1-8B (H100 SXM, TensorRT-LLM, one device) and DeepSeek-V3 (H200 SXM, TensorRT-LLM,
TP8 EP8, FP8): compile the step model once (:func:`perfcast.serving.step.compile_step`), then
price random mixes — decodes with random contexts, a prefill chunk in a third of the steps —
one by one (``step_s``, as the event simulation calls it; the attention rows it builds lazily are
included in the time) and vectorised (``step_many``, exact). Baseline, same run: one
``text-generate`` step (:func:`perfcast.inference.textgen.simulate`, capture cache warm) per
second. Targets (issue 13): ≥ 100,000 prices/s for Llama-3.1-8B and ≥ 10,000/s for DeepSeek-V3.

Run: ``make bench`` (or ``.venv/bin/python benchmarks/step_speed.py [--steps N]``).
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

from perfcast.capture.parallel import Layout
from perfcast.inference.textgen import simulate
from perfcast.serving.step import Deployment, compile_step
from perfcast.serving.types import Chunk, Mix

CASES = (("Llama-3.1-8B / H100 / TRT-LLM", Deployment("llama-3.1-8b", "h100-sxm", "trtllm"), 100_000),
         ("DeepSeek-V3 / H200 / TRT-LLM TP8 EP8 FP8",
          Deployment("deepseek-v3", "h200-sxm", "trtllm", Layout(tp=8, ep=8), quantize="fp8"), 10_000))
MAX_TOKENS = 8192


def mixes(n: int, seed: int = 0) -> list[Mix]:
    rng = np.random.default_rng(seed)
    d = rng.integers(1, 257, n)
    ctx = d * rng.integers(128, 8192, n)
    chunk = np.where(rng.random(n) < 1 / 3, rng.integers(1, MAX_TOKENS - 256, n), 0)
    past = rng.integers(0, 4096, n)
    return [Mix(int(a), int(b), (Chunk(int(c), int(p)),) if c else ()) for a, b, c, p in zip(d, ctx, chunk, past)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=100_000)
    args = ap.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # one core
    work = mixes(args.steps)
    cols = [np.array(x) for x in zip(*((m.decodes, m.decode_context, m.prefill_tokens,
                                        m.chunks[0].past if m.chunks else 0) for m in work))]
    print(f"step prices per second, one core ({args.steps:,} random mixes; baseline: one text-generate step)")
    for name, dep, target in CASES:
        t0 = time.perf_counter()
        step = compile_step(dep, max_tokens=MAX_TOKENS)
        compile_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        for m in work:
            step.step_s(m)
        scalar = len(work) / (time.perf_counter() - t0)
        t0 = time.perf_counter()
        step.step_many(*cols)
        vector = len(work) / (time.perf_counter() - t0)
        t0 = time.perf_counter()
        simulate(dep.request(decode=True, batch=64, length=2048))
        baseline = 1 / (time.perf_counter() - t0)
        print(f"  {name}: compile {compile_s:.2f} s")
        print(f"    one by one  {scalar:12,.0f} /s = {scalar / baseline:10,.0f}× text-generate "
              f"({baseline:.1f} /s); target ≥ {target:,}/s {'met' if scalar >= target else 'NOT met'}")
        print(f"    vectorised  {vector:12,.0f} /s = {vector / baseline:10,.0f}× text-generate")


if __name__ == "__main__":
    main()
