"""perfcast validate: the row mapping and every refusal, the two TPOT forms, the statistics, the
grouped closed form against simulate, the CLI's errors and the CI subset end to end."""

import hashlib
import json
import math
from pathlib import Path

import pytest

from perfcast.capture.parallel import Layout
from perfcast.inference import published, silicon
from perfcast.inference.steps import Group, Prices, StepTime, _closed_form, _simulate, price
from perfcast.inference.validation import (MAPPINGS, SERVING_TTFT, Prediction, ValidationRequest, ci_subset, command,
                                           predict, select, summarize, tpot_decode_step, tpot_static,
                                           tpot_steady_state)
from perfcast.inference.validation_stats import Population, by_key, stats, stratified
from perfcast.ir import UserError

# A real row of the shipped copy (Llama-3.1-8B-Instruct, H100, TRT-LLM, bf16, tp1, 1024/128 at 32).
LLAMA = ("meta_llama_llama_3_1_8b_instruct_meta_llama_llama_3_1_8b_instruct_h100_sxm_trtllm_agg_"
         "1024x128_c32_tp1_epnone_19")


@pytest.fixture(scope="module")
def frame():
    return silicon.read()[0]


@pytest.fixture(scope="module")
def rows(frame):
    return {r["id"]: r for r in frame.to_dict("records")}


@pytest.fixture(scope="module")
def llama(rows):
    return rows[LLAMA]


def _moe_row(llama, **changes):
    base = {**llama, "model_path": "Qwen/Qwen3-235B-A22B-FP8", "gemm_quant_mode": "fp8", "moe_quant_mode": "fp8",
            "precision": "fp8", "tp_size": "4", "moe_tp_size": "1", "moe_ep_size": "4", "attention_dp_size": "1"}
    return {**base, **changes}


# --- the mapping ----------------------------------------------------------------------------


def test_a_measured_row_maps_to_its_decode_step(llama):
    c = silicon.map_row(llama)
    assert c.predictable and not c.approximate
    assert (c.model, c.device, c.engine, c.quantize) == ("llama-3.1-8b", "h100-sxm", "trtllm", None)
    assert c.layout == Layout() and c.batch == 32 and c.num_queries == 32
    assert c.context == 1024 + 128 // 2 == 1088
    assert c.concurrency == 32 and c.tpot_ms == pytest.approx(13.187373043818466)
    assert command(c) == ("perfcast text-generate llama-3.1-8b --device h100-sxm --decode --num-queries 32 "
                          "--context-length 1088")


def test_attention_dp_batch_is_per_rank(llama):
    # tp 1 × attention-DP 4 ranks sharing the MoE layers over ep 4: 8 sequences per rank, 32 in the step
    c = silicon.map_row(_moe_row(llama, tp_size="1", attention_dp_size="4", moe_ep_size="4", batch_size="8"))
    assert c.predictable, c.reason
    assert c.layout == Layout(tp=1, ep=4, dp=4, attention_dp=True)
    assert (c.batch, c.num_queries) == (8, 8 * 4)
    assert "--dp-size 4 --attention-dp" in command(c)


def test_dense_attention_dp_ranks_are_replicas(llama):
    c = silicon.map_row({**llama, "attention_dp_size": "2", "batch_size": "16"})
    assert c.layout == Layout(dp=2) and not c.layout.attention_dp and c.num_queries == 32


def test_disaggregated_rows_use_the_decode_workers(rows):
    c = silicon.map_row(rows["dsr1_b200_trtllm_fp8_disagg_8192x1024_c128_cfg666"])
    assert c.mode == "disagg" and c.layout == Layout(tp=1, ep=8, dp=8, attention_dp=True)
    assert (c.batch, c.num_queries, c.context) == (16, 128, 8192 + 1024 // 2)


def test_shared_architecture_and_checkpoints_say_so(llama):
    r1 = silicon.map_row({**llama, "model_path": "deepseek-ai/DeepSeek-R1"})
    assert r1.model == "deepseek-v3" and r1.family == "deepseek-v3"
    assert "differs from V3's only in transformers_version" in r1.notes[0]
    fp8 = silicon.map_row({**llama, "model_path": "nvidia/Llama-3.1-8B-Instruct-FP8"})
    assert fp8.model == "llama-3.1-8b" and "same architecture" in fp8.notes[0]


@pytest.mark.parametrize("row_id, catalog, argv", [
    ("minimaxm2_5_h200_vllm_fp8_agg_8192x1024_c8_cfg606", "minimax-m2.5",
     "--num-queries 8 --context-length 8704 --tp-size 4 --engine vllm --engine-option allreduce_rms_fusion=off"),
    # 8,704 = 8,192 + 1,024 / 2; its own FP8; vLLM 0.16.0: no all-reduce + RMSNorm fusion
    ("2026_03_25_qwen3_5_397b_h200_sxm_sglang_fp8_agg_1024x8192_c64_tp8_0_ep8_0_582", "qwen3.5-397b-a17b",
     "--num-queries 64 --context-length 5120 --tp-size 8 --ep-size 8 --engine sglang "
     "--quantize attention=fp8,mlp=fp8,experts=fp8_block --kv-cache-dtype fp8 --cuda-graph-max-batch-size 64"),
    # the row: gemm fp8, moe fp8_block; its script (qwen3.5_fp8_h200.sh): KV cache fp8, CUDA graphs to CONC
    ("2026_03_25_kimi_k2_5_h200_sxm_vllm_int4_agg_8192x1024_c4_tp8_0_ep1_0_597", "kimi-k2.5",
     "--num-queries 4 --context-length 8704 --tp-size 8 --engine vllm --engine-option allreduce_rms_fusion=on"),
    # its own INT4 experts; its script turns the all-reduce + RMSNorm fusion on
    ("2026_03_25_glm_5_h200_sxm_sglang_fp8_agg_1024x1024_c4_tp8_0_ep1_0_500", "glm-5:glm-5-fp8",
     "--num-queries 4 --context-length 1536 --tp-size 8 --engine sglang"),  # zai-org/GLM-5-FP8, block FP8
    ("2026_04_06_glm_5_b200_sxm_sglang_fp4_agg_1024x1024_c4_tp8_ep1_1982", "glm-5",
     "--num-queries 4 --context-length 1536 --tp-size 8 --engine sglang --quantize fp4"),  # NVFP4: the row's
])
def test_the_sample_architectures_map_to_catalog_models(rows, row_id, catalog, argv):
    """The silicon sample's MiniMax-M2.5, Qwen3.5-MoE, Kimi-K2.5 and GLM-5 rows map to their
    catalog models (``family:checkpoint`` where a shipped checkpoint config is priced), with the
    row's layout, quantization and engine (named where it is not the device's default,
    TensorRT-LLM)."""
    family, _, model = catalog.partition(":")
    c = silicon.map_row(rows[row_id])
    assert c.predictable and c.model == (model or family) and c.family == family
    device = rows[row_id]["system"].replace("_", "-")
    assert command(c) == f"perfcast text-generate {model or family} --device {device} --decode {argv}"


@pytest.mark.parametrize("changes, quantize, approx", [
    ({"gemm_quant_mode": "fp8", "moe_quant_mode": "fp8"}, "fp8", None),
    ({"gemm_quant_mode": "fp8_block", "moe_quant_mode": "fp8_block"}, "fp8_block", None),
    ({"gemm_quant_mode": "nvfp4", "moe_quant_mode": "nvfp4"}, "fp4", None),  # H100: weight-only NVFP4
    ({"gemm_quant_mode": "int4_wo", "moe_quant_mode": "int4_wo"}, "w4a16", "int4_wo: int4 weight-only"),
])
def test_quantization_modes(llama, changes, quantize, approx):
    c = silicon.map_row({**llama, **changes})
    assert c.predictable and c.quantize == quantize
    assert (c.approximate[0].startswith(approx) if approx else c.approximate == ())


def test_nvfp4_is_exact_on_both_architectures(llama):
    for system in ("b200_sxm", "h100_sxm"):
        c = silicon.map_row({**llama, "system": system, "gemm_quant_mode": "nvfp4", "moe_quant_mode": "nvfp4"})
        assert c.predictable and c.quantize == "fp4" and c.approximate == ()
        assert c.notes[-1] == "quantization: the row's nvfp4 (--quantize fp4)"


def test_quantized_checkpoints_are_priced_as_they_say(llama):
    # Qwen3-235B-A22B-FP8's weights are block-scaled whichever FP8 label the row carries
    for mode in ("fp8", "fp8_block"):
        c = silicon.map_row(_moe_row(llama, gemm_quant_mode=mode, moe_quant_mode=mode))
        assert (c.model, c.family, c.quantize) == ("qwen3-235b-a22b-fp8", "qwen3-235b-a22b", None), c.reason
        assert c.notes[-1] == f"quantization: qwen3-235b-a22b-fp8's own (the row says {mode} / {mode})"
    # MiniMax-M2.5's own checkpoint is block-scaled FP8 too: never priced as per-tensor FP8 (whose
    # vLLM MoE kernel is ModelOpt's FlashInfer CUTLASS path, 6x vLLM's block one on H200 at 64 tokens)
    for mode in ("fp8", "fp8_block"):
        c = silicon.map_row(_moe_row(llama, model_path="MiniMaxAI/MiniMax-M2.5", system="h200_sxm",
                                     gemm_quant_mode=mode, moe_quant_mode=mode))
        assert (c.model, c.quantize) == ("minimax-m2.5", None), c.reason
        assert c.notes[-1] == f"quantization: minimax-m2.5's own (the row says {mode} / {mode})"
    # Kimi-K2.5's own checkpoint: INT4 experts (group 32), bf16 attention — not w4a16 everywhere
    c = silicon.map_row(_moe_row(llama, model_path="moonshotai/Kimi-K2.5", system="h200_sxm", tp_size="8",
                                 moe_ep_size="8", gemm_quant_mode="int4_wo", moe_quant_mode="int4_wo"))
    assert c.predictable and (c.model, c.quantize, c.approximate) == ("kimi-k2.5", None, ()), c.reason
    # gpt-oss's 4-bit rows: its MXFP4 checkpoint, on Hopper too (weight-only)
    c = silicon.map_row(_moe_row(llama, model_path="openai/gpt-oss-120b", system="h200_sxm",
                                 gemm_quant_mode="nvfp4", moe_quant_mode="nvfp4"))
    assert c.predictable and (c.model, c.quantize, c.approximate) == ("gpt-oss-120b", None, ())
    # DeepSeek-R1 on NVFP4: its served checkpoint's own config is not shipped, so its sibling's (the MLA
    # projections excluded), labelled approximate
    c = silicon.map_row(_moe_row(llama, model_path="deepseek-ai/DeepSeek-R1", system="b200_sxm", tp_size="8",
                                 moe_ep_size="8", gemm_quant_mode="nvfp4", moe_quant_mode="nvfp4"))
    assert (c.model, c.family, c.quantize) == ("deepseek-v3.1-nvfp4", "deepseek-v3", None), c.reason
    assert c.approximate[0].startswith("nvfp4: the served NVFP4 checkpoint's own hf_quant_config.json is not shipped")
    # GEMM and MoE modes that differ: one --quantize per module group; bf16 on an FP8 checkpoint is "none"
    c = silicon.map_row(_moe_row(llama, model_path="deepseek-ai/DeepSeek-R1", tp_size="8", moe_ep_size="8",
                                 gemm_quant_mode="fp8", moe_quant_mode="nvfp4"))
    assert c.predictable and c.quantize == "attention=fp8,mlp=fp8,experts=fp4"
    c = silicon.map_row(_moe_row(llama, model_path="deepseek-ai/DeepSeek-R1", tp_size="8", moe_ep_size="8",
                                 gemm_quant_mode="", moe_quant_mode=""))
    assert c.quantize == "none"


@pytest.mark.parametrize("system, device", [("gb200", "gb200"), ("b300_sxm", "b300-sxm"), ("gb300", "gb300")])
def test_blackwell_systems_map_to_their_devices(llama, system, device):
    c = silicon.map_row({**llama, "system": system, "gemm_quant_mode": "nvfp4", "moe_quant_mode": "nvfp4"})
    assert c.predictable and (c.device, c.quantize) == (device, "fp4")


@pytest.mark.parametrize("changes, reason", [
    ({"system": "l40s"}, "unknown device l40s"),
    ({"model_path": "org/New"}, "unknown model org/New (not in perfcast's mapping table)"),
    ({"backend": "tgi"}, "unknown backend tgi (known: trtllm, vllm, sglang)"),
    ({"mode": "offline"}, "unknown mode 'offline' (expected agg, disagg, static)"),
    ({"osl": "1"}, "no isl, osl ≥ 2 and measured TPOT in the row"),
    ({"silicon_tpot_ms": ""}, "no isl, osl ≥ 2 and measured TPOT in the row"),
    ({"gemm_quant_mode": "fp6"}, "unknown quantization mode 'fp6' (known: none, fp8, fp8_block, nvfp4, int4_wo)"),
    ({"tp_size": "3"}, "refused by perfcast: --tp-size 3 does not divide the 32 attention heads of llama-3.1-8b"),
    ({"moe_ep_size": "2"}, "layout: moe_ep_size 2 for a model without routed experts"),
    ({"batch_size": ""}, "agg: no batch_size (the batch of the step is not stated)"),
    ({"tp_size": ""}, "agg: no tp_size (the layout of the step is not stated)"),
    ({"mode": "disagg", "concurrency": ""}, "disagg: no decode_batch_size (the batch of the step is not stated)"),
])
def test_every_refusal_has_its_reason(llama, changes, reason):
    c = silicon.map_row({**llama, **changes})
    assert not c.predictable and c.reason == reason


def test_disagg_rows_without_decode_batch_or_workers_assume_one_decode_worker(llama):
    # concurrency 32, attention-DP 2: each of the one worker's two ranks holds 16 sequences
    c = silicon.map_row({**llama, "mode": "disagg", "concurrency": "32", "decode_tp_size": "1",
                         "decode_attention_dp_size": "2", "decode_batch_size": ""})
    assert c.predictable and c.batch == 16 and c.approximate == (silicon.ONE_DECODE_WORKER,)
    stated = silicon.map_row({**llama, "mode": "disagg", "concurrency": "32", "decode_tp_size": "1",
                              "decode_batch_size": "8"})
    assert stated.batch == 8 and not stated.approximate  # a stated batch is taken as it is


def test_moe_layouts(llama):
    # attention-DP over 8 ranks with every expert's FFN split 8 ways (moe_ep 1): priced
    c = silicon.map_row(_moe_row(llama, tp_size="1", attention_dp_size="8", moe_tp_size="8", moe_ep_size="1"))
    assert c.predictable and c.layout.attention_dp and c.layout.moe_tp == 8
    # aiconfigurator's constraint tp · adp = moe_tp · moe_ep broken by the row itself: 1 · 1 ≠ 2 · 1
    c = silicon.map_row(_moe_row(llama, tp_size="1", moe_tp_size="2", moe_ep_size="1"))
    assert c.reason == ("layout: moe_tp_size 2 × moe_ep_size 1 ≠ tp_size 1 × attention_dp_size 1 "
                        "(the row breaks aiconfigurator's own constraint)")


def test_product_layouts_are_restated_as_the_run_had_them(rows):
    # The same measurement in two collections: 2026-03-25 states the run's layout (tp 8, moe_ep 8),
    # 2026-04-06 the product of its 8 GPUs and its expert parallelism 8 (tp 64, moe_tp 8, moe_ep 8)
    own = rows["2026_03_25_deepseek_r1_b200_sxm_sglang_fp4_agg_1024x1024_c4_tp8_0_ep8_0_298"]
    product = rows["2026_04_06_deepseek_r1_b200_sxm_sglang_fp4_agg_1024x1024_c4_tp8_ep8_1015"]
    assert (own["silicon_tpot_ms"], own["silicon_ttft_ms"]) == (product["silicon_tpot_ms"], product["silicon_ttft_ms"])
    assert (product["tp_size"], product["moe_tp_size"], product["moe_ep_size"]) == ("64", "8", "8")
    a, b = silicon.map_row(own), silicon.map_row(product)
    assert a.layout == b.layout == Layout(tp=8, ep=8) and a.num_queries == b.num_queries == 4
    assert not any(n.startswith(silicon.LAYOUT_NOTE) for n in a.notes + b.approximate)
    assert [n for n in b.notes if n.startswith(silicon.LAYOUT_NOTE)] == [
        "layout restated: collection 2026-04-06.csv states tp 64 × attention DP 1, moe_tp 8 × moe_ep 8, the product "
        "of the run's 8 GPUs and its expert parallelism 8; priced as tp 8, moe_ep 8 on 8 GPUs (mapping.yaml "
        "product_layouts)"]
    # attention DP: 1 × 64 ranks of batch 4 → 8 ranks of 32 (the step's 256 sequences kept)
    own = rows["2026_03_25_deepseek_r1_b200_sxm_trtllm_fp8_agg_1024x1024_c256_tp8_0_ep8_0_1028"]
    c = silicon.map_row({**own, "collection": "2026-04-06.csv", "tp_size": "1", "attention_dp_size": "64",
                         "moe_tp_size": "8", "batch_size": "4"})
    assert c.layout == silicon.map_row(own).layout == Layout(tp=1, ep=8, dp=8, attention_dp=True)
    assert (c.batch, c.num_queries) == (32, 256)
    # the vLLM form (tp = attention DP = 4, moe_ep 16): 4 GPUs, expert parallelism 4, attention DP not kept
    c = silicon.map_row(rows["2026_04_06_kimi_k2_5_b200_sxm_vllm_fp4_agg_1024x1024_c32_tp4_ep4_1295"])
    assert c.layout == Layout(tp=4, ep=4) and (c.batch, c.num_queries) == (32, 32)
    assert c.approximate and c.approximate[-1].startswith("layout restated: the vLLM form keeps neither")
    # a row of another collection, or one without expert parallelism, is taken as stated
    assert silicon.map_row({**product, "collection": "2026-03-25.csv"}).layout == Layout(tp=64, ep=8)
    row = rows["2026_04_06_deepseek_r1_b200_sxm_sglang_fp4_agg_1024x1024_c4_tp8_ep1_101"]
    assert row["collection"] == "2026-04-06.csv" and silicon.map_row(row).layout == Layout(tp=8)


def test_attention_dp_the_rows_drop_is_read_back_from_the_campaigns_config(rows):
    """InferenceX's Kimi-K2.5 vLLM disaggregated runs on GB200 (config 697: 1 prefill worker `tp 4,
    ep 4, dp-attn`, 1 decode worker `tp 16, ep 16, dp-attn`) are stated as tp 4 / tp 16 without
    attention DP; mapping.yaml attention_dp_layouts reads them back, the decode batch per rank."""
    row = rows["kimik2_5_gb200_vllm_fp4_disagg_1024x1024_c256_cfg697"]
    assert (row["decode_tp_size"], row["decode_attention_dp_size"], row["decode_batch_size"]) == ("16", "1", "256")
    c = silicon.map_row(row)
    assert c.predictable and c.layout == Layout(tp=1, ep=16, dp=16, attention_dp=True)
    assert (c.batch, c.num_queries) == (16, 256)
    assert c.prefill_layout == Layout(tp=1, ep=4, dp=4, attention_dp=True)
    assert [n for n in c.notes if n.startswith(silicon.LAYOUT_NOTE)] == [
        "layout restated: the campaign's config ran attention DP the row does not state: prefill tp 4 → tp 1 × "
        "attention DP 4, moe_ep 4; decode tp 16 → tp 1 × attention DP 16, moe_ep 16 (mapping.yaml "
        "attention_dp_layouts: SemiAnalysisAI/InferenceX 235b232d2)"]
    # config 698: the prefill worker ran attention DP, the 4 decode workers tensor parallelism (tep4)
    c = silicon.map_row(rows["kimik2_5_gb200_vllm_fp4_disagg_8192x1024_c32_cfg698"])
    assert c.prefill_layout == Layout(tp=1, ep=4, dp=4, attention_dp=True) and c.layout == Layout(tp=4, ep=4)
    # another worker count, system or model: taken as stated
    assert silicon.map_row({**row, "decode_num_workers": "2"}).layout == Layout(tp=16, ep=16)
    assert silicon.map_row({**row, "system": "gb300"}).layout == Layout(tp=16, ep=16)


def test_every_measurement_in_two_collections_maps_alike_in_both(frame):
    """A measurement (TTFT and TPOT to every digit) that sits in more than one collection — one
    stating the run's layout, one the product — maps to one layout and one batch in all of them."""
    cases = {c.id: c for c in silicon.map_frame(frame)}
    seen: dict[tuple, list[dict]] = {}
    for r in frame[frame["mode"] == "agg"].to_dict("records"):
        seen.setdefault((r["silicon_ttft_ms"], r["silicon_tpot_ms"]), []).append(r)
    twins = [[r["id"] for r in rs] for rs in seen.values() if len({r["collection"] for r in rs}) > 1]
    assert len(twins) == 460
    for ids in twins:
        assert len({(cases[i].layout, cases[i].num_queries) for i in ids}) == 1, ids


def test_collection_of_sources():
    assert silicon.collection_of("source_file=2026-04-06.csv; silicon_concurrency=4") == "2026-04-06.csv"
    assert silicon.collection_of("db-dump/2026-04-27; config_id=199; silicon_concurrency=16") == "db-dump/2026-04-27"
    assert silicon.collection_of("source_file=/Users/x/aic-auto-gap-analysis/data/h100_sxm/trtllm/1.0.0rc3/"
                                 "Qwen_Qwen3-32B.csv; silicon_concurrency=8") == "h100_sxm/trtllm/1.0.0rc3/Qwen_Qwen3-32B.csv"
    assert silicon.collection_of("") == ""


def test_strict_refuses_approximate_rows(llama):
    from perfcast.inference.validation import _strictly

    c = _strictly(silicon.map_row({**llama, "gemm_quant_mode": "int4_wo", "moe_quant_mode": "int4_wo"}))
    assert c.reason == "approximate mapping refused (--strict): int4_wo"
    exact = silicon.map_row(llama)
    assert _strictly(exact) == exact


def test_malformed_numbers_are_errors_naming_row_and_column(llama):
    with pytest.raises(UserError, match=r"row .*epnone_19: column tp_size: 'four' is not a number"):
        silicon.map_row({**llama, "tp_size": "four"})
    with pytest.raises(UserError, match=r"column batch_size: '2.5' is not a non-negative integer"):
        silicon.map_row({**llama, "batch_size": "2.5"})


def test_shipped_copy_matches_its_manifest_and_source(tmp_path):
    m = silicon.manifest()
    shipped = silicon.shipped_path()
    assert hashlib.sha256(shipped.read_bytes()).hexdigest() == m["sha256"]
    source = Path("/tmp/aicx/aiconfigurator_core/systems/silicon_sample.csv")
    if not source.exists():
        pytest.skip("aiconfigurator-core 0.12.0 is not unpacked here")
    counts = silicon.convert(source, tmp_path / "copy.csv")
    assert counts == {"rows": m["rows"], "sha256_source": m["source"]["sha256"], "sha256": m["sha256"]}


# --- the two TPOT forms ---------------------------------------------------------------------


def test_tpot_forms():
    assert tpot_decode_step(0.0123) == 0.0123
    # 7.5 ms + 32 / 512 × 60 ms = 7.5 ms + 3.75 ms
    assert tpot_steady_state(0.0075, 0.060, 32, 512) == pytest.approx(0.01125, abs=1e-15)
    # batch 1 of a 1,000-token output: 1/1000 of a prefill per token
    assert tpot_steady_state(0.004, 0.1, 1, 1000) == pytest.approx(0.004 + 0.0001, abs=1e-15)


def _case(llama, id_, **changes):
    return silicon.map_row({**llama, "id": id_, **changes})


def test_predictions_use_both_forms_and_disagg_has_no_prefill(llama):
    agg = _case(llama, "a")
    dis = _case(llama, "d", mode="disagg", decode_batch_size="32", decode_tp_size="1")
    prices = Prices()
    from perfcast.inference.steps import group_of, point_of
    for c in (agg, dis):
        prices.table[(group_of(c, True), point_of(c, True))] = {"analytic": StepTime(0.010)}
    prices.table[(group_of(agg, False), point_of(agg, False))] = {"analytic": StepTime(0.080)}
    preds = {p.case.id: p for p in predict([agg, dis], prices, ("analytic",))["analytic"]}
    assert preds["a"].tpot_ms["decode-step"] == pytest.approx(10.0)
    assert preds["a"].tpot_ms["steady-state"] == pytest.approx(10.0 + 32 / 128 * 80.0)  # 30 ms
    assert preds["a"].ttft_ms == pytest.approx(80.0)
    assert preds["d"].tpot_ms["steady-state"] == preds["d"].tpot_ms["decode-step"] == pytest.approx(10.0)
    assert preds["d"].ttft_ms is None
    assert preds["a"].error("decode-step") == pytest.approx(10.0 / 13.187373043818466 - 1)


def test_a_missing_price_is_a_reason_not_a_number(llama):
    c = _case(llama, "a")
    preds = predict([c], Prices(), ("analytic",))["analytic"]
    assert preds[0].reason == "decode step not priced" and preds[0].tpot_ms == {}


# --- statistics and populations --------------------------------------------------------------


def test_stats_with_the_arithmetic():
    s = stats([-0.1, 0.2, 0.05, -0.4, None, math.nan])  # None and NaN are not errors
    assert s.n == 4
    assert s.median_abs == pytest.approx((0.1 + 0.2) / 2)
    assert s.p90_abs == pytest.approx(0.2 + 0.7 * (0.4 - 0.2))  # linear, position 0.9 × 3 = 2.7
    assert s.signed_median == pytest.approx((-0.1 + 0.05) / 2)
    assert stats([]) is None


def test_stratified_sample_is_seeded_and_capped(llama):
    cases = [_case(llama, f"h{i}") for i in range(10)] + [_case(llama, f"g{i}", system="gb200") for i in range(3)]
    a, b, other = stratified(cases, 0), stratified(cases, 0), stratified(cases, 5)
    assert a.ids == b.ids and len(a.ids) == 6 + 3  # 6 of the 10 h100 rows, all 3 gb200 rows
    assert {f"g{i}" for i in range(3)} <= a.ids
    assert a.ids != other.ids or len(cases) < 7


def test_summary_counts_coverage_errors_and_the_split(llama):
    small = _case(llama, "s", batch_size="8", concurrency="8")
    big = _case(llama, "b", batch_size="64", concurrency="64")
    refused = _case(llama, "r", system="l40s")
    preds = {"analytic": [Prediction(small, "analytic", {"decode-step": small.tpot_ms * 1.5, "steady-state": small.tpot_ms * 2}),
                          Prediction(big, "analytic", {"decode-step": big.tpot_ms * 0.9, "steady-state": big.tpot_ms})]}
    pop = Population("p", frozenset({"s", "b", "r"}), key="p")
    out = summarize(pop, [small, big, refused], preds, split=True)
    assert (out["rows"], out["mappable"], out["refused"]) == (3, 2, {"unknown device l40s": 1})
    m = out["models"]["analytic"]
    assert m["predicted"] == 2
    assert m["decode-step"]["median_abs"] == pytest.approx((0.5 + 0.1) / 2)
    assert m["decode-step"]["signed_median"] == pytest.approx((0.5 - 0.1) / 2)
    assert m["decode-step concurrency<=16"] == {"n": 1, "median_abs": pytest.approx(0.5), "p90_abs": pytest.approx(0.5),
                                                "signed_median": pytest.approx(0.5)}
    assert m["steady-state concurrency>16"]["median_abs"] == pytest.approx(0.0)
    assert [p.name for p in by_key([small, big, refused])] == ["h100_sxm / llama-3.1-8b / trtllm / agg",
                                                               "l40s / llama-3.1-8b / trtllm / agg"]


def test_selection_filters_and_their_errors(frame):
    cases = silicon.map_frame(frame.head(400))
    chosen, named = select(ValidationRequest(systems=("b300_sxm",), backends=("vllm",)), cases)
    assert chosen and all(c.system == "b300_sxm" and c.backend == "vllm" for c in chosen)
    chosen, _ = select(ValidationRequest(systems=("h200-sxm",), limit=3), cases)
    assert len(chosen) == 3 and {c.device for c in chosen} == {"h200-sxm"}
    for req, msg in ((ValidationRequest(systems=("tpu",)), "--system tpu: no row has it"),
                     (ValidationRequest(population="everything"), "--population 'everything': expected one of"),
                     (ValidationRequest(subset="nightly"), "--subset 'nightly': expected one of ci"),
                     (ValidationRequest(limit=0), "--limit must be at least 1")):
        with pytest.raises(UserError, match=msg):
            select(req, cases)


def test_published_rows_keep_their_source_and_map(tmp_path):
    pub, sources = published.read()
    assert len(pub) == 21 + 108 + 1 and set(pub["source"]) == {"vultr-b200-concurrency", "trtllm-0.9.0-performance",
                                                               "sglang-pr-14764"}
    assert sources["vultr-b200-concurrency"]["url"].startswith("https://docs.vultr.com/")
    first = pub.to_dict("records")[0]
    assert (first["batch_size"], first["isl"], first["osl"], first["silicon_tpot_ms"]) == ("1", "2048", "512", "2.91")
    bad = tmp_path / "bad.yaml"
    bad.write_text("sources: {s: {url: x}}\ntables:\n  - {source: s, table: t, row: {gpu: h100}, columns: [], values: []}\n")
    with pytest.raises(UserError, match=r"tables\[0\]: unknown column 'gpu'"):
        published.read(bad)


# --- static batches: TensorRT-LLM 0.9.0's performance tables ---------------------------------


@pytest.fixture(scope="module")
def static_rows():
    pub, _ = published.read()
    return {r["id"].split(": ", 1)[1]: r for r in pub.to_dict("records") if r["mode"] == "static"}


def test_static_tables_state_time_per_output_token(static_rows):
    # TensorRT-LLM 0.9.0: H200/H100/A100 × six models × (4 throughput + 2 first-token); SGLang's bench_one_batch
    assert len(static_rows) == 3 * 6 * (4 + 2) + 1
    r = static_rows["Peak Throughput, H200 GPUs (FP8): LLaMA 7B: b896 tp1 128/128"]
    # 896 sequences / (20,618 output tokens/s per GPU × 1 GPU) = 43.457 ms per output token of the batch
    assert float(r["silicon_tpot_ms"]) == pytest.approx(896 / 20618 * 1e3) == pytest.approx(43.4572)
    r = static_rows["Peak Throughput, H100 GPUs (FP8): Falcon 180B: b1024 tp4 128/128"]
    assert float(r["silicon_tpot_ms"]) == pytest.approx(1024 / (1100 * 4) * 1e3)  # 232.7 ms
    assert (r["dtype"], r["kv_cache_dtype"], r["gemm_quant_mode"]) == ("fp16", "fp8", "fp8")
    r = static_rows["Low Latency, A100 GPUs (FP16): LLaMA 70B: b1 tp8 2048/1"]
    assert (r["batch_size"], r["osl"], r["silicon_ttft_ms"], r["kv_cache_dtype"]) == ("1", "1", "249.2", "fp16")


def test_static_cases_price_the_whole_batch_prefill(static_rows):
    from perfcast.inference.steps import point_of

    c = silicon.map_row(static_rows["Peak Throughput, H100 GPUs (FP8): LLaMA 7B: b84 tp1 2048/128"])
    assert c.predictable and (c.model, c.device, c.quantize, c.dtype, c.kv_dtype) == (
        "llama-2-7b", "h100-sxm", "fp8", "fp16", "fp8")
    assert silicon.phases(c) == (True, False)
    assert point_of(c, True) == (84, 2048 + 128 // 2) and point_of(c, False) == (84, 2048)  # all 84 prompts at once
    assert c.engine == "trtllm-cpp"  # TensorRT-LLM 0.9.0: the C++ runtime (mapping.yaml backends by_version)
    assert command(c) == ("perfcast text-generate llama-2-7b --device h100-sxm --decode --num-queries 84 "
                          "--context-length 2112 --engine trtllm-cpp --dtype fp16 --quantize fp8 --kv-cache-dtype fp8")
    first = silicon.map_row(static_rows["Low Latency, H100 GPUs (FP8): LLaMA 7B: b1 tp1 2048/1"])
    assert first.predictable and silicon.phases(first) == (False,) and point_of(first, False) == (1, 2048)
    bad = silicon.map_row({**static_rows["Low Latency, H100 GPUs (FP8): LLaMA 7B: b1 tp1 2048/1"],
                           "kv_cache_dtype": "int4"})
    assert bad.reason == "column kv_cache_dtype: 'int4' (expected bf16, fp16 or fp8)"


def test_static_time_per_token_and_prediction(static_rows):
    # one 0.5 s prefill for the first token, then 127 decode steps of 20 ms: (0.5 + 127 × 0.02) / 128
    assert tpot_static(0.020, 0.5, 128) == pytest.approx((0.5 + 2.54) / 128) == pytest.approx(0.02375)
    c = silicon.map_row(static_rows["Peak Throughput, H100 GPUs (FP8): LLaMA 7B: b84 tp1 2048/128"])
    first = silicon.map_row(static_rows["Low Latency, H100 GPUs (FP8): LLaMA 7B: b1 tp1 2048/1"])
    prices = price([c, first], ("analytic",), baseline=False)
    d, p = prices.of(c, True)["analytic"], prices.of(c, False)["analytic"]
    ref = _simulate(Group("llama-2-7b", "h100-sxm", "fp8", Layout(), "trtllm-cpp", False, "fp16", "fp8"),
                    (84, 2048), ["analytic"])["analytic"]
    assert p.seconds == pytest.approx(ref.seconds, rel=1e-12)  # the batch's prefill is simulate's number
    pred = {x.case.id: x for x in predict([c, first], prices, ("analytic",))["analytic"]}
    assert pred[c.id].tpot_ms["steady-state"] == pytest.approx((p.seconds + 127 * d.seconds) / 128 * 1e3)
    assert pred[c.id].tpot_ms["decode-step"] == pytest.approx(d.seconds * 1e3)
    assert pred[first.id].tpot_ms == {} and pred[first.id].ttft_ms == pytest.approx(
        prices.of(first, False)["analytic"].seconds * 1e3)
    assert pred[first.id].error("steady-state") is None  # a first-token row has no TPOT to miss


def test_sglang_bench_one_batch_row_prices_the_figures_validation_md_quotes(static_rows):
    """sgl-project/sglang PR #14764: one static batch of 16 × 512 tokens of DeepSeek-V3.1 on 8 H200s,
    prefill 288.94 ms and median decode step 16.20 ms; docs/design/validation.md ("The step itself,
    measured apart from serving") quotes perfcast's 297.3 ms and 16.89 ms (the decode-step figure)."""
    c = silicon.map_row(static_rows["bench_one_batch, H200, DeepSeek-V3.1, TP 8, batch 16, 512 in / 512 out: "
                                    "b16 tp8 512/512"])
    assert c.predictable and (c.model, c.device, c.engine, c.mode) == ("deepseek-v3", "h200-sxm", "sglang", "static")
    assert (c.ttft_ms, c.tpot_ms) == (288.94, 16.20)
    prices = price([c], ("analytic",), baseline=False)
    prefill, decode = prices.of(c, False)["analytic"], prices.of(c, True)["analytic"]
    assert (round(prefill.seconds * 1e3, 1), round(decode.seconds * 1e3, 2)) == (297.3, 16.89)


# --- pricing: the grouped closed form is simulate's number ------------------------------------


@pytest.mark.parametrize("layout", [Layout(), Layout(tp=2)])
def test_closed_form_equals_simulate(layout):
    group = Group("llama-3.1-8b", "h100-sxm", None, layout, "trtllm", decode=True)
    points = [(8, 1088), (32, 2560), (1, 1088)]
    out = {p: {} for p in points}
    left = _closed_form(group, points, ["analytic", "roofline"], out)
    assert left == [(1, 1088)]  # a batch of one is outside the symbolic capture's exact range
    for p in points[:2]:
        ref = _simulate(group, p, ["analytic", "roofline"])
        for m in ("analytic", "roofline"):
            assert out[p][m].how == "closed form" and ref[m].how.startswith("simulate")
            assert out[p][m].seconds == pytest.approx(ref[m].seconds, rel=1e-9)
    assert out[(8, 1088)]["roofline"].seconds < out[(8, 1088)]["analytic"].seconds


def test_price_groups_decode_and_prefill_and_what_they_cannot_price(llama):
    cases = [_case(llama, "a"), _case(llama, "b", batch_size="16"), _case(llama, "g", system="l40s")]
    prices = price(cases, ("analytic", "profiling"))
    decode = prices.of(cases[0], True)
    assert decode["analytic"].how == "closed form" and decode["analytic"].seconds > 0
    # the profiling model needs concrete shapes: simulated per point from the shipped H100 database
    assert decode["profiling"].how.startswith("simulate") and decode["profiling"].seconds > 0
    prefill = prices.of(cases[0], False)
    assert prefill["roofline"].how.startswith("simulate") and prefill["analytic"].seconds > 0
    # closed forms: the two decode points; simulated: the one prompt length, and the profiling
    # model's two decode points
    assert prices.counts["closed-form points"] == 2 and prices.counts["simulated points"] == 3
    assert prices.of(cases[2], True) == {}


# --- the CLI ------------------------------------------------------------------------------------


@pytest.mark.parametrize("args, message", [
    (["--population", "all"], "--population 'all': expected one of llama-3.1-8b-h100-trtllm, stratified, published, "
                              "published-static"),
    (["--silicon-sample", "/nonexistent/sample.csv"], "--silicon-sample /nonexistent/sample.csv: no such file"),
    (["--system", "tpu_v9"], "--system tpu_v9: no row has it"),
    (["--limit", "0"], "--limit: expected at least 1, got '0'"),
    (["--rows", "out.txt"], "--rows out.txt: expected a .csv or .json file name"),
    (["--performance-model", "roofline"], "--performance-model roofline: the naive datasheet roofline is the baseline"),
    (["--performance-model", "magic"], "--performance-model 'magic': expected one of analytic, profiling"),
    (["--subset", "nightly"], "--subset 'nightly': expected one of ci"),
])
def test_cli_errors_are_one_line_and_exit_2(cli, args, message):
    proc = cli("validate", *args)
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"perfcast validate: error: {message}" or message in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr


def test_cli_installed_copy_is_found_or_refused(cli):
    from perfcast.db.aiconfigurator import default_root

    if default_root() is not None:
        pytest.skip("aiconfigurator-core is installed here")
    proc = cli("validate", "--silicon-sample", "aiconfigurator")
    assert proc.returncode == 2
    assert proc.stderr.strip() == ("perfcast validate: error: --silicon-sample aiconfigurator: aiconfigurator-core "
                                   "is not installed (pip install aiconfigurator-core, or pass a path)")


def test_cli_missing_columns(cli, tmp_path):
    bad = tmp_path / "sample.csv"
    bad.write_text("id,system,model_path\nx,h100_sxm,m\n")
    proc = cli("validate", "--silicon-sample", str(bad))
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1
    assert f"{bad}: missing columns backend, backend_version, precision" in proc.stderr


def test_ci_subset_end_to_end(cli, tmp_path, frame):
    rows_file = tmp_path / "rows.json"
    proc = cli("validate", "--subset", "ci", "--json", "--rows", str(rows_file), check=True)
    doc = json.loads(proc.stdout)
    cases = silicon.map_frame(frame)
    expected = len(ci_subset(cases)) + 21 + 18  # + the published rows: Vultr's, and Llama-2 7B's static ones
    assert doc["rows"]["selected"] == expected
    assert doc["rows"]["mappable"] > 0 and sum(doc["refused"].values()) == expected - doc["rows"]["mappable"]
    assert doc["baseline"] == "roofline" and doc["performance_models"] == ["analytic"]
    # the output says which
    assert list(doc["mapping"]) == ["decode-step", "steady-state", "serving", "closed-form", "ttft", "static",
                                    "assumptions"]
    named = {p["key"]: p for p in doc["populations"] if p["named"]}
    assert set(named) == {"selected", "stated-batch", "config-workers", "assumed-decode-batch",
                          "llama-3.1-8b-h100-trtllm", "stratified", "published", "published-static"}
    # the selected rows split by whether the row, the campaign's config or perfcast gives their decode batch
    assert (named["stated-batch"]["rows"] + named["config-workers"]["rows"] + named["assumed-decode-batch"]["rows"]
            == named["selected"]["rows"])
    assert named["assumed-decode-batch"]["approximate"] == named["assumed-decode-batch"]["mappable"]
    for key in ("selected", "llama-3.1-8b-h100-trtllm", "stratified"):
        for m in ("analytic", "roofline"):
            entry = named[key]["models"][m]
            assert entry["predicted"] > 0
            for mapping in MAPPINGS:
                s = entry[mapping]
                if mapping in SERVING_TTFT:  # only with --serving (tests/test_serving_validation.py)
                    assert s is None and entry[SERVING_TTFT[mapping]] is None
                    continue
                assert s["n"] == entry["predicted"]
                assert all(math.isfinite(s[k]) for k in ("median_abs", "p90_abs", "signed_median"))
            assert f"{MAPPINGS[0]} concurrency<=16" in entry
    # the Llama-2 7B static rows and the 3 MiniMax-M2.5 rows are priced; the 18 Nemotron rows have no
    # catalog entry
    assert named["published"]["rows"] == 39 and named["published"]["mappable"] == 18 + 3
    static = named["published-static"]["models"]["analytic"]
    # 3 devices × 4 throughput rows have a time per token; 3 × 2 first-token rows a TTFT
    assert static["steady-state"]["n"] == 12 and static["ttft"]["n"] == 6
    records = json.loads(rows_file.read_text())["rows"]
    assert len(records) == expected
    mapped = [r for r in records if not r["refused"]]
    assert len(mapped) == doc["rows"]["mappable"]
    for r in mapped:
        for m in ("analytic", "roofline"):
            if r["mode"] == "static" and r["osl"] == 1:
                assert r[f"{m} ttft_ms"] > 0 and r[f"{m} decode-step tpot_ms"] is None
                continue
            assert r[f"{m} decode-step tpot_ms"] > 0 and r[f"{m} steady-state tpot_ms"] >= r[f"{m} decode-step tpot_ms"]
        assert r["command"].startswith("perfcast text-generate ") and r["engine"] in ("trtllm", "trtllm-cpp", "vllm", "sglang")
    assert all(r["refused"] for r in records if not r["command"])
    assert doc["points"]["closed-form points"] > 0 and doc["timings_s"]["price"] > 0


def test_a_row_whose_weights_cannot_fit_its_stated_devices_is_refused(rows):
    """InferenceX's dated GB200 SGLang DeepSeek-R1 files state one device per worker: 671 GB of FP8
    weights on one 186 GB GB200 cannot have run, so the row is refused, not priced."""
    from perfcast.inference.steps import case_request, unfit

    c = silicon.map_row(rows["2026_04_06_deepseek_r1_gb200_sglang_fp8_disagg_8192x1024_c6144_tp1_ep1_1195"])
    assert c.predictable and c.layout.num_devices == 1
    why = price([c]).of(c, True)["analytic"].reason
    assert why.startswith("refused by perfcast: the weights need") and "more than gb200's" in why
    req = case_request(c, decode=True)
    assert unfit(int(req.device.hbm_capacity_bytes), req) is None and unfit(int(req.device.hbm_capacity_bytes) + 1, req)
