"""SGLang's request take-in interval (``--scheduler-recv-interval``, ``SchedulerRecvSkipper``) in
the event simulation and the closed form, and the InferenceX launch settings that set it."""

from __future__ import annotations

import dataclasses
import json

import pytest

from fuzzing import run_cli
from perfcast.inference.recipes import recipe_of
from perfcast.ir.errors import UserError
from perfcast.serving import meanfield, sim
from perfcast.serving import replay as replay_mod
from perfcast.serving.scheduler import scheduler_config
from perfcast.serving.sim import simulate
from perfcast.serving.types import AffineStep
from perfcast.serving.workload import Lengths, Trace, Workload
from serving_doc import table
from silicon_rows import case as _case
from test_serving_fastforward import _same

STEP = AffineStep(fixed_s=0.010, per_token_s=0.001)  # a step of T tokens: 10 + T ms


def _run(interval: int):
    """R0 (10 in, 6 out) at 0, R1 (10 in, 3 out) at 25 ms, R2 (10 in, 2 out) at 60 ms, on SGLang with a
    synchronous loop (docs/design/serving.md, "Overlap scheduling")."""
    s = scheduler_config("sglang", recv_interval=interval, overlap=False)
    w = Workload(trace=Trace((0.0, 0.025, 0.060), (10, 10, 10), (6, 3, 2)), num_requests=3, warmup=0)
    return simulate(STEP, s.kv_cache(100_000), s, w, trace=True)


def test_a_request_sent_during_decodes_waits_for_the_next_take_in():
    # hand-computed (ms): R0's prefill 20; its decodes 31, 42, 53 — R1, sent at 25, is taken in only
    # when three decode steps have run; R1's prefill 73; R2, sent at 60, is taken in right after a
    # prefill: its prefill 93; then 106 (three decodes), 118
    res, tr = _run(3)
    assert [c[0] * 1e3 for c in tr.counters] == pytest.approx([20, 31, 42, 53, 73, 93, 106, 118], rel=1e-12)
    assert [c[3] for c in tr.counters] == [1, 0, 0, 0, 1, 1, 0, 0]          # prefill chunks per step
    assert res.ttft_s.mean * 1e3 == pytest.approx((20 + 48 + 33) / 3, rel=1e-12)
    # taken in every step (SGLang's default), R1's prompt runs at 31 ms
    plain, tr1 = _run(1)
    assert [c[0] * 1e3 for c in tr1.counters][:3] == pytest.approx([20, 31, 51], rel=1e-12)
    assert plain.ttft_s.mean * 1e3 == pytest.approx(23, rel=1e-12)


def test_the_design_docs_take_in_example():
    _, tr = _run(3)
    rows = table("Request take-in interval (SGLang)", "| step |")
    assert [float(r[4]) for r in rows] == pytest.approx([c[0] * 1e3 for c in tr.counters], rel=1e-12)
    assert [r[1].count("prefill 10") for r in rows] == [c[3] for c in tr.counters]
    assert [int(r[3]) for r in rows] == [c[1] if not c[3] else 10 for c in tr.counters]   # tokens T


@pytest.mark.parametrize("interval", [2, 7, 30])
def test_the_fast_forward_stops_at_each_take_in(interval, monkeypatch):
    # decode runs are advanced without the scheduler only up to the next take-in: every figure equals
    # the run stepped one step at a time
    w = Workload(Lengths("uniform", 50, 400), Lengths("uniform", 20, 200), concurrency=12, num_requests=120, seed=3)
    opened = Workload(Lengths("uniform", 50, 400), Lengths("uniform", 20, 200), rate=20.0, num_requests=120, seed=4)
    s = scheduler_config("sglang", recv_interval=interval)
    fast = [dataclasses.asdict(simulate(STEP, s.kv_cache(200_000), s, x)[0]) for x in (w, opened)]
    monkeypatch.setattr(sim, "_fast_forward", lambda *a, **k: None)
    for x, f in zip((w, opened), fast):
        _same(f, dataclasses.asdict(simulate(STEP, s.kv_cache(200_000), s, x)[0]), f"{interval} {x}")


def test_the_closed_form_adds_the_wait_and_agrees_with_the_simulation():
    # desynchronised clients (uniform lengths): the simulation's mean TTFT rises by about
    # (N − 1) / 2 decode steps, as the closed form's does
    w = Workload(Lengths("uniform", 800, 1024), Lengths("uniform", 800, 1024), concurrency=16, num_requests=320,
                 seed=1)
    engine = meanfield.EngineConfig(policy="sglang", max_batch=4096, max_num_tokens=8192, kv_capacity_tokens=10**6,
                                    take_in_lag=2)   # SGLang's overlap schedule, as the simulation's profile
    load = meanfield.Workload(isl=912, osl=912, concurrency=16)
    step = AffineStep(fixed_s=0.010, per_token_s=2e-5)
    for n in (1, 10, 30):
        s = scheduler_config("sglang", recv_interval=n, max_num_tokens=8192)
        simulated = simulate(step, s.kv_cache(10**6), s, w)[0]
        closed = meanfield.closed_loop(step, meanfield.EngineConfig(**{**engine.__dict__, "recv_interval": n}), load)
        assert simulated.ttft_s.mean == pytest.approx(closed.ttft_s.mean, rel=0.15), n
        assert simulated.tpot_s.mean == pytest.approx(closed.tpot_s.mean, rel=0.05), n
    one = meanfield.closed_loop(step, engine, load)
    ten = meanfield.closed_loop(step, meanfield.EngineConfig(**{**engine.__dict__, "recv_interval": 10}), load)
    decode = step.step_s(meanfield._Model(step, engine, load).decode_mix(16))
    assert ten.ttft_s.mean - one.ttft_s.mean == pytest.approx(4.5 * decode, rel=0.05)


def test_the_take_in_interval_is_sglangs_and_one_by_default():
    assert scheduler_config("sglang").recv_interval == 1
    with pytest.raises(UserError, match="taking in requests every N decode steps is SGLang's"):
        scheduler_config("vllm", recv_interval=10)
    with pytest.raises(UserError, match="above 1 only for sglang"):
        meanfield.EngineConfig(policy="trtllm", recv_interval=2)
    with pytest.raises(UserError, match="priced by meanfield.closed_loop only"):
        from perfcast.serving.meanfield_grid import closed_loop_grid

        closed_loop_grid(STEP, meanfield.EngineConfig(policy="sglang", recv_interval=2), [100], 10, [4])


@pytest.mark.parametrize("argv, message", [
    (["--engine", "trtllm", "--scheduler-recv-interval", "10"], "--scheduler-recv-interval: taking in requests "
     "every N decode steps is SGLang's (scheduler_recv_interval); engine trtllm has none"),
    (["--engine", "sglang", "--scheduler-recv-interval", "10", "--disagg", "1p1d"],
     "--scheduler-recv-interval: modelled for an aggregated SGLang engine only; a disaggregated pool takes in its "
     "requests every step here (drop --disagg or the interval)"),
    (["--engine", "sglang", "--scheduler-recv-interval", "0"],
     "--scheduler-recv-interval: expected at least 1, got '0'"),
])
def test_serve_refuses_the_interval_where_it_cannot_apply(argv, message):
    rc, out, err = run_cli("serve", "llama-3.1-8b", "--isl", "100", "--osl", "10", "--concurrency", "2", *argv)
    assert (rc, out, err) == (2, "", f"perfcast serve: error: {message}\n")


def test_serve_reports_the_interval():
    rc, out, err = run_cli("serve", "llama-3.1-8b", "--engine", "sglang", "--isl", "uniform:100-200", "--osl",
                           "uniform:20-60", "--concurrency", "8", "--num-requests", "64", "--json",
                           "--scheduler-recv-interval", "10")
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["scheduler"]["recv_interval"] == 10
    assert any("taken in every 10 decode steps" in n for n in doc["notes"])


# -- the InferenceX launch settings -------------------------------------------------------------

def test_inferencex_sglang_b200_rows_take_their_scripts_interval():
    r1, sgl = "deepseek-ai/DeepSeek-R1", "sglang"
    assert recipe_of(r1, sgl, "b200_sxm", "fp4", 1024, 1024, 8, concurrency=8).recv_interval == 10
    assert recipe_of(r1, sgl, "b200_sxm", "fp4", 1024, 1024, 4, concurrency=16).recv_interval == 30
    assert recipe_of(r1, sgl, "b200_sxm", "fp8", 1024, 1024, 8, concurrency=64).recv_interval == 30
    assert recipe_of(r1, sgl, "b200_sxm", "fp8", 8192, 1024, 4, concurrency=64).recv_interval == 10   # TP 4
    assert recipe_of("Qwen/Qwen3.5-397B-A17B", sgl, "b200_sxm", "bf16", 1024, 1024, 8, concurrency=4).recv_interval \
        == 10
    assert recipe_of(r1, sgl, "h200_sxm", "fp8", 1024, 1024, 8, concurrency=64).recv_interval is None   # sets none
    row = dict(model_path=r1, backend="sglang", system="b200_sxm", precision="fp8", gemm_quant_mode="fp8_block",
               moe_quant_mode="fp8_block", tp_size="8", moe_tp_size="8", batch_size="32", concurrency="32")
    c = _case(**row)
    assert c.predictable, c.reason
    assert (c.recv_interval, c.kv_dtype) == (30, "fp8")
    assert "scheduler recv interval 30" in c.notes[-1] and "dsr1_fp8_b200.sh" in c.notes[-1]


def test_the_replay_serves_with_the_scripts_interval(monkeypatch):
    seen = []
    monkeypatch.setattr(replay_mod, "serve", lambda spec: seen.append(spec) or (_ for _ in ()).throw(UserError("x")))
    replay_mod.replay(_case(model_path="deepseek-ai/DeepSeek-R1", backend="sglang", system="b200_sxm",
                            precision="fp4", gemm_quant_mode="nvfp4", moe_quant_mode="nvfp4", tp_size="8",
                            moe_tp_size="8", batch_size="8", concurrency="8"))
    assert seen[0].recv_interval == 10


def test_inferencex_sglang_h200_rows_take_their_scripts_settings():
    """qwen3.5_fp8_h200.sh, glm5_fp8_h200.sh and dsr1_fp8_h200.sh (InferenceX, to 626932a11): what a
    recipe can state of them, and the note a row's case carries."""
    sgl = "sglang"
    q = recipe_of("Qwen/Qwen3.5-397B-A17B", sgl, "h200_sxm", "fp8", 1024, 1024, 8, concurrency=16, moe_tp=1)
    assert (q.kv_cache_dtype, q.max_num_tokens, q.memory_fraction, q.cuda_graph_max, q.recv_interval) == \
        ("fp8", 16384, 0.8, 16, None)
    g = recipe_of("zhipuai/GLM-5", sgl, "h200_sxm", "fp8", 1024, 1024, 8, concurrency=4)
    assert (g.kv_cache_dtype, g.max_num_tokens, g.memory_fraction, g.cuda_graph_max) == (None, None, 0.85, None)
    for r1 in ("deepseek-ai/DeepSeek-R1", "deepseek-ai/DeepSeek-V3"):   # the dump's name for the R1 runs
        d = recipe_of(r1, sgl, "h200_sxm", "fp8", 8192, 1024, 8, concurrency=8)
        assert (d.kv_cache_dtype, d.max_num_tokens, d.max_prefill_tokens, d.memory_fraction) == \
            (None, 32768, 32768, 0.82)
    assert recipe_of("Qwen/Qwen3.5-397B-A17B", sgl, "h200_sxm", "bf16", 1024, 1024, 8) is None   # no such script

