"""The MLA module validation (benchmarks/mla_module_accuracy.py): the shipped sample of TensorRT-LLM's
measured attention modules, and perfcast's price of one layer's module from the symbolic lowering — the
same leaves, at the same point, as text-generate's concrete step."""


import pytest

from attention_modules import benchmark, concrete_module_s, no_rows_is_one_line, shipped_sample


@pytest.fixture(scope="module")
def bench():
    return benchmark("mla_module_accuracy")


def test_the_shipped_sample_is_the_one_its_manifest_describes(bench):
    rows = shipped_sample(bench, "mla_modules")
    assert set(rows.model) == {"deepseek-v3"}
    assert set(rows.heads) == {16, 32, 64, 128} and (rows.tp * rows.heads == 128).all()
    assert set(rows.gemm) == {"bf16", "fp8_block", "nvfp4"} and set(rows.gemm) <= set(bench["QUANTIZE"])
    assert set(rows.phase) == {"decode", "prefill"} and (rows[rows.phase == "decode"].new_tokens == 1).all()


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
    want = concrete_module_s("deepseek-v3", "gb200", "trtllm", 8, decode, batch, tokens, past, quantize=quantize)
    assert got == pytest.approx(want, rel=1e-6)  # the collector runs the whole module: nothing stubbed


def test_every_module_is_priced_as_a_graph_replay(bench):
    """The collector replays every shape as a CUDA graph: no row carries a host floor, even a decode batch
    past TensorRT-LLM's default 128 captured graphs or a prefill the serving engine runs eagerly."""
    rows = bench["shipped"]()
    rows = rows[(rows.device == "h200-sxm") & (rows.gemm == "bf16") & (rows.tp == 8)]
    p = bench["priced"](rows, "analytic")
    assert len(p[(p.phase == "decode") & (p.batch > 128)]) and (p.host_s == 0).all() and (p.price_s == p.device_s).all()


def test_a_device_without_rows_is_one_line(bench, capsys):
    no_rows_is_one_line(bench, capsys)
