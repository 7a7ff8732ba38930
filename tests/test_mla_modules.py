"""The MLA module validation (benchmarks/mla_module_accuracy.py): the shipped sample of TensorRT-LLM's
measured attention modules, and perfcast's price of one layer's module from the symbolic lowering — the
same leaves, at the same point, as text-generate's concrete step."""

import hashlib
import runpy
from pathlib import Path

import pytest

import perfcast
from perfcast.capture.parallel import Layout
from perfcast.hardware import get_device
from perfcast.inference import silicon_file
from perfcast.inference.textgen import Request, simulate
from perfcast.models import load_model_config

ROOT = Path(perfcast.__file__).parents[2]


@pytest.fixture(scope="module")
def bench():
    return runpy.run_path(str(ROOT / "benchmarks" / "mla_module_accuracy.py"))


def test_the_shipped_sample_is_the_one_its_manifest_describes(bench):
    m = silicon_file.manifest()["mla_modules"]
    path = ROOT / "src/perfcast/data/validation" / m["file"]
    assert hashlib.sha256(path.read_bytes()).hexdigest() == m["sha256"]
    rows = bench["shipped"]()
    assert len(rows) == m["rows"] and set(rows.model) == {"deepseek-v3"}
    assert set(rows.heads) == {16, 32, 64, 128} and (rows.tp * rows.heads == 128).all()
    assert set(rows.gemm) == {"bf16", "fp8_block", "nvfp4"} and set(rows.gemm) <= set(bench["QUANTIZE"])
    assert set(rows.phase) == {"decode", "prefill"} and (rows[rows.phase == "decode"].new_tokens == 1).all()


def _concrete_module_s(device, tp, quantize, decode, batch, tokens, past):
    """One layer's module from text-generate's concrete step: every leaf of a MoE layer's self_attn but
    the all-reduce (the collector runs the whole module on one GPU)."""
    kw = dict(num_queries=batch, context_length=past, decode=True) if decode else \
        dict(num_queries=batch, query_length=tokens, context_length=past)
    r = simulate(Request(load_model_config("deepseek-v3"), get_device(device), engine="trtllm", layout=Layout(tp=tp),
                         quantize=quantize, **kw))
    return sum(float((lt.time_s + lt.trips * lt.launch_s) / lt.trips) for lt in r.rollups["analytic"].leaves
               if str(lt.leaf.attr("module") or "").startswith("model.layers.3.self_attn")
               and lt.leaf.kind != "all_reduce")


@pytest.mark.parametrize("gemm, decode, batch, tokens, past", [
    ("bf16", True, 16, 1, 4096),         # decode over 4,096 cached tokens, bf16 projections
    ("fp8_block", False, 2, 2048, 0),    # prefill of two 2,048-token prompts, the checkpoint's FP8 blocks
])
def test_the_symbolic_module_is_text_generates_concrete_one(bench, gemm, decode, batch, tokens, past):
    rows = bench["shipped"]().head(1).assign(device="gb200", phase="decode" if decode else "prefill", gemm=gemm,
                                             kv_dtype="bf16", tp=8, heads=16, batch=batch, new_tokens=tokens,
                                             past=past, latency_ms=1.0)
    got = float(bench["priced"](rows, "analytic").price_s.iloc[0])
    quantize = bench["QUANTIZE"][gemm] or None
    assert got == pytest.approx(_concrete_module_s("gb200", 8, quantize, decode, batch, tokens, past), rel=1e-6)


def test_every_module_is_priced_as_a_graph_replay(bench):
    """The collector replays every shape as a CUDA graph: no row carries a host floor, even a decode batch
    past TensorRT-LLM's default 128 captured graphs or a prefill the serving engine runs eagerly."""
    rows = bench["shipped"]()
    rows = rows[(rows.device == "h200-sxm") & (rows.gemm == "bf16") & (rows.tp == 8)]
    p = bench["priced"](rows, "analytic")
    assert len(p[(p.phase == "decode") & (p.batch > 128)]) and (p.host_s == 0).all() and (p.price_s == p.device_s).all()


def test_a_device_without_rows_is_one_line(bench, capsys):
    assert bench["main"](["--device", "mi300x"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("--device mi300x: no rows") and "\n" not in err
