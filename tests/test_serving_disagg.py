"""Disaggregated serving in the event simulation: the hand-computed case of
docs/design/serving.md, Little's law across both pools, what the decode pool and the transfer
change, agreement with the closed form, determinism, and the errors."""

import json

import pytest

from perfcast.ir.errors import UserError
from perfcast.serving.disagg import PoolSpec, simulate_disagg
from perfcast.serving.meanfield import EngineConfig
from perfcast.serving.meanfield import Workload as ClosedFormLoad
from perfcast.serving.meanfield_disagg import Pool, disaggregated
from perfcast.serving.scheduler import scheduler_config
from perfcast.serving.sim import Speculative
from perfcast.serving.types import AffineStep
from perfcast.serving.workload import Lengths, Trace, Workload

from serving_doc import table

CASE = "Disaggregated: a hand-computed case"  # docs/design/serving.md

STEP = AffineStep(fixed_s=0.010, per_token_s=0.001)   # a step of T tokens: 10 + T ms
LINE = AffineStep(0.005, 2e-5, 1e-8)


def _pools(engine="vllm", prefill=1, decode=1, step=LINE, kv=500_000, **sched):
    s = scheduler_config(engine, **sched)
    return PoolSpec(step, s.kv_cache(kv), s, prefill), PoolSpec(step, s.kv_cache(kv), s, decode)


def _fixed(isl, osl, **kw):
    return Workload(Lengths("fixed", isl), Lengths("fixed", osl), **kw)


def _hand_run():
    pre, dec = _pools(step=STEP, kv=4096, max_num_tokens=16)
    w = Workload(trace=Trace((0.0, 0.0, 0.0), (10, 6, 4), (3, 2, 3)), num_requests=3, warmup=0)
    return simulate_disagg(pre, dec, w, transfer_s=lambda n: 0.005, trace=True, first_token="prefill")


def test_hand_computed_case():
    # TTFT 26, 26, 40 ms; finishes 54, 54, 76 ms; TPOT (54−26)/2, (54−26)/1, (76−40)/2 ms
    res, _ = _hand_run()
    assert res.ttft_s.mean == pytest.approx((26 + 26 + 40) / 3e3, rel=1e-12)
    assert res.tpot_s.mean == pytest.approx((14 + 28 + 18) / 3e3, rel=1e-12)
    assert res.e2e_s.mean == pytest.approx((54 + 54 + 76) / 3e3, rel=1e-12)
    assert res.steps == 2 + 4
    assert res.output_tokens_per_s == pytest.approx(8 / 0.076, rel=1e-12)
    assert res.devices == 2 and res.output_tokens_per_s_per_device == pytest.approx(4 / 0.076, rel=1e-12)


def test_hand_computed_case_matches_the_design_doc():
    _, tr = _hand_run()
    pre, dec = tr.by_name("prefill 0"), tr.by_name("decode 0")
    spans = {(i, phase): (a, b) for t in (pre, dec) for i, phase, a, b in t.spans}
    ms = pytest.approx
    for k, (name, isl, osl, ttft, tpot) in enumerate(table(CASE, "| request | input |")):
        assert name == f"R{k}"
        first, finish = spans[(k, "prefill")][1], spans[(k, "decode")][1]
        assert first * 1e3 == ms(float(ttft), rel=1e-12)
        assert (finish - first) / (int(osl) - 1) * 1e3 == ms(float(tpot), rel=1e-12)
    for k, (name, ends, starts, arrives) in enumerate(table(CASE, "| request | prefill ends")):
        assert spans[(k, "prefill")][1] * 1e3 == ms(float(ends), rel=1e-12)
        assert [x * 1e3 for x in spans[(k, "transfer")]] == ms([float(starts), float(arrives)], rel=1e-12)
    assert [c[0] * 1e3 for c in pre.counters] == ms([float(r[4]) for r in table(CASE, "| step | scheduled (tokens)")])
    assert [c[0] * 1e3 for c in dec.counters] == ms([float(r[4]) for r in table(CASE, "| step | scheduled |")])


@pytest.mark.parametrize("engine", ["vllm", "sglang", "trtllm"])
@pytest.mark.parametrize("c,router", [(4, "round_robin"), (24, "round_robin"), (24, "least_loaded")])
def test_closed_loop_littles_law_across_both_pools(engine, c, router):
    # C / request throughput = mean E2E, up to the ramp-up and drain of the counted window
    n, osl = 30 * c, 40
    pre, dec = _pools(engine, prefill=1, decode=2)
    res, _ = simulate_disagg(pre, dec, _fixed(300, osl, num_requests=n, concurrency=c, seed=1),
                             transfer_s=lambda isl: 1e-5 * isl, router=router)
    e2e = res.ttft_s.mean + (osl - 1) * res.tpot_s.mean
    assert e2e == pytest.approx(res.e2e_s.mean, rel=1e-9)
    assert c / res.requests_per_s == pytest.approx(res.e2e_s.mean, rel=1.5 * c / (n - c) + 0.01)


def test_more_decode_instances_lower_tpot_at_high_concurrency():
    step = AffineStep(0.005, 2e-4)   # a 64-sequence decode step: 17.8 ms; 32 sequences: 11.4 ms
    w = _fixed(200, 100, num_requests=640, concurrency=64)
    one, _ = simulate_disagg(*_pools(decode=1, step=step), w, transfer_s=lambda n: 0.002)
    two, _ = simulate_disagg(*_pools(decode=2, step=step), w, transfer_s=lambda n: 0.002)
    assert two.tpot_s.mean < 0.8 * one.tpot_s.mean
    assert two.devices == 3 and one.devices == 2


def test_from_the_decode_side_the_first_token_waits_for_the_transfer_and_a_decode_step():
    w = _fixed(300, 20, num_requests=60, rate=2.0, seed=2)
    at_prefill, _ = simulate_disagg(*_pools(), w, transfer_s=lambda n: 0.05, first_token="prefill")
    at_decode, _ = simulate_disagg(*_pools(), w, transfer_s=lambda n: 0.05)
    assert at_decode.ttft_s.mean > at_prefill.ttft_s.mean + 0.05
    assert at_decode.e2e_s.mean == pytest.approx(at_prefill.e2e_s.mean, rel=1e-12)


def test_the_transfer_delays_the_second_token_not_the_first():
    # one client, one request at a time: the transfer adds exactly to E2E, and to TPOT / (osl − 1)
    w = _fixed(500, 21, num_requests=6, concurrency=1)
    fast, _ = simulate_disagg(*_pools(), w, transfer_s=lambda n: 0.0, first_token="prefill")
    slow, _ = simulate_disagg(*_pools(), w, transfer_s=lambda n: 0.05, first_token="prefill")
    assert slow.ttft_s == fast.ttft_s
    assert slow.e2e_s.mean - fast.e2e_s.mean == pytest.approx(0.05, rel=1e-9)
    assert slow.tpot_s.mean - fast.tpot_s.mean == pytest.approx(0.05 / 20, rel=1e-9)


def test_agrees_with_the_closed_form_on_poisson_arrivals():
    """1P2D, isl 1000, osl 101, 5 req/s, a 10 ms transfer. The closed form counts the transfer
    in TTFT, so it is compared with the simulation's TTFT + transfer. Tolerances: throughput 5 %
    (both serve the offered rate, the simulation the rate of its sampled arrivals: ±1/√1350 ≈ 3 %
    for the counted requests), TPOT 5 % (the closed form prices
    the mean batch, τ(E[d]), the simulation averages τ over the batch's fluctuations), TTFT 10 %
    (an M/D/1 prefill wait against the simulation's actual batching of the prompts)."""
    isl, osl, rate, xfer = 1000, 101, 5.0, 0.01
    pre, dec = _pools(decode=2)
    res, _ = simulate_disagg(pre, dec, _fixed(isl, osl, num_requests=1500, rate=rate), transfer_s=lambda n: xfer,
                             first_token="prefill")
    engine = EngineConfig(policy="vllm", max_batch=pre.sched.max_num_seqs, max_num_tokens=pre.sched.max_num_tokens,
                          kv_capacity_tokens=500_000)
    cf = disaggregated(Pool(LINE, engine, 1), Pool(LINE, engine, 2), ClosedFormLoad(isl, osl, rate_per_s=rate), xfer)
    assert res.stable
    assert res.output_tokens_per_s == pytest.approx(cf.output_tokens_per_s, rel=0.05)
    assert res.tpot_s.mean == pytest.approx(cf.tpot_s.mean, rel=0.05)
    assert res.ttft_s.mean + xfer == pytest.approx(cf.ttft_s.mean, rel=0.10)


@pytest.mark.parametrize("rho", [0.5, 0.8])
def test_the_closed_forms_prefill_wait_is_the_round_robin_routers(rho):
    """4P2D, isl 4000, osl 51, Poisson arrivals at ρ of the pair's saturated rate. The simulation
    routes round robin, each prefill instance taking every fourth arrival; the closed form's wait
    is Allen–Cunneen's for those Erlang arrivals, a quarter of a Poisson instance's M/D/1 wait:
    TTFT within 10 % (185 / 174 ms, 246 / 239 ms); with the M/D/1 wait of a random split it would
    be 1.4× / 2.1× the simulation's."""
    from perfcast.serving.meanfield_disagg import _pools as closed_pools
    from perfcast.serving.meanfield_disagg import sustainable_rate
    from perfcast.serving.queueing import md1_wait, split_wait

    isl, osl = 4000, 51
    pre, dec = _pools(prefill=4, decode=2)
    engine = EngineConfig(policy="vllm", max_batch=pre.sched.max_num_seqs, max_num_tokens=pre.sched.max_num_tokens,
                          kv_capacity_tokens=500_000)
    pp, dp = Pool(LINE, engine, 4), Pool(LINE, engine, 2)
    rate = rho * sustainable_rate(pp, dp, ClosedFormLoad(isl, osl))
    res, _ = simulate_disagg(pre, dec, _fixed(isl, osl, num_requests=3000, rate=rate), transfer_s=lambda n: 0.0,
                             first_token="prefill")
    cf = disaggregated(pp, dp, ClosedFormLoad(isl, osl, rate_per_s=rate), 0.0)
    assert res.stable and cf.stable
    assert cf.ttft_s.mean == pytest.approx(res.ttft_s.mean, rel=0.10)
    mu = closed_pools(pp, dp, ClosedFormLoad(isl, osl), None).mu_prefill
    random_split = cf.ttft_s.mean - split_wait("round_robin", rate, mu, 4) + md1_wait(rate / (4 * mu), mu)
    assert random_split > 1.3 * res.ttft_s.mean


def test_least_loaded_counts_an_instance_mid_step_as_busy():
    """At a low rate no prompt should wait behind another while an instance is idle: the least
    loaded router's TTFT is round robin's, its p99 included (it was a whole prefill more when an
    instance in the middle of a step looked idle)."""
    pre, dec = _pools(prefill=4, decode=1)
    w = _fixed(4000, 11, num_requests=400, rate=2.0)
    rr, _ = simulate_disagg(pre, dec, w, transfer_s=lambda n: 0.0, router="round_robin")
    ll, _ = simulate_disagg(pre, dec, w, transfer_s=lambda n: 0.0, router="least_loaded")
    assert ll.ttft_s.p99 == pytest.approx(rr.ttft_s.p99, rel=0.05)
    assert ll.ttft_s.mean == pytest.approx(rr.ttft_s.mean, rel=0.02)


def test_deterministic_for_a_seed():
    pre, dec = _pools("sglang", prefill=2, decode=2)
    w = Workload(Lengths("uniform", 100, 900), Lengths("uniform", 10, 120), num_requests=300, rate=8.0, seed=3)
    a, _ = simulate_disagg(pre, dec, w, transfer_s=lambda n: 2e-5 * n)
    b, _ = simulate_disagg(pre, dec, w, transfer_s=lambda n: 2e-5 * n)
    c, _ = simulate_disagg(pre, dec, Workload(w.input_len, w.output_len, num_requests=300, rate=8.0, seed=4),
                           transfer_s=lambda n: 2e-5 * n)
    assert a == b
    assert a.ttft_s != c.ttft_s


def test_a_request_that_never_fits_a_decode_instance_is_one_line():
    pre, _ = _pools()
    s = scheduler_config("vllm")
    small = PoolSpec(LINE, s.kv_cache(1024), s, 2)
    with pytest.raises(UserError, match="request 0 .*decode instance's KV cache of 1024 tokens") as e:
        simulate_disagg(pre, small, _fixed(1000, 100, num_requests=4, concurrency=2), transfer_s=lambda n: 0.0)
    assert "\n" not in str(e.value)


def test_a_small_decode_cache_queues_or_preempts_but_finishes():
    # each decode instance holds about three of these sequences at once
    pre, _ = _pools()
    for engine in ("vllm", "sglang", "trtllm"):
        s = scheduler_config(engine)
        res, _ = simulate_disagg(pre, PoolSpec(LINE, s.kv_cache(2048), s, 1),
                                 _fixed(500, 120, num_requests=60, concurrency=12), transfer_s=lambda n: 0.001)
        assert res.requests == 48 and res.kv_peak_tokens <= 2048
        assert engine != "trtllm" or res.preemptions == 0


def test_speculative_decoding_runs_on_the_decode_pool():
    spec = Speculative(1, (1.0,), draft_fraction=0.0)
    res, _ = simulate_disagg(*_pools(), _fixed(200, 41, num_requests=40, concurrency=4), transfer_s=lambda n: 0.0,
                             speculative=spec)
    assert res.decode_tokens_per_step == pytest.approx(2.0)


def test_chrome_trace_has_a_process_per_instance(tmp_path):
    pre, dec = _pools(prefill=2, decode=2)
    _, tr = simulate_disagg(pre, dec, _fixed(300, 10, num_requests=12, concurrency=4), transfer_s=lambda n: 0.003,
                            trace=True)
    events = json.loads(tr.to_chrome(tmp_path / "t.json").read_text())["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert names == {0: "prefill 0", 1: "prefill 1", 2: "decode 0", 3: "decode 1"}  # a process each
    assert {e["pid"] for e in events} == {0, 1, 2, 3}
    phases = {e["name"] for e in events if e["ph"] == "X"}
    assert {"prefill", "transfer", "decode"} <= phases
    assert {p for t in tr.traces[:2] for _, p, _, _ in t.spans} <= {"queued", "prefill"}


def test_pool_and_router_errors():
    s = scheduler_config("vllm")
    with pytest.raises(UserError, match="instances"):
        PoolSpec(LINE, s.kv_cache(4096), s, 0)
    with pytest.raises(UserError, match="--router"):
        simulate_disagg(*_pools(), _fixed(10, 2, num_requests=2, concurrency=1), transfer_s=lambda n: 0.0,
                        router="random")
