"""The serving step model prices what text-generate prices, for any mix, without re-capturing."""

import numpy as np
import pytest

from perfcast.capture.parallel import Layout
from perfcast.inference.textgen import simulate
from perfcast.ir import UserError
from perfcast.serving.memory import Memory, kv_capacity_tokens
from perfcast.serving.step import GRID, Deployment, StepModel, compile_step
from perfcast.serving.types import AffineStep, Chunk, Mix

LLAMA = Deployment("llama-3.1-8b", "h100-sxm", "trtllm")


@pytest.fixture(scope="module")
def llama():
    # (its own model, not compile_step's per-process memo: another test file on this worker may have
    # compiled the deployment for a larger step, which the memo would hand back)
    return StepModel(LLAMA, max_tokens=4096)


def _textgen(dep, **kw):
    return simulate(dep.request(**kw)).step_time_s("analytic")


@pytest.mark.parametrize("batch,context", [(1, 1024), (8, 1088), (64, 2048)])
def test_a_decode_step_is_text_generates_plus_the_engine_loops_idle(llama, batch, context):
    assert llama.step_s(Mix(batch, batch * context)) == pytest.approx(
        _textgen(LLAMA, decode=True, batch=batch, length=context) + 580e-6, rel=1e-12)


def test_the_loops_idle_is_trtllms_measured_figure_scaled_on_a_grace_host_and_nobody_elses():
    from perfcast.engines import get_engine, iteration_gap
    from perfcast.hardware.device import get_device

    trtllm = get_engine("trtllm")
    assert iteration_gap(trtllm, get_device("h100-sxm")).value_s == 580e-6
    assert "#13957" in iteration_gap(trtllm, get_device("h100-sxm")).source
    grace = get_device("gb200")
    assert iteration_gap(trtllm, grace).value_s == pytest.approx(580e-6 * grace.spec.datasheet.host_issue_scale)
    for name in ("vllm", "sglang", "trtllm-cpp"):   # no measured figure: none modelled, and said so
        assert iteration_gap(get_engine(name), get_device("h100-sxm")) is None
    vllm = StepModel(Deployment("llama-3.1-8b", "h100-sxm", "vllm"), max_tokens=64)
    assert vllm.step_s(Mix(8, 8 * 1088)) == pytest.approx(
        _textgen(Deployment("llama-3.1-8b", "h100-sxm", "vllm"), decode=True, batch=8, length=1088), rel=1e-12)
    # serve's notes name the figure and its source, or say there is none
    from perfcast.serving.serve import launch_note

    assert "no GPU idle between decode steps modelled" in launch_note(vllm)
    trt = StepModel(LLAMA, max_tokens=64)
    assert "each decode step adds 580 µs of GPU idle" in launch_note(trt) and "#13957" in launch_note(trt)
    assert "GPU idle" not in (launch_note(trt, decode=False) or "")


@pytest.mark.parametrize("tokens,past", [(1024, 0), (512, 1024), (3008, 0), (40, 96)])
def test_a_prefill_chunk_is_text_generates(llama, tokens, past):
    assert llama.step_s(Mix(chunks=(Chunk(tokens, past),))) == pytest.approx(
        _textgen(LLAMA, decode=False, batch=1, length=tokens, context=past), rel=1e-12)


def test_off_the_grid_contexts_are_interpolated_closely(llama):
    context = 1000 + GRID // 2
    exact = _textgen(LLAMA, decode=True, batch=16, length=context) + 580e-6
    assert llama.step_s(Mix(16, 16 * context)) == pytest.approx(exact, rel=1e-4)
    exact = _textgen(LLAMA, decode=False, batch=1, length=3001, context=999)
    assert llama.step_s(Mix(chunks=(Chunk(3001, 999),))) == pytest.approx(exact, rel=1e-5)


def test_a_mixed_step_is_the_dense_part_at_all_tokens_plus_each_requests_attention(llama):
    mix = Mix(32, 32 * 2048, (Chunk(256, 512),))
    dense = llama._dense_prefill[mix.tokens] + llama._head[mix.sequences]
    attention = llama.attention_decode_s(32, 2048, mix.tokens) + llama.attention_prefill_s(1, 256, 512, mix.tokens)
    assert llama.step_s(mix) == pytest.approx(dense + attention, rel=1e-12)
    # heavier than either part alone, lighter than the two steps run one after the other
    alone = llama.step_s(Mix(32, 32 * 2048)) + llama.step_s(Mix(chunks=(Chunk(256, 512),)))
    assert max(llama.step_s(Mix(32, 32 * 2048)), llama.step_s(Mix(chunks=(Chunk(256, 512),)))) \
        < llama.step_s(mix) < alone


def test_the_vectorised_prices_are_the_scalar_ones_on_the_grid(llama):
    d = np.array([8, 0, 64, 5])
    ctx = d * np.array([1088, 0, 2048, 512])
    s = np.array([0, 1024, 512, 112])
    p = np.array([0, 0, 1024, 32])
    many = llama.step_many(d, ctx, s, p)
    one = [llama.step_s(Mix(int(a), int(b), (Chunk(int(c), int(e)),) if c else ())) for a, b, c, e in zip(d, ctx, s, p)]
    assert many == pytest.approx(one, rel=1e-9)


def test_arrays_of_mixes_are_priced_as_one_mix_is(llama):
    """``step_s_array`` (the closed form's grid tabulates with it): the step model's and the
    affine step's elementwise ``step_s``, decodes with and without speculative tokens, none, one
    or two identical chunks."""
    rng = np.random.default_rng(0)
    d, ctx = rng.integers(0, 300, 400), rng.integers(0, 3000, 400)
    t, p, c = rng.integers(1, 1500, 400), rng.integers(0, 5000, 400), rng.integers(0, 3, 400)
    c[d == 0] = 1
    affine = AffineStep(0.008, 5e-5, 1e-8)
    for k in (0, 2):
        model, line = llama.step_s_array(d, d * ctx, t, p, c, k), affine.step_s_array(d, d * ctx, t, p, c, k)
        for i in range(400):
            mix = Mix(int(d[i]), int(d[i] * ctx[i]), (Chunk(int(t[i]), int(p[i])),) * int(c[i]), draft=k)
            assert model[i] == pytest.approx(llama.step_s(mix), rel=1e-14)
            assert line[i] == affine.step_s(mix)


def test_speculative_verification_costs_more_than_a_decode_and_less_than_k_plus_one(llama):
    one = llama.step_s(Mix(16, 16 * 1024))
    verify = llama.step_s(Mix(16, 16 * 1024, draft=3))
    assert one < verify < 4 * one


def test_a_step_beyond_the_compiled_tokens_is_one_line(llama):
    with pytest.raises(UserError, match="exceeds the 4096"):
        llama.step_s(Mix(chunks=(Chunk(5000),)))
    with pytest.raises(UserError, match="a step of 5000 tokens exceeds the 4096"):
        llama.step_s_array([1, 0], [10, 0], [2, 5000], [0, 0], [1, 1])


def test_a_measured_table_pricing_is_refused():
    with pytest.raises(UserError, match="--performance-model"):
        compile_step(Deployment("llama-3.1-8b", "h100-sxm", performance_model="profiling"))


def test_tensor_parallel_steps_match_text_generate():
    dep = Deployment("llama-3.1-8b", "h100-sxm", "vllm", layout=Layout(tp=2))
    step = compile_step(dep, max_tokens=2048)
    assert step.step_s(Mix(32, 32 * 1024)) == pytest.approx(_textgen(dep, decode=True, batch=32, length=1024),
                                                            rel=1e-12)
    assert step.step_s(Mix(chunks=(Chunk(2048),))) == pytest.approx(
        _textgen(dep, decode=False, batch=1, length=2048), rel=1e-12)


def test_kv_capacity_by_each_engines_rule():
    mem = Memory(capacity_bytes=80_000, weights_bytes=16_000, activation_bytes=4_000, kv_bytes_per_token=10)
    assert kv_capacity_tokens(mem, 0.9, "free", 32) == 5376   # 0.9 × (80k − 16k − 4k) = 54,000 B → 5,400 → 168 blocks
    assert kv_capacity_tokens(mem, 0.9, "total", 16) == 5200  # 0.9 × 80k − 16k − 4k = 52,000 B
    assert kv_capacity_tokens(mem, 0.9, "static", 1) == 5600  # 0.9 × 80k − 16k = 56,000 B
    assert kv_capacity_tokens(Memory(10, 20, 0, 1), 0.9, "free", 16) == 0
