"""SGLang's cap on one prefill batch's input tokens (``--max-prefill-tokens``, ``PrefillAdder``'s
``rem_input_tokens``) in the event simulation, the closed form, the CLI and the InferenceX recipes
that set it."""

from __future__ import annotations

import json

import pytest

from fuzzing import run_cli
from perfcast.inference.recipes import recipe_of
from perfcast.ir.errors import UserError
from perfcast.serving import meanfield
from perfcast.serving.scheduler import scheduler_config
from perfcast.serving.sim import simulate
from perfcast.serving.types import AffineStep
from perfcast.serving.workload import Trace, Workload
from serving_doc import table

STEP = AffineStep(fixed_s=0.010, per_token_s=0.001)  # a step of T tokens: 10 + T ms


def _run(cap: int | None):
    """R0, R1, R2 (6 in) and R3 (20 in), 2 out each, all sent at 0, on SGLang with a synchronous
    loop and a 24-token chunk (docs/design/serving.md, "SGLang's prefill batches")."""
    s = scheduler_config("sglang", overlap=False, max_num_tokens=24, max_prefill_tokens=cap)
    w = Workload(trace=Trace((0.0,) * 4, (6, 6, 6, 20), (2, 2, 2, 2)), num_requests=4, warmup=0)
    return simulate(STEP, s.kv_cache(100_000), s, w, trace=True)


def test_a_prompt_over_the_input_room_waits_whole_for_the_next_batch():
    # hand-computed (ms): R0 + R1 (12 tokens; R2's 6 exceed the 4 left of 16) end at 22; R2 alone
    # (R3's 20 exceed the 10 left) at 38; R3 alone, over the cap but first in its batch, at 68;
    # the four decodes at 82
    res, tr = _run(16)
    assert [c[0] * 1e3 for c in tr.counters] == pytest.approx([22, 38, 68, 82], rel=1e-12)
    assert [c[3] for c in tr.counters] == [2, 1, 1, 0]             # prefill chunks per step
    assert res.ttft_s.mean * 1e3 == pytest.approx((22 + 22 + 38 + 68) / 4, rel=1e-12)
    # SGLang's own 16,384: one 24-token batch (R3 chunked at 6), then R3's other 14, then the decodes
    plain, tr1 = _run(None)
    assert [c[0] * 1e3 for c in tr1.counters] == pytest.approx([34, 58, 72], rel=1e-12)
    assert plain.ttft_s.mean * 1e3 == pytest.approx((34 * 3 + 58) / 4, rel=1e-12)


def test_the_design_docs_prefill_batch_example():
    _, tr = _run(16)
    rows = table("SGLang's prefill batches", "| step |")
    assert [float(r[3]) for r in rows] == pytest.approx([c[0] * 1e3 for c in tr.counters], rel=1e-12)
    assert [int(r[2]) for r in rows] == [round((c[0] - c[4]) * 1e3) - 10 for c in tr.counters]   # T = 10 + T ms


def test_the_closed_form_batches_whole_prompts_within_the_cap():
    load = meanfield.Workload(isl=6000, osl=16, concurrency=64)
    engine = meanfield.EngineConfig(policy="sglang", max_num_tokens=32768, kv_capacity_tokens=10**7)
    capped = meanfield.EngineConfig(**{**engine.__dict__, "max_prefill_tokens": 16384})
    assert meanfield._Model(STEP, engine, load).prefill_batch_max == 5       # 32,768 // 6,000
    assert meanfield._Model(STEP, capped, load).prefill_batch_max == 2       # 16,384 // 6,000
    assert meanfield._Model(STEP, meanfield.EngineConfig(**{**engine.__dict__, "max_prefill_tokens": 100}),
                            load).prefill_batch_max == 1                      # one prompt, whatever its length
    # fewer prompts a batch: more, smaller prefill batches, a shorter wait for the first token at this load
    assert meanfield.closed_loop(STEP, capped, load).ttft_s.mean < meanfield.closed_loop(STEP, engine, load).ttft_s.mean
    with pytest.raises(UserError, match="SGLang's only"):
        meanfield.EngineConfig(policy="vllm", max_prefill_tokens=8192)


def test_the_serve_flag_reaches_both_tiers_and_is_refused_where_it_cannot_apply():
    args = ("serve", "llama-3.1-8b", "--device", "h200-sxm", "--engine", "sglang", "--isl", "6000", "--osl", "4",
            "--concurrency", "16", "--num-requests", "128", "--max-num-tokens", "32768", "--json")
    rc, out, err = run_cli(*args)
    assert rc == 0, err
    default = json.loads(out)
    assert default["scheduler"]["max_prefill_tokens"] == 16384     # SGLang's own (server_args.py)
    rc, out, err = run_cli(*args, "--max-prefill-tokens", "32768")
    assert rc == 0, err
    wide = json.loads(out)
    assert wide["scheduler"]["max_prefill_tokens"] == 32768
    assert any("max prefill tokens 32768" in n for n in wide["notes"])
    for tier in ("simulation", "closed form"):   # five prompts a batch instead of two: a longer first token
        assert wide["tiers"][tier]["ttft_s"]["mean"] > default["tiers"][tier]["ttft_s"]["mean"]
    rc, out, err = run_cli("serve", "llama-3.1-8b", "--engine", "vllm", "--isl", "100", "--osl", "10",
                           "--concurrency", "1", "--max-prefill-tokens", "100")
    assert rc == 2 and err.count("\n") == 1 and "--max-prefill-tokens" in err and "engine vllm has none" in err
    rc, out, err = run_cli("serve", "llama-3.1-8b", "--engine", "sglang", "--isl", "100", "--osl", "10",
                           "--concurrency", "1", "--max-prefill-tokens", "0")
    assert rc == 2 and "--max-prefill-tokens" in err


def test_inferencex_sglang_scripts_prefill_limits():
    """dsr1_fp8_h200.sh and the Qwen3.5 B200 scripts launch --chunked-prefill-size 32768
    --max-prefill-tokens 32768 (InferenceX, every version to 626932a11)."""
    sgl, qwen = "sglang", "Qwen/Qwen3.5-397B-A17B"
    for r1 in ("deepseek-ai/DeepSeek-R1", "deepseek-ai/DeepSeek-V3"):
        d = recipe_of(r1, sgl, "h200_sxm", "fp8", 8192, 1024, 8, concurrency=8)
        assert (d.max_num_tokens, d.max_prefill_tokens, d.memory_fraction) == (32768, 32768, 0.82)
    for precision in ("fp8", "bf16"):
        q = recipe_of(qwen, sgl, "b200_sxm", precision, 1024, 1024, 8, concurrency=64)
        assert (q.max_num_tokens, q.max_prefill_tokens) == (32768, 32768)
    assert recipe_of(qwen, sgl, "h200_sxm", "fp8", 1024, 1024, 8, concurrency=16).max_prefill_tokens is None
