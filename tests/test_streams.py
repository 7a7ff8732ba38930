"""The engine's second stream: TensorRT-LLM runs a MoE layer's shared experts on an auxiliary CUDA stream
alongside the router and the routed experts, inside CUDA graphs only (engine rule ``aux_stream``;
docs/design/engines.md, "The second stream"; perfcast.rollup.streams)."""

import json

import sympy

from perfcast.capture.parallel import Layout
from perfcast.hardware import get_device
from perfcast.inference.textgen import Request, simulate
from perfcast.ir import leaves
from perfcast.models import load_model_config
from perfcast.rollup.overlap import OverlapRollup
from perfcast.rollup.streams import Timing, conc, hidden
from tests.test_engines import run_cli

H200 = ("deepseek-v3", "--device", "h200-sxm", "--decode", "--num-queries", "64", "--context-length", "4096",
        "--tp-size", "8", "--ep-size", "8")


def _step(*argv, engine="trtllm") -> dict:
    rc, out, err = run_cli("text-generate", *argv, "--engine", engine, "--json")
    assert rc == 0, err
    return json.loads(out)


def _result(engine="trtllm", cuda_graph_max=None):
    return simulate(Request(model=load_model_config("deepseek-v3"), device=get_device("h200-sxm"), decode=True,
                            num_queries=64, context_length=4096, engine=engine, cuda_graph_max=cuda_graph_max,
                            layout=Layout(8, 8, 1, 1, False, False, None)))


def test_concurrent_parts_share_what_both_use():
    main = Timing(sympy.Integer(10), {"memory.hbm": sympy.Integer(8), "network": sympy.Integer(2)})
    aux = Timing(sympy.Integer(5), {"memory.hbm": sympy.Integer(4)})
    assert conc(main, aux).time == 12  # the HBM both read: 8 + 4 > the longer side's 10
    assert hidden(main, aux) == 3
    assert hidden(main, Timing(sympy.Integer(5), {"compute": sympy.Integer(5)})) == 5  # nothing shared: all of it


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


def test_under_cuda_graphs_the_second_stream_hides_the_shared_experts():
    """The worked example of docs/design/engines.md: 32.2 ms one stream, 30.2 ms with the second."""
    result = _result()
    r, ev = result.rollups["analytic"], result.evaluations["analytic"]
    assert result.launch.mode == "cuda_graph"
    serial = sum(row["time_s"] for row in ev.leaves.values()) + ev.launch_time_s
    assert round(serial * 1e3, 1) == 32.2 and round(ev.time_s * 1e3, 1) == 30.2
    assert abs(serial - ev.stream_overlap_s - ev.time_s) < 1e-12
    aux = sum(row["time_s"] for leaf, row in zip((lt.leaf for lt in r.leaves), ev.leaves.values())
              if leaf.attr("stream") == "aux")
    assert 0 < ev.stream_overlap_s <= aux + 1e-12  # at most the aux side: here all of it (58 layers)
    assert abs(ev.stream_overlap_s - aux) < 1e-9
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
    doc = _step(*H200)
    m = doc["performance_models"]["analytic"]
    assert round(m["total_time_s"] * 1e3, 1) == 30.2 and round(m["stream_overlap_s"] * 1e3, 2) == 1.99
    assert "kernels run one after another except the engine's second stream (its note): no other overlap is " \
           "assumed" in doc["notes"]
    note = next(n for n in doc["notes"] if n.startswith("second stream:"))
    assert "fused_gate_up_gemm, gemm, silu_and_mul run on trtllm's auxiliary stream alongside cutlass_fused_moe, " \
           "moe_routing, router_gemm" in note
    rc, out, _ = run_cli("text-generate", *H200, "--engine", "trtllm")
    assert rc == 0 and "(second stream: run alongside)" in out and "−1.989 ms" in out


def test_the_trace_puts_the_aux_kernels_on_their_own_track(tmp_path):
    path = tmp_path / "t.json"
    rc, _, err = run_cli("text-generate", *H200, "--engine", "trtllm", "--chrome-trace", str(path))
    assert rc == 0, err
    doc = json.loads(path.read_text())
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    spans = [e for e in events if e.get("ph") == "X"]
    aux = [e for e in spans if e["tid"] == 2]
    assert {e["name"] for e in aux} == {"fused_gate_up_gemm", "silu_and_mul", "gemm"} and len(aux) == 3 * 58
    end = max(e["ts"] + e["dur"] for e in spans) / 1e3
    assert round(end, 1) == 30.2  # the trace ends where the step does
    names = {e["args"]["name"] for e in events if e.get("ph") == "M"}
    assert names == {"h200-sxm (analytic)", "h200-sxm (analytic, second stream)"}


def test_nvfp4_experts_on_a_gb200_rack():
    """docs/design/engines.md: 21.41 → 19.66 ms, measured 17.44 ms."""
    argv = ("deepseek-v3.1-nvfp4", "--device", "gb200", "--decode", "--num-queries", "2048", "--context-length",
            "5120", "--ep-size", "32", "--dp-size", "32", "--attention-dp", "--kv-cache-dtype", "fp8",
            "--cuda-graph-max-batch-size", "64")
    m = _step(*argv)["performance_models"]["analytic"]
    assert round(m["total_time_s"] * 1e3, 2) == 19.66
    assert round((m["total_time_s"] + m["stream_overlap_s"]) * 1e3, 2) == 21.41
