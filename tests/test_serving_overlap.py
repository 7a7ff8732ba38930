"""Overlap scheduling (SGLang's overlap schedule, TensorRT-LLM's overlap scheduler, vLLM's async
scheduling): a request sent on a step's outputs is taken in one step later by a synchronous loop,
two by a loop running a step ahead (docs/design/serving.md, "Overlap scheduling")."""

from __future__ import annotations

import dataclasses
import json

import pandas as pd
import pytest

from fuzzing import run_cli
from perfcast.engines.spec import get_engine
from perfcast.inference.silicon import map_frame
from perfcast.serving import sim
from perfcast.serving.scheduler import scheduler_config
from perfcast.serving.sim import simulate
from perfcast.serving.types import AffineStep
from perfcast.serving.workload import Lengths, Trace, Workload
from serving_doc import table
from test_serving_fastforward import _same

STEP = AffineStep(fixed_s=0.010, per_token_s=0.001)  # a step of T tokens: 10 + T ms


def _closed(overlap: bool):
    """Two clients: R0 (10 in, 2 out) and R1 (10 in, 5 out) at 0; R2 (10 in, 2 out) sent by R0's
    client when R0 completes. vLLM, a 100-token step budget."""
    s = scheduler_config("vllm", max_num_tokens=100, overlap=overlap)
    w = Workload(trace=Trace((0.0, 0.0, 0.0), (10, 10, 10), (2, 5, 2)), concurrency=2, num_requests=3, warmup=0)
    return simulate(STEP, s.kv_cache(100_000), s, w, trace=True)


def test_a_request_sent_on_a_completion_misses_the_launched_steps():
    # hand-computed (ms): both prompts 10 + 20 → 30; both decode 12 → 42, R0 done, R2 sent;
    # synchronous: R1 alone 11 → 53, R1 + R2's prompt 21 → 74 (R2's first token), both 12 → 86;
    # one step ahead: R1 alone → 53, → 64, R1 + R2's prompt → 85, R2 alone → 96
    sync, tr = _closed(False)
    assert [c[0] * 1e3 for c in tr.counters] == pytest.approx([30, 42, 53, 74, 86], rel=1e-12)
    assert sync.ttft_s.mean * 1e3 == pytest.approx((30 + 30 + 32) / 3, rel=1e-12)
    ahead, tr = _closed(True)
    assert [c[0] * 1e3 for c in tr.counters] == pytest.approx([30, 42, 53, 64, 85, 96], rel=1e-12)
    assert ahead.ttft_s.mean * 1e3 == pytest.approx((30 + 30 + 43) / 3, rel=1e-12)


def test_the_design_docs_overlap_example():
    rows = table("Overlap scheduling", "| step |")
    for overlap, col in ((False, 2), (True, 4)):
        _, tr = _closed(overlap)
        ends = [float(r[col]) for r in rows if r[col]]
        assert ends == pytest.approx([c[0] * 1e3 for c in tr.counters], rel=1e-12)
        prompts = [r[col - 1].count("prefill 10") + r[col - 1].count("R1 prefill") for r in rows if r[col]]
        assert prompts == [c[3] for c in tr.counters]


def test_an_arrival_joins_a_step_later_one_step_ahead():
    # R0 (10 in, 4 out) at 0, R1 (10 in, 2 out) at 25 ms, during R0's first decode (20 → 31):
    # a synchronous loop prefills R1 in the next step (31 → 52), one step ahead a step later (42 → 63)
    for overlap, ends in ((False, [20, 31, 52, 64]), (True, [20, 31, 42, 63, 74])):
        s = scheduler_config("vllm", max_num_tokens=100, overlap=overlap)
        w = Workload(trace=Trace((0.0, 0.025), (10, 10), (4, 2)), num_requests=2, warmup=0)
        _, tr = simulate(STEP, s.kv_cache(100_000), s, w, trace=True)
        assert [c[0] * 1e3 for c in tr.counters] == pytest.approx(ends, rel=1e-12), overlap


@pytest.mark.parametrize("engine", ["vllm", "sglang", "trtllm"])
def test_the_fast_forward_waits_for_the_lagged_requests(engine, monkeypatch):
    # runs of decode steps stop where a held request joins: every figure equals the run stepped one
    # step at a time, with the loop synchronous and one step ahead, closed and open loops
    loads = (Workload(Lengths("uniform", 50, 400), Lengths("uniform", 20, 200), concurrency=12, num_requests=120,
                      seed=3),
             Workload(Lengths("uniform", 50, 400), Lengths("uniform", 20, 200), rate=20.0, num_requests=120, seed=4))
    runs = []
    for overlap in (False, True):
        s = scheduler_config(engine, overlap=overlap)
        runs += [(s, w, dataclasses.asdict(simulate(STEP, s.kv_cache(200_000), s, w)[0])) for w in loads]
    monkeypatch.setattr(sim, "_fast_forward", lambda *a, **k: None)
    for s, w, fast in runs:
        _same(fast, dataclasses.asdict(simulate(STEP, s.kv_cache(200_000), s, w)[0]), f"{engine} {s.overlap} {w}")


def test_the_profiles_state_the_default_and_its_source():
    for name in ("vllm", "sglang", "trtllm"):
        setting = get_engine(name).scheduler.overlap
        assert setting.value is True and setting.sources
        assert scheduler_config(name).take_in_lag == 2
        assert scheduler_config(name, overlap=False).take_in_lag == 1


def test_vllm_rows_before_0_14_run_the_synchronous_loop():
    rows = pd.DataFrame([{"id": f"r{v}", "backend": "vllm", "backend_version": v,
                          "model_path": "meta-llama/Llama-3.1-8B-Instruct", "system": "h100_sxm", "precision": "bf16",
                          "mode": "agg", "isl": "1024", "osl": "128", "gemm_quant_mode": "", "moe_quant_mode": "",
                          "batch_size": "8", "tp_size": "1", "pp_size": "1", "attention_dp_size": "1",
                          "moe_tp_size": "1", "moe_ep_size": "1", "silicon_ttft_ms": "100", "silicon_tpot_ms": "10",
                          "concurrency": "8", "benchmark": "gap-analysis", "collection": "x.csv"}
                         for v in ("0.12.0", "0.14.0", "0.19.0", "nightly-5b8c30d6")])
    cases = {c.backend_version: c for c in map_frame(rows)}
    assert cases["0.12.0"].overlap is False and "synchronous scheduling loop" in " ".join(cases["0.12.0"].notes)
    assert [cases[v].overlap for v in ("0.14.0", "0.19.0", "nightly-5b8c30d6")] == [None, None, None]


def test_serve_states_the_loop_and_takes_the_flag():
    base = ("serve", "llama-3.1-8b", "--device", "h100-sxm", "--isl", "256", "--osl", "uniform:8-24",
            "--concurrency", "4", "--num-requests", "16", "--json")
    rc, out, err = run_cli(*base)
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["scheduler"]["overlap_scheduling"] is True and doc["scheduler"]["take_in_lag_steps"] == 2
    rc, out, err = run_cli(*base, "--no-overlap-scheduling")
    assert rc == 0, err
    slow = json.loads(out)
    assert slow["scheduler"]["overlap_scheduling"] is False and slow["scheduler"]["take_in_lag_steps"] == 1
    assert slow["ttft_s"]["mean"] < doc["ttft_s"]["mean"]
    rc, _, err = run_cli(*base, "--no-overlap-scheduling", "--disagg", "1p1d")
    assert rc == 2 and err.count("\n") == 1 and "--overlap-scheduling / --no-overlap-scheduling" in err
