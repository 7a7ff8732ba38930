"""The closed loop over arrays of load points gives the scalar closed form's figures, point by
point: random affine steps under every policy, chunked or not, speculative decoding with a draft
cost, prefix hits, KV capacities that bind and do not, the token budget's bound; a compiled step
model; a step cost priced only one mix at a time; the scalar path's refusals."""

import math
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from perfcast.ir import UserError
from perfcast.serving.meanfield import EngineConfig, Workload, closed_loop
from perfcast.serving.meanfield_grid import closed_loop_grid
from perfcast.serving.step import Deployment, compile_step
from perfcast.serving.types import SLO, AffineStep, Mix

REL = 1e-9  # both root searches run to rounding (Brent's xtol 1e-14 on the prompt rate)
FIGURES = {"ttft_s": lambda r: r.ttft_s.mean, "tpot_s": lambda r: r.tpot_s.mean, "e2e_s": lambda r: r.e2e_s.mean,
           "requests_per_s": lambda r: r.requests_per_s, "output_tokens_per_s": lambda r: r.output_tokens_per_s,
           "output_tokens_per_s_per_device": lambda r: r.output_tokens_per_s_per_device,
           "output_tokens_per_s_per_user": lambda r: r.output_tokens_per_s_per_user,
           "mean_batch": lambda r: r.mean_batch}


def assert_agrees(step, engine, isls, osl, concurrencies, batches, *, hit=0.0, draft=None, slo=None):
    """The grid of isl × concurrency × max_batch against ``closed_loop`` point by point; returns
    the grid."""
    grid = closed_loop_grid(step, engine, np.array(isls)[:, None, None], osl, np.array(concurrencies)[None, :, None],
                            max_batch=np.array(batches)[None, None, :], prefix_hit_rate=hit, draft=draft, slo=slo)
    for (i, j, k), isl in np.ndenumerate(np.broadcast_to(np.array(isls)[:, None, None], grid.ttft_s.shape)):
        load = Workload(int(isl), osl, concurrency=concurrencies[j], prefix_hit_rate=hit)
        one = closed_loop(step, replace(engine, max_batch=batches[k]), load, draft=draft, slo=slo)
        for name, figure in FIGURES.items():
            assert getattr(grid, name)[i, j, k] == pytest.approx(figure(one), rel=REL), (name, isl, concurrencies[j])
        # the peak rounds the in-flight count's tokens up: rounding of the root may move it by one token
        assert abs(grid.kv_peak_tokens[i, j, k] - one.kv_peak_tokens) <= 1
        if slo is not None:
            assert grid.goodput_requests_per_s[i, j, k] == pytest.approx(one.goodput_requests_per_s, rel=REL)
    return grid


@st.composite
def families(draw):
    policy = draw(st.sampled_from(["vllm", "sglang", "trtllm"]))
    k = draw(st.integers(0, 3))
    engine = EngineConfig(policy=policy, max_num_tokens=draw(st.integers(256, 16384)),
                          chunked_prefill=draw(st.booleans()), kv_capacity_tokens=draw(st.integers(5_000, 2_000_000)),
                          devices=draw(st.integers(1, 8)), spec_k=k,
                          acceptance=tuple(draw(st.lists(st.floats(0.0, 1.0), min_size=k, max_size=k))))
    step = AffineStep(draw(st.floats(1e-4, 0.05)), draw(st.floats(1e-7, 1e-3)), draw(st.floats(0.0, 1e-7)))
    draft = draw(st.none() | st.builds(AffineStep, st.floats(1e-5, 1e-3), st.floats(0.0, 1e-5)))
    top = 4000 if engine.chunked_prefill else engine.max_num_tokens  # an unchunked prompt fits the budget
    isls = draw(st.lists(st.integers(1, top), min_size=1, max_size=3, unique=True))
    osl = draw(st.integers(2, 2000))
    isls = [i for i in isls if i + osl <= engine.kv_capacity_tokens] or [1]
    if 1 + osl > engine.kv_capacity_tokens:
        engine = replace(engine, kv_capacity_tokens=1 + osl)
    return (step, engine, isls, osl, draw(st.lists(st.integers(1, 600), min_size=1, max_size=5, unique=True)),
            draw(st.lists(st.integers(1, 512), min_size=1, max_size=3, unique=True)), draw(st.floats(0.0, 1.0)), draft)


@settings(max_examples=150)
@given(families())
def test_the_grid_is_the_scalar_closed_form_for_affine_steps(case):
    step, engine, isls, osl, concurrencies, batches, hit, draft = case
    assert_agrees(step, engine, isls, osl, concurrencies, batches, hit=hit, draft=draft)


STEP = AffineStep(0.008, 5e-5, 1e-8)


def test_the_token_budget_bound_is_the_scalar_ones():
    """vllm, a 512-token budget, 400-token prompts, osl 10: the mean step fills the budget at
    r = 512 / (9 + 400) = 1.25 prompts per step, d = 11.25 decodes, far below 256 sequences; the
    engine state there is the scalar path's ``top`` state."""
    engine = EngineConfig(max_batch=256, max_num_tokens=512)
    grid = assert_agrees(STEP, engine, [400, 300], 10, [1, 8, 64, 256, 600], [16, 256])
    assert grid.budget_bound.any() and not grid.budget_bound.all()
    bound = grid.requests_per_s[0][grid.budget_bound[0]]
    assert bound == pytest.approx(bound.max(), rel=REL)  # one state: the budget's


@pytest.mark.parametrize("policy", ["vllm", "sglang", "trtllm"])
def test_several_prompts_per_step_and_the_kink_at_one(policy):
    """Short prompts and outputs (isl 50, osl 8): at up to 512 in flight the engine takes up to
    ~73 prompts per step; the root crosses r = 1 (a mixed policy's ``max(1, m r)``, sglang's
    prefill batch of ``clamp(r, 1, q)``) and many integer counts. ``r = X · τ = X · TPOT`` (E = 1)."""
    grid = assert_agrees(STEP, EngineConfig(policy=policy), [50, 51], 8, list(range(1, 40)) + [100, 512], [512])
    r = grid.requests_per_s * grid.tpot_s
    assert (r < 1).any() and (r > 1).any()


@pytest.mark.parametrize("policy", ["vllm", "trtllm"])
def test_a_prompt_near_the_budget_takes_a_second_chunk_step_as_the_decodes_grow(policy):
    """A 2048-token budget and a 1900-token prompt: one chunk step while the decodes leave it
    2048 − n ≥ 1900 tokens (n ≤ 148), two from n = 149, so ``m(n)`` rises between 148 and 149,
    where some roots lie (d = r · 199 = X · TPOT · 199); the budget binds at the largest loads."""
    engine = EngineConfig(policy=policy, max_num_tokens=2048)
    grid = assert_agrees(STEP, engine, [1900, 1990, 2040], 200, list(range(1, 300)), [512])
    d = grid.requests_per_s[0] * grid.tpot_s[0] * 199
    assert ((148 < d) & (d < 149)).any() and grid.budget_bound.any()


def test_kv_capacity_binds_as_in_the_scalar_path():
    """⌊30000 / (2000 + 500)⌋ = 12 sequences: the concurrencies above 12 wait."""
    grid = assert_agrees(STEP, EngineConfig(kv_capacity_tokens=30_000), [2000], 500, [4, 12, 13, 100], [8, 64])
    assert grid.mean_batch[0, 3, 1] == pytest.approx(12, rel=REL)
    assert grid.mean_batch[0, 3, 0] == pytest.approx(8, rel=REL)


def test_goodput_under_an_slo():
    grid = assert_agrees(STEP, EngineConfig(), [1000], 200, [1, 16, 64, 256], [256], slo=SLO(ttft_s=0.5, tpot_s=0.02))
    assert (grid.goodput_requests_per_s == 0).any() and (grid.goodput_requests_per_s > 0).any()


class Curved:
    """A step cost with no array pricing, nonlinear in its tokens (the interpolation between
    integer counts matters): ``2 ms + 20 µs · T^1.1 + 1 ns per cached key``."""

    def step_s(self, mix: Mix) -> float:
        keys = mix.decode_context + sum(c.past + c.tokens for c in mix.chunks)
        return 0.002 + 2e-5 * mix.tokens ** 1.1 + 1e-9 * keys


@pytest.mark.parametrize("policy", ["vllm", "sglang"])
def test_a_step_cost_priced_one_mix_at_a_time(policy):
    engine = EngineConfig(policy=policy, max_num_tokens=2048, spec_k=1, acceptance=(0.7,))
    assert_agrees(Curved(), engine, [100, 3000], 100, [1, 5, 50, 300], [64, 256], hit=0.2, draft=STEP)


@pytest.fixture(scope="module")
def llama():
    return compile_step(Deployment("llama-3.1-8b", "h100-sxm"), max_tokens=8192 + 512)


@pytest.mark.parametrize("policy,chunked,k", [("vllm", True, 0), ("vllm", True, 2), ("sglang", True, 0),
                                             ("sglang", False, 1), ("trtllm", False, 0), ("trtllm", True, 2)])
def test_the_grid_is_the_scalar_closed_form_for_a_compiled_step_model(llama, policy, chunked, k):
    engine = EngineConfig(policy=policy, chunked_prefill=chunked, kv_capacity_tokens=300_000, spec_k=k,
                          acceptance=(0.8, 0.6)[:k])
    isls = [128, 1500, 7000] if chunked else [128, 1500]
    assert_agrees(llama, engine, isls, 300, [1, 3, 64, 200, 600], [8, 256, 512], hit=0.25,
                  draft=AffineStep(2e-4, 1e-6) if k else None)


@pytest.mark.parametrize("engine,isls,osl,concurrencies,point", [
    (EngineConfig(kv_capacity_tokens=100), [100, 20], 10, [1], (100, 1)),                 # KV holds no request
    (EngineConfig(max_num_tokens=64, chunked_prefill=False), [10, 100], 10, [1], (100, 1)),  # prompt over the budget
    (EngineConfig(policy="sglang", max_num_tokens=64, chunked_prefill=False), [100], 10, [1], (100, 1)),
    (EngineConfig(), [100], 1, [1], (100, 1)),                                            # osl < 2
    (EngineConfig(), [0, 100], 10, [1], (0, 1)),                                          # isl < 1
    (EngineConfig(), [100], 10, [0, 3], (100, 0)),                                        # concurrency < 1
])
def test_the_scalar_paths_refusals(engine, isls, osl, concurrencies, point):
    """The grid refuses with the message the scalar path gives its (first) refused point."""
    with pytest.raises(UserError) as scalar:
        closed_loop(STEP, engine, Workload(point[0], osl, concurrency=point[1]))
    with pytest.raises(UserError) as grid:
        closed_loop_grid(STEP, engine, np.array(isls)[:, None], osl, np.array(concurrencies))
    assert str(grid.value) == str(scalar.value)


def test_a_batch_limit_below_one_is_refused_as_the_engine_refuses_it():
    with pytest.raises(UserError, match=r"max_batch 0: must be at least 1"):
        closed_loop_grid(STEP, EngineConfig(), 100, 10, 4, max_batch=np.array([0, 8]))


def test_the_grid_keeps_the_points_shape_and_solves_each_state_once():
    grid = closed_loop_grid(STEP, EngineConfig(max_batch=32), np.array([100, 200])[:, None], 50, np.arange(1, 101))
    assert grid.ttft_s.shape == (2, 100)
    # per prompt length: the full engine (32), then each C that does not fill it (C ≤ 32, with the
    # requests on their way in)
    assert grid.states == 2 * (1 + 32)
    assert math.isclose(grid.requests_per_s[0, -1], grid.requests_per_s[0, 32], rel_tol=1e-12)


def test_worked_example_on_a_grid():
    """docs/design/serving.md, "The grid form": the worked example's C = 8 and C = 12 in one call —
    TPOT 14.822 and 15 ms, TTFT 44.799 ms and 0.27 s, X = 16.345 and 50/3 req/s."""
    grid = closed_loop_grid(AffineStep(0.00925, 1e-4), EngineConfig(max_batch=8), isl=200, osl=31,
                            concurrency=np.array([8, 12]))
    r = (math.sqrt(229360) - 132) / 1432
    tau = (9.25 + 23 * r) / 1e3
    assert grid.tpot_s == pytest.approx([tau, 0.015], rel=REL)
    assert grid.ttft_s == pytest.approx([tau + (29.25 + 3 * r) / 1e3, 0.27], rel=REL)
    assert grid.requests_per_s == pytest.approx([r / tau, 50 / 3], rel=REL)
