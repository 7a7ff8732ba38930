"""A sliding-window layer's decode reads only its window (perf.kernel_classes.generation_work),
as the measured window rows of the attention tables do (benchmarks/kernel_accuracy.py --windowed;
docs/design/calibration.md, "How well it holds")."""

from __future__ import annotations

import runpy
from functools import lru_cache
from pathlib import Path

import pytest

import perfcast
from perfcast.capture.parallel import Layout
from perfcast.hardware import get_device
from perfcast.inference.textgen import Request, simulate
from perfcast.models import load_model_config


@lru_cache(maxsize=None)
def _attention_by_layer(context: int) -> dict[str, float]:
    r = simulate(Request(load_model_config("gpt-oss-120b"), get_device("gb200"), engine="trtllm", decode=True,
                         layout=Layout(tp=4), num_queries=64, context_length=context))
    out: dict[str, float] = {}
    for lt in r.rollups["analytic"].leaves:
        if lt.leaf.kind == "attention":
            kind = "sliding" if lt.leaf.attr("window") else "full"
            out[kind] = out.get(kind, 0.0) + float(lt.time_s)
    return out


def test_a_sliding_layer_reads_its_window_and_a_full_layer_its_cache():
    assert load_model_config("gpt-oss-120b").data["sliding_window"] == 128
    short, long = _attention_by_layer(120), _attention_by_layer(8704)
    # under the window the two kinds of layer read the same cache; past it only the full layers grow
    assert short["sliding"] == pytest.approx(short["full"], rel=1e-9)
    assert long["full"] > 4 * long["sliding"]
    assert long["sliding"] == pytest.approx(_attention_by_layer(4096)["sliding"], rel=1e-9)


def test_the_window_rows_priced_by_the_full_attention_fit():
    """The figures calibration.md quotes: window rows no fit is made with, out of sample. The fit is
    a nonlinear least-squares one, and OpenBLAS picks its kernels by CPU (DYNAMIC_ARCH): the same
    code gave the B200 median 6.0 % (rounded) where calibration.md was measured and gives 5.94 % on an
    AMD EPYC, so the quoted tenths are checked to within 0.1 point."""
    bench = runpy.run_path(str(Path(perfcast.__file__).parents[2] / "benchmarks" / "kernel_accuracy.py"))
    got = {(r["device"], r["variant"]): (r["rows"], r["median"] * 100, r["p90"] * 100)
           for d in ("h100-sxm", "b200-sxm") for r in bench["windowed"](d, "trtllm")}
    for key, (rows, median, p90) in {("b200-sxm", "bf16"): (5477, 6.0, 23.9),
                                     ("h100-sxm", "bf16"): (5897, 15.5, 53.6)}.items():
        assert got[key][0] == rows
        assert got[key][1:] == pytest.approx((median, p90), abs=0.1)
