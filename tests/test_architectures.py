"""The generic decoder path: every shipped architecture builds, captures (prefill and decode),
lowers under every GPU engine and eager with no unpriced op, has its published size, caches the
bytes per token its attention kind implies, and respects the HBM floor of what a decode step
must read; an architecture perfcast cannot price is refused naming the part."""

import json
from dataclasses import replace
from functools import lru_cache

import pytest

from perfcast.capture import hf_config, lower
from perfcast.capture.build import build_model, capture
from perfcast.capture.parallel import Layout
from perfcast.hardware import get_device
from perfcast.inference.textgen import Request, simulate
from perfcast.ir import Leaf, UserError, walk
from perfcast.models import architecture, load_model_config

ENGINES = ["trtllm", "vllm", "sglang", "eager"]
DEVICE = "h200-sxm"
B, CONTEXT = 8, 1024  # decode: 8 sequences after 1,024 cached tokens

#: catalog entry -> (total parameters perfcast counts, the published size it must match and where
#: it is published). The count is the language model's (no vision tower, no MTP layers).
SIZES = {
    # 1.04 T total (Kimi-K2 model card: "1T total parameters"; Kimi-K2.5 keeps K2's language model)
    "kimi-k2.5": (1_026_408_209_408, 1.0e12, 0.03),
    # 62 layers × (q 3072·6144 + k, v 3072·1024 each + o 6144·3072 = 44,040,192; q/k norms 6,144 +
    # 1,024; two layer norms 2·3,072; router 256·3,072 = 786,432; experts 256·3·3,072·1,536 =
    # 3,623,878,656) = 62 × 3,668,718,592 = 227,460,552,704; + embedding and lm_head
    # 2·200,064·3,072 = 1,229,193,216; + final norm 3,072. MiniMax-M2 model card: "230B total".
    "minimax-m2.5": (228_689_748_992, 230e9, 0.01),
    # DeepSeek-V3.2 (deepseek-ai/DeepSeek-V3.2, safetensors): 685B with the 14B MTP module, as
    # DeepSeek-V3's README counts it ("685B ... 671B of the Main Model weights and 14B of the
    # Multi-Token Prediction (MTP) Module weights"); V3's 671.03 B + 61 indexers (wq_b 1,536·64·128,
    # wk 7,168·128, k_norm 2·128, weights_proj 7,168·64 = 13,959,424 each) = 671.88 B
    "deepseek-v3.2": (671_877_929_216, 685e9 - 14e9, 0.002),
    # GLM-5 model card (zai-org/GLM-5): "744B parameters (40B active)"
    "glm-5": (743_911_199_232, 744e9, 0.001),
    # Qwen3.5-397B-A17B: 397 B with its vision encoder (the name; model card "397B in total")
    "qwen3.5-397b-a17b": (396_346_350_336, 397e9, 0.005),
    # 28 layers × (LayerNorm 2·4,096; q, k, v, out 4·4,096²; fc_in 4,096·16,384 + 16,384; fc_out
    # 16,384·4,096 + 4,096) = 28 × 201,355,264 = 5,637,947,392; + wte 50,400·4,096 = 206,438,400;
    # + ln_f 8,192; + lm_head 206,438,400 + its bias 50,400. EleutherAI/gpt-j-6b model card:
    # "Number of parameters 6,053,381,344" (0.04 % more).
    "gpt-j-6b": (6_050_882_784, 6_053_381_344, 0.001),
    # 60 layers × (ln_attn, ln_mlp 4·8,192; query_key_value 8,192·(128 + 2·8)·64 = 75,497,472;
    # dense 8,192² = 67,108,864; MLP 2·8,192·32,768 = 536,870,912) = 60 × 679,510,016 =
    # 40,770,600,960; + the tied embedding 65,024·8,192 = 532,676,608; + ln_f 16,384.
    # tiiuae/falcon-40b model card: "a 40B parameters causal decoder-only model".
    "falcon-40b": (41_303_293_952, 40e9, 0.035),
    # Gemma 2 report (arXiv:2408.00118) Table 2, 9B: 917,504,000 embedding (256,000 × 3,584, tied)
    # + 8,324,201,984 non-embedding parameters
    "gemma-2-9b": (9_241_705_984, 917_504_000 + 8_324_201_984, 0),
    # 40 layers × (qkv_proj 5,120·(40 + 2·10)·128 = 39,321,600; o_proj 5,120² = 26,214,400;
    # gate_up_proj 5,120·2·17,920 = 183,500,800; down_proj 17,920·5,120 = 91,750,400; norms
    # 2·5,120) = 40 × 340,797,440 = 13,631,897,600; + embedding and lm_head 2·32,064·5,120 =
    # 328,335,360; + final norm 5,120. Phi-3 report (arXiv:2404.14219): "phi-3-medium, 14B".
    "phi-3-medium-4k": (13_960_238_080, 14e9, 0.003),
    # Phi-3-medium's layers (40 × 340,797,440 = 13,631,897,600) with the 100,352-token vocabulary
    # (2·100,352·5,120 = 1,027,604,480) + 5,120. Phi-4 report (arXiv:2412.08905): "14-billion".
    "phi-4": (14_659_507_200, 14e9, 0.05),
    # Llama 4 model cards: Scout "17B active, 109B total", Maverick "17B active, 400B total", both
    # with the vision encoder, which perfcast does not count (the text model only)
    "llama-4-scout": (107_769_861_120, 109e9, 0.015),
    "llama-4-maverick": (400_711_848_960, 400e9, 0.005),
    # Gemma 3 report (arXiv:2503.19786) Table 1, 12B: 10,759M non-embedding parameters; + the
    # tied embedding 262,208 × 3,840 = 1,006,878,720 (the vision encoder's 417M not counted)
    "gemma-3-12b": (11_766_034_176, 10_759e6 + 1_006_878_720, 0.0001),
    # 36 layers × (q, o 2·4,096²; k, v 2·4,096·1,024; MLP 3·4,096·12,288; norms 2·4,096) =
    # 36 × 192,946,176 = 6,946,062,336; + embedding and lm_head 2·131,072·4,096 = 1,073,741,824;
    # + final norm 4,096. Ministral-8B-Instruct-2410 model card: "8.0B".
    "ministral-8b": (8_019_808_256, 8.0e9, 0.005),
}


@lru_cache(maxsize=None)
def sim(model: str, engine: str, decode: bool):
    shape = dict(num_queries=B, context_length=CONTEXT, decode=True) if decode else dict(num_queries=2, query_length=256)
    return simulate(Request(load_model_config(model), get_device(DEVICE), engine=engine, **shape))


@pytest.mark.parametrize("model", sorted(SIZES))
def test_architecture_lowers_under_every_engine_and_respects_the_hbm_floor(model):
    """No unpriced op under any engine; no engine beats the HBM roofline of its own bytes, none
    drops a matrix FLOP eager runs; a decode step reads at least every non-expert weight (the
    embedding table aside) and the whole KV cache."""
    peak = float(get_device(DEVICE).hbm_bandwidth_bytes_per_s)
    for decode in (True, False):
        eager = sim(model, "eager", decode).evaluations["analytic"]
        for engine in ENGINES:
            r = sim(model, engine, decode)
            ev = r.evaluations["analytic"]
            where = (model, engine, "decode" if decode else "prefill")
            assert not r.lowered.unknown, where
            assert ev.time_s >= ev.totals["bytes.hbm"] / peak, where
            assert ev.totals["flops.matrix"] == pytest.approx(eager.totals["flops.matrix"], rel=1e-9), where
            if decode:
                floor = _non_expert_weight_bytes(model) + r.memory.kv_cache_bytes
                assert ev.time_s >= floor / peak, (where, ev.time_s, floor / peak)


@lru_cache(maxsize=None)
def _decode_capture(model: str):
    return capture(hf_config(load_model_config(model)), batch=2, new_tokens=1, past=16, decode=True)


def _non_expert_weight_bytes(model: str) -> int:
    """bf16 bytes of every parameter but the stacked routed experts and the embedding table."""
    cap = _decode_capture(model)
    return sum(int(t.numel) * 2 for name, t in cap.params.items()
               if len(t.shape) != 3 and "embed_tokens" not in name)


@pytest.mark.parametrize("model", sorted(SIZES))
def test_parameter_count_is_the_published_size(model):
    count, published, tolerance = SIZES[model]
    r = sim(model, "eager", True)
    assert r.memory.parameters == count
    assert abs(count - published) <= tolerance * published


# KV cache per token (bf16, every layer), by hand, one model per attention kind:
KV_PER_TOKEN = {
    "minimax-m2.5": 62 * 8 * 128 * 2 * 2,  # GQA: layers × KV heads × head size × (K, V) × 2 B = 253,952
    "kimi-k2.5": 61 * (512 + 64) * 2,  # MLA: the latent (kv_lora_rank) + the rope key, one entry = 70,272
    "glm-5": 78 * ((512 + 64) + 128) * 2,  # DSA: MLA's latent + the indexer's 128-wide key = 109,824
    "deepseek-v3.2": 61 * ((512 + 64) + 128) * 2,  # DSA, an indexer in every layer = 85,888
    "qwen3.5-397b-a17b": 15 * 2 * 256 * 2 * 2,  # hybrid: only the 15 full-attention layers cache = 30,720
    "gpt-j-6b": 28 * 16 * 256 * 2 * 2,  # MHA: every head caches its K and V = 458,752
    "falcon-40b": 60 * 8 * 64 * 2 * 2,  # grouped: 8 KV heads for 128 query heads = 122,880
    "gemma-2-9b": 42 * 8 * 256 * 2 * 2,  # GQA, every layer (windows cap the tokens, not the entry) = 344,064
    "phi-3-medium-4k": 40 * 10 * 128 * 2 * 2,  # fused qkv_proj, 10 KV heads = 204,800
    "gemma-3-12b": 48 * 8 * 256 * 2 * 2,  # GQA, 40 local layers windowed at 1,024 tokens = 393,216
}


@pytest.mark.parametrize("model", sorted(KV_PER_TOKEN))
def test_kv_cache_bytes_per_token_by_hand(model):
    r = sim(model, "eager", True)
    assert r.memory.kv_cache_bytes_per_token == KV_PER_TOKEN[model]
    state = 0
    if model == "qwen3.5-397b-a17b":
        # 45 Gated DeltaNet layers keep per sequence a 64 × 128 × 128 fp32 state (4,194,304 B) and
        # the conv state: (2·16·128 + 64·128 = 12,288 channels) × (4 − 1) taps × 2 B = 73,728 B
        state = 45 * (64 * 128 * 128 * 4 + 12_288 * 3 * 2)
    tokens = CONTEXT + 1
    if model == "gemma-3-12b":  # the 40 local layers keep the last 1,024 of the 1,025 tokens
        assert r.memory.kv_cache_bytes == B * (40 * 1024 + 8 * tokens) * 8 * 256 * 2 * 2
        return
    assert r.memory.kv_cache_bytes == B * tokens * KV_PER_TOKEN[model] + B * state


def test_glm5_layer_runs_the_indexer_and_the_sparse_attention_once():
    """GLM-5's decode layer: one lightning-indexer kernel and one top-k sparse attention per layer
    (78 of each), each query attending min(past + 1, 2,048) selected entries."""
    kinds = {}
    for v in walk(lower(_decode_capture("glm-5")).graph):
        if isinstance(v.op, Leaf):
            kinds.setdefault(v.op.kind, []).append((v.trips, v.op))
    assert sum(t for t, _ in kinds["sparse_indexer"]) == 78 and sum(t for t, _ in kinds["sparse_attention"]) == 78
    assert "attention" not in kinds
    # decode after 16 cached tokens: 17 keys each, 64 heads (absorbed: 576 + 512 wide):
    # 2 sequences × 64 × 17 × 2 × (576 + 512) matrix FLOPs
    (_, leaf), *_ = kinds["sparse_attention"]
    assert leaf.cost.get("flops.matrix") == 2 * 64 * 17 * 2 * (576 + 512)


def test_deepseek_v32_indexer_rotates_half_split_and_glm5_interleaved():
    """The two DSA models differ in the indexer's RoPE (DeepSeek-V3.2 half-split with
    ``rotate_half``'s neg, GLM-5 interleaved pairs) and in what the attention returns (V3.2's
    decoder layer takes two values); both capture with one indexer and one sparse attention a layer,
    V3.2's 128 heads attending the selected entries."""
    ops = {}
    for name in ("deepseek-v3.2", "glm-5"):
        cap = _decode_capture(name)
        ops[name] = {r.op for r in cap.records if r.layer == 3}
        low = lower(cap)
        kinds = [v.op.kind for v in walk(low.graph) if isinstance(v.op, Leaf)]
        assert "attention" not in kinds and not low.unknown
    assert "aten.neg.default" in ops["deepseek-v3.2"] and "aten.neg.default" not in ops["glm-5"]
    kinds = {}
    for v in walk(lower(_decode_capture("deepseek-v3.2")).graph):
        if isinstance(v.op, Leaf):
            kinds.setdefault(v.op.kind, []).append((v.trips, v.op))
    assert sum(t for t, _ in kinds["sparse_indexer"]) == 61 == sum(t for t, _ in kinds["sparse_attention"])
    (_, leaf), *_ = kinds["sparse_attention"]
    assert leaf.cost.get("flops.matrix") == 2 * 128 * 17 * 2 * (576 + 512)


def test_qwen35_hybrid_layers_are_two_groups():
    """Qwen3.5-MoE: 45 Gated DeltaNet layers and 15 gated full-attention layers (every 4th)."""
    cap = _decode_capture("qwen3.5-397b-a17b")
    groups = sorted((g.count, g.representative) for g in cap.groups)
    assert groups == [(15, 3), (45, 0)]
    ops = {(r.layer, r.op) for r in cap.records if r.op.startswith("perfcast.")}
    assert (0, "perfcast.gated_delta_rule.default") in ops and (0, "perfcast.causal_conv1d.default") in ops
    assert (3, "perfcast.attention.default") in ops and (3, "perfcast.gated_delta_rule.default") not in ops


def test_kimi_k25_prices_its_language_model():
    m = load_model_config("kimi-k2.5")
    assert m.model_type == "kimi_k25" and m.data["model_type"] == "deepseek_v3"
    assert m.architecture.parts["DeepseekV3Attention"] == "mla"
    assert "vision_config" in m.wrapper and "vision_config" not in m.data


# -- refusals ------------------------------------------------------------------------------------

def test_an_unknown_model_type_is_refused_by_name(tmp_path, cli):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "mamba", "hidden_size": 64}))
    proc = cli("text-generate", str(path))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "'mamba' is not an architecture perfcast knows" in proc.stderr


def test_a_module_the_row_does_not_list_is_refused_by_name():
    """A row that left out Qwen3.5's Gated DeltaNet class: the capture refuses, naming it,
    instead of pricing transformers' torch loop over chunks."""
    arch = architecture("qwen3_5_moe_text")
    parts = {k: v for k, v in arch.parts.items() if k != "Qwen3_5MoeGatedDeltaNet"}
    from perfcast.capture import substitutions

    cfg = hf_config(load_model_config("qwen3.5-397b-a17b"))
    cfg.num_hidden_layers, cfg.layer_types = 4, cfg.layer_types[:4]
    model = build_model(cfg, "bf16")
    with pytest.raises(UserError, match=r"model_type 'qwen3_5_moe_text': its module Qwen3_5MoeGatedDeltaNet "
                                        r"is not one perfcast knows \(known kinds: attention, mla, dsa"):
        substitutions.apply(model, replace(arch, parts=parts))


def test_tensor_parallel_divides_the_linear_attention_heads():
    r = simulate(Request(load_model_config("qwen3.5-397b-a17b"), get_device(DEVICE), engine="vllm",
                         num_queries=8, context_length=1024, decode=True, layout=Layout(tp=4)))
    assert not r.lowered.unknown
    # per device: 64 / 4 value heads of the 45 GDN layers' state, 2 KV heads replicated to 1 each
    state = 45 * (16 * 128 * 128 * 4 + (12_288 // 4) * 3 * 2)
    assert r.memory.kv_cache_bytes == 8 * 1025 * 15 * 1 * 256 * 2 * 2 + 8 * state


def test_falcon_multi_query_caches_one_kv_head(tmp_path):
    """Falcon's multi-query form (Falcon-7B's layout: multi_query without the new decoder
    architecture) keeps one KV head per layer: 60 × 1 × 64 × (K, V) × 2 B = 15,360 B per token."""
    data = json.loads(load_model_config("falcon-40b").path.read_text())
    data.update(new_decoder_architecture=False, multi_query=True)
    data.pop("num_kv_heads")
    path = tmp_path / "falcon-mqa.json"
    path.write_text(json.dumps(data))
    m = load_model_config(str(path))
    assert m.data["num_key_value_heads"] == 1
    r = simulate(Request(m, get_device(DEVICE), engine="vllm", num_queries=2, context_length=64, decode=True))
    assert not r.lowered.unknown and r.memory.kv_cache_bytes_per_token == 60 * 1 * 64 * 2 * 2



@pytest.mark.parametrize("name", ["glm-5", "deepseek-v3.2", "qwen3.5-397b-a17b"])
@pytest.mark.parametrize("decode", [False, True])
def test_symbolic_capture_of_the_new_mixers_matches_a_concrete_capture(tmp_path, monkeypatch, name, decode):
    """DSA and Gated DeltaNet keep the symbolic capture exact: the cached (B, S, C) capture
    lowered at a point is the concrete capture's graph, leaf for leaf."""
    from perfcast.capture.cache import symbolic_capture, valid_at
    from perfcast.ir import dim

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    m = load_model_config(name)
    sym, _ = symbolic_capture(m, dtype="bf16", decode=decode, context=decode)
    b, s, c = 3, 9, 40
    point = {dim("B"): b, dim("S"): s, dim("C"): c}
    assert valid_at(sym, point)
    concrete = lower(capture(hf_config(m), batch=b, new_tokens=1 if decode else s, past=c if decode else 0,
                             decode=decode))

    def structure(low):
        return [(v.trips, v.op.kind, v.op.attr("module"), v.op.cost) for v in walk(low.graph) if isinstance(v.op, Leaf)]

    assert structure(lower(sym, point=point)) == structure(concrete)


def test_gemma2_alternates_sliding_and_global_layers_with_soft_capping():
    """Gemma 2: even layers attend a 4,096-token window, odd layers everything (21 of each); both
    soft-cap their scores at 50 (3 more vector FLOPs per pair) and the logits at 30."""
    cap = _decode_capture("gemma-2-9b")
    assert sorted((g.count, g.representative) for g in cap.groups) == [(21, 0), (21, 1)]
    attn = {r.layer: r.scalars for r in cap.records if r.op == "perfcast.attention.default"}
    assert attn[0][2] == 4096 and attn[1][2] == 0 and attn[0][6] == attn[1][6] == 50.0
    assert [r.op for r in cap.records if r.module == "logits_softcap"] == [
        "aten.div.Tensor", "aten.tanh.default", "aten.mul.Tensor"]
    # 6,000 cached tokens: the 21 sliding layers hold 4,096 of them (+ the new one), the others 6,001
    r = simulate(Request(load_model_config("gemma-2-9b"), get_device(DEVICE), engine="vllm",
                         num_queries=1, context_length=6000, decode=True))
    entry = 8 * 256 * 2 * 2
    assert r.memory.kv_cache_bytes == 21 * 4096 * entry + 21 * 6001 * entry
    leaf = next(v.op for v in walk(lower(cap).graph) if isinstance(v.op, Leaf) and v.op.kind == "attention")
    # decode, 17 keys (16 cached + 1), 16 heads, 2 sequences: 8 vector FLOPs per pair
    assert leaf.cost.get("flops.vector") == 8 * 2 * 16 * 17


def test_llama4_chunked_rope_layers_and_global_nope_layers():
    """Llama 4 Maverick: every 4th layer is a global NoPE layer, the others attend within
    8,192-token chunks; every 2nd layer is MoE (128 experts, top 1, plus the shared expert), the
    others dense. After 9,000 cached tokens a chunked layer reads the 9,000 − 8,192 = 808 tokens
    of its chunk (+ the new one), a global layer all 9,001."""
    cap = capture(hf_config(load_model_config("llama-4-maverick")), batch=2, new_tokens=1, past=9000, decode=True)
    assert sorted((g.count, g.representative) for g in cap.groups) == [(12, 1), (12, 3), (24, 0)]
    attn = {r.layer: r.scalars for r in cap.records if r.op == "perfcast.attention.default"}
    assert attn[0][0] == attn[1][0] == 808 and attn[0][5] == attn[1][5] == 8192
    assert attn[3][0] == 9000 and attn[3][5] == 0
    moe = {r.layer: r.scalars for r in cap.records if r.op == "perfcast.moe_experts.default"}
    assert moe == {1: (1, 128), 3: (1, 128)}


def test_chunked_attention_pairs():
    from perfcast.ir.rules import chunked_pairs

    # a 10,000-token prefill in chunks of 8,192: 8,192·8,193/2 + 1,808·1,809/2
    assert chunked_pairs(10_000, 0, 8192) == 8192 * 8193 // 2 + 1808 * 1809 // 2
    # one decode token with 808 of its chunk cached: 809 keys
    assert chunked_pairs(1, 808, 8192) == 809


def test_every_kind_has_a_capture_handler():
    from perfcast.capture import substitutions
    from perfcast.models.architecture import KINDS, table

    assert set(substitutions.HANDLERS.keys()) == set(KINDS)
    used = {kind for row in table().values() for kind in row.parts.values()}
    assert used <= set(KINDS)


def test_gemma3_five_local_layers_per_global_layer():
    """Gemma 3 12B: of every 6 layers 5 attend a 1,024-token window with the local RoPE base and
    the 6th attends everything: 40 local and 8 global layers, each kind with its own rotary table."""
    cap = _decode_capture("gemma-3-12b")
    assert sorted((g.count, g.representative) for g in cap.groups) == [(8, 5), (40, 0)]
    attn = {r.layer: r.scalars for r in cap.records if r.op == "perfcast.attention.default"}
    assert attn[0][2] == 1024 and attn[5][2] == 0


@pytest.mark.parametrize("model_type", ["ministral", "ministral3"])
def test_rows_without_a_shipped_config_capture(tmp_path, model_type):
    """The Ministral (layer_types) and Ministral 3 rows: a two-layer config of each captures in
    both phases with every op priced."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": model_type, "hidden_size": 256, "intermediate_size": 512,
                                "num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 2,
                                "head_dim": 32, "vocab_size": 1000, "sliding_window": 64,
                                "layer_types": ["sliding_attention", "full_attention"]}))
    cfg = hf_config(load_model_config(str(path)))
    for decode in (False, True):
        cap = capture(cfg, batch=2, new_tokens=1 if decode else 8, past=100 if decode else 0, decode=decode)
        assert not lower(cap).unknown
        windows = {r.layer: r.scalars[2] for r in cap.records if r.op == "perfcast.attention.default"}
        if model_type == "ministral":  # per layer_types: the first layer windowed, the second not
            assert windows == {0: 64, 1: 0}


def test_gptj_tensor_parallel_rank_keeps_the_head_size():
    """GPT-J sizes its heads as n_embd / n_head; at tp 2 a rank holds 8 heads of 256, so its
    q/k/v/out projections are 4,096 × 2,048 and its cache half the model's. Per rank: 28 ×
    (4 · 4,096 · 2,048 + fc_in 4,096 · 8,192 + 8,192 + fc_out 8,192 · 4,096 + 4,096 + LayerNorm
    8,192) = 28 × 100,683,776 = 2,819,145,728; + wte and lm_head rows 25,200 · 4,096 each and the
    lm_head bias 25,200; + ln_f 8,192 = 3,025,617,520."""
    r = simulate(Request(load_model_config("gpt-j-6b"), get_device(DEVICE), engine="vllm", num_queries=8,
                         context_length=1024, decode=True, layout=Layout(tp=2)))
    assert not r.lowered.unknown
    assert r.memory.parameters == 3_025_617_520
    assert r.memory.kv_cache_bytes_per_token == 28 * 8 * 256 * 2 * 2


def test_falcon_tensor_parallel_rank_keeps_the_head_size():
    """Falcon-180B sizes its heads as hidden / heads (14,848 / 232 = 64); at tp 4 a rank holds 58
    query heads and 2 of the 8 KV groups, its fused query_key_value (58 + 2·2) · 64 = 3,968 wide.
    Per rank: 80 × (query_key_value 14,848 · 3,968 = 58,916,864; dense 3,712 · 14,848 =
    55,115,776; MLP 2 · 14,848 · 14,848 = 440,926,208; ln_attn and ln_mlp 4 · 14,848 = 59,392) =
    80 × 555,018,240 = 44,401,459,200; + the tied embedding's 16,256 rows · 14,848 = 241,369,088;
    + ln_f 29,696 = 44,642,857,984 (× 4 = 178,571,431,936: the whole model's 178,557,088,768 with
    the final norm on every rank). The KV cache: 80 layers × K and V × 2 heads × 64 in fp8."""
    r = simulate(Request(load_model_config("falcon-180b"), get_device("h100-sxm"), engine="trtllm", num_queries=8,
                         context_length=1024, decode=True, layout=Layout(tp=4), dtype="fp16", quantize="fp8",
                         kv_dtype="fp8"))
    assert not r.lowered.unknown
    assert r.memory.parameters == 44_642_857_984
    assert r.memory.kv_cache_bytes_per_token == 80 * 2 * 2 * 64 * 1 == 20_480