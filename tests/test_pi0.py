"""The π0 control step in the DSL (kernels/pi0.py): FLOPs by hand at π0's sizes, k-fold
scaling of the denoising, the closed form's symbols, the catalog entry's figures."""

import contextlib
import io
import json

import pytest
import sympy

from perfcast.cli.main import main
from perfcast.dsl import TraceError, trace
from perfcast.ir import BYTES_HBM, FLOPS_MATRIX, Loop, cost, walk
from perfcast.kernels import get_kernel
from perfcast.kernels.pi0 import GEMMA_2B, GEMMA_300M, pi0_step

DEFAULT = dict(B=1, images=3, L=48, k=10, H=50)


def graph():
    return get_kernel("pi0").graph


def at(expr, **point):
    expr = sympy.sympify(expr)
    values = {**DEFAULT, **point}
    return expr.subs({s: values[s.name] for s in expr.free_symbols})


def denoise_step_cost():
    """One iteration of the denoising loop (its body's rolled-up work)."""
    loop = next(v.op for v in walk(graph()) if isinstance(v.op, Loop) and v.op.name == "denoise")
    return cost(loop.body)


def run(*argv):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = main(["kernel", "pi0", *argv])
    return rc, out.getvalue()


def test_action_expert_step_flops_by_hand():
    # S = H + 1 = 51 suffix tokens (state + 50 actions); keys: P + S = 256·3 + 48 + 51 = 867,
    # computed in ceil(867/64) = 14 whole tiles of 64 = 896. Expert: D 1024, F 4096, 8 query
    # heads over 1 KV head, head dim 256, 18 layers.
    S, D, F, q_width, kv_width, keys = 51, 1024, 4096, 8 * 256, 256, 14 * 64
    per_layer = (2 * S * D * q_width * 2          # q and o projections
                 + 2 * S * D * kv_width * 2       # k and v projections
                 + 2 * S * D * F * 3              # gate, up, down
                 + 2 * 8 * S * keys * 256 * 2)    # scores and attention-weighted values
    assert per_layer == 2_139_095_040
    embed = (2 * 1 * 32 * D                        # state_proj (one token)
             + 2 * 50 * 32 * D                     # action_in_proj
             + 2 * 50 * (2 * D) * D                # action_time_mlp_in over [action, time]
             + 2 * 50 * D * D)                     # action_time_mlp_out
    out = 2 * 50 * D * 32                          # action_out_proj
    assert embed + out == 321_191_936
    step = 18 * per_layer + embed + out
    assert step == 38_824_902_656
    assert at(denoise_step_cost()[FLOPS_MATRIX]) == step


def test_vlm_prefill_flops_by_hand():
    # SigLIP So400m/14 over 3 images × 256 patches = 768 tokens: D 1152, F 4304, 16 heads × 72.
    n, t, d, f = 768, 256, 1152, 4304
    vit_layer = 2 * n * d * d * 4 + 2 * n * d * f * 2 + 2 * 3 * 16 * t * t * 72 * 2
    assert vit_layer == 24_291_311_616
    vision = 2 * n * 588 * d + 27 * vit_layer + 2 * n * d * 2048  # patch embedding, layers, head
    # Gemma-2B over P = 768 + 48 = 816 tokens (attention in ceil(816/64) = 13 tiles: 832 rows
    # of queries and of keys): D 2048, F 16384, 8 query heads over 1 KV head, head dim 256.
    P, D, F, rows = 816, 2048, 16384, 13 * 64
    vlm_layer = 2 * P * D * 2048 * 2 + 2 * P * D * 256 * 2 + 2 * P * D * F * 3 + 2 * 8 * rows * rows * 256 * 2
    assert vlm_layer == 185_354_682_368
    assert vision == 660_529_741_824 and 18 * vlm_layer == 3_336_384_282_624
    prefill = vision + 18 * vlm_layer
    assert prefill == 3_996_914_024_448
    total = cost(graph())[FLOPS_MATRIX]
    assert at(total, k=0) == prefill
    assert at(total) == prefill + 10 * 38_824_902_656 == 4_385_163_051_008


def test_every_weight_is_read_once_per_use():
    # Each denoising step streams the expert's 18 layers of weights: per layer q/o 2·1024·2048,
    # k/v 2·1024·256, gate/up/down 3·1024·4096 (no biases, Gemma), bf16 (2 bytes).
    per_layer = 2 * 1024 * 2048 + 2 * 1024 * 256 + 3 * 1024 * 4096
    loop = next(v.op for v in walk(graph()) if isinstance(v.op, Loop) and v.op.name == "denoise")
    names = {f"expert.w_{w}" for w in ("q", "k", "v", "o", "gate", "up", "down")}
    weights = sum((v.op.cost[BYTES_HBM] * v.trips for v in walk(loop.body)
                   if getattr(v.op, "kind", None) == "load" and v.op.attr("source") in names), sympy.Integer(0))
    assert weights == 18 * per_layer * 2 == 622_854_144


def test_closed_form_is_symbolic_in_the_design_space():
    names = {"B", "images", "L", "k", "H"}
    c = cost(graph())
    assert {s.name for s in c[FLOPS_MATRIX].free_symbols} == names
    assert {s.name for s in c[BYTES_HBM].free_symbols} == names
    rc, out = run("--json", "--device", "h200-sxm")
    doc = json.loads(out)
    assert rc == 0 and set(doc["free_symbols"]) == names


def test_denoising_time_is_linear_in_k():
    rc, out = run("--json", "--device", "h200-sxm", "--sweep", "k=1,5,10,20")
    sweep = json.loads(out)["sweep"]
    t = [e["totals"]["time_s"] for e in sweep]
    step = (t[2] - t[1]) / 5  # one denoising step: everything else is fixed
    assert step > 0
    assert t[0] == pytest.approx(t[1] - 4 * step, rel=1e-12)
    assert t[3] == pytest.approx(t[2] + 10 * step, rel=1e-12)
    # FLOPs: the same decomposition exactly (the prefill, then 38,824,902,656 per step)
    flops = [e["totals"]["flops.matrix"] for e in sweep]
    assert flops == [3_996_914_024_448 + k * 38_824_902_656 for k in (1, 5, 10, 20)]


def test_control_rate_and_action_rate():
    rc, out = run("--json", "--device", "h200-sxm", "--set", "k=10", "--set", "H=50", "--set", "images=3")
    doc = json.loads(out)
    t = doc["totals"]["time_s"]
    fig = {f["name"]: f for f in doc["figures"]}
    assert fig["control_rate"]["value"] == pytest.approx(1 / t) and fig["control_rate"]["unit"] == "Hz"
    assert fig["action_rate"]["value"] == pytest.approx(50 / t) and fig["action_rate"]["unit"] == "actions/s"
    assert fig["action_rate"]["formula"] == "H/time_s"
    assert fig["batch_action_rate"]["value"] == pytest.approx(1 * 50 / t)
    assert any("masks the state token" in n for n in doc["notes"])  # the model's assumptions


def test_a_batch_of_observations():
    # four robots in one step: each gets a slower control rate, the batch more actions per second
    rc, out = run("--json", "--device", "h200-sxm", "--sweep", "B=1,4")
    sweep = json.loads(out)["sweep"]
    fig = [{f["name"]: f["value"] for f in e["figures"]} for e in sweep]
    t = [e["totals"]["time_s"] for e in sweep]
    assert t[0] < t[1] < 4 * t[0]
    assert fig[1]["batch_action_rate"] == pytest.approx(4 * 50 / t[1])
    assert fig[1]["batch_action_rate"] > fig[0]["batch_action_rate"]
    assert fig[1]["control_rate"] < fig[0]["control_rate"]


def test_sweep_figures_and_a_longer_chunk():
    rc, out = run("--json", "--device", "h200-sxm", "--sweep", "H=50,100")
    sweep = json.loads(out)["sweep"]
    rates = [{f["name"]: f["value"] for f in e["figures"]} for e in sweep]
    for e, r in zip(sweep, rates):
        assert r["action_rate"] == pytest.approx(e["point"]["H"] / e["totals"]["time_s"])
    # a chunk twice as long costs less than twice the time: more actions per second
    assert sweep[1]["totals"]["time_s"] < 2 * sweep[0]["totals"]["time_s"]
    assert rates[1]["action_rate"] > rates[0]["action_rate"]


def test_text_report_and_slow_rollup(tmp_path):
    trace_file = tmp_path / "pi0.json"
    rc, out = run("--device", "h200-sxm", "--rollup", "both", "--chrome-trace", str(trace_file))
    assert rc == 0
    assert "Figures" in out and "control_rate (Hz)" in out and "slow" in out
    assert "vector rate for bf16 taken from fp32:" in out  # one line for all its leaves
    events = json.loads(trace_file.read_text())
    assert any(e["name"] == "expert.down_proj" for e in events["traceEvents"])
    rc, out = run("--json", "--device", "h200-sxm", "--rollup", "slow")
    doc = json.loads(out)
    slow = doc["slow"]
    assert {f["name"] for f in slow["figures"]} == {"control_rate", "action_rate", "batch_action_rate"}
    # the schedule overlaps work the serial sum does not: never slower than the fast roll-up
    assert slow["figures"][0]["value"] >= doc["figures"][0]["value"]


def test_model_sizes_are_builder_parameters():
    # a smaller expert (half the layers) in the same trace shape: the step's layer FLOPs halve
    half = GEMMA_300M.__class__(**{**GEMMA_300M.__dict__, "depth": 9})
    g = trace(lambda b: pi0_step(b, expert=half), "pi0-half", padded=True)
    loop = next(v.op for v in walk(g) if isinstance(v.op, Loop) and v.op.name == "denoise")
    embed_and_out = 3_276_800 + 65_536 + 209_715_200 + 104_857_600 + 3_276_800
    assert at(cost(loop.body)[FLOPS_MATRIX]) == 9 * 2_139_095_040 + embed_and_out
    wrong = GEMMA_2B.__class__(**{**GEMMA_2B.__dict__, "name": "expert", "kv_heads": 2, "heads": 8})
    with pytest.raises(TraceError, match="kv_heads and head_dim must match"):
        trace(lambda b: pi0_step(b, expert=wrong), "pi0-bad", padded=True)


def test_bad_symbol_is_a_clear_error(capsys):
    assert main(["kernel", "pi0", "--set", "steps=10"]) == 2
    err = capsys.readouterr().err
    assert "unknown symbol 'steps'" in err and "Traceback" not in err


def test_pi05_action_expert_step_flops_by_hand():
    # π0.5: the suffix is the H = 50 action tokens (no state token); the prompt is L = 200 tokens,
    # so the keys are 768 + 200 + 50 = 1018, in ceil(1018/64) = 16 tiles = 1024. Each of the 37
    # adaptive norms (2 per layer, and the final one) runs a 1024 → 3·1024 Dense on one
    # conditioning row.
    S, D, F, keys = 50, 1024, 4096, 16 * 64
    per_layer = (2 * S * D * 2048 * 2 + 2 * S * D * 256 * 2 + 2 * S * D * F * 3
                 + 2 * 8 * S * keys * 256 * 2 + 2 * 3 * 2 * 1 * D * D)
    assert per_layer == 2_162_163_712
    time_mlp, action_in, final_norm, action_out = 2 * 2 * D * D, 2 * S * 32 * D, 3 * 2 * D * D, 2 * S * D * 32
    step = 18 * per_layer + time_mlp + action_in + final_norm + action_out
    assert step == 38_935_986_176
    g = get_kernel("pi05").graph
    loop = next(v.op for v in walk(g) if isinstance(v.op, Loop) and v.op.name == "denoise")
    body = cost(loop.body)
    assert at(body[FLOPS_MATRIX], L=200) == step
    # the adaptive norms' weights are read every step: 37 · 3 · 1024² bf16 values
    modulation = tuple(f"_w_{part}" for part in ("scale", "shift", "gate"))  # expert.ln1_w_scale, …
    ada = sum((v.op.cost[BYTES_HBM] * v.trips for v in walk(loop.body) if getattr(v.op, "kind", None) == "load"
               and v.op.attr("source").endswith(modulation)), sympy.Integer(0))
    assert ada == 37 * 3 * D * D * 2 == 232_783_872
    assert {s.name for s in cost(g)[FLOPS_MATRIX].free_symbols} == {"B", "images", "L", "k", "H"}


def test_pi05_in_the_catalog():
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["kernel", "pi05", "--json", "--device", "h200-sxm"]) == 0
    doc = json.loads(out.getvalue())
    assert doc["point"]["L"] == 200
    assert {f["name"] for f in doc["figures"]} == {"control_rate", "action_rate", "batch_action_rate"}
    assert not any("state token" in n for n in doc["notes"])  # π0.5 has none


def test_the_memory_curve_the_docs_quote():
    # models.md: the H200's memory efficiency is 15% of peak at 10 MB and 42% at 100 MB
    import yaml
    from pathlib import Path

    import perfcast.hardware

    spec = yaml.safe_load((Path(perfcast.hardware.__file__).parent / "devices" / "h200-sxm.yaml").read_text())
    points = dict(map(tuple, spec["calibration"]["efficiency"]["memory"]["points"]))
    assert round(points[1e7], 2) == 0.15 and round(points[1e8], 2) == 0.42


def test_a_figure_needs_its_symbols():
    from perfcast.ir import UserError
    from perfcast.kernels import TIME, Figure

    from perfcast.ir import dim

    rate = Figure("action_rate", "actions/s", dim("H") / TIME, "H per second")
    assert rate.at(0.5, {"H": 50}) == 100.0  # 50 actions in half a second
    with pytest.raises(UserError, match="needs a value for H"):
        rate.at(0.5, {})
