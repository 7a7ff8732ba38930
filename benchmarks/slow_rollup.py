"""Benchmark: the slow (modulo-scheduling) roll-up's speed.

- Flash attention (both catalog versions) at 100 design points (prefill, T_kv from 128 to 12,800):
  target under 1 s per kernel. Baseline measured in the same run: the fast roll-up's exact
  ``evaluate`` at the same points.
- One DeepSeek-V3 decode step (61 layers rolled into loops; the layer body is what gets
  scheduled) on h200-sxm: target under 10 s, baseline the fast roll-up's roll-up + evaluate of the
  same lowered graph. The capture itself is not timed.

Run: ``make bench`` (or ``.venv/bin/python benchmarks/slow_rollup.py``).
"""

from __future__ import annotations

import argparse
import time

from perfcast.hardware import get_device
from perfcast.kernels import get_kernel
from perfcast.perf import AnalyticPerformanceModel
from perfcast.rollup import rollup
from perfcast.rollup.slow import SlowRollup


def flash(device, name: str, points: int) -> tuple[float, float, dict]:
    spec = get_kernel(name)
    model = AnalyticPerformanceModel(device)
    pts = [{**spec.defaults, "T_kv": 128 * (i + 1)} for i in range(points)]
    slow = SlowRollup(model, device)
    t0 = time.perf_counter()
    last = [slow.run(spec.graph, p) for p in pts][-1]
    slow_s = time.perf_counter() - t0
    fast = rollup(spec.graph, model)
    t0 = time.perf_counter()
    for p in pts:
        fast.evaluate(p)
    return slow_s, time.perf_counter() - t0, last.as_dict()


def deepseek_decode(device) -> tuple[float, float, dict]:
    from perfcast.capture import lower
    from perfcast.inference.textgen import Request, step_capture
    from perfcast.models import load_model_config

    req = Request(load_model_config("deepseek-v3"), device, num_queries=64, decode=True, context_length=4096)
    cap, at, _ = step_capture(req)
    graph = lower(cap, point=at).graph
    model = AnalyticPerformanceModel(device)
    t0 = time.perf_counter()
    fast = rollup(graph, model)
    ev = fast.evaluate({})
    fast_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    r = SlowRollup(model, device).run(graph, {}, ev.launch_time_s)
    return time.perf_counter() - t0, fast_s, r.as_dict()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="h100-sxm")
    ap.add_argument("--points", type=int, default=100)
    ap.add_argument("--skip-deepseek", action="store_true")
    args = ap.parse_args()
    device = get_device(args.device)
    print(f"slow roll-up speed on {device.name} (baseline: the fast roll-up, same points, same run)")
    for name in ("flash-attention", "flash-attention-softmax"):
        slow_s, fast_s, doc = flash(device, name, args.points)
        print(f"  {name:24s} {args.points} points: slow {slow_s:.3f} s (target < 1 s: "
              f"{'met' if slow_s < 1 else 'MISSED'}), fast evaluate {fast_s:.3f} s, ratio {slow_s / fast_s:.2f}× "
              f"· last point II {doc['ii']:,} cycles, set by {doc['limiter']}")
    if not args.skip_deepseek:
        slow_s, fast_s, doc = deepseek_decode(get_device("h200-sxm"))
        print(f"  deepseek-v3 decode step (64 × 4096) on h200-sxm: slow {slow_s:.3f} s (target < 10 s: "
              f"{'met' if slow_s < 10 else 'MISSED'}), fast roll-up + evaluate {fast_s:.3f} s, "
              f"ratio {slow_s / fast_s:.2f}× · {len(doc['loops'])} loops scheduled")


if __name__ == "__main__":
    main()
