"""TensorRT-LLM's batch waiting (``batch_wait_timeout_iters`` / ``batch_wait_max_tokens_ratio``,
``PyExecutor._schedule`` / ``_waiting_requests``) in the event simulation, and the InferenceX
launch settings the validation applies to that campaign's rows (``perfcast.inference.recipes``)."""

from __future__ import annotations

import json

import pytest

from fuzzing import run_cli
from perfcast.inference.recipes import RECIPE_NOTE, recipe_of
from perfcast.ir.errors import UserError
from perfcast.serving import replay as replay_mod
from perfcast.serving.scheduler import scheduler_config
from perfcast.serving.sim import simulate
from perfcast.serving.types import AffineStep
from perfcast.serving.workload import Trace, Workload
from serving_doc import table
from silicon_rows import case as _case

STEP = AffineStep(fixed_s=0.010, per_token_s=0.001)  # a step of T tokens: 10 + T ms


def _run(batch_wait, isl1=10, third=False):
    """R0 (prompt 10, 6 tokens out) at t = 0; R1 (prompt ``isl1``, 3 out) at 0.5 ms, while R0's
    prompt runs; with ``third``, R2 (prompt 10, 2 out) at 70 ms. TRT-LLM, a 100-token step budget,
    a synchronous loop (an arrival joins the next step; docs/design/serving.md, "Overlap scheduling")."""
    sched = scheduler_config("trtllm", max_num_tokens=100, batch_wait=batch_wait, overlap=False)
    arrivals, isl, osl = (0.0, 0.0005), (10, isl1), (6, 3)
    if third:
        arrivals, isl, osl = arrivals + (0.070,), isl + (10,), osl + (2,)
    w = Workload(trace=Trace(arrivals, isl, osl), num_requests=len(isl), warmup=0)
    res, tr = simulate(STEP, sched.kv_cache(100_000), sched, w, trace=True)
    return res, tr


def test_context_requests_wait_for_the_timeout():
    # hand-computed (ms): step 1 R0's prompt, 10 + 10 → 20 (no decode in it: no waiting); steps 2
    # and 3 R0's decode alone, R1's prompt held (1 + 10 = 11 tokens < 0.5 × 100; 0 then 1 steps
    # waited), 11 ms each → 31, 42; step 4 (2 steps waited ≥ 2) R0's decode + R1's prompt,
    # 10 + 11 → 63, R1's first token; steps 5 and 6 both decode, 12 ms each → 75, 87
    res, tr = _run((2, 0.5))
    assert [c[0] * 1e3 for c in tr.counters] == pytest.approx([20, 31, 42, 63, 75, 87], rel=1e-12)
    assert [c[3] for c in tr.counters] == [1, 0, 0, 1, 0, 0]          # prefill chunks per step
    assert res.ttft_s.mean == pytest.approx((20 + 62.5) / 2e3, rel=1e-12)
    assert res.tpot_s.mean == pytest.approx(((87 - 20) / 5 + (87 - 63) / 2) / 2e3, rel=1e-12)


def test_releasing_the_prompts_restarts_the_count():
    # R2 arrives during step 5 (63 → 75 ms): the count restarted at R1's release, so R2 waits
    # again — step 6 decodes R0 and R1 alone (12 ms → 87, both finish), step 7 runs R2's prompt
    # alone (no decode left to wait beside: 20 ms → 107), step 8 its last token (11 ms → 118)
    _, tr = _run((2, 0.5), third=True)
    assert [c[0] * 1e3 for c in tr.counters] == pytest.approx([20, 31, 42, 63, 75, 87, 107, 118], rel=1e-12)


def test_the_design_docs_batch_waiting_example():
    _, tr = _run((2, 0.5), third=True)
    rows = table("Batch waiting (TensorRT-LLM)", "| step |")
    assert [float(r[4]) for r in rows] == pytest.approx([c[0] * 1e3 for c in tr.counters], rel=1e-12)
    # sequences and prompts in each step
    assert [(r[1].count("decode") + r[1].count("prefill"), r[1].count("prefill")) for r in rows] == \
        [(c[1], c[3]) for c in tr.counters]


def test_without_batch_waiting_the_prompt_joins_the_next_step():
    res, tr = _run(None)
    assert [c[0] * 1e3 for c in tr.counters] == pytest.approx([20, 41, 53, 65, 76, 87], rel=1e-12)
    assert res.ttft_s.mean == pytest.approx((20 + 40.5) / 2e3, rel=1e-12)
    assert _run((0, 0.0))[0].ttft_s.mean == res.ttft_s.mean        # (0, 0): off, TRT-LLM's default


def test_enough_tokens_release_the_prompt_at_once():
    # R1's prompt of 60 tokens: 1 + 60 ≥ 0.5 × 100, released in step 2 although no step has waited
    released, _ = _run((20, 0.5), isl1=60)
    plain, _ = _run(None, isl1=60)
    assert released.ttft_s.mean == plain.ttft_s.mean
    # the step's tokens count its decodes too: 1 + 10 reaches 0.11 × 100
    assert _run((20, 0.11))[0].ttft_s.mean == _run(None)[0].ttft_s.mean
    # a timeout of 0 never holds a prompt (batch_wait_iters_count >= 0 at once), whatever the ratio
    assert _run((0, 0.9))[0].ttft_s.mean == _run(None)[0].ttft_s.mean


def test_batch_waiting_is_trtllms_and_off_by_default():
    assert scheduler_config("trtllm").batch_wait == (0, 0.0) and not scheduler_config("trtllm").waits
    with pytest.raises(UserError, match="batch waiting is TensorRT-LLM's"):
        scheduler_config("vllm", batch_wait=(20, 0.9))
    with pytest.raises(UserError, match="--batch-wait-max-tokens-ratio: expected at most 1"):
        scheduler_config("trtllm", batch_wait=(20, 1.5))


@pytest.mark.parametrize("argv, message", [
    (["--engine", "vllm", "--batch-wait-iters", "3"], "--batch-wait-iters / --batch-wait-max-tokens-ratio: batch "
     "waiting is TensorRT-LLM's (batch_wait_timeout_iters, batch_wait_max_tokens_ratio); engine vllm has none"),
    (["--engine", "trtllm", "--batch-wait-iters", "3", "--tier", "closed-form"],
     "--batch-wait-iters: holds prompts in the simulation; the closed form does not model batch waiting"),
    (["--engine", "trtllm", "--batch-wait-iters", "3", "--disagg", "1p1d"],
     "--batch-wait-iters / --batch-wait-max-tokens-ratio: batch waiting holds prompts out of steps with decodes; "
     "a disaggregated pool runs only one of the two (drop --disagg or the batch wait)"),
    (["--engine", "trtllm", "--batch-wait-iters", "3", "--dp-size", "2", "--attention-dp"],
     "--batch-wait-iters / --batch-wait-max-tokens-ratio: TensorRT-LLM waits for batches only without attention DP "
     "(PyExecutor._schedule); drop --attention-dp or the batch wait"),
])
def test_serve_refuses_batch_waiting_where_it_cannot_apply(argv, message):
    model = "qwen3-30b-a3b" if "--attention-dp" in argv else "llama-3.1-8b"
    rc, out, err = run_cli("serve", model, "--isl", "100", "--osl", "10", "--concurrency", "2", *argv)
    assert (rc, out, err) == (2, "", f"perfcast serve: error: {message}\n")


# -- the InferenceX launch settings -------------------------------------------------------------

def test_an_inferencex_row_takes_its_scripts_settings():
    c = _case()
    assert c.predictable, c.reason
    assert (c.kv_dtype, c.max_num_tokens, c.batch_wait) == ("fp8", 16384, (20, 0.9))
    assert c.notes[-1].startswith(f"{RECIPE_NOTE}: KV cache fp8, max num tokens 16384, batch_wait_timeout_iters 20")
    assert "70b_fp8_h200_trt_slurm.sh" in c.notes[-1]
    # the script waits for batches at ISL 1024 / OSL 1024 below TP 8 only
    assert _case(tp_size="8", batch_size="32").batch_wait is None
    assert _case(osl="8192").batch_wait is None and _case(osl="8192").max_num_tokens == 16384
    assert (_case(backend="vllm").kv_dtype, _case(backend="vllm").batch_wait) == ("fp8", None)


def test_other_rows_keep_the_engines_defaults():
    for c in (_case(benchmark="gap-analysis"), _case(model_path="Qwen/Qwen3-32B", gemm_quant_mode="none")):
        assert c.predictable, c.reason
        assert (c.kv_dtype, c.max_num_tokens, c.batch_wait) == (None, None, None)
        assert not any(n.startswith(RECIPE_NOTE) for n in c.notes)
    assert recipe_of("meta-llama/Llama-3.1-70B", "sglang", "h200_sxm", "fp8", 1024, 1024, 1) is None


def test_the_replay_serves_with_the_scripts_settings(monkeypatch):
    seen = []

    def fake_serve(spec):
        seen.append(spec)
        raise UserError("stop here")

    monkeypatch.setattr(replay_mod, "serve", fake_serve)
    rep = replay_mod.replay(_case())
    assert rep.reason == "refused by perfcast serve: stop here"
    assert (seen[0].max_num_tokens, seen[0].batch_wait, seen[0].deployment.kv_dtype) == (16384, (20, 0.9), "fp8")


def test_gpt_oss_rows_take_their_budget_and_memory_fraction():
    row = dict(model_path="openai/gpt-oss-120b", precision="fp4", gemm_quant_mode="", isl="1024", osl="8192",
               tp_size="1", batch_size="8", concurrency="8")
    c = _case(**row)
    assert c.predictable, c.reason
    assert (c.kv_dtype, c.max_num_tokens, c.memory_fraction, c.batch_wait) == (None, 20000, 0.85, None)
    assert "KV cache the model dtype" in c.notes[-1]
    b200 = _case(**row, system="b200_sxm")
    assert (b200.kv_dtype, b200.max_num_tokens, b200.memory_fraction) == ("fp8", 20000, 0.85)
    vllm = _case(**row, backend="vllm")
    assert (vllm.kv_dtype, vllm.max_num_tokens, vllm.memory_fraction) == (None, 8192, 0.9)
    # the TensorRT-LLM scripts capture decode graphs up to their concurrency: a 256-client batch replays one
    # (the engine's default captures 128), and the replay's deployment launches so
    big = _case(**{**row, "batch_size": "256", "concurrency": "256"}, system="b200_sxm")
    assert big.cuda_graph_max == 256 and "CUDA graphs up to 256 sequences (the concurrency)" in big.notes[-1]
    assert vllm.cuda_graph_max is None
    assert replay_mod.deployment_of(big).cuda_graph_max == 256


def test_deepseek_r1_rows_take_their_scripts_budget_formula():
    """dsr1_*_trt.sh: MAX_NUM_TOKENS=$(( ($CONC+$ISL+64+63)/64*64 )), at least 8192 — the engine's
    default at ISL 1,024, CONC + 8,256 rounded up to 64 at ISL 8,192 (a whole 8,192-token prompt beside
    every client's decode)."""
    row = dict(model_path="deepseek-ai/DeepSeek-R1", precision="fp4", gemm_quant_mode="nvfp4", moe_quant_mode="nvfp4",
               isl="8192", osl="1024", tp_size="8", moe_tp_size="1", moe_ep_size="8", batch_size="256",
               concurrency="256", system="b200_sxm")
    assert _case(**row).max_num_tokens == 8512
    assert _case(**{**row, "concurrency": "4", "batch_size": "4"}).max_num_tokens == 8320
    assert _case(**{**row, "isl": "1024"}).max_num_tokens == 8192
    assert "max num tokens 8512" in _case(**row).notes[-1]
    assert recipe_of("deepseek-ai/DeepSeek-R1", "trtllm", "h200_sxm", "fp8", 8192, 1024, 8, False, 64).max_num_tokens \
        == 8320


def test_the_memory_fraction_sizes_the_kv_cache():
    def capacity(*flags):
        rc, out, err = run_cli("serve", "llama-3.1-8b", "--engine", "vllm", "--isl", "100", "--osl", "10",
                               "--concurrency", "2", "--tier", "closed-form", "--json", *flags)
        assert rc == 0, err
        return json.loads(out)["kv_cache"]["capacity_tokens"]

    default, half = capacity(), capacity("--memory-fraction", "0.45")
    assert half < default / 2          # vLLM's share of all memory, the weights taken out of it first
    rc, out, err = run_cli("serve", "llama-3.1-8b", "--isl", "100", "--osl", "10", "--concurrency", "2",
                           "--kv-capacity", "100000", "--memory-fraction", "0.5")
    assert (rc, out, err) == (2, "", "perfcast serve: error: --memory-fraction: sizes the KV cache from memory; "
                                     "--kv-capacity gives its tokens\n")


def test_a_batch_below_the_concurrency_is_not_an_engine_limit(monkeypatch):
    c = _case(benchmark="gap-analysis", model_path="Qwen/Qwen3-32B", gemm_quant_mode="none", batch_size="8",
              concurrency="32", tp_size="2")
    assert c.predictable and not c.batch_limits
    assert c.notes[-1] == ("engine max batch: batch_size 8 is below the concurrency 32; not taken as the engine's "
                           "limit (its default serves the client's load)")
    assert _case(benchmark="gap-analysis", model_path="Qwen/Qwen3-32B", gemm_quant_mode="none").batch_limits
    seen = []
    monkeypatch.setattr(replay_mod, "serve", lambda spec: seen.append(spec) or (_ for _ in ()).throw(UserError("x")))
    replay_mod.replay(c)
    replay_mod.replay(_case())
    # TensorRT-LLM's default limit (2048) capped at the 32 clients; the InferenceX row's own batch
    assert [s.max_batch_size for s in seen] == [32, 32]
