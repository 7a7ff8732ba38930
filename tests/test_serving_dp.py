"""Attention-DP ranks simulated together (perfcast.serving.sim_dp): the hand-computed case of
docs/design/serving.md, one coupled rank against the one-engine simulation, identical ranks
against one rank, the balancers, and `perfcast serve` choosing the coupled simulation."""

import dataclasses

import pytest

from perfcast.serving.scheduler import scheduler_config
from perfcast.serving.sim import simulate
from perfcast.serving.sim_dp import simulate_coupled
from perfcast.serving.types import AffineStep
from perfcast.serving.workload import Lengths, Trace, Workload

from serving_doc import table

SECTION = "Attention-DP ranks step together"
STEP = AffineStep(fixed_s=0.010, per_token_s=0.001)   # a step of T tokens: 10 + T ms


def _hand(coupled: bool):
    sched = scheduler_config("vllm", max_num_tokens=8)
    w = Workload(trace=Trace((0.0, 0.015), (2, 8), (4, 2)), num_requests=2, warmup=0)
    kv = sched.kv_cache(4096)
    if coupled:
        return simulate_coupled(STEP, kv, sched, w, 2, trace=True)
    # independent ranks: each request alone on its own engine instance
    one = [simulate(STEP, kv, sched, Workload(trace=Trace((a,), (i,), (o,)), num_requests=1, warmup=0))[0]
           for a, i, o in ((0.0, 2, 4), (0.015, 8, 2))]
    return one, None


def test_hand_computed_coupled_ranks_match_the_design_doc():
    res, tr = _hand(True)
    steps = table(SECTION, "| step |")
    assert [c[0] * 1e3 for c in tr.counters] == pytest.approx([float(r[4]) for r in steps], rel=1e-12)
    assert [c[4] * 1e3 for c in tr.counters] == pytest.approx([0.0] + [float(r[4]) for r in steps[:-1]], rel=1e-12)
    assert [(c[0] - c[4]) * 1e3 for c in tr.counters] == pytest.approx([float(r[3]) for r in steps], rel=1e-12)
    reqs = table(SECTION, "| request |")
    assert [t * 1e3 for t in res.samples.ttft_s] == pytest.approx([float(r[1]) for r in reqs], rel=1e-12)
    assert [t * 1e3 for t in res.samples.tpot_s] == pytest.approx([float(r[2]) for r in reqs], abs=5e-3)
    alone, _ = _hand(False)
    assert [r.ttft_s.mean * 1e3 for r in alone] == pytest.approx([float(r[3]) for r in reqs], rel=1e-12)
    assert [r.tpot_s.mean * 1e3 for r in alone] == pytest.approx([float(r[4]) for r in reqs], rel=1e-12)
    assert res.steps == 4 and res.mean_batch == pytest.approx(6 / 4 / 2)
    assert any("2 attention-DP ranks stepped together" in n for n in res.notes)


def _figures(r) -> list[float]:
    """Every figure of a result, flat (the fast-forward sums ITL gaps in another order: equal to the last bits)."""
    out = [r.output_tokens_per_s, r.requests_per_s, r.steps, r.kv_peak_tokens, r.preemptions, r.stable,
           r.sustainable_rate or 0.0]
    if r.samples is not None:
        out += [*r.samples.ttft_s, *r.samples.tpot_s]
        for s in (r.ttft_s, r.tpot_s, r.itl_s, r.e2e_s):
            out += [s.mean, s.p50, s.p90, s.p99]
    return out


@pytest.mark.parametrize("engine", ["vllm", "sglang", "trtllm"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_one_coupled_rank_is_the_one_engine_simulation(engine, seed):
    sched = scheduler_config(engine, max_num_tokens=640)
    kv = sched.kv_cache(6000)   # tight: vLLM preempts, SGLang retracts, TensorRT-LLM holds requests back
    for w in (Workload(Lengths("uniform", 50, 600), Lengths("uniform", 5, 80),
                       concurrency=12, num_requests=60, seed=seed),
              Workload(Lengths("uniform", 50, 600), Lengths("uniform", 5, 80),
                       rate=1.0, num_requests=60, seed=seed, cv=2.0)):
        one, _ = simulate(STEP, kv, sched, w)
        coupled, _ = simulate_coupled(STEP, kv, sched, w, 1)
        assert one.stable and one.samples is not None
        assert _figures(coupled) == pytest.approx(_figures(one), rel=1e-12, abs=1e-15)


@pytest.mark.parametrize("engine", ["vllm", "trtllm"])
def test_ranks_with_identical_loads_are_one_rank(engine):
    sched = scheduler_config(engine, max_num_tokens=256)
    kv = sched.kv_cache(1 << 20)
    w = Workload(Lengths("fixed", 200), Lengths("fixed", 30), concurrency=8, num_requests=64)
    one, _ = simulate(STEP, kv, sched, w, devices=2)
    four, _ = simulate_coupled(STEP, kv, sched, dataclasses.replace(w, concurrency=32, num_requests=256), 4,
                               devices=2)
    # every request's figures four times over (percentiles of 4n samples interpolate differently)
    for a, b in ((four.samples.ttft_s, one.samples.ttft_s), (four.samples.tpot_s, one.samples.tpot_s)):
        assert sorted(a) == pytest.approx(sorted(b * 4), rel=1e-12)
    for a, b in ((four.ttft_s, one.ttft_s), (four.tpot_s, one.tpot_s), (four.e2e_s, one.e2e_s)):
        assert a.mean == pytest.approx(b.mean, rel=1e-12)
    assert four.output_tokens_per_s == pytest.approx(4 * one.output_tokens_per_s, rel=1e-12)
    assert four.output_tokens_per_s_per_device == pytest.approx(one.output_tokens_per_s_per_device, rel=1e-12)
    assert four.devices == 8 and four.mean_batch == pytest.approx(one.mean_batch, rel=1e-12)


def test_a_prefill_on_one_rank_slows_every_rank():
    """Varying lengths: the ranks' prefills fall in different steps, so coupled ranks decode more
    slowly than independent ones with the same share of the load."""
    sched = scheduler_config("vllm")
    kv = sched.kv_cache(1 << 20)
    lengths = Lengths("uniform", 1600, 2000), Lengths("uniform", 80, 100)
    alone, _ = simulate(STEP, kv, sched, Workload(*lengths, concurrency=8, num_requests=80))
    coupled, _ = simulate_coupled(STEP, kv, sched, Workload(*lengths, concurrency=32, num_requests=320), 4)
    assert coupled.tpot_s.mean > 1.3 * alone.tpot_s.mean
    assert coupled.output_tokens_per_s < 4 * alone.output_tokens_per_s


@pytest.mark.parametrize("engine, expected", [("sglang", [0, 1, 2, 0, 1, 2]), ("vllm", [0, 1, 2, 0, 0, 0])])
def test_the_balancers(engine, expected, monkeypatch):
    """Round robin hands requests out in turn; least loaded to the rank with the fewest unfinished
    requests (rank 0's short requests finish before the next arrives; ranks 1 and 2 are still busy)."""
    import perfcast.serving.sim_dp as sim_dp

    sched = scheduler_config(engine, max_num_tokens=64)
    w = Workload(trace=Trace((0.0, 0.0, 0.0, 0.5, 0.6, 0.7), (4, 40, 40, 4, 4, 4), (2, 200, 200, 2, 2, 2)),
                 num_requests=6, warmup=0)
    seen, real = {}, sim_dp._Coupled._route

    def route(self, i):
        seen[i] = real(self, i)
        return seen[i]

    monkeypatch.setattr(sim_dp._Coupled, "_route", route)
    simulate_coupled(STEP, sched.kv_cache(1 << 16), sched, w, 3)
    assert [seen[i] for i in range(6)] == expected


def test_serve_steps_attention_dp_ranks_together_and_dense_replicas_apart():
    from perfcast.capture.parallel import Layout
    from perfcast.serving.serve import ServeSpec, serve
    from perfcast.serving.step import Deployment

    w = Workload(Lengths("uniform", 800, 1200), Lengths("uniform", 40, 80), concurrency=8, num_requests=48)
    moe = Deployment("qwen3-30b-a3b", "h100-sxm", "vllm", Layout(dp=2, ep=2, attention_dp=True))
    rep = serve(ServeSpec(moe, w))
    sim = rep.results["simulation"]
    assert any("2 attention-DP ranks stepped together" in n for n in sim.notes)
    assert not any("one of 2 data-parallel ranks simulated" in n for n in sim.notes)
    assert any("one of 2 data-parallel ranks priced" in n for n in rep.results["closed form"].notes)
    assert sim.devices == 2
    # a trace is replayed on the coupled ranks as one engine (independent ranks would each need their own)
    traced = serve(ServeSpec(moe, Workload(trace=Trace((0.0, 0.01, 0.02), (900, 1000, 1100), (40, 50, 60)),
                                           num_requests=3, warmup=0))).results["simulation"]
    assert traced.requests == 3


def _balance_run(arrivals, osl, balance):
    sched = scheduler_config("trtllm", max_num_tokens=64)
    if balance is not None:
        sched = dataclasses.replace(sched, adp_balance=balance)
    n = len(arrivals)
    w = Workload(trace=Trace(arrivals, (4,) * n, osl), num_requests=n, warmup=0)
    res, tr = simulate_coupled(STEP, sched.kv_cache(1 << 16), sched, w, 2, trace=True)
    return res.samples.ttft_s, {(i, ph): (x, y) for i, ph, x, y in tr.spans}


def test_tensorrt_llm_holds_a_rank_s_prompt_until_every_rank_has_one():
    """attention_dp_config enable_balance: R2 alone on rank 0 is held while rank 1 has no prompt —
    here until rank 1's R1 finishes (its last generation request) with the timeout out of reach; with R3
    arriving for rank 1 at the same time both go at once; batching_wait_iters 3 holds ready prompts
    three steps more (one decode each, 11 ms)."""
    alone = (0.0, 0.0, 0.1), (200, 200, 2)
    plain, _ = _balance_run(*alone, None)
    held, spans = _balance_run(*alone, (0, 10_000))
    assert held[:2] == pytest.approx(plain[:2], rel=1e-12)
    assert spans[(2, "prefill")][0] == pytest.approx(spans[(1, "decode")][1], rel=1e-12)   # after R1 finishes
    pair = (0.0, 0.0, 0.1, 0.1), (200, 200, 2, 2)
    assert _balance_run(*pair, (0, 10_000))[0] == pytest.approx(_balance_run(*pair, None)[0], rel=1e-12)
    waited = _balance_run(*pair, (3, 10_000))[0]
    assert [b - a for a, b in zip(_balance_run(*pair, None)[0][2:], waited[2:])] == pytest.approx([0.033, 0.033])


def test_the_balance_timeout_counts_every_step_without_prompts_on_every_rank():
    """TensorRT-LLM counts towards timeout_iters in every step in which not every rank has a prompt
    (none included) and lets the prompts go when it is reached: with timeout 1 nothing is held."""
    alone = (0.0, 0.0, 0.1), (200, 200, 2)
    assert _balance_run(*alone, (0, 1))[0] == pytest.approx(_balance_run(*alone, None)[0], rel=1e-12)


def test_attention_dp_balance_is_refused_where_it_cannot_apply():
    from perfcast.ir.errors import UserError

    with pytest.raises(UserError, match="TensorRT-LLM's"):
        dataclasses.replace(scheduler_config("vllm"), adp_balance=(0, 60))


@pytest.mark.parametrize("engine", ["vllm", "sglang", "trtllm"])
def test_the_closed_form_of_coupled_ranks_follows_the_simulation(engine):
    """Four coupled ranks of 16 clients each, lengths varying ±10 %: the closed form's mean step
    with every rank's prompts (U = 1 − (1 − u)^R) against the simulation, and the one-rank form
    at R = 1 unchanged."""
    from perfcast.serving import meanfield

    sched = scheduler_config(engine, max_num_tokens=2048)
    kv = sched.kv_cache(1 << 20)
    cfg = meanfield.EngineConfig(policy=sched.policy, max_batch=1024, max_num_tokens=sched.max_num_tokens,
                                 chunked_prefill=sched.chunked_prefill, kv_capacity_tokens=kv.capacity_tokens,
                                 take_in_lag=sched.take_in_lag)
    load = meanfield.Workload(isl=1000, osl=100, concurrency=16)
    one = meanfield.solve(STEP, cfg, load)
    assert meanfield.solve(STEP, dataclasses.replace(cfg, coupled_ranks=1), load) == one
    four = meanfield.solve(STEP, dataclasses.replace(cfg, coupled_ranks=4), load)
    assert four.tpot_s.mean > 1.3 * one.tpot_s.mean
    lengths = Lengths("uniform", 900, 1100), Lengths("uniform", 90, 110)
    sim, _ = simulate_coupled(STEP, kv, sched, Workload(*lengths, concurrency=64, num_requests=1280), 4)
    assert sim.tpot_s.mean == pytest.approx(four.tpot_s.mean, rel=0.2)   # 0.83–0.91 (docs/design/serving.md)
    alone, _ = simulate(STEP, kv, sched, Workload(*lengths, concurrency=16, num_requests=320))
    assert alone.tpot_s.mean == pytest.approx(one.tpot_s.mean, rel=0.15)


def test_the_closed_form_grid_refuses_coupled_ranks():
    from perfcast.ir.errors import UserError
    from perfcast.serving import meanfield
    from perfcast.serving.meanfield_grid import closed_loop_grid

    with pytest.raises(UserError, match="coupled attention-DP ranks"):
        closed_loop_grid(STEP, meanfield.EngineConfig(coupled_ranks=2), [1000], 100, [16])


@pytest.mark.parametrize("rate, ranks, wait, timeout", [(0.032, 8, 0, 60), (0.032, 8, 10, 50), (0.2, 4, 10, 50),
                                                        (0.05, 1, 0, 60), (0.5, 8, 0, 60), (0.01, 2, 3, 20)])
def test_the_balance_hold_is_the_renewal_mean(rate, ranks, wait, timeout):
    """queueing.balance_hold_steps against 200,000 sampled cycles: each rank's first prompt at an
    exponential time, the cycle ending when every rank has one (then ``wait`` steps more) or at the
    timeout; a rank's later prompts, Poisson after its first, counted by their expectation."""
    import numpy as np

    from perfcast.serving.queueing import balance_hold_steps

    first = np.random.default_rng(5).exponential(1 / rate, (200_000, ranks))
    t = first.max(axis=1)
    end = np.where(t <= timeout, t + wait, float(timeout))[:, None]
    span = np.where(first <= end, end - first, np.nan)
    held = np.nansum(span + rate * span ** 2 / 2)
    count = np.nansum(np.where(np.isnan(span), np.nan, 1 + rate * span))
    assert balance_hold_steps(rate, ranks, wait, timeout) == pytest.approx(held / count, rel=0.01)
    assert balance_hold_steps(0.0, ranks, wait, timeout) == timeout / 2


def test_the_closed_form_holds_balanced_prompts_as_the_simulation_does():
    """TensorRT-LLM's attention-DP balance on 8 ranks of 32 clients, a decode-dominated step (20 ms +
    50 µs a token), isl 1,000, osl 1,000 ±10 %: the closed form's TTFT with the mean hold against the
    simulation's (0.76 against 0.72 s; 0.14 s without the hold), its TPOT and throughput within 11 %."""
    from perfcast.serving import meanfield

    step = AffineStep(fixed_s=0.020, per_token_s=0.00005)
    sched = scheduler_config("trtllm", max_num_tokens=8192, adp_balance=(0, 60))
    kv = sched.kv_cache(1 << 22)
    cfg = meanfield.EngineConfig(policy="trtllm", max_batch=1024, max_num_tokens=8192,
                                 chunked_prefill=sched.chunked_prefill, kv_capacity_tokens=kv.capacity_tokens,
                                 take_in_lag=sched.take_in_lag, coupled_ranks=8, adp_balance=(0, 60))
    load = meanfield.Workload(isl=1000, osl=1000, concurrency=32)
    cf = meanfield.solve(step, cfg, load)
    lengths = Lengths("uniform", 900, 1100), Lengths("uniform", 900, 1100)
    sim, _ = simulate_coupled(step, kv, sched, Workload(*lengths, concurrency=256, num_requests=3072), 8)
    assert cf.ttft_s.mean == pytest.approx(sim.ttft_s.mean, rel=0.1)
    assert cf.tpot_s.mean == pytest.approx(sim.tpot_s.mean, rel=0.1)
    assert cf.output_tokens_per_s * 8 == pytest.approx(sim.output_tokens_per_s, rel=0.15)
    apart = meanfield.solve(step, dataclasses.replace(cfg, adp_balance=None, coupled_ranks=1), load)
    assert apart.ttft_s.mean < 0.25 * sim.ttft_s.mean
