"""Rows the campaign's speculative-decoding scripts measured: the container image and date the shipped
copy keeps from ``silicon_data_source``, and the rows ``perfcast validate`` leaves unpriced because
only a speculative script ran their image (``inferencex_recipes.yaml`` speculative_runs)."""

from __future__ import annotations

from collections import Counter

import pytest

from perfcast.inference import recipes, silicon
from perfcast.inference.silicon_file import image_of, measured_of
from perfcast.inference.validation import _strictly
from perfcast.ir.errors import UserError
from silicon_rows import case

R1 = "deepseek-ai/DeepSeek-R1"
POST3 = "nvcr.io/nvidia/tensorrt-llm/release:1.2.0rc6.post3"
POST2 = "nvcr.io/nvidia/tensorrt-llm/release:1.2.0rc6.post2"
RC2 = "nvcr.io/nvidia/tensorrt-llm/release:1.1.0rc2.post2"
FP8_ROW = dict(precision="fp8", gemm_quant_mode="fp8_block", moe_quant_mode="fp8_block")
# DeepSeek-R1 NVFP4 on four B200s, TP 4, 8 clients, 1,024 / 1,024 tokens: an InferenceX row
R1_ROW = dict(model_path=R1, system="b200_sxm", precision="fp4", gemm_quant_mode="nvfp4", moe_quant_mode="nvfp4",
              batch_size="8", tp_size="4", moe_tp_size="4", concurrency="8", backend_version="1.2.0rc6.post3")


def test_the_image_and_date_come_from_the_three_forms_of_the_source():
    assert image_of("source_file=2026-03-25.csv; model=DeepSeek-R1; silicon_concurrency=4; "
                    "measured=2026-02-03T17:34:19Z; wip=False; image=nvcr.io#nvidia/tensorrt-llm/release:1.2.0rc6.post2") \
        == POST2
    dump = ("db-dump/2026-04-27; config_id=716; silicon_concurrency=4; measured=2026-04-17T00:00:00.000Z; "
            "workflow_run_id=747; lmsysorg/sglang:v0.5.10.post1-cu130")
    assert image_of(dump) == "lmsysorg/sglang:v0.5.10.post1-cu130"
    assert measured_of(dump) == "2026-04-17"
    assert image_of("x; lmsysorg/sglang:deepseek-v4-b300@sha256:26e1") == "lmsysorg/sglang:deepseek-v4-b300@sha256:26e1"
    gap = "source_file=/Users/a/data/h100_sxm/trtllm/1.0.0rc3/x.csv; gtl_job_id=1; dynamo_version=0.9.0"
    assert (image_of(gap), measured_of(gap)) == ("", "")
    assert (image_of(""), measured_of("")) == ("", "")


def test_a_row_of_the_speculative_scripts_image_is_not_priced_and_says_why():
    mtp = case(**R1_ROW, image=POST3)
    assert not mtp.predictable
    assert mtp.reason.startswith("ran speculative decoding, MTP with 3 draft tokens, 1 with attention DP")
    assert POST3 in mtp.reason and "acceptance rate" in mtp.reason and "speculative_runs" in mtp.reason
    plain = case(**{**R1_ROW, "backend_version": "1.2.0rc6.post2"}, image=POST2)
    assert plain.predictable, plain.reason


def test_a_row_of_a_day_only_the_speculative_script_was_swept_is_not_priced():
    c = case(**{**R1_ROW, "backend_version": "1.1.0rc2.post2"}, image=RC2, measured="2026-01-14")
    assert c.reason.startswith("ran speculative decoding, MTP with 3 draft tokens, 1 with attention DP (image "
                               f"{RC2}, on 2026-01-14 only the campaign's speculative script ran")


@pytest.mark.parametrize("change", [dict(benchmark="gap-analysis"), dict(precision="bf16", gemm_quant_mode="",
                                                                         moe_quant_mode=""),
                                    dict(system="h200_sxm"), dict(image="")])
def test_only_the_campaigns_rows_of_that_image_configuration_and_system_are_refused(change):
    c = case(**{**R1_ROW, "image": POST3, **change})
    assert not (c.reason or "").startswith("ran speculative decoding")


def test_the_shipped_copy_refuses_exactly_the_speculative_scripts_rows():
    frame, _ = silicon.read()
    assert {"image", "measured"} <= set(frame.columns)
    cases = {c.id: c for c in silicon.map_frame(frame)}
    refused = Counter()
    for row in frame.to_dict("records"):
        if row["mode"] == "agg" and (cases[row["id"]].reason or "").startswith("ran speculative decoding"):
            refused[(row["model_path"], row["system"], row["backend"], row["precision"], row["image"])] += 1
    assert refused == {(R1, "b200_sxm", "trtllm", "fp4", POST3): 46, (R1, "b200_sxm", "trtllm", "fp8", POST3): 42,
                       (R1, "b200_sxm", "trtllm", "fp4", RC2): 17, (R1, "b200_sxm", "trtllm", "fp8", RC2): 15,
                       (R1, "h200_sxm", "trtllm", "fp8", RC2): 41,
                       ("Qwen/Qwen3.5-397B-A17B", "b200_sxm", "sglang", "fp8", "lmsysorg/sglang:v0.5.9-cu130"): 42}
    either = Counter((c.system, c.model_path, c.backend) for c in cases.values()
                     if c.mode == "agg" and any(a.startswith(recipes.SHARED_NOTE) for a in c.approximate))
    assert either == {("b200_sxm", R1, "sglang"): 58, ("h200_sxm", R1, "trtllm"): 2,
                      ("b300_sxm", "Qwen/Qwen3.5-397B-A17B", "sglang"): 58,
                      ("b200_sxm", "deepseek-ai/DeepSeek-V3", "sglang"): 11,
                      ("b300_sxm", "deepseek-ai/DeepSeek-V3", "sglang"): 10}


def test_a_malformed_entry_is_an_error_naming_it(monkeypatch):
    entry = {"model_path": R1, "backend": "trtllm", "systems": ["b200_sxm"], "precisions": ["fp4"],
             "images": [POST3], "method": "MTP"}
    whole = {**entry, "source": "s"}
    docs = iter([{"recipes": [], "speculative_runs": [entry]},
                 {"recipes": [], "speculative_runs": [whole], "speculative_or_plain": [whole]},
                 {"recipes": [], "speculative_or_plain": [{**whole, "since": "2026-01-14", "tp": "8"}]},
                 {"recipes": [], "speculative_runs": [{**whole, "measured": "2026-01-14"}]}])
    monkeypatch.setattr(recipes, "_doc", lambda: doc)
    try:
        for missing in ("speculative_runs\\[0\\]: missing source", "speculative_or_plain\\[0\\]: missing since",
                        "speculative_or_plain\\[0\\]: tp: expected a list of tensor-parallel sizes",
                        "speculative_runs\\[0\\]: measured: expected a list of dates"):
            doc = next(docs)
            recipes._speculative_entries.cache_clear()
            with pytest.raises(UserError, match=rf"inferencex_recipes.yaml: {missing}"):
                recipes.speculative_run(R1, "trtllm", "b200_sxm", "fp4", "other")
    finally:
        recipes._speculative_entries.cache_clear()


@pytest.mark.parametrize("measured, either", [("2025-12-15", False), ("2026-01-28", True), ("", True)])
def test_a_row_either_twin_may_have_measured_is_priced_as_the_plain_one_and_labelled(measured, either):
    c = case(**{**R1_ROW, "backend_version": "1.1.0rc2.post2"}, image=RC2, measured=measured)
    assert c.predictable, c.reason
    labels = [a for a in c.approximate if a.startswith(recipes.SHARED_NOTE)]
    assert bool(labels) == either
    if either:
        assert _strictly(c).reason.startswith("approximate mapping refused (--strict): ")  # the first label
        assert labels == [f"speculative or plain: the campaign's MTP script and its plain twin both ran image {RC2} "
                          f"from 2026-01-14 (inferencex_recipes.yaml speculative_or_plain); priced as the plain one"]


def test_a_tensor_parallel_size_the_speculative_script_cannot_run_is_the_plain_scripts():
    row = dict(R1_ROW, backend="sglang", backend_version="0.5.9", precision="fp8", gemm_quant_mode="fp8_block",
               moe_quant_mode="fp8_block", image="lmsysorg/sglang:v0.5.9-cu130", measured="2026-03-25")
    at = {tp: case(**{**row, "tp_size": str(tp), "moe_tp_size": str(tp)}) for tp in (4, 8)}
    assert all(c.predictable for c in at.values())
    assert [any(a.startswith(recipes.SHARED_NOTE) for a in at[tp].approximate) for tp in (4, 8)] == [False, True]


def test_the_database_dumps_deepseek_v3_rows_take_deepseek_r1s_scripts():
    assert recipes.campaign_model("deepseek-ai/DeepSeek-V3") == R1
    assert recipes.campaign_model("meta-llama/Llama-3.1-70B") == "meta-llama/Llama-3.1-70B"
    v3 = case(**{**R1_ROW, "model_path": "deepseek-ai/DeepSeek-V3", "backend_version": "1.2.0rc6.post2"},
              image=POST2, measured="2026-02-03")
    r1 = case(**{**R1_ROW, "backend_version": "1.2.0rc6.post2"}, image=POST2, measured="2026-02-03")
    assert (v3.kv_dtype, v3.engine_options, v3.memory_fraction) == (r1.kv_dtype, r1.engine_options, r1.memory_fraction) \
        == ("fp8", (("moe_backend", "TRTLLM"),), 0.8)
    assert case(**{**R1_ROW, "model_path": "deepseek-ai/DeepSeek-V3"}, image=POST3).reason.startswith(
        "ran speculative decoding")


def test_strict_refuses_a_row_either_twin_may_have_measured_naming_the_label():
    c = case(**{**R1_ROW, **FP8_ROW, "backend_version": "1.1.0rc2.post2", "system": "h200_sxm"}, image=RC2,
             measured="2026-01-28")
    assert c.predictable and _strictly(c).reason == "approximate mapping refused (--strict): speculative or plain"
