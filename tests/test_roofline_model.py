"""The naive datasheet roofline as a performance model users can ask for
(``--performance-model roofline``): the same-run baseline beside the analytic model, in the fast
and the slow roll-up."""

import json
import subprocess
import sys

import pytest

from perfcast.hardware import get_device
from perfcast.inference.textgen import Request, simulate
from perfcast.models import load_model_config


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "perfcast.cli.main", *args], capture_output=True, text=True,
                          timeout=600)


def test_one_gemm_by_hand():
    """4096³ bf16 on an H100 SXM: 2·4096³ FLOP at 989.4 TFLOP/s (137.4 GFLOP → 138.9 µs) against
    3 · 4096² · 2 B at 3.35 TB/s (30.0 µs): compute-bound, 138.9 µs."""
    proc = _cli("op", "mm", "--shape", "4096x4096", "--shape", "4096x4096", "--device", "h100-sxm",
                "--performance-model", "roofline", "--json")
    assert proc.returncode == 0, proc.stderr
    r = json.loads(proc.stdout)["performance_models"]["roofline"]
    assert r["time_s"] == pytest.approx(2 * 4096**3 / 989.4e12, rel=1e-12) and r["bound"] == "compute"


def test_text_generate_prices_a_step_with_both_roll_ups():
    """The slow roll-up schedules the roofline's resource terms (it had failed: the roofline has no
    analytic fallback to take them from); a decode step is memory-bound on the roofline and, with
    no efficiency below peak, cheaper than the analytic model."""
    res = simulate(Request(load_model_config("qwen3-8b"), get_device("h100-sxm"), num_queries=8, query_length=1,
                           context_length=1024, decode=True, performance_models=("analytic", "roofline"),
                           rollup="both"))
    fast = {m: res.step_time_s(m) for m in ("analytic", "roofline")}
    assert 0 < fast["roofline"] < fast["analytic"]
    assert set(res.slow) == {"analytic", "roofline"}
    # one stream of kernels, none overlapping: the schedule is the sum the fast roll-up takes
    # (to the cycle it rounds each kernel to)
    slow = res.slow["roofline"]
    assert slow.time_s == pytest.approx(fast["roofline"], rel=1e-4) and slow.resource_bound_time_s <= slow.time_s


def test_the_flag_is_listed_and_a_wrong_one_is_one_line():
    proc = _cli("text-generate", "qwen3-8b", "--device", "h100-sxm", "--performance-model", "magic")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert "expected one of analytic, profiling, roofline" in proc.stderr
