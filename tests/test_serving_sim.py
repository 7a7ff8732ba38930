"""The serving event simulation: a hand-computed schedule (also in docs/design/serving.md),
Little's law in closed loop, determinism, preemption, prefix reuse, speculative decoding,
overload, and the three engines' schedulers where they differ."""

import json
import re

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from perfcast.ir.errors import UserError
from perfcast.serving.scheduler import scheduler_config
from perfcast.serving.metrics import summarize
from perfcast.serving.sim import Speculative, simulate
from perfcast.serving.types import SLO, AffineStep
from perfcast.serving.workload import Lengths, Trace, Workload

from serving_doc import section, table

SCHEDULE = "A hand-computed schedule"  # docs/design/serving.md

STEP = AffineStep(fixed_s=0.010, per_token_s=0.001)  # a step of T tokens: 10 + T ms
FAST = AffineStep(fixed_s=0.010, per_token_s=1e-5)   # 10 ms + 10 us per token


def _fixed(isl, osl, **kw):
    return Workload(Lengths("fixed", isl), Lengths("fixed", osl), **kw)


def _hand_run(trace=False):
    sched = scheduler_config("vllm", max_num_tokens=8)
    w = Workload(trace=Trace((0.0, 0.0, 0.0), (10, 6, 4), (3, 2, 3)), num_requests=3, warmup=0)
    return simulate(STEP, sched.kv_cache(4096), sched, w, trace=trace)


def test_hand_computed_schedule():
    # step ends (ms): 18, 36, 52, 64, 75 (docs/design/serving.md)
    res, _ = _hand_run()
    assert res.ttft_s.mean == pytest.approx((36 + 36 + 52) / 3e3, rel=1e-12)
    assert res.tpot_s.mean == pytest.approx((14 + 16 + 11.5) / 3e3, rel=1e-12)
    assert res.e2e_s.mean == pytest.approx((64 + 52 + 75) / 3e3, rel=1e-12)
    assert res.steps == 5
    assert res.output_tokens_per_s == pytest.approx(8 / 0.075, rel=1e-12)


def test_hand_computed_schedule_matches_the_design_doc():
    _, tr = _hand_run(trace=True)
    spans = {(i, phase): (a, b) for i, phase, a, b in tr.spans}
    rows = table(SCHEDULE, "| request |")
    assert [r[0] for r in rows] == ["R0", "R1", "R2"]
    for k, (name, isl, osl, ttft_ms, tpot_ms) in enumerate(rows):
        first = spans[(k, "decode")][0]
        finish = spans[(k, "decode")][1]
        assert first * 1e3 == pytest.approx(float(ttft_ms), rel=1e-12)
        assert (finish - first) / (int(osl) - 1) * 1e3 == pytest.approx(float(tpot_ms), rel=1e-12)
    steps = table(SCHEDULE, "| step |")
    ends = [float(r[4]) for r in steps]
    assert [c[0] * 1e3 for c in tr.counters] == pytest.approx(ends, rel=1e-12)
    # each step's start (the previous one's end: nothing idles) and its batch: sequences, prefill chunks
    assert [c[4] * 1e3 for c in tr.counters] == pytest.approx([0.0, *ends[:-1]], rel=1e-12)
    assert [(c[1], c[3]) for c in tr.counters] == [(r[1].count(",") + 1, r[1].count("prefill")) for r in steps]
    assert [(c[1], c[3]) for c in tr.counters] == [(1, 1), (2, 2), (3, 1), (2, 0), (1, 0)]


def test_the_per_request_samples_are_what_the_summaries_summarize():
    res, _ = _hand_run()
    ms = [(float(r[3]), float(r[4])) for r in table(SCHEDULE, "| request |")]  # TTFT, TPOT of R0, R1, R2
    assert [t * 1e3 for t in res.samples.ttft_s] == pytest.approx([t for t, _ in ms], rel=1e-12)
    assert [t * 1e3 for t in res.samples.tpot_s] == pytest.approx([t for _, t in ms], rel=1e-12)
    assert res.ttft_s == summarize(np.array(res.samples.ttft_s))
    assert res.tpot_s == summarize(np.array(res.samples.tpot_s))


def test_speculative_example_of_the_design_doc():
    text = section("Speculative decoding")
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in text.splitlines()
            if re.match(r"\| \d", line)]
    assert len(rows) == 2
    for k, acc, expected in rows:
        spec = Speculative(int(k), tuple(float(a) for a in acc.split(",")), draft_fraction=0.0)
        assert spec.expected_tokens_per_step == pytest.approx(float(expected), rel=1e-12)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(engine=st.sampled_from(["vllm", "sglang", "trtllm"]), c=st.integers(1, 12),
       isl=st.integers(8, 600), osl=st.integers(2, 80), seed=st.integers(0, 9))
def test_closed_loop_littles_law(engine, c, isl, osl, seed):
    # C / request throughput = mean(TTFT + (osl − 1)·TPOT) = mean E2E, up to the ramp-up and
    # drain at the edges of the counted window: about C / counted requests (docs/design/serving.md)
    n = 40 * c
    sched = scheduler_config(engine)
    res, _ = simulate(AffineStep(0.004, 3e-5, 1e-8), sched.kv_cache(1_000_000), sched,
                      _fixed(isl, osl, num_requests=n, concurrency=c, seed=seed))
    e2e = res.ttft_s.mean + (osl - 1) * res.tpot_s.mean
    assert e2e == pytest.approx(res.e2e_s.mean, rel=1e-9)
    counted = n - c
    assert c / res.requests_per_s == pytest.approx(e2e, rel=1.5 * c / counted + 0.01)


def _open(rate, n=400, seed=3, **kw):
    return Workload(Lengths("uniform", 100, 400), Lengths("uniform", 20, 120), num_requests=n, rate=rate,
                    seed=seed, **kw)


def test_deterministic_for_a_seed():
    sched = scheduler_config("vllm")
    kv = sched.kv_cache(200_000)
    a, _ = simulate(STEP, kv, sched, _open(1.0))
    b, _ = simulate(STEP, kv, sched, _open(1.0))
    c, _ = simulate(STEP, kv, sched, _open(1.0, seed=4))
    assert a == b
    assert a.ttft_s != c.ttft_s


def test_preemption_when_the_kv_cache_is_small():
    sched = scheduler_config("vllm")
    w = _fixed(200, 300, num_requests=64, concurrency=32)
    big, _ = simulate(STEP, sched.kv_cache(1_000_000), sched, w)
    small, _ = simulate(STEP, sched.kv_cache(4096), sched, w)
    assert big.preemptions == 0 and small.preemptions > 0
    assert small.kv_peak_tokens <= 4096
    # every counted token was still produced, and preemption costs latency
    for r in (big, small):
        assert r.output_tokens_per_s * (r.requests * 300 / r.output_tokens_per_s) == pytest.approx(r.requests * 300)
        assert r.ttft_s.mean <= r.e2e_s.mean
    assert small.e2e_s.mean > big.e2e_s.mean


def test_trtllm_guaranteed_no_evict_never_preempts():
    w = _fixed(200, 300, num_requests=64, concurrency=32)
    for engine, preempts in (("trtllm", False), ("vllm", True), ("sglang", True)):
        sched = scheduler_config(engine)
        res, _ = simulate(STEP, sched.kv_cache(4096), sched, w)
        assert (res.preemptions > 0) == preempts, engine


class Recorder:
    """An affine step that remembers the mixes it priced."""

    def __init__(self):
        self.mixes = []

    def step_s(self, mix):
        self.mixes.append(mix)
        return STEP.step_s(mix)


@pytest.mark.parametrize("engine,mixed_chunk,mixes", [("sglang", None, False), ("sglang", True, True),
                                                      ("vllm", None, True), ("trtllm", None, True)])
def test_sglang_runs_a_prefill_batch_alone_unless_mixed_chunk(engine, mixed_chunk, mixes):
    sched = scheduler_config(engine, mixed_chunk=mixed_chunk)
    rec = Recorder()
    simulate(rec, sched.kv_cache(200_000), sched, _open(30.0, n=100))
    assert any(m.decodes and m.chunks for m in rec.mixes) == mixes


def test_prefix_hit_rate_lowers_ttft():
    sched = scheduler_config("vllm")
    kv = sched.kv_cache(500_000)
    cold, _ = simulate(STEP, kv, sched, _fixed(2048, 32, num_requests=80, concurrency=8))
    warm, _ = simulate(STEP, kv, sched, _fixed(2048, 32, num_requests=80, concurrency=8, prefix_hit_rate=0.75))
    assert warm.ttft_s.mean < 0.8 * cold.ttft_s.mean


def test_trace_hash_blocks_are_reused():
    n = 40
    arrivals = tuple(0.5 * i for i in range(n))
    shared = tuple(range(4))  # every prompt starts with the same 4 × 512 tokens
    hashes = tuple(shared + (1000 + i,) for i in range(n))
    sched = scheduler_config("vllm")
    kv = sched.kv_cache(200_000)
    base = Trace(arrivals, (2600,) * n, (16,) * n)
    plain, _ = simulate(FAST, kv, sched, Workload(trace=base, num_requests=n))
    reuse, _ = simulate(FAST, kv, sched, Workload(trace=Trace(arrivals, (2600,) * n, (16,) * n, hashes), num_requests=n))
    assert reuse.ttft_s.mean < 0.5 * plain.ttft_s.mean


def test_speculative_full_acceptance_emits_two_tokens_per_step():
    sched = scheduler_config("vllm")
    spec = Speculative(1, (1.0,), draft_fraction=0.0)
    res, _ = simulate(STEP, sched.kv_cache(100_000), sched, _fixed(64, 9, num_requests=8, concurrency=4),
                      speculative=spec)
    # 9 tokens: the first from the prefill, then 4 decode steps of 2
    assert res.decode_tokens_per_step == 2.0
    plain, _ = simulate(STEP, sched.kv_cache(100_000), sched, _fixed(64, 9, num_requests=8, concurrency=4))
    assert res.tpot_s.mean < plain.tpot_s.mean
    assert res.itl_s.mean > res.tpot_s.mean  # one chunk carries two tokens: ITL ≈ 2 × TPOT


def test_speculative_tokens_per_step_matches_the_expectation():
    spec = Speculative(3, (0.8, 0.6, 0.5), draft_fraction=0.1)
    sched = scheduler_config("vllm")
    res, _ = simulate(STEP, sched.kv_cache(1_000_000), sched, _fixed(32, 4001, num_requests=8, concurrency=8),
                      speculative=spec)
    # ~8·4000/2.52 ≈ 12,700 draws of a variable of std ≈ 1.0: the mean is within ±0.03 (> 3 σ)
    assert res.decode_tokens_per_step == pytest.approx(2.52, abs=0.03)


def test_overload_is_reported_unstable():
    sched = scheduler_config("vllm", max_batch_size=16)
    kv = sched.kv_cache(500_000)
    w = lambda rate: _fixed(256, 64, num_requests=600, rate=rate, seed=1)  # noqa: E731
    # capacity ≈ 16 sequences per ~10 ms step / 64 tokens ≈ 25 requests/s (less the prefill steps)
    low, _ = simulate(FAST, kv, sched, w(5.0))
    high, _ = simulate(FAST, kv, sched, w(100.0), slo=SLO(ttft_s=1.0))
    assert low.stable and low.ttft_s is not None
    assert not high.stable
    assert high.ttft_s is None and high.tpot_s is None and high.e2e_s is None and high.itl_s is None
    assert high.samples is None and len(low.samples.ttft_s) == low.requests
    assert high.goodput_requests_per_s is None
    assert 15.0 < high.sustainable_rate < 25.0
    # per user: the decode rate its requests ran at (16 sequences a ~10 ms step, prompt steps
    # between), not a silent 0 — the closed form gives its saturated rate likewise
    assert 50.0 < high.output_tokens_per_s_per_user < low.output_tokens_per_s_per_user


def test_a_request_that_can_never_fit_is_a_user_error():
    sched = scheduler_config("vllm")
    with pytest.raises(UserError, match=r"request 0 .*can never fit the KV cache of 1024 tokens"):
        simulate(STEP, sched.kv_cache(1024), sched, _fixed(1000, 100, num_requests=2, concurrency=1))
    trt = scheduler_config("trtllm")
    with pytest.raises(UserError, match="--max-num-tokens: 8192 is less than request 0's input_length 9000"):
        simulate(STEP, trt.kv_cache(100_000), trt, _fixed(9000, 10, num_requests=2, concurrency=1))


def test_goodput_counts_requests_meeting_every_slo():
    sched = scheduler_config("vllm")
    w = _open(1.0, n=200)
    all_ok, _ = simulate(STEP, sched.kv_cache(200_000), sched, w, slo=SLO(ttft_s=100.0))
    none_ok, _ = simulate(STEP, sched.kv_cache(200_000), sched, w, slo=SLO(ttft_s=1e-6))
    assert all_ok.goodput_requests_per_s == pytest.approx(all_ok.requests_per_s)
    assert none_ok.goodput_requests_per_s == 0.0


def test_chrome_trace(tmp_path):
    _, tr = _hand_run(trace=True)
    doc = json.loads(tr.to_chrome(tmp_path / "t.json").read_text())
    ev = doc["traceEvents"]
    assert {e["name"] for e in ev if e["ph"] == "X"} == {"queued", "prefill", "decode"}
    assert {e["name"] for e in ev if e["ph"] == "C"} == {"batch", "kv"}
    assert all(e["pid"] == 0 for e in ev)


def test_warmup_is_excluded():
    sched = scheduler_config("vllm")
    res, _ = simulate(STEP, sched.kv_cache(100_000), sched, _fixed(64, 8, num_requests=50, concurrency=5))
    assert res.requests == 45
    res, _ = simulate(STEP, sched.kv_cache(100_000), sched, _fixed(64, 8, num_requests=50, concurrency=5, warmup=0))
    assert res.requests == 50
