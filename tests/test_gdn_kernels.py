"""Gated DeltaNet's kernels measured and fitted (docs/design/calibration.md, "Gated DeltaNet"):
aiconfigurator-core's gdn tables converted, their op mapped for the profiling model, the two
kernel classes' fits in the shipped calibration files, their prices against the tables, and
``perfcast calibrate --only``, which added those fits without refitting the rest."""

from __future__ import annotations

import shutil

import pandas as pd
import pytest

from fuzzing import run_cli
from perfcast.db.aic_tables import GDN, gdn
from perfcast.hardware import get_device
from perfcast.inputs import load_yaml
from perfcast.ir import Tensor, make_leaf
from perfcast.perf import AnalyticPerformanceModel
from perfcast.perf.calibrated import kernel_calibration
from perfcast.perf.databases import shipped_root
from perfcast.perf.profiling import ProfilingDataSource


def leaf(b, s, decode, heads=(2, 8)):
    hk, hv = heads
    ins = (Tensor("q", (b, s, hk, 128), "bf16"), Tensor("k", (b, s, hk, 128), "bf16"),
           Tensor("v", (b, s, hv, 128), "bf16"), Tensor("g", (b, s, hv), "fp32"), Tensor("beta", (b, s, hv), "bf16"))
    return make_leaf("gated_delta_rule", "gdn", ins, (Tensor("o", (b, s, hv, 128), "bf16"),),
                     op="perfcast.gated_delta_rule.default", past=0, decode=decode, state_dtype="fp32")


def measured(device, framework, version, table, **key):
    d = pd.read_csv(shipped_root() / device / framework / version / f"{table}.csv.gz")
    for k, v in key.items():
        d = d[d[k] == v]
    assert len(d) == 1
    return float(d.latency_us.iloc[0])


def test_the_converter_splits_scan_and_recurrence_and_drops_the_convolution():
    raw = pd.DataFrame({
        "kernel_source": ["chunk_gated_delta_rule", "causal_conv1d_fn", "fused_recurrent_gated_delta_rule_packed_decode",
                          "causal_conv1d_update"],
        "phase": ["context", "context", "generation", "generation"], "batch_size": [1, 1, 64, 64],
        "seq_len": [1024, 1024, 1, 1], "num_k_heads": 2, "num_v_heads": 8, "head_k_dim": 128, "head_v_dim": 128,
        "latency": [0.07, 0.005, 0.013, 0.002]})
    (scan, a), (step, b) = gdn(raw, "sglang")
    assert (scan.name, step.name) == ("GatedDeltaRule", "GatedDeltaRuleDecode") and scan.keys == GDN
    assert a.kernel_source.tolist() == ["chunk_gated_delta_rule"] and a.decode.tolist() == [0]
    assert b.batch.tolist() == [64] and b.decode.tolist() == [1] and set(b.dtype) == {"bfloat16"}
    assert scan.counts["dropped_causal_conv1d"] == 1 and step.counts["dropped_causal_conv1d"] == 1


def test_the_shipped_databases_hold_and_map_the_tables():
    src = ProfilingDataSource(shipped_root() / "b200-sxm" / "sglang" / "0.5.14")
    assert {"GatedDeltaRule", "GatedDeltaRuleDecode"} <= set(src.tables)
    entry = src.mapping.ops["perfcast.gated_delta_rule.default"]
    assert (entry.kernel_type, list(entry.alternate_kernel_types)) == ("GatedDeltaRule", ["GatedDeltaRuleDecode"])
    # the profiling model reads them: the one-token recurrence, not the one-token scan
    for b, s, decode, table in ((1, 8192, False, "GatedDeltaRule"), (64, 1, True, "GatedDeltaRuleDecode"), (1, 1, False, "GatedDeltaRule")):
        got = src.lookup(leaf(b, s, decode))
        want = measured("b200-sxm", "sglang", "0.5.14", table, batch=b, seq_len=s, k_heads=2, v_heads=8)
        assert got.latency_us == pytest.approx(want), (b, s, decode)


@pytest.mark.parametrize("framework,version", [("sglang", "0.5.14"), ("vllm", "0.24.0")])
def test_the_fits_price_the_tables_they_came_from(framework, version):
    b200 = get_device("b200-sxm")
    model = AnalyticPerformanceModel(b200, calibration=kernel_calibration(b200, framework, version))
    for b, s, decode, table in ((1, 1024, False, "GatedDeltaRule"), (1, 8192, False, "GatedDeltaRule"),
                                (8, 1024, False, "GatedDeltaRule"), (64, 1, True, "GatedDeltaRuleDecode")):
        r = model.process_op(leaf(b, s, decode))
        want = measured("b200-sxm", framework, version, table, batch=b, seq_len=s, k_heads=2, v_heads=8)
        assert float(r.time_s) == pytest.approx(want * 1e-6, rel=0.15), (b, s, decode)
        assert r.notes[0].startswith(f"calibrated gdn.{'recurrent' if decode else 'chunked'}/bf16 ({framework}")
    # before: the chunked form's FLOPs and bytes at the efficiency curves, 20 µs for 324 µs measured
    assert float(AnalyticPerformanceModel(b200).process_op(leaf(1, 8192, False)).time_s) < 25e-6


def test_tensorrt_llm_takes_another_engines_recurrence_fit_and_says_so():
    h200 = get_device("h200-sxm")
    cal = kernel_calibration(h200, "trtllm", "1.3.0rc20")
    assert "gdn.chunked/bf16" in cal.file.fits and "gdn.recurrent/bf16" not in cal.file.fits  # 43 shapes
    r = AnalyticPerformanceModel(h200, calibration=cal).process_op(leaf(64, 1, True))
    assert "vllm 0.24.0 fit on h200-sxm measurements; trtllm 1.3.0rc20's tables have none" in r.notes[0]


def test_every_fit_names_its_out_of_sample_error():
    for path in sorted((shipped_root().parent.parent / "hardware" / "calibration").glob("*/*.yaml")):
        for key, fit in load_yaml(path)["fits"].items():
            if key.startswith("gdn."):
                assert fit["out_of_sample"]["median"] < 0.15 and fit["rows"] >= 40, (path, key)


def test_calibrate_only_adds_a_class_and_keeps_the_other_fits(tmp_path):
    shipped = shipped_root().parent.parent / "hardware" / "calibration" / "b200-sxm" / "vllm-0.24.0.yaml"
    out = tmp_path / "cal.yaml"
    doc = load_yaml(shipped)
    doc["fits"] = {k: v for k, v in doc["fits"].items() if not k.startswith("gdn.")}
    from perfcast.inputs import dump_yaml

    out.write_text(dump_yaml(doc, sort_keys=False, width=120))
    db = shipped_root() / "b200-sxm" / "vllm" / "0.24.0"
    rc, stdout, err = run_cli("calibrate", str(db), "--only", "gdn.recurrent", "--out", str(out))
    assert rc == 0, err
    got = load_yaml(out)["fits"]
    assert set(got) == set(doc["fits"]) | {"gdn.recurrent/bf16"}
    assert all(got[k] == v for k, v in doc["fits"].items())  # not refitted


def test_calibrate_only_errors(tmp_path):
    db = shipped_root() / "a100-sxm-80gb" / "trtllm" / "1.0.0"
    rc, _, err = run_cli("calibrate", str(db), "--only", "gdn.scan", "--out", str(tmp_path / "x.yaml"))
    assert rc == 2 and err.count("\n") == 1 and "--only gdn.scan: no such kernel class" in err
    rc, _, err = run_cli("calibrate", str(db), "--only", "gdn.chunked", "--out", str(tmp_path / "x.yaml"))
    assert rc == 2 and err.count("\n") == 1 and "no kernel table of class gdn.chunked" in err
    other = tmp_path / "other.yaml"
    shutil.copy(shipped_root().parent.parent / "hardware" / "calibration" / "b200-sxm" / "sglang-0.5.14.yaml", other)
    rc, _, err = run_cli("calibrate", str(shipped_root() / "b200-sxm" / "vllm" / "0.24.0"), "--only", "gdn.chunked",
                         "--out", str(other))
    assert rc == 2 and err.count("\n") == 1 and "not a calibration of vllm 0.24.0" in err


def test_the_kernel_benchmark_measures_the_fits_and_skips_what_no_fold_can_fit(capsys):
    """``benchmarks/kernel_accuracy.py --framework trtllm --family gdn`` on H200: the scan k-fold (the
    figure calibration.md's table sums), and TensorRT-LLM's 43-shape recurrence table skipped, as the
    calibration skips it, rather than a row with no figure the text report cannot print."""
    import runpy
    from pathlib import Path

    import perfcast

    bench = runpy.run_path(str(Path(perfcast.__file__).parents[2] / "benchmarks" / "kernel_accuracy.py"))
    rows = bench["rows_for"]("h200-sxm", "trtllm", {"gdn"})
    assert [r["class"] for r in rows] == ["gdn.chunked"] and rows[0]["model"]["median"] < 0.06
    assert "gdn.recurrent/bf16: 43 rows, too few to fit with a fold held out" in capsys.readouterr().err
    assert bench["main"](["--device", "h200-sxm", "--family", "gdn"]) == 0  # the text report renders
