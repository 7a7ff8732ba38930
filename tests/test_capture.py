"""Model capture: re-roll, symbolic capture, serving semantics, lowering coverage."""

import json
import random

import pytest
import sympy

from perfcast import engines
from perfcast.capture import capture, hf_config, lower
from perfcast.capture import Capture
from perfcast.capture import OpRecord, TensorMeta
from perfcast.inference.explain import symbolic_step
from perfcast.inference.textgen import Request
from perfcast.hardware import get_device
from perfcast.ir import BYTES_HBM, FLOPS_MATRIX, FLOPS_VECTOR, cost, dim
from perfcast.models import load_model_config

TINY_LLAMA = {"model_type": "llama", "hidden_size": 256, "intermediate_size": 512,
              "num_hidden_layers": 3, "num_attention_heads": 8, "num_key_value_heads": 2,
              "head_dim": 32, "vocab_size": 1000, "rms_norm_eps": 1e-5, "max_position_embeddings": 4096,
              "tie_word_embeddings": False, "hidden_act": "silu"}
TINY_DEEPSEEK = {"model_type": "deepseek_v3", "hidden_size": 256, "intermediate_size": 512,
                 "moe_intermediate_size": 64, "num_hidden_layers": 3, "first_k_dense_replace": 1,
                 "num_attention_heads": 4, "num_key_value_heads": 4, "n_routed_experts": 16,
                 "n_shared_experts": 1, "num_experts_per_tok": 4, "n_group": 4, "topk_group": 2,
                 "q_lora_rank": 96, "kv_lora_rank": 64, "qk_nope_head_dim": 32, "qk_rope_head_dim": 16,
                 "v_head_dim": 32, "vocab_size": 1000, "max_position_embeddings": 4096,
                 "rope_interleave": True, "tie_word_embeddings": False}
TINY_GPT_OSS = {"model_type": "gpt_oss", "hidden_size": 128, "intermediate_size": 128,
                "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
                "head_dim": 32, "num_local_experts": 8, "num_experts_per_tok": 2, "sliding_window": 16,
                "layer_types": ["sliding_attention", "full_attention"] * 2, "vocab_size": 1000,
                "max_position_embeddings": 4096, "tie_word_embeddings": False}


def model(tmp_path, data, name="tiny"):
    p = tmp_path / f"{name}.json"
    p.write_text(json.dumps(data))
    return load_model_config(str(p))


def totals(graph):
    c = cost(graph)
    return {k: c.get(k) for k in (FLOPS_MATRIX, FLOPS_VECTOR, BYTES_HBM)}


@pytest.mark.parametrize("data", [TINY_LLAMA, TINY_DEEPSEEK, TINY_GPT_OSS], ids=["llama", "deepseek", "gpt-oss"])
@pytest.mark.parametrize("decode", [False, True])
def test_rerolled_cost_equals_unrolled_capture(tmp_path, data, decode):
    cfg = hf_config(model(tmp_path, data))
    kw = dict(batch=2, new_tokens=1 if decode else 24, past=40 if decode else 0, decode=decode)
    rolled = capture(cfg, **kw)
    unrolled = capture(cfg, reroll=False, **kw)
    assert len(rolled.groups) < len(unrolled.groups) == data["num_hidden_layers"]
    assert totals(lower(rolled).graph) == totals(lower(unrolled).graph)


def test_two_kinds_of_layer_become_two_loops(tmp_path):
    cap = capture(hf_config(model(tmp_path, TINY_DEEPSEEK)), batch=1, new_tokens=8)
    assert [g.count for g in cap.groups] == [1, 2]  # 1 dense layer, 2 MoE layers
    cap = capture(hf_config(load_model_config("deepseek-v3")), batch=1, new_tokens=1, past=16, decode=True)
    assert [g.count for g in cap.groups] == [3, 58]


@pytest.mark.parametrize("data", [TINY_LLAMA, TINY_DEEPSEEK, TINY_GPT_OSS], ids=["llama", "deepseek", "gpt-oss"])
@pytest.mark.parametrize("decode", [False, True])
def test_symbolic_capture_matches_concrete_captures(tmp_path, data, decode):
    m = model(tmp_path, data)
    req = Request(model=m, device=get_device("h100-sxm"), decode=decode, context_length=1 if decode else 0)
    _, low, _ = symbolic_step(req)
    sym = totals(low.graph)
    rng = random.Random(7)
    cfg = hf_config(m)
    for _ in range(2):
        b, s, c = rng.randint(2, 9), rng.randint(2, 40), rng.randint(2, 60)
        concrete = capture(cfg, batch=b, new_tokens=1 if decode else s, past=c if decode else 0, decode=decode)
        # lowered as symbolic_step lowers: under the request's engine (the device's default)
        applied = engines.apply(req.profile(), concrete, decode=decode, device="h100-sxm",
                                hidden_size=data["hidden_size"])
        want = totals(lower(applied.capture, plan=applied.plan, engine=applied.profile.name).graph)
        point = {dim("B"): b, dim("S"): s, dim("C"): c}
        got = {k: sympy.sympify(v).subs(point) for k, v in sym.items()}
        assert got == want, (b, s, c)


def test_decode_attention_reads_the_kv_cache(tmp_path):
    cap = capture(hf_config(model(tmp_path, TINY_LLAMA)), batch=4, new_tokens=1, past=100, decode=True)
    attn = [leaf for leaf in _leaves(lower(cap).graph) if leaf.kind == "attention"][0]
    # per layer: 4 seqs × 2 kv heads × 101 cached tokens × (32 + 32) × 2 bytes read, + 1 written
    kv_read = 4 * 2 * 101 * 64 * 2
    q_and_out = 2 * (4 * 8 * 1 * 32 * 2)
    assert attn.cost[BYTES_HBM] == kv_read + q_and_out + 4 * 1 * 2 * 64 * 2
    # 2·B·H·P·(d_qk + d_v) with P = 101 keys for the one new token
    assert attn.cost[FLOPS_MATRIX] == 2 * 4 * 8 * 101 * 64


def test_causal_prefill_counts_unmasked_pairs_only(tmp_path):
    cap = capture(hf_config(model(tmp_path, TINY_LLAMA)), batch=1, new_tokens=10)
    attn = [leaf for leaf in _leaves(lower(cap).graph) if leaf.kind == "attention"][0]
    assert attn.cost[FLOPS_MATRIX] == 2 * 8 * (10 * 11 // 2) * 64  # 55 pairs, not 100


def test_sliding_window_caps_attended_keys(tmp_path):
    cap = capture(hf_config(model(tmp_path, TINY_GPT_OSS)), batch=1, new_tokens=1, past=100, decode=True)
    attn = sorted((leaf for leaf in _leaves(lower(cap).graph) if leaf.kind == "attention"),
                  key=lambda leaf: leaf.attr("window"))
    assert [a.attr("window") for a in attn] == [0, 16]
    assert attn[0].cost[FLOPS_MATRIX] == 2 * 4 * 101 * 64
    assert attn[1].cost[FLOPS_MATRIX] == 2 * 4 * 16 * 64


def test_logits_only_for_the_last_position_in_prefill(tmp_path):
    cap = capture(hf_config(model(tmp_path, TINY_LLAMA)), batch=3, new_tokens=20)
    lm = [leaf for leaf in _leaves(lower(cap).graph) if leaf.attr("module") == "lm_head"]
    assert len(lm) == 1 and lm[0].cost[FLOPS_MATRIX] == 2 * 3 * 256 * 1000


def test_moe_reads_only_the_experts_its_routing_reaches(tmp_path):
    cap = capture(hf_config(model(tmp_path, TINY_DEEPSEEK)), batch=3, new_tokens=1, past=8, decode=True)
    moe, balanced = ([leaf for leaf in _leaves(lower(cap, moe_routing=r).graph) if leaf.kind == "grouped_matmul"][0]
                     for r in ("random", "balanced"))
    assert (moe.attr("routing"), balanced.attr("routing")) == ("random", "balanced")
    per_expert = (2 * 64 * 256 + 256 * 64) * 2  # gate_up + down, bf16
    # 3 tokens × top-4: 2·T·k·params FLOPs either way
    assert moe.cost[FLOPS_MATRIX] == balanced.cost[FLOPS_MATRIX] == 2 * 3 * 4 * (2 * 64 * 256 + 256 * 64)
    acts = 3 * (2 * 256 * 2 + 4 * 8)  # tokens in and out, routing indices
    # balanced: 12 of 16 experts' weights; random: 16·(1 − (12/16)³) = 9.25 of them
    assert balanced.cost[BYTES_HBM] == 12 * per_expert + acts
    assert moe.cost[BYTES_HBM] == sympy.Rational(37, 4) * per_expert + acts


def test_mla_decode_is_absorbed_and_caches_the_latent(tmp_path):
    cap = capture(hf_config(model(tmp_path, TINY_DEEPSEEK)), batch=2, new_tokens=1, past=30, decode=True)
    attn = [leaf for leaf in _leaves(lower(cap).graph) if leaf.kind == "attention"][0]
    q, k, v = attn.inputs[:3]
    assert (q.shape[-1], k.shape[1], k.shape[-1], v.shape[-1]) == (64 + 16, 1, 64 + 16, 64)
    assert attn.attr("shared_kv")


def test_unknown_ops_are_reported_not_zero():
    meta = TensorMeta((sympy.Integer(4),), "bf16", False, 0)
    cap = Capture([OpRecord("aten.frobnicate.default", (meta,), (meta,), (), "x", None),
                   OpRecord("aten.view.default", (meta,), (meta,), (), "x", None)], [], {}, set())
    low = lower(cap)
    assert low.unknown == {("aten.frobnicate.default", "4"): 1}
    assert low.free == {"view": 1}
    assert low.graph.ops == ()


def _leaves(graph):
    from perfcast.ir import leaves

    return leaves(graph)


def test_fusion_keeps_flops_and_cuts_traffic_and_kernels(tmp_path):
    cap = capture(hf_config(model(tmp_path, TINY_LLAMA)), batch=2, new_tokens=16)
    fused, plain = lower(cap), lower(cap, fusion=False)
    f, p = totals(fused.graph), totals(plain.graph)
    assert f[FLOPS_MATRIX] == p[FLOPS_MATRIX] and f[FLOPS_VECTOR] == p[FLOPS_VECTOR]
    assert f[BYTES_HBM] < p[BYTES_HBM]
    kinds = [leaf.kind for leaf in _leaves(fused.graph)]
    assert "fused" in kinds and len(kinds) < len(_leaves(plain.graph))
    # RMSNorm as one kernel: reads x (bf16) and the weight, writes the normalised x.
    norm = [leaf for leaf in _leaves(fused.graph) if leaf.attr("module").endswith("layers.0.input_layernorm")][0]
    assert norm.cost[BYTES_HBM] == 2 * 16 * 256 * 2 + 256 * 2 + 2 * 16 * 256 * 2


def test_broadcast_inputs_cost_their_stored_data(tmp_path):
    """lm_head on the last position runs as a bmm with the weight expanded over the batch:
    the weight is still read once."""
    cap = capture(hf_config(model(tmp_path, TINY_LLAMA)), batch=4, new_tokens=8)
    lm = [leaf for leaf in _leaves(lower(cap).graph) if leaf.attr("module") == "lm_head"][0]
    weight = 256 * 1000 * 2
    assert lm.cost[BYTES_HBM] == weight + 4 * 256 * 2 + 4 * 1000 * 2


def test_activation_peak_excludes_weights(tmp_path):
    from perfcast.inference.memory import activation_peak

    cap = capture(hf_config(model(tmp_path, TINY_LLAMA)), batch=1, new_tokens=1, past=4, decode=True)
    assert activation_peak(cap, {}) < 256 * 1000 * 2  # lm_head's weight is not an activation


@pytest.mark.parametrize("data", [TINY_LLAMA, TINY_DEEPSEEK, TINY_GPT_OSS], ids=["llama", "deepseek", "gpt-oss"])
@pytest.mark.parametrize("decode", [False, True])
def test_cached_symbolic_capture_lowers_to_the_concrete_graph(tmp_path, monkeypatch, data, decode):
    from perfcast.capture.cache import symbolic_capture, valid_at

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    m = model(tmp_path, data)
    sym, hit = symbolic_capture(m, dtype="bf16", decode=decode, context=decode)
    assert not hit and symbolic_capture(m, dtype="bf16", decode=decode, context=decode)[1]
    b, s, c = 5, 17, 33
    point = {dim("B"): b, dim("S"): s, dim("C"): c}
    assert valid_at(sym, point) and not valid_at(sym, {**point, dim("B"): 1})
    concrete = lower(capture(hf_config(m), batch=b, new_tokens=1 if decode else s,
                             past=c if decode else 0, decode=decode))
    at_point = lower(sym, point=point)
    assert totals(at_point.graph) == totals(concrete.graph)
    def structure(g):
        return [(leaf.kind, leaf.attr("module"), leaf.cost) for leaf in _leaves(g)]

    assert structure(at_point.graph) == structure(concrete.graph)
