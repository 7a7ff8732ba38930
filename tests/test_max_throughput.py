"""The held-out saturated-throughput check (``benchmarks/max_throughput_check.py``): its data
file loads, names models and devices perfcast ships and a source for every row, and its row
function prices one cheap row. No accuracy is asserted here: the check is a benchmark."""

import importlib.util
import math
import sys
from pathlib import Path

from perfcast.hardware import get_device
from perfcast.inference.silicon import catalog_model
from perfcast.inputs import load_yaml

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "max_throughput_check.py"
DATA = ROOT / "src" / "perfcast" / "data" / "validation" / "max_throughput.yaml"


def _module():
    spec = importlib.util.spec_from_file_location("max_throughput_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up while being defined
    spec.loader.exec_module(module)
    return module


check = _module()


def test_every_row_names_a_known_model_device_and_source():
    data = load_yaml(DATA)
    rows, sources = data["rows"], data["sources"]
    assert len(rows) >= 20
    for name, src in sources.items():
        assert src["url"].startswith("https://github.com/NVIDIA/TensorRT-LLM/blob/" + src["commit"]), name
        assert len(src["commit"]) == 40
    for r in rows:
        assert r["source"] in sources
        catalog_model(r["model"])
        get_device(r["device"])
        assert r["precision"] in ("fp8", "fp4")
        assert r["output_tokens_per_s"] > 0 and r["isl"] > 0 and r["osl"] > 0 and r["tp"] >= 1
        assert f"{r['isl']}/{r['osl']}" in sources[r["source"]]["num_requests"]
        assert r["num_requests"] == sources[r["source"]]["num_requests"][f"{r['isl']}/{r['osl']}"]
    assert check.read_rows()[0] == rows


def test_the_row_function_prices_one_cheap_row():
    row = {"model": "llama-3.1-8b", "device": "h100-sxm", "tp": 1, "precision": "fp8", "isl": 128, "osl": 128,
           "num_requests": 30000, "output_tokens_per_s": 28312}
    p = check.predict(row, cap=64)
    assert p.reason is None
    assert math.isfinite(p.output_tokens_per_s) and p.output_tokens_per_s > 0
    s = check.summary([row], [p])
    assert s["predicted"] == 1 and s["refused"] == {}


def test_a_refused_row_is_counted_with_its_reason():
    # 20,000-token prompts exceed the engine's default 8,192-token budget with chunked prefill off.
    row = {"model": "llama-3.1-8b", "device": "h100-sxm", "tp": 1, "precision": "fp8", "isl": 20000, "osl": 2,
           "num_requests": 1000, "output_tokens_per_s": 1351}
    p = check.predict(row, cap=2)
    assert p.output_tokens_per_s is None and "max-num-tokens" in p.reason
    assert check.summary([row], [p])["refused"] == {p.reason: 1}


def test_every_row_runs_the_pages_cuda_graphs():
    # the page's llm_options.yml captures decode batches up to 8,192 (padded), not the engine's 128
    src = load_yaml(DATA)["sources"]["trtllm-perf-overview"]
    assert "batch_sizes 1..8192" in src["llm_options"] and "enable_padding true" in src["llm_options"]
    row = {"model": "llama-3.1-8b", "device": "gb200", "tp": 1, "precision": "fp4"}
    assert check.deployment(row).cuda_graph_max == check.CUDA_GRAPH_MAX == 8192
