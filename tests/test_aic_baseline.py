"""The same-run aiconfigurator baseline (``benchmarks/aic_baseline.py``): what aiconfigurator is
given for a row, which config it reads, and the statistics both sides are summarised by. Running
aiconfigurator itself needs its own environment (the benchmark sets one up); no figure is
asserted here."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from perfcast.inference import silicon
from perfcast.inference.silicon import Case

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "aic_baseline.py"
WORKER = ROOT / "benchmarks" / "aic_worker.py"
LLAMA_ROW = "meta_llama_llama_3_1_8b_instruct_meta_llama_llama_3_1_8b_instruct_h100_sxm_trtllm_agg_2048x256_c32_tp4_epnone_110"


def _module():
    spec = importlib.util.spec_from_file_location("aic_baseline", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


bench = _module()


@pytest.fixture(scope="module")
def rows():
    frame, _ = silicon.read(None)
    return {r["id"]: r for r in frame.to_dict("records")}


def test_a_row_is_given_to_aiconfigurator_as_its_own_columns(rows):
    assert bench.aic_arguments(rows[LLAMA_ROW]) == {
        "model_path": "meta-llama/Llama-3.1-8B-Instruct", "system_name": "h100_sxm", "mode": "agg",
        "backend_name": "trtllm", "backend_version": "1.0.0rc3", "isl": 2048, "osl": 256,
        "gemm_quant_mode": None, "moe_quant_mode": None,   # the row states none: aiconfigurator reads the config's
        "batch_size": 32, "tp_size": 4, "pp_size": 1, "moe_tp_size": 1, "moe_ep_size": 1}


def test_a_moe_row_keeps_its_quantization_and_expert_layout(rows):
    row = next(r for r in rows.values() if r["mode"] == "agg" and str(r.get("moe_quant_mode")) == "nvfp4"
               and (bench._int(r.get("moe_ep_size")) or 0) > 1)
    args = bench.aic_arguments(row)
    assert args["moe_quant_mode"] == "nvfp4" and args["moe_ep_size"] == int(row["moe_ep_size"])
    assert all(isinstance(args[k], int) for k in bench.LAYOUT_COLUMNS if k in args)


def test_aiconfigurator_reads_the_config_perfcast_prices(tmp_path):
    cases = [Case(id="a", system="", model_path="", backend="", backend_version="", mode="agg", isl=1, osl=1,
                  concurrency=1, tpot_ms=1.0, ttft_ms=1.0, family="", model=name)
             for name in ("llama-3.1-8b", "deepseek-v3.1-nvfp4", "llama-3.1-8b")]
    dirs = bench.config_dirs(cases, tmp_path)
    assert sorted(dirs) == ["deepseek-v3.1-nvfp4", "llama-3.1-8b"]
    config = json.loads((Path(dirs["llama-3.1-8b"]) / "config.json").read_text())
    assert config["num_hidden_layers"] == 32 and config["hidden_size"] == 4096
    assert not (Path(dirs["llama-3.1-8b"]) / "hf_quant_config.json").exists()
    quant = json.loads((Path(dirs["deepseek-v3.1-nvfp4"]) / "hf_quant_config.json").read_text())
    assert quant["quantization"]["quant_algo"] == "NVFP4"


def test_error_statistics():
    s = bench.error_stats([110, 90, 150, None, 100], [100, 100, 100, 100, 0])
    assert s["n"] == 3
    assert s["median_abs"] == pytest.approx(0.10)
    assert s["signed_median"] == pytest.approx(0.10)
    assert s["p90_abs"] == pytest.approx(float(np.percentile([0.1, 0.1, 0.5], 90)))
    assert bench.error_stats([None], [1.0]) == {"n": 0}


def test_common_rows_are_those_every_predictor_prices():
    base = {"measured_tpot_ms": 10.0, "measured_ttft_ms": 100.0}
    cols = [c for _, t, f in bench.PREDICTORS for c in (t, f)]
    full = dict(base, **{c: 11.0 if "tpot" in c else 120.0 for c in cols})
    gap = dict(full, **{"aic tpot_ms": None})
    out = bench.compare([full, gap])
    assert out["tpot"]["aiconfigurator"]["own"]["n"] == 1
    assert out["tpot"]["perfcast simulation"]["own"]["n"] == 2
    assert out["tpot"]["perfcast simulation"]["common"]["n"] == 1
    assert out["ttft"]["perfcast closed form"]["common"]["median_abs"] == pytest.approx(0.2)


def test_the_worker_says_how_to_call_it():
    r = subprocess.run([sys.executable, str(WORKER)], capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.strip() == "usage: aic_worker.py IN.json OUT.json"
