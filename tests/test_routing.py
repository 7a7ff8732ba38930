"""perfcast.ir.routing: the experts a batch of routed tokens reaches, and what a MoE leaf reads."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import sympy
from hypothesis import given
from hypothesis import strategies as st

from fuzzing import run_cli
from perfcast.ir import dim
from perfcast.ir.routing import active_experts


def test_random_routing_is_the_occupancy_expectation():
    # gpt-oss: 128 experts, top 4, 32 tokens: 128·(1 − (31/32)^32) = 81.66, where balanced reads all 128
    got = active_experts(sympy.Integer(128), sympy.Integer(32), 4, 128, "random")
    assert isinstance(got, sympy.Rational) and float(got) == pytest.approx(128 * (1 - (31 / 32) ** 32), abs=1e-9)
    assert round(float(got), 2) == 81.66
    assert active_experts(sympy.Integer(128), sympy.Integer(32), 4, 128, "balanced") == 128
    # ep 8 over DeepSeek's 256 experts: a device holds 32 and is reached in the same proportion
    assert float(active_experts(sympy.Integer(32), sympy.Integer(64), 8, 256, "random")) == pytest.approx(
        32 * (1 - (248 / 256) ** 64), abs=1e-9)


def test_symbolic_numeric_and_array_forms_agree():
    T = dim("T")
    expr = active_experts(sympy.Rational(256, 8), T, 8, 256, "random")
    assert expr.has(T) and not expr.has(sympy.Float)
    for t in (1, 7, 64, 4096, 10 ** 6):  # a closed form substituted lands on the concrete lowering's rational
        exact = active_experts(sympy.Rational(256, 8), sympy.Integer(t), 8, 256, "random")
        assert expr.subs(T, t) == exact and exact.q <= 2 ** 32
    f = sympy.lambdify((T,), 3 * expr + 1, modules="numpy")
    assert f(np.array([64.0, 1e6])) == pytest.approx([3 * 32 * (1 - (31 / 32) ** 64) + 1, 97.0])
    assert sympy.diff(expr, T).subs(T, 1) == -32 * sympy.Rational(31, 32) * sympy.log(sympy.Rational(31, 32))
    arr = active_experts(np.array([32.0, 16.0]), np.array([64.0, 3.0]), np.array([8, 8]), np.array([256, 256]), "random")
    assert arr == pytest.approx([32 * (1 - (248 / 256) ** 64), 16 * (1 - (248 / 256) ** 3)])
    assert active_experts(np.array([4.0]), np.array([1.0]), 2, 8, None) == pytest.approx([1.0])  # none named: balanced


@given(st.integers(1, 512), st.integers(1, 16), st.sampled_from([1, 2, 4, 8]), st.integers(1, 20000))
def test_random_reaches_at_most_what_balanced_does_and_every_expert_eventually(per_rank, k, ep, tokens):
    experts = per_rank * ep
    k = min(k, experts)
    local = sympy.Integer(per_rank)
    rnd = float(active_experts(local, sympy.Integer(tokens), k, experts, "random"))
    bal = float(active_experts(local, sympy.Integer(tokens), k, experts, "balanced"))
    assert 0 < rnd <= bal + 2 ** -32
    assert bal == min(per_rank, tokens * k / ep)
    # the first token always lands: k/ep pairs on the device in expectation, reaching k/ep experts
    assert float(active_experts(local, sympy.Integer(1), k, experts, "random")) == pytest.approx(k / ep, abs=1e-9)
    # and the ratio is never below 1 − 1/e of balanced's (the worst case is T·k = E)
    assert rnd >= (1 - 1 / math.e) * bal - 1e-9


def test_an_unknown_routing_is_refused():
    with pytest.raises(ValueError, match="routing 'zipf'"):
        active_experts(sympy.Integer(8), sympy.Integer(8), 2, 8, "zipf")


@pytest.mark.parametrize("argv", [
    ["text-generate", "llama-3.1-8b", "--decode", "--context-length", "64"],
    ["serve", "llama-3.1-8b", "--isl", "128", "--osl", "16", "--concurrency", "2", "--tier", "closed-form"],
    ["optimize", "llama-3.1-8b", "--devices", "h100-sxm", "--total-devices", "1"],
])
def test_moe_routing_for_a_dense_model_is_one_line(argv):
    rc, out, err = run_cli(*argv, "--moe-routing", "balanced")
    assert (rc, out) == (2, "") and err.strip().endswith("--moe-routing balanced: llama-3.1-8b has no routed experts")
    assert len(err.strip().splitlines()) == 1


def test_moe_routing_balanced_reads_what_the_tables_measure():
    argv = ("text-generate", "gpt-oss-120b", "--device", "h200-sxm", "--decode", "--num-queries", "32",
            "--context-length", "1024", "--tp-size", "2", "--engine", "vllm", "--json")
    docs = {r: json.loads(run_cli(*argv, "--moe-routing", r)[1]) for r in ("random", "balanced")}
    moe = {r: d["ops"][0] for r, d in docs.items()}
    assert {m["name"] for m in moe.values()} == {"perfcast.moe_experts"}
    # 32 tokens × top 4 of 128: balanced reads every expert, random 81.7 of them (64 %)
    assert moe["random"]["flops"] == moe["balanced"]["flops"]
    assert 0.6 < moe["random"]["bytes_hbm"] / moe["balanced"]["bytes_hbm"] < 0.7
    assert 0.6 < moe["random"]["time_s"]["analytic"] / moe["balanced"]["time_s"]["analytic"] < 0.8
    assert docs["random"]["notes"][0].startswith("MoE routing: random") and \
        docs["balanced"]["notes"][0].startswith("MoE routing: balanced (--moe-routing)")


def test_a_deployment_file_states_its_routing(tmp_path):
    path = tmp_path / "deployment.yaml"
    path.write_text("perfcast_deployment: 1\nmodel: qwen3-30b-a3b\ndevice: h200-sxm\nengine: trtllm\n"
                    "moe_routing: zipf\n")
    rc, out, err = run_cli("serve", "--deployment", str(path), "--concurrency", "2")
    assert rc == 2 and "moe_routing" in err and "random" in err and len(err.strip().splitlines()) == 1
    path.write_text(path.read_text().replace("zipf", "balanced"))
    rc, out, err = run_cli("serve", "--deployment", str(path), "--concurrency", "2", "--moe-routing", "random")
    assert rc == 2 and "--moe-routing: --deployment" in err
