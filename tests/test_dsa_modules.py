"""The DSA module validation (benchmarks/dsa_module_accuracy.py): the shipped sample of SGLang's
measured attention modules, and perfcast's price of one layer's module from the symbolic lowering —
the same leaves, at the same point, as text-generate's concrete step."""


import pytest

from attention_modules import benchmark, concrete_module_s, no_rows_is_one_line, shipped_sample


@pytest.fixture(scope="module")
def bench():
    return benchmark("dsa_module_accuracy")


def test_the_shipped_sample_is_the_one_its_manifest_describes(bench):
    rows = shipped_sample(bench, "dsa_modules")
    assert set(rows.model) == {"glm-5-fp8", "deepseek-v3.2"} and set(rows.tp) == {4, 8}
    assert set(rows.phase) == {"decode", "prefill"} and (rows[rows.phase == "decode"].new_tokens == 1).all()


@pytest.mark.parametrize("model, decode, batch, tokens, past", [
    ("glm-5-fp8", True, 8, 1, 8192),        # decode: the sparse indexer and sparse attention over 8,192 cached
    ("deepseek-v3.2", False, 1, 4096, 0),   # prefill above index_topk: the calibrated sparse prefill
])
def test_the_symbolic_module_is_text_generates_concrete_one(bench, model, decode, batch, tokens, past):
    mod = bench["Module"](model, "h200-sxm", 8, "bf16", decode, batch * tokens, "analytic")
    got = float(mod.device_s(float(batch), float(tokens), float(past)))
    want = concrete_module_s(model, "h200-sxm", "sglang", 8, decode, batch, tokens, past,
                             stubbed={"fused_qkv_a_proj_with_mqa"})
    assert got == pytest.approx(want, rel=1e-6)


def test_a_prefill_module_is_priced_as_an_eager_step(bench):
    """The collector runs prefill eagerly: a small prefill's module costs its kernels × SGLang's host
    interval per kernel (docs/design/engines.md, "Launches"), more than its kernels' device time; a
    decode module within SGLang's captured batches (256 on H200) replays a CUDA graph and costs its
    kernels' time, a larger one is eager."""
    rows = bench["shipped"]()
    rows = rows[(rows.device == "h200-sxm") & (rows.model == "glm-5-fp8") & (rows.tp == 8) & (rows.kv_dtype == "bf16")]
    priced = bench["price"](rows, "analytic")
    small = priced[(priced.phase == "prefill") & (priced.batch * priced.new_tokens <= 64)]
    assert len(small) and (small.price_s == small.host_s).all() and (small.host_s > small.device_s).all()
    dec = priced[(priced.phase == "decode") & (priced.batch <= 256)]
    assert len(dec) and (dec.host_s == 0).all() and (dec.price_s == dec.device_s).all()
    eager = priced[(priced.phase == "decode") & (priced.batch > 256)]
    assert len(eager) and (eager.host_s > 0).all() and (eager.price_s >= eager.host_s).all()


def test_a_device_without_rows_is_one_line(bench, capsys):
    no_rows_is_one_line(bench, capsys)
