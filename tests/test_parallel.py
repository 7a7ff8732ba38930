"""Parallel layouts for captured models: collectives inferred by the plan, per-device memory,
pipeline stages, clear errors for impossible layouts."""

import json

import pytest
import sympy

from perfcast.capture.parallel import Layout, stage_layers
from perfcast.hardware import get_device
from perfcast.inference.textgen import Request, simulate
from perfcast.ir import Leaf, UserError, walk
from perfcast.models import load_model_config

H, HEADS, KV, HD, INTER, LAYERS, VOCAB = 512, 8, 4, 64, 1024, 4, 1024
MOE = dict(hidden=256, heads=8, kv=4, hd=32, inter=128, experts=16, top_k=4, layers=4, vocab=512)


@pytest.fixture(scope="module")
def dense(tmp_path_factory):
    path = tmp_path_factory.mktemp("dense") / "config.json"
    path.write_text(json.dumps({
        "model_type": "llama", "hidden_size": H, "num_attention_heads": HEADS, "num_key_value_heads": KV,
        "intermediate_size": INTER, "num_hidden_layers": LAYERS, "vocab_size": VOCAB,
        "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
        "bos_token_id": 1, "eos_token_id": 2}))
    return load_model_config(str(path))


@pytest.fixture(scope="module")
def moe(tmp_path_factory):
    m = MOE
    path = tmp_path_factory.mktemp("moe") / "config.json"
    path.write_text(json.dumps({
        "model_type": "qwen3_moe", "hidden_size": m["hidden"], "num_attention_heads": m["heads"],
        "num_key_value_heads": m["kv"], "head_dim": m["hd"], "intermediate_size": 512,
        "moe_intermediate_size": m["inter"], "num_experts": m["experts"], "num_experts_per_tok": m["top_k"],
        "num_hidden_layers": m["layers"], "vocab_size": m["vocab"], "max_position_embeddings": 4096,
        "norm_topk_prob": True, "decoder_sparse_step": 1, "mlp_only_layers": [], "tie_word_embeddings": False}))
    return load_model_config(str(path))


def run(model, layout=Layout(), *, device="h200-sxm", models=("analytic",), **kw):
    kw.setdefault("num_queries", 2)
    kw.setdefault("query_length", 64)
    return simulate(Request(model, get_device(device), layout=layout, performance_models=models, **kw))


def collectives(result) -> list[tuple[str, str, int, sympy.Expr, int]]:
    """(kind, axis, group, message bytes, calls) of every collective leaf, in order."""
    from perfcast.ir.rules import collective_message

    out = []
    for v in walk(result.lowered.graph):
        if isinstance(v.op, Leaf) and v.op.attr("collective"):
            out.append((v.op.kind, v.op.attr("axis"), v.op.attr("group_size"),
                        collective_message(v.op.inputs, v.op.outputs), int(v.trips)))
    return out


def test_tensor_parallel_collectives_and_memory(dense):
    r = run(dense, Layout(tp=4))
    tokens = 2 * 64
    act = tokens * H * 2  # bf16 activations (tokens, hidden)
    # embedding (vocab-parallel, partial) → all-reduce; per layer attention and MLP blocks end in a
    # row-parallel linear → one all-reduce each; lm_head's vocab-sharded logits → all-gather
    assert collectives(r) == [
        ("all_reduce", "tp", 4, act, 1),
        ("all_reduce", "tp", 4, act, LAYERS), ("all_reduce", "tp", 4, act, LAYERS),
        ("all_gather", "tp", 4, 2 * VOCAB * 2, 1),  # last position's logits, 2 sequences
    ]
    per_layer = H * H // 4 * 2 + 2 * H * (KV // 4 * HD) + 3 * H * INTER // 4 + 2 * H
    params = LAYERS * per_layer + 2 * VOCAB // 4 * H + H
    assert r.memory.parameters == params and r.memory.weights_bytes == 2 * params
    single = run(dense)
    assert single.memory.kv_cache_bytes == 4 * r.memory.kv_cache_bytes  # KV heads split 4 ways
    doc_notes = " ".join(r.notes)
    assert "layout: tp4 on 4 devices of hgx-h200 — tp: 4 on nvlink" in doc_notes


def test_sequence_parallel_replaces_all_reduce(dense):
    r = run(dense, Layout(tp=2, sequence_parallel=True))
    act = 128 * H * 2
    kinds = [(k, n) for k, _, _, b, n in collectives(r) if b == act]
    # embedding RS, then per layer: AG + RS around attention and around the MLP, final AG
    assert kinds == [("reduce_scatter", 1), ("all_gather", LAYERS), ("reduce_scatter", LAYERS),
                     ("all_gather", LAYERS), ("reduce_scatter", LAYERS), ("all_gather", 1)]


def test_kv_heads_replicated_when_fewer_than_tp(dense):
    r = run(dense, Layout(tp=8))
    assert any("4 KV heads < tp 8: each KV head is replicated on 2 devices" in n for n in r.notes)
    assert run(dense).memory.kv_cache_bytes == 4 * r.memory.kv_cache_bytes  # one KV head per device


def test_pipeline_stages(dense):
    assert [list(x) for x in stage_layers(5, 2)] == [[0, 1, 2], [3, 4]]
    r = run(dense, Layout(pp=2), num_queries=4)
    assert r.request.micro_batches == 2 and r.request.sequences_per_micro_batch == 2
    sends = [c for c in collectives(r) if c[0] == "send_recv"]
    assert sends == [("send_recv", "pp", 2, 2 * 64 * H * 2, 1)]  # one micro-batch's activations
    t = r.stage_times_s["analytic"]
    assert len(t) == 2 and r.step_time_s("analytic") == pytest.approx(sum(t) + max(t))
    single = run(dense, num_queries=4)
    # each stage holds half the layers (and the embedding or lm_head): fewer weights per device
    assert r.memory.weights_bytes < 0.6 * single.memory.weights_bytes
    assert r.memory.kv_cache_bytes == single.memory.kv_cache_bytes // 2


def test_data_parallel_replicas(dense):
    r = run(dense, Layout(dp=2), num_queries=4)
    assert collectives(r) == []
    half = run(dense, num_queries=2)
    assert r.evaluations["analytic"].time_s == half.evaluations["analytic"].time_s
    assert r.tokens_per_s_per_device("analytic") == pytest.approx(half.tokens_per_s_per_device("analytic"))


def _grouped(result) -> Leaf:
    return next(v.op for v in walk(result.lowered.graph) if isinstance(v.op, Leaf) and v.op.kind == "grouped_matmul")


def test_expert_parallel_within_tp(moe):
    m = MOE
    r = run(moe, Layout(tp=2, ep=2))
    tokens = 128
    g = _grouped(r)
    per_expert = 3 * m["hidden"] * m["inter"]  # gate, up, down (moe_tp = tp / ep = 1: whole experts)
    assert g.cost["flops.matrix"] == 2 * tokens * m["top_k"] * per_expert // 2  # half the pairs
    # all tp ranks hold the same tokens: no all-to-all; the MoE block's partial outputs are all-reduced
    assert {c[0] for c in collectives(r)} == {"all_reduce", "all_gather"}
    single = run(moe)
    experts_bytes = m["layers"] * m["experts"] * per_expert * 2
    assert single.memory.weights_bytes - r.memory.weights_bytes > experts_bytes // 2  # + attention split


@pytest.mark.parametrize("engine, device, options", [("sglang", "h200-sxm", (("moe_a2a_backend", "deepep"),)),
                                                     ("trtllm", "gb200", ())])
def test_attention_data_parallel_dispatch_and_combine(moe, engine, device, options):
    """The all-to-all exchange: SGLang with DeepEP (--moe-a2a-backend deepep), TensorRT-LLM on an NVL72 rack."""
    m = MOE
    r = run(moe, Layout(dp=4, ep=4, attention_dp=True), num_queries=8, engine=engine, device=device,
            engine_options=options)
    tokens = 2 * 64  # each data-parallel rank: 2 of the 8 sequences
    routed = tokens * m["top_k"] * m["hidden"] * 2
    assert collectives(r) == [("all_to_all", "ep", 4, routed, m["layers"])] * 2
    g = _grouped(r)
    assert g.cost["flops.matrix"] == 2 * tokens * m["top_k"] * 3 * m["hidden"] * m["inter"]
    assert g.attr("dispatched") is True
    assert any("attention data parallelism" in n for n in r.notes)


def test_trtllm_gathers_the_moe_groups_tokens_where_it_runs_no_all_to_all(moe):
    """TensorRT-LLM on an HGX node (no multi-node NVLink memory): every rank's tokens
    all-gathered over the MoE group before the experts, their outputs reduce-scattered after
    (the engine profile's moe_exchange); the expert work is the all-to-all's."""
    m = MOE
    r = run(moe, Layout(dp=4, ep=4, attention_dp=True), num_queries=8, engine="trtllm")
    tokens = 2 * 64
    everyone = 4 * tokens * m["hidden"] * 2  # the group's tokens, bf16 (the experts are unquantized)
    assert collectives(r) == [("all_gather", "ep", 4, everyone, m["layers"]),
                              ("reduce_scatter", "ep", 4, everyone, m["layers"])]
    assert _grouped(r).cost["flops.matrix"] == 2 * tokens * m["top_k"] * 3 * m["hidden"] * m["inter"]
    assert any("all-gather the group's tokens over ep 4" in n for n in r.notes)
    fp8 = run(moe, Layout(dp=4, ep=4, attention_dp=True), num_queries=8, engine="trtllm", quantize="fp8")
    gather = collectives(fp8)[0]
    assert gather[0] == "all_gather" and gather[3] == everyone // 2  # quantized before the gather: one byte each


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_vllm_and_sglang_gather_the_moe_groups_tokens_by_default(moe, engine):
    """vLLM's default all-to-all backend is allgather_reducescatter (ParallelConfig.all2all_backend), SGLang's
    MoE layer runs in FULL scatter mode unless --moe-a2a-backend is set (LayerCommunicator): both gather."""
    r = run(moe, Layout(dp=4, ep=4, attention_dp=True), num_queries=8, engine=engine)
    everyone = 4 * 2 * 64 * MOE["hidden"] * 2
    assert collectives(r) == [("all_gather", "ep", 4, everyone, MOE["layers"]),
                              ("reduce_scatter", "ep", 4, everyone, MOE["layers"])]


def test_profiling_model_prices_tp_all_reduce_from_nccl_and_looks_up_ep_grouped_gemm(moe):
    r = run(moe, Layout(tp=2, ep=2), models=("analytic", "profiling"), decode=True, context_length=64)
    from perfcast.report.textgen import missed_ops

    reasons = {x["op"]: x["reason"] for x in missed_ops(r, "profiling")}
    # looked up at its expert split; this toy model's sizes are not among the measured ones
    assert "hidden=256, inter=128, experts=16, top_k=4, moe_tp=1, moe_ep=2" in reasons["perfcast.moe_experts.default"]
    assert "all_reduce" not in reasons  # intra-node all-reduce priced from the NCCL table


@pytest.mark.parametrize("layout, kw, message", [
    (Layout(tp=3), {}, "--tp-size 3 does not divide the 8 attention heads"),
    (Layout(tp=2), {"num_devices": 8}, "--num-devices 8 ≠ --tp-size 2 × --dp-size 1 × --pp-size 1 = 2"),
    (Layout(ep=2), {}, "has no routed experts"),
    (Layout(pp=5), {}, "--pp-size 5 exceeds the 4 decoder layers"),
    (Layout(dp=4), {"num_queries": 2}, "--num-queries 2 cannot feed --dp-size 4"),
])
def test_invalid_dense_layouts(dense, layout, kw, message):
    with pytest.raises(UserError, match=message.replace("(", r"\(").replace(")", r"\)")):
        run(dense, layout, **kw)


@pytest.mark.parametrize("layout, message", [
    (Layout(tp=4, ep=3), "--ep-size 3 does not divide the 16 routed experts"),
    (Layout(tp=1, ep=2), "--ep-size 2 must divide --tp-size 1"),
    (Layout(dp=6, ep=4, attention_dp=True), "--ep-size 4 must divide --tp-size × --dp-size = 6"),
])
def test_invalid_moe_layouts(moe, layout, message):
    with pytest.raises(UserError, match=message):
        run(moe, layout, num_queries=6)


def test_attention_dp_with_expert_tensor_parallelism(moe):
    """ep 2 of a group of tp 1 × dp 4: each expert's FFN split over moe_tp 2 devices, which all
    compute every token routed to the expert shard — dispatched over ep, gathered over moe_tp,
    reduce-scattered back, combined over ep."""
    r = run(moe, Layout(dp=4, ep=2, attention_dp=True), num_queries=8)
    kinds = [lt.leaf.kind for lt in r.rollups["analytic"].leaves
             if lt.leaf.kind in ("all_to_all", "all_gather", "reduce_scatter")]
    assert kinds[:4] == ["all_to_all", "all_gather", "reduce_scatter", "all_to_all"]
    moe_leaf = next(lt.leaf for lt in r.rollups["analytic"].leaves if lt.leaf.kind == "grouped_matmul")
    # token share moe_tp / tp = 2: the rank's 2 sequences and its moe_tp partner's
    assert moe_leaf.attr("token_share") == 2 and moe_leaf.attr("expert_tp") == 2


def test_cli_parallel_flags_and_errors(cli, dense):
    doc = json.loads(cli("text-generate", str(dense.path), "--tp-size", "2", "--pp-size", "2", "--num-queries", "4",
                         "--query-length", "32", "--json", check=True).stdout)
    assert doc["parallel"] == {"num_devices": 4, "tp": 2, "ep": 1, "dp": 1, "pp": 2, "attention_dp": False,
                               "sequence_parallel": False, "micro_batches": 2, "sequences_per_micro_batch": 2}
    assert len(doc["performance_models"]["analytic"]["stage_times_s"]) == 2
    proc = cli("text-generate", str(dense.path), "--tp-size", "3")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "attention heads" in proc.stderr
    proc = cli("text-generate", str(dense.path), "--tp-size", "2", "--device", "mi300x")
    assert proc.returncode == 2 and "pass --topology" in proc.stderr
    proc = cli("text-generate", str(dense.path), "--tp-size", "2", "--topology", "switch:8")
    assert proc.returncode == 2 and "takes a shipped topology" in proc.stderr


def test_multi_node_data_parallel_axis_crosses_infiniband(moe):
    r = run(moe, Layout(tp=8, dp=2, ep=16, attention_dp=True), num_queries=4, models=("analytic", "profiling"),
            engine="sglang", engine_options=(("moe_a2a_backend", "deepep"),))
    assert any("dp: 2 on infiniband" in n and "ep: 8 on nvlink × 2 on infiniband" in n for n in r.notes)
    from perfcast.report.textgen import missed_ops

    a2a = [x for x in missed_ops(r, "profiling") if x["op"] == "all_to_all"]
    assert a2a and "crosses nvlink and infiniband" in a2a[0]["reason"]


def test_kernel_collectives_priced_on_a_topology(cli):
    """The DSL DeepSeekMoE block: its hand-written dispatch all-to-all over ep priced on hgx-h200,
    inside a node at EP = 8 and hierarchically over two nodes at EP = 16."""
    from perfcast.hardware.topology import get_topology
    from perfcast.perf.collectives import topology_cost

    proc = cli("kernel", "deepseek-moe")
    assert proc.returncode == 2 and "needs a topology to be priced (pass --topology)" in proc.stderr
    topo = get_topology("hgx-h200")
    for ep, tiers in ((8, "nvlink"), (16, "hierarchical")):
        doc = json.loads(cli("kernel", "deepseek-moe", "--topology", "hgx-h200", "--set", f"EP={ep}", "--json",
                             check=True).stdout)
        dispatch = doc["leaves"]["dispatch"]
        message = 2 * 7168 * 4096 * 8 // ep  # T/EP tokens travel top_k times each: 2·D·T·top_k/EP bytes
        expected = topology_cost("all_to_all", message, topo.with_devices(ep), ep)
        assert dispatch["time_s"] == pytest.approx(float(expected.time_s), rel=1e-12)
        assert (expected.algorithm == "hierarchical") == (tiers == "hierarchical")
        assert doc["leaves"]["shared_down.all_reduce"]["time_s"] == 0  # TP = 1: a group of one


def test_tied_embedding_is_held_by_the_first_and_last_stage(tmp_path):
    cfg = {"model_type": "llama", "hidden_size": 256, "num_attention_heads": 4, "num_key_value_heads": 4,
           "intermediate_size": 512, "num_hidden_layers": 2, "vocab_size": 4096, "rms_norm_eps": 1e-5,
           "max_position_embeddings": 1024, "tie_word_embeddings": True}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    r = run(load_model_config(str(path)), Layout(pp=2), num_queries=2, query_length=16)
    layer = 4 * 256 * 256 + 3 * 256 * 512 + 2 * 256
    # the last stage: one layer, the final norm, and lm_head = the tied embedding (4096 × 256)
    assert r.memory.parameters == layer + 256 + 4096 * 256


def test_the_moe_exchange_option_forces_one_and_applies_with_attention_dp_only(moe, cli):
    """``--engine-option moe_exchange`` (TensorRT-LLM's forced all-to-all method): all_to_all on an
    HGX node where the engine would gather; one line and exit 2 where it cannot apply; the
    InferenceX gpt-oss B200 script's MNNVL mapped onto its attention-DP rows (moe_tp 1) only."""
    from perfcast.inference.recipes import recipe_of

    forced = run(moe, Layout(dp=4, ep=4, attention_dp=True), num_queries=8, engine="trtllm",
                 engine_options=(("moe_exchange", "all_to_all"),))
    assert [c[0] for c in collectives(forced)] == ["all_to_all", "all_to_all"]
    for flags in (["--tp-size", "2"], ["--dp-size", "2", "--attention-dp"]):  # no attention DP; moe_tp 2
        proc = cli("text-generate", str(moe.path), "--engine", "trtllm", "--engine-option", "moe_exchange=gather",
                   "--num-queries", "4", *flags)
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "moe_exchange" in proc.stderr
    # a disaggregated run takes it where one pool can: the decode pool here (the prefill pool's moe_tp is 2)
    proc = cli("serve", str(moe.path), "--engine", "trtllm", "--engine-option", "moe_exchange=gather", "--dp-size", "4",
               "--ep-size", "4", "--attention-dp", "--disagg", "1p1d", "--prefill-tp-size", "2", "--isl", "64",
               "--osl", "8", "--concurrency", "4", "--num-requests", "8", "--json")
    assert proc.returncode == 0, proc.stderr
    args = ("openai/gpt-oss-120b", "trtllm", "b200_sxm", "fp4", 1024, 1024, 1)
    assert ("moe_exchange", "all_to_all") in recipe_of(*args, attention_dp=True, moe_tp=1).engine_options
    assert "moe_exchange" not in dict(recipe_of(*args, attention_dp=True, moe_tp=2).engine_options)
    assert "moe_exchange" not in dict(recipe_of(*args, attention_dp=False).engine_options)
