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
from perfcast.inference.validation import (MAPPINGS, Prediction, ValidationRequest, ci_subset, command,
                                           predict, select, summarize, tpot_decode_step, tpot_steady_state)
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
     "--num-queries 8 --context-length 8704 --tp-size 4 --quantize fp8"),  # 8,704 = 8,192 + 1,024 / 2
    ("2026_03_25_qwen3_5_397b_h200_sxm_sglang_fp8_agg_1024x8192_c64_tp8_0_ep8_0_582", "qwen3.5-397b-a17b",
     "--num-queries 64 --context-length 5120 --tp-size 8 --ep-size 8 --quantize fp8"),
    ("2026_03_25_kimi_k2_5_h200_sxm_vllm_int4_agg_8192x1024_c4_tp8_0_ep1_0_597", "kimi-k2.5",
     "--num-queries 4 --context-length 8704 --tp-size 8 --quantize w4a16"),
    ("2026_03_25_glm_5_h200_sxm_sglang_fp8_agg_1024x1024_c4_tp8_0_ep1_0_500", "glm-5",
     "--num-queries 4 --context-length 1536 --tp-size 8 --quantize fp8"),
])
def test_the_sample_architectures_map_to_catalog_models(rows, row_id, catalog, argv):
    """The silicon sample's MiniMax-M2.5, Qwen3.5-MoE, Kimi-K2.5 and GLM-5 rows map to their
    catalog models, with the row's layout and quantization."""
    c = silicon.map_row(rows[row_id])
    assert c.predictable and c.model == catalog and c.family == catalog
    assert command(c) == f"perfcast text-generate {catalog} --device h200-sxm --decode {argv}"


@pytest.mark.parametrize("changes, quantize, approx", [
    ({"gemm_quant_mode": "fp8", "moe_quant_mode": "fp8"}, "fp8", None),
    ({"gemm_quant_mode": "fp8_block", "moe_quant_mode": "fp8_block"}, "fp8", "fp8_block: block-scaled FP8"),
    ({"gemm_quant_mode": "int4_wo", "moe_quant_mode": "int4_wo"}, "w4a16", "int4_wo: int4 weight-only"),
])
def test_quantization_modes(llama, changes, quantize, approx):
    c = silicon.map_row({**llama, **changes})
    assert c.predictable and c.quantize == quantize
    assert (c.approximate[0].startswith(approx) if approx else c.approximate == ())


def test_nvfp4_is_approximate_where_fp4_exists(llama):
    c = silicon.map_row({**llama, "system": "b200_sxm", "gemm_quant_mode": "nvfp4", "moe_quant_mode": "nvfp4"})
    assert c.predictable and c.quantize == "fp4" and c.approximate[0].startswith("nvfp4: NVFP4")


@pytest.mark.parametrize("changes, reason", [
    ({"system": "gb200"}, "unknown device gb200"),
    ({"system": "b300_sxm"}, "unknown device b300_sxm"),
    ({"system": "gb300"}, "unknown device gb300"),
    ({"model_path": "org/New"}, "unknown model org/New (not in perfcast's mapping table)"),
    ({"backend": "tgi"}, "unknown backend tgi (known: trtllm, vllm, sglang)"),
    ({"mode": "offline"}, "unknown mode 'offline' (expected agg or disagg)"),
    ({"osl": "1"}, "no isl, osl ≥ 2 and measured TPOT in the row"),
    ({"silicon_tpot_ms": ""}, "no isl, osl ≥ 2 and measured TPOT in the row"),
    ({"gemm_quant_mode": "fp6"}, "unknown quantization mode 'fp6' (known: none, fp8, fp8_block, nvfp4, int4_wo)"),
    ({"gemm_quant_mode": "fp8", "moe_quant_mode": "nvfp4"},
     "mixed quantization gemm fp8 / moe nvfp4: perfcast applies one --quantize to every matmul"),
    ({"gemm_quant_mode": "nvfp4", "moe_quant_mode": "nvfp4"},
     "refused by perfcast: device h100-sxm has no fp4 matrix rate (has fp64, tf32, bf16, fp16, fp8, int8); "
     "choose another --dtype/--quantize"),
    ({"tp_size": "3"}, "refused by perfcast: --tp-size 3 does not divide the 32 attention heads of llama-3.1-8b"),
    ({"moe_ep_size": "2"}, "layout: moe_ep_size 2 for a model without routed experts"),
    ({"batch_size": ""}, "agg: no batch_size (the batch of the step is not stated)"),
    ({"tp_size": ""}, "agg: no tp_size (the layout of the step is not stated)"),
    ({"mode": "disagg"}, "disagg: no decode_batch_size (the batch of the step is not stated)"),
])
def test_every_refusal_has_its_reason(llama, changes, reason):
    c = silicon.map_row({**llama, **changes})
    assert not c.predictable and c.reason == reason


def test_moe_layout_refusals(llama):
    # perfcast's own check: with attention-DP every device of the MoE group holds experts
    c = silicon.map_row(_moe_row(llama, tp_size="1", attention_dp_size="8", moe_tp_size="8", moe_ep_size="1"))
    assert c.reason.startswith("refused by perfcast: --attention-dp: --ep-size must equal --tp-size × --dp-size = 8")
    # aiconfigurator's constraint tp · adp = moe_tp · moe_ep broken by the row itself: 1 · 1 ≠ 2 · 1
    c = silicon.map_row(_moe_row(llama, tp_size="1", moe_tp_size="2", moe_ep_size="1"))
    assert c.reason == ("layout: moe_tp_size 2 × moe_ep_size 1 ≠ tp_size 1 × attention_dp_size 1 "
                        "(the row breaks aiconfigurator's own constraint)")


def test_strict_refuses_approximate_rows(llama):
    from perfcast.inference.validation import _strictly

    c = _strictly(silicon.map_row({**llama, "gemm_quant_mode": "fp8_block", "moe_quant_mode": "fp8_block"}))
    assert c.reason == "approximate mapping refused (--strict): fp8_block"
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
    refused = _case(llama, "r", system="gb200")
    preds = {"analytic": [Prediction(small, "analytic", {"decode-step": small.tpot_ms * 1.5, "steady-state": small.tpot_ms * 2}),
                          Prediction(big, "analytic", {"decode-step": big.tpot_ms * 0.9, "steady-state": big.tpot_ms})]}
    pop = Population("p", frozenset({"s", "b", "r"}), key="p")
    out = summarize(pop, [small, big, refused], preds, split=True)
    assert (out["rows"], out["mappable"], out["refused"]) == (3, 2, {"unknown device gb200": 1})
    m = out["models"]["analytic"]
    assert m["predicted"] == 2
    assert m["decode-step"]["median_abs"] == pytest.approx((0.5 + 0.1) / 2)
    assert m["decode-step"]["signed_median"] == pytest.approx((0.5 - 0.1) / 2)
    assert m["decode-step concurrency<=16"] == {"n": 1, "median_abs": pytest.approx(0.5), "p90_abs": pytest.approx(0.5),
                                                "signed_median": pytest.approx(0.5)}
    assert m["steady-state concurrency>16"]["median_abs"] == pytest.approx(0.0)
    assert [p.name for p in by_key([small, big, refused])] == ["gb200 / llama-3.1-8b / trtllm / agg",
                                                               "h100_sxm / llama-3.1-8b / trtllm / agg"]


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
    assert len(pub) == 21 and set(pub["source"]) == {"vultr-b200-concurrency"}
    assert sources["vultr-b200-concurrency"]["url"].startswith("https://docs.vultr.com/")
    first = pub.to_dict("records")[0]
    assert (first["batch_size"], first["isl"], first["osl"], first["silicon_tpot_ms"]) == ("1", "2048", "512", "2.91")
    bad = tmp_path / "bad.yaml"
    bad.write_text("sources: {s: {url: x}}\ntables:\n  - {source: s, table: t, row: {gpu: h100}, columns: [], values: []}\n")
    with pytest.raises(UserError, match=r"tables\[0\]: unknown column 'gpu'"):
        published.read(bad)


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
    cases = [_case(llama, "a"), _case(llama, "b", batch_size="16"), _case(llama, "g", system="gb200")]
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
    (["--population", "all"], "--population 'all': expected one of llama-3.1-8b-h100-trtllm, stratified, published"),
    (["--silicon-sample", "/nonexistent/sample.csv"], "--silicon-sample /nonexistent/sample.csv: no such file"),
    (["--system", "tpu_v9"], "--system tpu_v9: no row has it"),
    (["--limit", "0"], "--limit must be at least 1 (got 0)"),
    (["--rows", "out.txt"], "--rows out.txt: expected a .csv or .json file name"),
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
    expected = len(ci_subset(cases)) + 21  # + the published rows
    assert doc["rows"]["selected"] == expected
    assert doc["rows"]["mappable"] > 0 and sum(doc["refused"].values()) == expected - doc["rows"]["mappable"]
    assert doc["baseline"] == "roofline" and doc["performance_models"] == ["analytic"]
    assert list(doc["mapping"]) == ["decode-step", "steady-state", "ttft", "assumptions"]  # the output says which
    named = {p["key"]: p for p in doc["populations"] if p["named"]}
    assert set(named) == {"selected", "llama-3.1-8b-h100-trtllm", "stratified", "published"}
    for key in ("selected", "llama-3.1-8b-h100-trtllm", "stratified"):
        for m in ("analytic", "roofline"):
            entry = named[key]["models"][m]
            assert entry["predicted"] > 0
            for mapping in MAPPINGS:
                s = entry[mapping]
                assert s["n"] == entry["predicted"]
                assert all(math.isfinite(s[k]) for k in ("median_abs", "p90_abs", "signed_median"))
            assert f"{MAPPINGS[0]} concurrency<=16" in entry
    # the 3 MiniMax-M2.5 rows are priced; the 18 Nemotron rows have no catalog entry
    assert named["published"]["rows"] == 21 and named["published"]["mappable"] == 3
    records = json.loads(rows_file.read_text())
    assert len(records) == expected
    mapped = [r for r in records if not r["refused"]]
    assert len(mapped) == doc["rows"]["mappable"]
    for r in mapped:
        for m in ("analytic", "roofline"):
            assert r[f"{m} decode-step tpot_ms"] > 0 and r[f"{m} steady-state tpot_ms"] >= r[f"{m} decode-step tpot_ms"]
        assert r["command"].startswith("perfcast text-generate ") and r["engine"] in ("trtllm", "vllm", "sglang")
    assert all(r["refused"] for r in records if not r["command"] or r["system"] == "gb200")
    assert doc["points"]["closed-form points"] > 0 and doc["timings_s"]["price"] > 0
