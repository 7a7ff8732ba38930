"""The closed form (mean field) of serving: docs/design/serving.md's worked example,
the closed-loop identity, monotonicity, overload, speculative decoding, prefix hits and the
disaggregated split."""

import math
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from perfcast.ir import UserError
from perfcast.serving.meanfield import (
    EngineConfig, Workload, closed_loop, expected_tokens_per_step, max_load, open_loop, solve,
)
from perfcast.serving.meanfield_disagg import Pool, choose_ratio, disaggregated, sustainable_rate
from perfcast.serving.types import SLO, AffineStep

REL = 1e-9  # Brent's method is run to xtol 1e-14 on the prompt rate; figures agree to 1e-9

STEP = AffineStep(fixed_s=0.00925, per_token_s=1e-4)
ENGINE = EngineConfig(policy="vllm", max_batch=8)


def _root_c8() -> float:
    """docs/design/serving.md: C = 8 with one step of take-in lag, 716 r² + 132 r − 74 = 0."""
    return (math.sqrt(229360) - 132) / 1432


def test_worked_example_closed_loop():
    """docs/design/serving.md: isl 200, osl 31, step 9.25 ms + 0.1 ms/token, 8 slots, a synchronous
    loop (L = 1). The full engine (r = 0.25, 8 in flight) needs 8.25 clients: at C = 8 the engine
    holds 8 − r, r = 0.24226 solving 716 r² + 132 r − 74 = 0; τ = 9.25 + 23 r = TPOT, TTFT = τ (the
    step a request sent on a completion waits) + 29.25 + 3 r (one step carrying the whole prompt)."""
    r0 = _root_c8()
    tau = (9.25 + 23 * r0) / 1e3
    r = closed_loop(STEP, ENGINE, Workload(200, 31, concurrency=8))
    assert r0 == pytest.approx(0.24226, abs=5e-6)
    assert r.tpot_s.mean == pytest.approx(tau, rel=REL)
    assert r.ttft_s.mean == pytest.approx(tau + (29.25 + 3 * r0) / 1e3, rel=REL)
    assert r.ttft_s.mean == pytest.approx(0.044799, abs=5e-7)
    assert r.requests_per_s == pytest.approx(r0 / tau, rel=REL)     # 16.345 req/s
    assert r.e2e_s.mean == pytest.approx(8 / (r0 / tau), rel=REL)
    assert r.mean_batch == pytest.approx(8 - r0, rel=REL)


def test_worked_example_queued_clients():
    """C = 12 ≥ 8.25: the full engine's state (r = 0.25, τ = 15 ms, TTFT service 30 ms); the other
    12 − 8 − 0.25 wait W = 3.75 / (50/3) = 0.225 s, TTFT = 0.225 + 0.015 + 0.03 = 0.27 s,
    X = 12 / (0.27 + 30 · 0.015) = 12 / 0.72 = 50/3 req/s."""
    r = closed_loop(STEP, ENGINE, Workload(200, 31, concurrency=12))
    assert r.tpot_s.mean == pytest.approx(0.015, rel=REL)
    assert r.ttft_s.mean == pytest.approx(0.27, rel=REL)
    assert r.requests_per_s == pytest.approx(50 / 3, rel=REL)
    assert r.output_tokens_per_s == pytest.approx(50 / 3 * 31, rel=REL)   # 516.67 tokens/s
    assert max_load(STEP, ENGINE, Workload(200, 31)).requests_per_s == pytest.approx(50 / 3, rel=REL)


def test_overlap_scheduling_adds_a_step_to_the_wait():
    """L = 2 (overlap scheduling): C = 12 ≥ 8 + 2 · 0.25 still fills the engine; W = 3.5 / (50/3)
    = 0.21 s and TTFT = 0.21 + 2 · 0.015 + 0.03 = 0.27 s — the lag's step moves out of the queue."""
    two = replace(ENGINE, take_in_lag=2)
    assert closed_loop(STEP, two, Workload(200, 31, concurrency=12)).ttft_s.mean == pytest.approx(0.27, rel=REL)
    eight = closed_loop(STEP, two, Workload(200, 31, concurrency=8))
    one = closed_loop(STEP, ENGINE, Workload(200, 31, concurrency=8))
    assert eight.ttft_s.mean > one.ttft_s.mean and eight.requests_per_s < one.requests_per_s
    assert eight.requests_per_s * eight.e2e_s.mean == pytest.approx(8, rel=1e-12)
    with pytest.raises(UserError, match="take_in_lag 3"):
        replace(ENGINE, take_in_lag=3)


engines = st.builds(
    EngineConfig, policy=st.sampled_from(["vllm", "sglang", "trtllm"]), max_batch=st.integers(1, 512),
    max_num_tokens=st.integers(4096, 16384), chunked_prefill=st.booleans(),
    kv_capacity_tokens=st.integers(10_000, 2_000_000), spec_k=st.just(0))
steps = st.builds(AffineStep, fixed_s=st.floats(1e-4, 0.05), per_token_s=st.floats(1e-7, 1e-3),
                  per_context_s=st.floats(0.0, 1e-7))


@given(engines, steps, st.integers(1, 4000), st.integers(2, 2000), st.integers(1, 1024), st.floats(0.0, 1.0))
def test_closed_loop_identity(engine, step, isl, osl, c, hit):
    """X = C / (TTFT + (osl − 1) TPOT) exactly, and X · E2E = C (Little) to rounding."""
    if isl + osl > engine.kv_capacity_tokens:
        engine = replace(engine, kv_capacity_tokens=isl + osl)
    r = closed_loop(step, engine, Workload(isl, osl, concurrency=c, prefix_hit_rate=hit))
    assert r.requests_per_s == c / (r.ttft_s.mean + (osl - 1) * r.tpot_s.mean)
    assert r.requests_per_s * r.e2e_s.mean == pytest.approx(c, rel=1e-12)
    assert 0.0 < r.mean_batch <= min(c, engine.max_batch) * (1 + 1e-9)


@pytest.mark.parametrize("policy", ["vllm", "sglang", "trtllm"])
def test_more_clients_more_throughput_until_saturation(policy):
    """Throughput rises with C until the 32 slots fill (with the requests on their way in, C ≥ 32 +
    L r: 33 here), then stays; TTFT never falls."""
    engine = EngineConfig(policy=policy, max_batch=32)
    step = AffineStep(0.008, 5e-5, 1e-8)
    runs = [closed_loop(step, engine, Workload(1000, 200, concurrency=c)) for c in range(1, 65)]
    x = [r.requests_per_s for r in runs]
    full = next(i for i, r in enumerate(runs) if r.mean_batch >= 32 * (1 - 1e-12))
    assert full == 32   # C = 33
    assert all(b > a for a, b in zip(x[:full], x[1:full + 1]))
    assert all(b == pytest.approx(x[full], rel=REL) for b in x[full + 1:])
    assert all(b.ttft_s.mean >= a.ttft_s.mean * (1 - 1e-12) for a, b in zip(runs, runs[1:]))


def test_overload_is_unstable_with_the_sustainable_rate():
    sat = max_load(STEP, ENGINE, Workload(200, 31)).requests_per_s
    over = open_loop(STEP, ENGINE, Workload(200, 31, rate_per_s=sat * 1.01))
    assert not over.stable and over.ttft_s is None and over.tpot_s is None and over.e2e_s is None
    assert over.sustainable_rate == pytest.approx(sat, rel=REL)
    at = open_loop(STEP, ENGINE, Workload(200, 31, rate_per_s=sat))
    assert not at.stable and at.ttft_s is None
    under = open_loop(STEP, ENGINE, Workload(200, 31, rate_per_s=sat * 0.99))
    assert under.stable and math.isfinite(under.ttft_s.p99) and under.requests_per_s == sat * 0.99


def test_open_loop_latency_rises_with_rate():
    runs = [open_loop(STEP, ENGINE, Workload(200, 31, rate_per_s=lam)) for lam in (1, 4, 8, 12, 16)]
    ttft = [r.ttft_s.mean for r in runs]
    assert ttft == sorted(ttft) and ttft[-1] > 10 * ttft[0]
    assert all(r.ttft_s.p50 <= r.ttft_s.p90 <= r.ttft_s.p99 for r in runs)


def test_speculative_tokens_per_step():
    # E = 1 + 0.8 + 0.8·0.5 = 2.2
    assert expected_tokens_per_step((0.8, 0.5)) == pytest.approx(2.2, rel=1e-15)
    assert expected_tokens_per_step(()) == 1.0


def test_speculative_tpot_is_step_over_e():
    """A step of 20 ms whatever it holds, and a draft forward of 1 ms: a verify step with k = 2
    costs 20 + 2 · 1 = 22 ms, and TPOT = 22 / 2.2 = 10 ms."""
    engine = EngineConfig(max_batch=16, spec_k=2, acceptance=(0.8, 0.5))
    r = closed_loop(AffineStep(0.02, 0.0), engine, Workload(100, 50, concurrency=4), draft=AffineStep(0.001, 0.0))
    assert r.tpot_s.mean == pytest.approx(0.010, rel=REL)


@pytest.mark.parametrize("policy", ["vllm", "sglang", "trtllm"])
def test_prefix_hits_lower_ttft(policy):
    engine = EngineConfig(policy=policy, max_batch=64)
    step = AffineStep(0.008, 5e-5, 1e-8)
    for load in (Workload(4000, 200, concurrency=16), Workload(4000, 200, rate_per_s=2.0)):
        cold, warm = solve(step, engine, load), solve(step, engine, replace(load, prefix_hit_rate=0.5))
        assert warm.ttft_s.mean < cold.ttft_s.mean
        assert warm.requests_per_s >= cold.requests_per_s


def test_sglang_decodes_stall_for_prefill():
    """Same step, same load: SGLang's prefill batches run alone, so its TPOT carries whole
    prompts where vLLM's mixed steps share the step's fixed cost."""
    load = Workload(200, 31, concurrency=8)
    assert closed_loop(STEP, replace(ENGINE, policy="sglang"), load).tpot_s.mean > closed_loop(STEP, ENGINE, load).tpot_s.mean


PREFILL = Pool(AffineStep(0.0, 1e-4), EngineConfig(max_num_tokens=1000))
DECODE = Pool(AffineStep(0.02, 0.0), EngineConfig(max_batch=10))


def test_disaggregated_ratio_hand_checked():
    """isl 1000, osl 201. A prefill instance takes one 1000-token prompt per step: 0.1 s, 10
    req/s. A decode instance holds 10 sequences at 20 ms a step, 200 steps a request: 10 / 4 s
    = 2.5 req/s. Of 5 instances, x prefill: min(10 x, 2.5 (5 − x)) = 10, 7.5, 5, 2.5 req/s;
    the best is 1P4D, 10 · 201 / 5 = 402 output tokens/s per device."""
    best, splits = choose_ratio(5, PREFILL, DECODE, Workload(1000, 201), kv_transfer_s=0.01)
    assert [s.rate_per_s for s in splits] == pytest.approx([10.0, 7.5, 5.0, 2.5], rel=REL)
    assert (best.prefill_instances, best.decode_instances) == (1, 4)
    assert best.output_tokens_per_s_per_device == pytest.approx(402.0, rel=REL)


def test_disaggregated_point_and_slo():
    """At 5 req/s on 1P4D: TTFT = prefill wait 0.5 / (2 · 10 · 0.5) = 0.05 s + prefill 0.1 s +
    transfer 0.01 s + the decode-slot wait; TPOT = 20 ms. An SLO binds below the sustainable rate."""
    pre, dec = replace(PREFILL, instances=1), replace(DECODE, instances=4)
    r = disaggregated(pre, dec, Workload(1000, 201, rate_per_s=5.0), 0.01)
    assert r.tpot_s.mean == pytest.approx(0.02, rel=REL)
    assert 0.16 < r.ttft_s.mean < 0.2 and r.devices == 5
    over = disaggregated(pre, dec, Workload(1000, 201, rate_per_s=10.0), 0.01)
    assert not over.stable and over.ttft_s is None and over.sustainable_rate == pytest.approx(10.0)
    best, _ = choose_ratio(5, PREFILL, DECODE, Workload(1000, 201), 0.01, slo=SLO(ttft_s=0.3))
    assert 0 < best.rate_per_s < sustainable_rate(pre, dec, Workload(1000, 201))
    at = disaggregated(pre, dec, Workload(1000, 201, rate_per_s=best.rate_per_s), 0.01)
    assert at.ttft_s.mean == pytest.approx(0.3, rel=1e-6)


@pytest.mark.parametrize("make", [
    lambda: EngineConfig(policy="orca"),
    lambda: EngineConfig(spec_k=2, acceptance=(0.5,)),
    lambda: Workload(100, 1),
    lambda: Workload(100, 10, concurrency=2, rate_per_s=1.0),
    lambda: closed_loop(STEP, EngineConfig(kv_capacity_tokens=100), Workload(100, 10, concurrency=1)),
    lambda: closed_loop(STEP, EngineConfig(max_num_tokens=64, chunked_prefill=False), Workload(100, 10, concurrency=1)),
])
def test_user_errors(make):
    with pytest.raises(UserError):
        make()


def test_the_first_wave_worked_example():
    """docs/design/serving.md, "The first wave": 8 prompts of 200 tokens sent together to an idle
    vLLM engine with a 512-token budget, step 9.25 ms + 0.1 ms a token. Steps of 512 tokens (the
    prefilled prompts' decodes first) finish prompts 0–1, 2–4 and 5–6 at 60.45, 120.9 and 181.35 ms;
    the fourth step, 7 decodes and prompt 7's last 71 tokens, ends at 198.4 ms: mean 130.5875 ms."""
    from perfcast.serving.meanfield import _Model
    from perfcast.serving.meanfield_burst import counting_the_first_wave, first_wave_ttfts

    engine, load = EngineConfig(policy="vllm", max_batch=8, max_num_tokens=512), Workload(200, 31, concurrency=8)
    wave = first_wave_ttfts(_Model(STEP, engine, load), 8)
    assert wave == pytest.approx([0.06045] * 2 + [0.1209] * 3 + [0.18135] * 2 + [0.1984], rel=1e-12)
    steady = closed_loop(STEP, engine, load)
    run = counting_the_first_wave(steady, STEP, engine, load, warmup=0, num_requests=8)
    assert run.ttft_s.mean == pytest.approx(0.1305875, rel=1e-12)
    assert (run.ttft_s.p50, run.ttft_s.p99) == pytest.approx((0.1209, 0.1984 - 0.07 * (0.1984 - 0.18135)), rel=1e-12)
    assert run.e2e_s.mean - run.ttft_s.mean == pytest.approx(steady.e2e_s.mean - steady.ttft_s.mean, rel=1e-12)
    ten = counting_the_first_wave(steady, STEP, engine, load, warmup=0, num_requests=80)
    assert ten.ttft_s.mean == pytest.approx((8 * 0.1305875 + 72 * steady.ttft_s.mean) / 80, rel=1e-12)
    late = counting_the_first_wave(steady, STEP, engine, load, warmup=5, num_requests=80)   # 5 .. 7 counted
    assert late.ttft_s.mean == pytest.approx((2 * 0.18135 + 0.1984 + 72 * steady.ttft_s.mean) / 75, rel=1e-12)
    assert run.requests_per_s == steady.requests_per_s   # throughput: the steady state's
