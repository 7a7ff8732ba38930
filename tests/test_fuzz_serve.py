"""``perfcast serve`` under hostile flag values: exit 2 with one short line, or a plausible result
(the fuzzing harness of tests/fuzzing.py) — never a traceback, a hang, a flood or a non-finite
figure. Every case runs a small workload on Llama-3.1-8B (one step model, compiled once)."""

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from fuzzing import check_answered, run_cli

NUMBERS = ["0", "-1", "1", "3", "nan", "inf", "-inf", "1e30", "1e400", "2.5", "x", "", "9" * 30, "0x10", "1_000"]
LENGTHS = ["64", "0", "-5", "uniform:32-96", "uniform:96-32", "uniform:1-", "normal:64,8", "normal:64,-1",
           "lognormal:64,0.5", "lognormal:nan,1", "poisson:5", "64.5", "inf", "1e9", "uniform:1-1e30"]
SPECULATIVE = ["mtp:2", "eagle:1", "mtp:0", "mtp:99", "mtp:x", "draft:llama-3.2-1b:2", "draft::2", "draft:nosuch:2",
               "lookahead:2", "mtp", ":", "mtp:1:2"]
ACCEPTANCE = ["0.8,0.5", "0.5", "1.5,0.2", "nan,0.1", "-0.1,0.2", "a,b", "", "0.8,0.5,0.1"]
DISAGG = ["1p1d", "0p1d", "1p0d", "2x2", "auto:1", "auto:4", "auto:x", "99999p1d", "1P1D"]
FLAGS = {
    "--concurrency": NUMBERS, "--request-rate": NUMBERS, "--num-requests": NUMBERS, "--max-batch-size": NUMBERS,
    "--max-num-tokens": NUMBERS, "--kv-capacity": NUMBERS, "--prefix-hit-rate": NUMBERS + ["0.5", "1"],
    "--cv": NUMBERS, "--warmup": NUMBERS, "--seed": NUMBERS, "--tp-size": NUMBERS, "--dp-size": NUMBERS,
    "--ttft-slo": NUMBERS, "--tpot-slo": NUMBERS, "--isl": LENGTHS, "--osl": LENGTHS,
    "--speculative": SPECULATIVE, "--acceptance": ACCEPTANCE, "--disagg": DISAGG,
    "--engine": ["vllm", "sglang", "trtllm", "eager", "nosuch"], "--tier": ["simulation", "closed-form", "both", "x"],
}


@st.composite
def argv(draw):
    out = ["serve", "llama-3.1-8b", "--osl", "8", "--isl", "64", "--num-requests", "16"]
    load = draw(st.sampled_from([["--concurrency", "2"], ["--request-rate", "50"], ["--max-load"], []]))
    out += load
    for flag in draw(st.lists(st.sampled_from(sorted(FLAGS)), min_size=1, max_size=3, unique=True)):
        out += [flag, draw(st.sampled_from(FLAGS[flag]))]
    return out + draw(st.sampled_from([[], ["--json"]]))


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(argv())
def test_serve_answers_every_hostile_flag(args):
    rc, out, err = run_cli(*args)
    event(f"exit {rc}")
    check_answered(rc, out, err, args)
