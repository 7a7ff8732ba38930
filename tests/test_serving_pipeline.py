"""Pipeline parallelism in serving: a step is one cycle of the stages' batches in flight
(docs/design/serving.md, "Pipeline parallelism")."""

import json

import numpy as np
import pytest
from serving_doc import section, table

from perfcast.capture.parallel import Layout
from perfcast.cli.main import main
from perfcast.inference.textgen import simulate
from perfcast.ir import UserError
from perfcast.serving.scheduler import scheduler_config
from perfcast.serving.step import Deployment, compile_step
from perfcast.serving.step_pipeline import cycle_s, micro_batches
from perfcast.serving.types import AffineStep, Chunk, Mix

PP2 = Deployment("llama-3.1-8b", "h100-sxm", "vllm", layout=Layout(pp=2))


@pytest.fixture(scope="module")
def pp2():
    return compile_step(PP2, max_tokens=4096)


def test_the_documents_hand_computed_cycle():
    stages = [AffineStep(1e-3, 1e-5), AffineStep(2e-3, 1e-5)]
    mix = Mix(5, 500, (Chunk(100, 0),))
    rows = table("Pipeline parallelism", "| micro-batch")
    parts = micro_batches(mix, 2)
    for row, m in zip(rows, parts, strict=True):
        assert [int(row[1]), int(row[2]), int(row[4])] == [m.decodes, m.decode_context, m.tokens]
        assert [c.tokens for c in m.chunks] == ([] if row[3] == "—" else [int(row[3])])
        t0, t1 = stages[0].step_s(m) * 1e3, stages[1].step_s(m) * 1e3
        assert [t0, t1, t0 + t1] == pytest.approx([float(row[5]), float(row[6]), float(row[7])], abs=1e-12)
    text = section("Pipeline parallelism")
    assert "the cycle is\n**5.05 ms**" in text and "**3.02 ms**" in text
    assert cycle_s(stages, mix) == pytest.approx(5.05e-3, abs=1e-15)
    assert cycle_s(stages, Mix(1, 100)) == pytest.approx(3.02e-3, abs=1e-15)


@pytest.mark.parametrize("seed", range(5))
def test_micro_batches_share_the_step_out_whole(seed):
    rng = np.random.default_rng(seed)
    for _ in range(200):
        p = int(rng.integers(2, 9))
        d = int(rng.integers(0, 40))
        chunks = tuple(Chunk(int(rng.integers(1, 500)), int(rng.integers(0, 900))) for _ in range(rng.integers(0, 6)))
        mix = Mix(d, int(rng.integers(d, 50 * d + 1)) if d else 0, chunks, int(rng.integers(0, 3)))
        parts = micro_batches(mix, p)
        assert len(parts) == p and sum(m.decodes for m in parts) == d
        assert sum(m.decode_context for m in parts) == mix.decode_context
        assert sorted((c.tokens, c.past) for m in parts for c in m.chunks) == sorted((c.tokens, c.past) for c in chunks)
        assert max(m.decodes for m in parts) - min(m.decodes for m in parts) <= 1
        assert {m.draft for m in parts} == {mix.draft}


@pytest.mark.parametrize("p", [2, 3, 4, 8])
def test_no_micro_batch_holds_more_than_two_batches_of_prompt(p):
    """Within a cycle budget of p batches of B tokens, chunks of at most B each, dealt largest
    first: each micro-batch's prompt tokens stay within 2 B (what the stages are compiled for)."""
    rng = np.random.default_rng(p)
    budget = 64
    for _ in range(2000):
        left, chunks = p * budget, []
        while left > 0 and rng.random() < 0.9:
            t = int(rng.integers(1, min(budget, left) + 1))
            chunks.append(Chunk(t))
            left -= t
        for m in micro_batches(Mix(int(rng.integers(0, 3 * p)), 0, tuple(chunks)), p):
            assert m.prefill_tokens <= 2 * budget


def test_a_lone_request_passes_every_stage_as_text_generate_prices_it(pp2):
    """One sequence is one micro-batch: its cycle is its pass through both stages, text-generate's
    pipelined step of one micro-batch (Σ of the stage times)."""
    one = simulate(PP2.request(decode=True, batch=1, length=1024)).step_time_s("analytic")
    assert pp2.step_s(Mix(1, 1024)) == pytest.approx(one, rel=1e-12)
    assert sum(s.step_s(Mix(1, 1024)) for s in pp2.stages) == pytest.approx(one, rel=1e-12)
    prompt = simulate(PP2.request(decode=False, batch=1, length=2048)).step_time_s("analytic")
    assert pp2.step_s(Mix(chunks=(Chunk(2048),))) == pytest.approx(prompt, rel=1e-12)


def test_a_full_pipeline_runs_at_its_busiest_stage(pp2):
    mix = Mix(64, 64 * 2048)
    half = Mix(32, 32 * 2048)
    last = pp2.stages[-1].step_s(half)
    assert pp2.stages[-1].step_s(half) > pp2.stages[0].step_s(half)    # the last stage holds the LM head
    assert pp2.step_s(mix) == pytest.approx(2 * last, rel=1e-12)


def test_the_decode_fast_path_is_the_cycle(pp2):
    rng = np.random.default_rng(3)
    for d, per in zip(rng.integers(0, 300, 200), rng.integers(1, 4000, 200)):
        assert pp2.decode_s(int(d), int(d * per)) == pp2.step_s(Mix(int(d), int(d * per)))


def test_the_vectorised_cycle_is_the_scalar_one(pp2):
    rng = np.random.default_rng(7)
    d = rng.integers(0, 200, 300)
    ctx = d * rng.integers(1, 3000, 300)
    t = rng.integers(1, 1500, 300)
    past = rng.integers(0, 2000, 300)
    c = rng.integers(0, 3, 300)
    c[d + c * t > 4096] = 0
    got = pp2.step_s_array(d, ctx, t, past, c)
    want = [pp2.step_s(Mix(int(a), int(b), (Chunk(int(x), int(y)),) * int(n))) for a, b, x, y, n in zip(d, ctx, t, past, c)]
    np.testing.assert_allclose(got, want, rtol=1e-12)


def test_a_cycle_budgets_one_batch_per_stage_in_the_pipeline_loop():
    sched = scheduler_config("trtllm", micro_batches=4)
    assert (sched.max_num_tokens, sched.micro_batches, sched.step_tokens) == (8192, 4, 4 * 8192)
    assert not sched.overlap and scheduler_config("trtllm").overlap    # _executor_loop_pp, not the overlap loop
    assert scheduler_config("trtllm").step_tokens == 8192
    with pytest.raises(UserError, match="--overlap-scheduling"):
        scheduler_config("sglang", micro_batches=2, overlap=True)


def test_serve_runs_a_pipeline_and_says_how(capsys):
    code = main(["serve", "llama-3.1-8b", "--device", "h100-sxm", "--pp-size", "2", "--concurrency", "8",
                 "--isl", "512", "--osl", "32", "--num-requests", "24", "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    doc = json.loads(out)
    sim, cf = doc["tiers"]["simulation"], doc["tiers"]["closed form"]
    assert doc["devices"] == 2 and doc["layout"]["pp"] == 2
    assert sim["throughput"]["output_tokens_per_s"] > 0 and cf["tpot_s"]["mean"] > 0
    assert sim["tpot_s"]["mean"] == pytest.approx(cf["tpot_s"]["mean"], rel=0.25)
    assert any(n.startswith("pipeline: 2 stages with 2 batches in flight") for n in doc["notes"])


def test_a_disaggregated_pool_may_be_a_pipeline(capsys):
    code = main(["serve", "llama-3.1-8b", "--device", "h100-sxm", "--pp-size", "2", "--request-rate", "4",
                 "--isl", "1024", "--osl", "32", "--num-requests", "40", "--disagg", "1p1d", "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    doc = json.loads(out)
    assert doc["tiers"]["simulation"]["tpot_s"]["mean"] > 0
    assert {n.split(":")[0] for n in doc["notes"]} >= {"prefill pool's pipeline", "decode pool's pipeline"}


def test_both_tiers_agree_on_a_pipeline_in_a_desynchronised_closed_loop():
    from perfcast.serving.serve import ServeSpec, serve
    from perfcast.serving.workload import Lengths, Workload

    dep = Deployment("llama-3.1-8b", "h100-sxm", "sglang", layout=Layout(pp=2))
    work = Workload(Lengths("uniform", 1600, 2048), Lengths("uniform", 48, 64), num_requests=80, concurrency=8)
    a = serve(ServeSpec(dep, work)).agreement()
    assert a["tpot_s"] == pytest.approx(1, abs=0.15) and a["output_tokens_per_s"] == pytest.approx(1, abs=0.15)
