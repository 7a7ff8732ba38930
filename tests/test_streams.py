"""The engine's second stream: TensorRT-LLM runs a MoE layer's shared experts on an auxiliary CUDA stream
alongside the router and the routed experts, inside CUDA graphs only (engine rule ``aux_stream``;
docs/design/engines.md, "The second stream"; perfcast.rollup.streams)."""

import json

import sympy

from perfcast.capture.parallel import Layout
from perfcast.hardware import get_device
from perfcast.inference.textgen import Request, simulate
from perfcast.ir import Tensor, leaves, make_leaf
from perfcast.models import load_model_config
from perfcast.rollup.overlap import OverlapRollup
from perfcast.rollup.streams import SMS, Timing, conc, hidden, on_stream
from tests.test_engines import run_cli

H200 = ("deepseek-v3", "--device", "h200-sxm", "--decode", "--num-queries", "64", "--context-length", "4096",
        "--tp-size", "8", "--ep-size", "8")


def _step(*argv, engine="trtllm") -> dict:
    rc, out, err = run_cli("text-generate", *argv, "--engine", engine, "--json")
    assert rc == 0, err
    return json.loads(out)


GB200 = ("deepseek-v3.1-nvfp4", "--device", "gb200", "--decode", "--num-queries", "2048", "--context-length",
         "5120", "--ep-size", "32", "--dp-size", "32", "--attention-dp", "--kv-cache-dtype", "fp8",
         "--cuda-graph-max-batch-size", "64")


def _result(cuda_graph_max=None, wide=False):
    if wide:  # GB200's: attention DP, the MoE's all-to-alls on the main stream
        return simulate(Request(model=load_model_config("deepseek-v3.1-nvfp4"), device=get_device("gb200"),
                                decode=True, num_queries=2048, context_length=5120, engine="trtllm", kv_dtype="fp8",
                                cuda_graph_max=64, layout=Layout(1, 32, 32, 1, True, False, None)))
    return simulate(Request(model=load_model_config("deepseek-v3"), device=get_device("h200-sxm"), decode=True,
                            num_queries=64, context_length=4096, engine="trtllm", cuda_graph_max=cuda_graph_max,
                            layout=Layout(8, 8, 1, 1, False, False, None)))


def _aux_s(result) -> float:
    r, ev = result.rollups["analytic"], result.evaluations["analytic"]
    return sum(row["time_s"] for lt, row in zip(r.leaves, ev.leaves.values()) if lt.leaf.attr("stream") == "aux")


def test_concurrent_parts_share_what_both_use():
    main = Timing(sympy.Integer(10), {"memory.hbm": sympy.Integer(8), "network": sympy.Integer(2)})
    aux = Timing(sympy.Integer(5), {"memory.hbm": sympy.Integer(4)})
    assert conc(main, aux).time == 12  # the HBM both read: 8 + 4 > the longer side's 10
    assert hidden(main, aux) == 3
    assert hidden(main, Timing(sympy.Integer(5), {"compute": sympy.Integer(5)})) == 5  # nothing shared: all of it


def test_compute_kernels_hold_the_sms_and_collectives_leave_them():
    gemm = make_leaf("matmul", "g", [Tensor("a", (64, 128), "bf16"), Tensor("w", (128, 128), "bf16")],
                     [Tensor("o", (64, 128), "bf16")])
    a2a = make_leaf("all_to_all", "x", [Tensor("a", (64, 128), "bf16")], [Tensor("o", (64, 128), "bf16")],
                    collective="all_to_all", axis="ep", group_size=8)
    t = Timing(sympy.Integer(4), {"memory.hbm": sympy.Integer(3)})
    assert on_stream(gemm, t).busy == {"memory.hbm": 3, SMS: 4}
    assert on_stream(a2a, t) == t
    # experts (8) then an all-to-all (6) on the main stream; shared experts (5) beside: only the all-to-all hides them
    main = on_stream(gemm, Timing(sympy.Integer(8))) + on_stream(a2a, Timing(sympy.Integer(6)))
    assert hidden(main, on_stream(gemm, Timing(sympy.Integer(5)))) == 5
    assert hidden(on_stream(gemm, Timing(sympy.Integer(8))), on_stream(gemm, Timing(sympy.Integer(5)))) == 0


def test_the_plan_marks_the_shared_experts_and_the_routed_path_before_the_join():
    low = _result().lowered
    marked = {(str(leaf.attr("stream")), str(leaf.attr("kernel"))) for leaf in leaves(low.graph)
              if leaf.attr("stream_join")}
    assert marked == {("aux", "fused_gate_up_gemm"), ("aux", "silu_and_mul"), ("aux", "gemm"),
                      ("main", "router_gemm"), ("main", "moe_routing"), ("main", "cutlass_fused_moe")}
    # the dense layers have no MoE block; the tensor-parallel all-reduce after the add is on neither side
    joins = {leaf.attr("stream_join") for leaf in leaves(low.graph) if leaf.attr("stream_join")}
    assert joins == {"model.layers.3.mlp"}
    assert not any(leaf.attr("stream") for leaf in leaves(low.graph) if leaf.attr("kernel", "").startswith("allreduce"))


def test_without_a_collective_beside_them_the_shared_experts_wait_for_the_sms():
    """H200, TP 8 × EP 8: the main stream's router and fused MoE hold every SM; nothing hides (32.2 ms)."""
    result = _result()
    ev = result.evaluations["analytic"]
    assert result.launch.mode == "cuda_graph" and ev.stream_overlap_s == 0 and _aux_s(result) > 0
    assert round(ev.time_s * 1e3, 1) == 32.2


def test_under_the_all_to_alls_the_second_stream_hides_the_shared_experts():
    """The worked example of docs/design/engines.md: GB200, attention DP over 32 ranks, 21.41 → 19.66 ms."""
    result = _result(wide=True)
    r, ev = result.rollups["analytic"], result.evaluations["analytic"]
    serial = sum(row["time_s"] for row in ev.leaves.values()) + ev.launch_time_s
    assert round(serial * 1e3, 2) == 21.41 and round(ev.time_s * 1e3, 2) == 19.66
    assert abs(serial - ev.stream_overlap_s - ev.time_s) < 1e-12
    assert abs(ev.stream_overlap_s - _aux_s(result)) < 1e-9  # all of it: the all-to-alls take longer
    (block, trips), = ev.stream_blocks_s
    assert block == "model.layers.3.mlp" and trips == 58
    # the --overlap roll-up's block fold applies the same rule: its plain sum is the step's time
    ov = OverlapRollup(r, ["comm-overlap"])
    assert abs(float(r.model.realize(ov.before_s)) - ev.time_s) < 1e-9
    assert float(r.model.realize(ov.time_s)) <= ev.time_s + 1e-12


def test_an_eager_step_runs_both_on_one_stream():
    result = _result(cuda_graph_max=0)
    assert result.launch.mode == "eager" and result.evaluations["analytic"].stream_overlap_s == 0
    assert any(n.startswith("second stream: trtllm would run") and "this step launches eager: one stream" in n
               for n in result.notes)


def test_engines_without_the_rule_price_one_stream():
    doc = _step(*H200, engine="vllm")
    assert doc["performance_models"]["analytic"]["stream_overlap_s"] == 0
    assert "kernels run one after another: no overlap between them is assumed" in doc["notes"]


def test_the_report_says_what_runs_beside_what():
    doc = _step(*GB200)
    m = doc["performance_models"]["analytic"]
    assert round(m["total_time_s"] * 1e3, 2) == 19.66 and round(m["stream_overlap_s"] * 1e3, 3) == 1.751
    assert "kernels run one after another except the engine's second stream (its note): no other overlap is " \
           "assumed" in doc["notes"]
    note = next(n for n in doc["notes"] if n.startswith("second stream:"))
    assert "fused_gate_up_gemm, gemm, silu_and_mul run on trtllm's auxiliary stream alongside cutlass_fused_moe, " \
           "moe_routing, perfcast.all_to_all, router_gemm" in note and "each compute kernel holding every SM" in note
    rc, out, _ = run_cli("text-generate", *GB200, "--engine", "trtllm")
    assert rc == 0 and "(second stream: run alongside)" in out and "−1.751 ms" in out


def test_the_trace_puts_the_aux_kernels_on_their_own_track(tmp_path):
    for argv, step in ((H200, 32.2), (GB200, 19.66)):
        path = tmp_path / "t.json"
        rc, _, err = run_cli("text-generate", *argv, "--engine", "trtllm", "--chrome-trace", str(path))
        assert rc == 0, err
        doc = json.loads(path.read_text())
        events = doc["traceEvents"] if isinstance(doc, dict) else doc
        spans = [e for e in events if e.get("ph") == "X"]
        aux = [e for e in spans if e["tid"] == 2]
        assert {e["name"] for e in aux} == {"fused_gate_up_gemm", "silu_and_mul", "gemm"} and len(aux) == 3 * 58
        end = max(e["ts"] + e["dur"] for e in spans) / 1e3
        assert round(end, len(str(step).split(".")[1])) == step  # the trace ends where the step does
        names = {e["args"]["name"] for e in events if e.get("ph") == "M"}
        assert names == {f"{argv[2]} (analytic)", f"{argv[2]} (analytic, second stream)"}




def test_a_rule_naming_an_unknown_role_is_one_line_and_exit_2(tmp_path):
    profile = tmp_path / "p.yaml"
    profile.write_text("extends: trtllm\nname: trtllm-typo\nrules:\n  - rule: aux_stream\n    modules: [shared_experts]\n"
                       "    alongside: [routr]\n    launch: [cuda_graph]\n    sources: [\"a test\"]\n")
    rc, out, err = run_cli("text-generate", "deepseek-v3", "--decode", "--context-length", "128", "--engine", str(profile))
    assert rc == 2 and not out and err.count("\n") == 1
    assert f"{profile}: key 'rules.0.alongside.0': 'routr' is not a role (known: embedding" in err
