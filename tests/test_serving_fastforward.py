"""The event simulation's fast-forward (runs of pure-decode steps advanced without the scheduler,
through completions in an open loop) and the disaggregated loop's split (the prefill pool first,
then each decode instance alone, where nothing flows back) are optimisations only: every figure
equals the one of the same run stepped through the scheduler one step at a time in one event loop —
aggregated and disaggregated, all three engines, open and closed loops, tight KV caches, both
routers, speculative decoding."""

import dataclasses
import math
import random

import numpy as np
import pytest

from perfcast.serving import disagg, sim
from perfcast.serving.disagg import PoolSpec, simulate_disagg
from perfcast.serving.scheduler import scheduler_config
from perfcast.serving.sim import Speculative, simulate
from perfcast.serving.step import GRID, Deployment, compile_step
from perfcast.serving.types import AffineStep
from perfcast.serving.workload import Lengths, Trace, Workload


def _cases(n: int, seed: int = 7) -> list[dict]:
    rnd = random.Random(seed)
    out = []
    for k in range(n):
        isl = rnd.choice([Lengths("fixed", rnd.choice([50, 300, 1000])), Lengths("uniform", 20, 800)])
        osl = rnd.choice([Lengths("fixed", rnd.choice([2, 10, 60, 200])), Lengths("uniform", 2, 150)])
        load = ({"rate": rnd.choice([5.0, 30.0, 200.0]), "cv": rnd.choice([1.0, 2.0])} if rnd.random() < 0.6
                else {"concurrency": rnd.choice([1, 4, 32])})
        out.append(dict(engine=rnd.choice(["vllm", "sglang", "trtllm"]),
                        workload=Workload(isl, osl, num_requests=rnd.choice([40, 120]), seed=k, **load),
                        max_batch_size=rnd.choice([None, 4, 16, 64]), kv=rnd.choice([3000, 20000, 500000]),
                        step=AffineStep(rnd.choice([0.002, 0.01]), rnd.choice([1e-5, 1e-4]), rnd.choice([0.0, 1e-8])),
                        prefill=rnd.choice([1, 2, 3]), decode=rnd.choice([1, 2, 3]), transfer=rnd.choice([0.0, 0.001, 0.02]),
                        router=rnd.choice(["round_robin", "least_loaded"]), first=rnd.choice(["decode", "prefill"]),
                        spec=rnd.random() < 0.1))
    return out


def _run(c: dict, mode: str) -> dict:
    s = scheduler_config(c["engine"], max_batch_size=c["max_batch_size"], max_num_tokens=2048, chunked_prefill=True)
    spec = Speculative(2, (0.8, 0.5), None, 0.1) if c["spec"] else None
    if mode == "agg":
        r, _ = simulate(c["step"], s.kv_cache(c["kv"]), s, c["workload"], speculative=spec)
    else:
        r, _ = simulate_disagg(PoolSpec(c["step"], s.kv_cache(c["kv"]), s, c["prefill"]),
                               PoolSpec(c["step"], s.kv_cache(c["kv"]), s, c["decode"]), c["workload"],
                               transfer_s=lambda n, t=c["transfer"]: t * (1 + n / 1000), router=c["router"],
                               first_token=c["first"], speculative=spec)
    return dataclasses.asdict(r)   # every figure, the step count among them


def _same(a, b, path=""):
    if isinstance(a, dict):
        for k in a:
            _same(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, (list, tuple)) and not (a and isinstance(a[0], str)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            _same(x, y, f"{path}[{i}]")
    elif isinstance(a, float) and isinstance(b, float):
        assert a == b or (math.isnan(a) and math.isnan(b)) or abs(a - b) <= 1e-9 * max(abs(a), abs(b)), (path, a, b)
    else:
        assert a == b, (path, a, b)


@pytest.mark.parametrize("mode", ["agg", "disagg"])
def test_the_fast_forward_changes_no_figure(mode, monkeypatch):
    cases = _cases(60)
    fast = [_run(c, mode) for c in cases]
    monkeypatch.setattr(sim, "_fast_forward", lambda *a, **k: None)
    monkeypatch.setattr(disagg, "_fast_forward", lambda *a, **k: None)
    monkeypatch.setattr(disagg, "SPLIT", False)   # (the decode instances stepped with the prefill pool)
    for c, f in zip(cases, fast):
        _same(f, _run(c, mode), f"{mode} {c['engine']} {c['workload']}")


@pytest.fixture(scope="module")
def llama():
    return compile_step(Deployment("llama-3.1-8b", "h100-sxm", "trtllm"), max_tokens=4096)


def test_a_decode_row_prices_as_decode_s(llama):
    rnd = random.Random(3)
    for _ in range(300):
        b = rnd.randint(1, 256)
        ctx = b * rnd.randint(1, 6000) + rnd.randint(0, b - 1)
        dense, row, host = llama.decode_row(b, ctx)
        x = ctx / b
        i = int(x // GRID)
        f = x / GRID - i
        assert max(dense + (row[i] + f * (row[i + 1] - row[i])), host) == llama.decode_s(b, ctx)
        assert (host > 0) == (b > 128)  # TensorRT-LLM replays CUDA graphs up to 128 sequences, then launches eagerly
    assert llama.decode_row(0, 0) is None and llama.decode_row(5000, 5000) is None


@pytest.mark.parametrize("mode", ["agg", "disagg"])
def test_the_fast_forward_on_a_compiled_step_changes_no_figure(mode, llama, monkeypatch):
    # the fast-forward prices a compiled step from its rows (StepModel.decode_row), not per call
    cases = [dict(c, step=llama, spec=False) for c in _cases(16, seed=11)]
    fast = [_run(c, mode) for c in cases]
    monkeypatch.setattr(sim, "_fast_forward", lambda *a, **k: None)
    monkeypatch.setattr(disagg, "_fast_forward", lambda *a, **k: None)
    monkeypatch.setattr(disagg, "SPLIT", False)
    for c, f in zip(cases, fast):
        _same(f, _run(c, mode), f"{mode} {c['engine']} {c['workload']}")


@pytest.mark.parametrize("engine", ["trtllm", "vllm", "sglang"])
def test_a_decode_instance_stepped_alone_changes_no_figure(engine, monkeypatch):
    # a split run's TensorRT-LLM and vLLM decode instances run in serving.decode_pass: open loops,
    # batch limits within the budget, tight KV caches (TensorRT-LLM's admission waits for blocks;
    # vLLM's falls back to the event loop where its blocks could run out), both clocks
    from perfcast.serving import decode_pass

    ran = []
    real = decode_pass.run
    monkeypatch.setattr(decode_pass, "run", lambda loop, y: ran.append(y.name) or real(loop, y))
    cases = [dict(c, engine=engine, spec=False, router="round_robin", max_batch_size=c["max_batch_size"] or 8,
                  workload=dataclasses.replace(c["workload"], concurrency=None,
                                               rate=c["workload"].rate or 50.0, cv=c["workload"].cv or 1.0))
             for c in _cases(40, seed=5)]
    fast = [_run(c, "disagg") for c in cases]
    assert len(ran) >= 40
    monkeypatch.setattr(disagg, "_fast_forward", lambda *a, **k: None)
    monkeypatch.setattr(disagg, "SPLIT", False)
    for c, f in zip(cases, fast):
        _same(f, _run(c, "disagg"), f"{engine} {c['workload']}")


@pytest.mark.parametrize("blocks", [1, 2])
def test_a_vllm_decode_instance_takes_its_last_block_on_its_last_step(blocks, monkeypatch):
    # one request at a time whose last decode step crosses into a new block: the decode pool's
    # peak is that block (vLLM takes blocks as tokens come), in the split loop and the joint one
    s = scheduler_config("vllm", max_batch_size=8, max_num_tokens=2048)
    bs = s.kv_cache(100_000).block_size
    isl, osl = 4 * bs, blocks * bs + 2         # isl + osl − 1 = 4 + blocks blocks + 1 token
    w = Workload(trace=Trace((0.0, 100.0, 200.0), (isl,) * 3, (osl,) * 3), num_requests=3, warmup=0)

    def peak():
        r, _ = simulate_disagg(PoolSpec(AffineStep(0.01, 1e-5), s.kv_cache(100_000), s),
                               PoolSpec(AffineStep(0.01, 1e-5), s.kv_cache(100_000), s), w, transfer_s=lambda n: 0.001)
        return r.kv_peak_tokens

    assert peak() == (5 + blocks) * bs
    monkeypatch.setattr(disagg, "SPLIT", False)
    assert peak() == (5 + blocks) * bs


@pytest.mark.parametrize("ratio", [(2.5, 0.3, 40), (2.5, 0.9, 2000)], ids=["decaying", "held"])
def test_an_sglang_decode_instance_admits_within_its_reserved_room(ratio, monkeypatch):
    # with new_token_ratio above 1 (a profile may set it) the room, not the KV cache, holds
    # requests back: the decode pass admits as _sglang_admit_prefilled does, the ratio decaying
    from perfcast.serving import decode_pass

    base = scheduler_config("sglang", max_batch_size=8, max_num_tokens=2048)
    s = dataclasses.replace(base, new_token_ratio=ratio)
    kv = s.kv_cache(8 * 700)
    w = Workload(Lengths("fixed", 300), Lengths("fixed", 200), num_requests=60, rate=80.0, seed=3)
    ran = []
    real = decode_pass.run
    monkeypatch.setattr(decode_pass, "run", lambda loop, y: ran.append(y.name) or real(loop, y))

    def served():
        r, _ = simulate_disagg(PoolSpec(AffineStep(0.002, 1e-5), kv, s, 2), PoolSpec(AffineStep(0.01, 1e-5), kv, s),
                               w, transfer_s=lambda n: 0.001)
        return dataclasses.asdict(r)

    split = served()
    assert ran
    monkeypatch.setattr(disagg, "_fast_forward", lambda *a, **k: None)
    monkeypatch.setattr(disagg, "SPLIT", False)
    joint = served()
    _same(split, joint)
    assert split["mean_batch"] < 7.5       # (the room held the batch below its limit)


def test_the_fast_forward_is_taken_through_completions_in_an_open_loop(monkeypatch):
    # requests 100 s apart, each decoding for about 2 s alone: after its prefill step the
    # fast-forward takes its whole decode, through its completion, in one call
    s = scheduler_config("vllm", max_num_tokens=2048)
    w = Workload(trace=Trace(tuple(100.0 * k for k in range(5)), (100,) * 5, (200,) * 5), num_requests=5, warmup=0)
    calls = []
    real = sim._fast_forward
    monkeypatch.setattr(sim, "_fast_forward", lambda *a, **k: calls.append(k) or real(*a, **k))
    r, _ = simulate(AffineStep(0.01, 1e-5), s.kv_cache(100_000), s, w)
    assert all(k == {"finishes": True, "max_steps": None, "first": False, "lag": s.take_in_lag} for k in calls)
    assert r.steps == 5 * 200 and len(calls) == 5


def test_a_closed_loop_s_fast_forward_ends_with_its_first_completions(monkeypatch):
    """One client, 200 output tokens: its prefill step, then one run of 199 decode steps whose last
    is the completion (the client sends then); nothing else is scheduled."""
    s = scheduler_config("vllm", max_num_tokens=2048)
    w = Workload(Lengths("fixed", 100), Lengths("fixed", 200), num_requests=4, warmup=0, concurrency=1)
    steps = []
    real = sim._execute
    monkeypatch.setattr(sim, "_execute", lambda *a: steps.append(a[2]) or real(*a))
    r, _ = simulate(AffineStep(0.01, 1e-5), s.kv_cache(100_000), s, w)
    assert r.steps == 4 * 200 and len(steps) == 4 and all(not p[0][2] for p in steps)


def test_a_closed_loop_s_fast_forward_runs_the_take_in_lag_past_its_first_completion(monkeypatch):
    """Two clients, output lengths 120, 180 and then 50 tokens: after the first prefill step one run
    takes the decodes through the first completion (the run's step 119) and the take-in lag more
    (its client's next request joins no earlier), 121 steps; the next request's prefill is
    scheduled; one run through its completion and the lag (51 steps); the rest of the longest (6)."""
    s = scheduler_config("vllm", max_num_tokens=2048)
    assert s.take_in_lag == 2
    w = Workload(Lengths("fixed", 100), Lengths("fixed", 120), num_requests=3, warmup=0, concurrency=2)
    gen = sim.generate
    monkeypatch.setattr(sim, "generate", lambda x: dataclasses.replace(gen(x), output_length=np.array([120, 180, 50])))
    runs, real = [], sim._fast_forward
    monkeypatch.setattr(sim, "_fast_forward", lambda eng, run, *a, **k: _counted(real, runs, eng, run, *a, **k))
    r, _ = simulate(AffineStep(0.01, 1e-5), s.kv_cache(100_000), s, w)
    assert runs == [121, 51, 6]
    assert r.steps == 180     # the longest request's: the engine never idles


def _counted(real, runs, eng, run, *a, **k):
    before = run.steps
    t = real(eng, run, *a, **k)
    if t is not None:
        runs.append(run.steps - before)
    return t
