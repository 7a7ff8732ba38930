"""Headline predictions pinned, each beside the measurement it is validated against, so that a
change that moves one is seen (and its closing note says by how much). A pin failing is not a
bug by itself: update the pin together with the figures the docs quote for it."""

import json
import subprocess
import sys

import pytest

from perfcast.hardware import get_device
from perfcast.models import load_model_config
from perfcast.profiler import closed_loop as cl


def test_one_decode_gemm_on_h100():
    """README, "Calibration data": 8 × 4096 × 4096 bf16 on an H100 SXM. Measured: 16.41 µs
    (aiconfigurator-core 0.12.0, h100_sxm gemm table, trtllm)."""
    proc = subprocess.run([sys.executable, "-m", "perfcast.cli.main", "op", "mm", "--shape", "8x4096", "--shape",
                           "4096x4096", "--device", "h100-sxm", "--json"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    t = json.loads(proc.stdout)["performance_models"]["analytic"]["time_s"]
    assert t * 1e6 == pytest.approx(15.51, abs=0.005)


@pytest.mark.parametrize("model, point, predicted_ms, measured_graph_ms, error_in_docs", [
    # benchmarks/measured/h200-2026-12-04b (docs/design/validation.md, "GPU closed loop", second
    # run): the step less its host launches against its CUDA-graph replay on an H200 — the decode
    # over a StaticCache (eager-static), the prefill filling a DynamicCache (eager)
    ("llama-3.1-8b", "decode:1@1024", 6.971, 7.988, -0.127),
    ("qwen3-30b-a3b", "prefill:1x2048", 56.91, 67.49, -0.157),
])
def test_eager_steps_measured_on_an_h200(model, point, predicted_ms, measured_graph_ms, error_in_docs):
    preds, _, _ = cl.predict(load_model_config(model), get_device("h200-sxm"), cl.parse_points(point)[0], "bf16")
    got = preds["analytic"].kernels_s * 1e3
    assert got == pytest.approx(predicted_ms, rel=5e-4)
    assert round(got / measured_graph_ms - 1, 3) == error_in_docs  # the figure the docs' table quotes


def test_dynamic_cache_decode_measured_on_an_h200():
    """benchmarks/measured/h200-2026-12-04d (validation.md, "GPU closed loop", third run): Llama-3.1-8B
    decoding 64 sequences after 4,096 tokens with generate()'s DynamicCache — 32.575 ms of kernels
    traced, 17.1 ms of them the per-layer torch.cat of the cache — against eager's kernels."""
    preds, _, _ = cl.predict(load_model_config("llama-3.1-8b"), get_device("h200-sxm"),
                             cl.parse_points("decode:64@4096")[0], "bf16", cache="dynamic")
    got = preds["analytic"].kernels_s * 1e3
    assert got == pytest.approx(30.787, rel=5e-4)
    assert round(got / 32.575 - 1, 3) == -0.055
