"""perfcast text-generate / explain / models: WE-5, memory, sanity across the catalog, errors."""

import json

import pytest

from perfcast.hardware import get_device
from perfcast.inference.textgen import Request, simulate
from perfcast.models import catalog_names, load_model_config

CATALOG = ["llama-3.1-8b", "llama-3.1-70b", "llama-3.1-405b", "qwen3-8b", "qwen3-32b",
           "qwen3-30b-a3b", "qwen3-235b-a22b", "qwen3-235b-a22b-fp8", "deepseek-v3", "deepseek-v3.1-nvfp4",
           "mixtral-8x7b", "gpt-oss-120b"]


@pytest.fixture(scope="module")
def we5(tmp_path_factory):
    from perfcast.cli.main import main
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["text-generate", "llama-3.1-8b", "--num-queries", "8", "--query-length", "4096",
                     "--json"]) == 0
    return json.loads(out.getvalue())


def test_we5_parameters_and_weights(we5):
    assert we5["memory"]["parameters"] == 8_030_261_248
    assert we5["memory"]["weights_bytes"] == 16_060_522_496


def test_we5_kv_cache(we5):
    assert we5["memory"]["kv_cache_bytes_per_token"] == 131_072  # 32 layers × 2 × 8 × 128 × 2 B
    assert we5["memory"]["kv_cache_bytes"] == 4_294_967_296  # 8 sequences × 4,096 tokens


def test_we5_linear_flops(we5):
    tokens = 8 * 4096
    assert we5["flops"]["matmul_excluding_lm_head"] == 13_958_643_712 * tokens
    assert we5["flops"]["lm_head"] == 1_050_673_152 * 8  # last position of each sequence only


def test_we5_decode_cannot_beat_weight_streaming(cli):
    doc = json.loads(cli("text-generate", "llama-3.1-8b", "--decode", "--context-length", "1",
                         "--device", "h100-sxm", "--json", check=True).stdout)
    t = doc["performance_models"]["analytic"]["total_time_s"]
    assert t >= 16_060_522_496 / 3.35e12 >= 4.79e-3
    assert doc["tokens_per_s_per_device"] == pytest.approx(1 / t)


def test_json_keys(we5):
    assert we5["performance_models"]["analytic"]["total_time_s"] > 0
    assert we5["tokens_per_s_per_device"] > 0
    assert we5["memory"]["activation_peak_bytes"] > 0 and we5["memory"]["fits"] is True
    op = we5["ops"][0]
    assert {"name", "calls", "time_s", "bound"} <= set(op) and "analytic" in op["time_s"]
    assert we5["unknown_ops"] == []


def test_catalog_is_complete_and_listed(cli):
    assert set(CATALOG) <= set(catalog_names())
    rows = json.loads(cli("models", "--json", check=True).stdout)["models"]
    assert {r["name"] for r in rows} >= set(CATALOG)


@pytest.mark.parametrize("name", CATALOG)
def test_catalog_sanity_decode(name):
    """Physically possible numbers: no step beats streaming the weights it reads or the
    device's peak FLOP rate; every op has a rule."""
    dev = get_device("h200-sxm")
    r = simulate(Request(load_model_config(name), dev, num_queries=4, context_length=2048, decode=True,
                         quantize="fp8"))
    ev = r.evaluations["analytic"]
    assert not r.lowered.unknown
    assert ev.time_s >= ev.totals["bytes.hbm"] / float(dev.hbm_bandwidth_bytes_per_s)
    assert ev.time_s >= ev.totals["flops.matrix"] / float(dev.matrix_flops_per_s("fp8"))
    d = r.request.model.data
    experts = d.get("num_local_experts") or d.get("num_experts") or d.get("n_routed_experts")
    if not experts:  # dense: every weight is read every step
        assert ev.time_s >= r.memory.weights_bytes / float(dev.hbm_bandwidth_bytes_per_s)
    assert r.memory.kv_cache_bytes == r.memory.kv_cache_bytes_per_token * 4 * 2049 or experts or \
        d.get("layer_types")


def test_model_that_does_not_fit_is_reported_and_strict_fails(cli):
    doc = json.loads(cli("text-generate", "llama-3.1-405b", "--device", "h100-sxm", "--query-length",
                         "128", "--json", check=True).stdout)
    assert doc["memory"]["fits"] is False and doc["deployable"] is False
    assert doc["memory"]["shortfall_bytes"] > 700e9
    text = cli("text-generate", "llama-3.1-405b", "--device", "h100-sxm", "--query-length", "128").stdout
    assert "DOES NOT FIT" in text and "NOT deployable" in text
    proc = cli("text-generate", "llama-3.1-405b", "--device", "h100-sxm", "--strict-memory")
    assert proc.returncode == 2 and "does not fit on h100-sxm" in proc.stderr


def test_quantization_changes_weight_bytes_and_rates():
    dev = get_device("h100-sxm")
    m = load_model_config("llama-3.1-8b")
    base = simulate(Request(m, dev, num_queries=1, query_length=256))
    fp8 = simulate(Request(m, dev, num_queries=1, query_length=256, quantize="fp8"))
    w4 = simulate(Request(m, dev, num_queries=1, query_length=256, quantize="w4a16"))
    linear = 32 * 218_103_808  # q, k, v, o, gate, up, down weights; embeddings and lm_head stay bf16
    assert base.memory.weights_bytes == 16_060_522_496
    assert fp8.memory.weights_bytes == 16_060_522_496 - linear * 1  # 2 → 1 byte
    # 2 → 0.5 byte plus one fp16 scale per 128 weights: 1/2 + 2/128 = 33/64 byte, 95/64 less
    assert w4.memory.weights_bytes == 16_060_522_496 - linear * 95 // 64
    # 256 tokens: TensorRT-LLM's eager prefill waits on its host (291 kernels × 35 µs) at either precision
    for r in (base, fp8):
        assert r.evaluations["analytic"].time_s == pytest.approx(291 * 35e-6) and r.evaluations["analytic"].host_launch_s > 0
    base, fp8 = (simulate(Request(m, dev, num_queries=1, query_length=2048, quantize=q)) for q in (None, "fp8"))
    assert 0 == base.evaluations["analytic"].host_launch_s == fp8.evaluations["analytic"].host_launch_s
    assert fp8.evaluations["analytic"].time_s < base.evaluations["analytic"].time_s  # 2,048 tokens: the device's


def test_kv_cache_dtype_flag():
    dev = get_device("h100-sxm")
    m = load_model_config("llama-3.1-8b")
    r = simulate(Request(m, dev, num_queries=2, context_length=1000, decode=True, kv_dtype="fp8"))
    assert r.memory.kv_cache_bytes_per_token == 65_536


def test_chrome_trace(cli, tmp_path):
    path = tmp_path / "t.json"
    cli("text-generate", "qwen3-8b", "--decode", "--context-length", "64", "--chrome-trace", str(path),
        check=True)
    events = json.loads(path.read_text())["traceEvents"]
    kernels = [e for e in events if e["ph"] == "X"]
    assert len(kernels) > 36 * 10 and all(e["dur"] > 0 for e in kernels)


def test_explain_prints_closed_forms(cli):
    doc = json.loads(cli("explain", "llama-3.1-8b", "--json", check=True).stdout)
    assert set(doc["symbols"]) == {"B", "S"}
    # WE-5 in closed form: linear weights 13,958,643,712 FLOPs per token (+ attention's S² term
    # and its 262,144·B·S linear part), lm_head once per sequence.
    assert doc["symbolic"]["flops.matrix"] == "262144*B*S**2 + 13958905856*B*S + 1050673152*B"
    doc = json.loads(cli("explain", "llama-3.1-8b", "--decode", "--json", check=True).stdout)
    assert set(doc["symbols"]) == {"B", "C"}
    assert "131072*B*C" in doc["symbolic"]["bytes.hbm"]


@pytest.mark.parametrize("args, message", [
    (["text-generate", "llama-3.1-9b"], "unknown model 'llama-3.1-9b'; did you mean llama-3.1-8b"),
    (["text-generate", "llama-3.1-8b", "--decode"], "--decode needs --context-length"),
    (["text-generate", "llama-3.1-8b", "--num-queries", "0"], "--num-queries: expected at least 1, got '0'"),
    (["text-generate", "llama-3.1-8b", "--quantize", "fp5"], "--quantize 'fp5': expected one of"),
    (["text-generate", "llama-3.1-8b", "--device", "h999"], "unknown device"),
    (["text-generate", "llama-3.1-8b", "--performance-model", "magic"], "--performance-model 'magic'"),
    (["text-generate", "/nonexistent/config.json"], "cannot read"),
])
def test_bad_input_is_one_line_exit_2(cli, args, message):
    proc = cli(*args)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_bad_config_files(cli, tmp_path):
    bad = tmp_path / "config.json"
    bad.write_text("{not json")
    proc = cli("text-generate", str(bad))
    assert proc.returncode == 2 and "not valid JSON" in proc.stderr
    bad.write_text(json.dumps({"model_type": "bert"}))
    proc = cli("text-generate", str(bad))
    assert proc.returncode == 2 and "'bert' is not an architecture perfcast knows" in proc.stderr
    bad.write_text(json.dumps({"hidden_size": 1}))
    proc = cli("text-generate", str(bad))
    assert proc.returncode == 2 and "key 'model_type'" in proc.stderr


def test_cached_capture_is_used_without_torch(tmp_path):
    import os
    import subprocess
    import sys

    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path))
    code = ("import sys, json, contextlib, io\n"
            "from perfcast.cli.main import main\n"
            "out = io.StringIO()\n"
            "with contextlib.redirect_stdout(out):\n"
            "    main(['text-generate', 'qwen3-8b', '--decode', '--num-queries', '4', '--context-length', '64', '--json'])\n"
            "doc = json.loads(out.getvalue())\n"
            "print(doc['capture'], 'torch' in sys.modules, doc['performance_models']['analytic']['total_time_s'])\n")
    first = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout.split()
    second = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout.split()
    assert first[:3] == ["symbolic", "capture", "True"]
    assert second[:4] == ["symbolic", "capture", "(cached)", "False"]  # no torch import at all
    assert first[-1] == second[-1]


def test_batch_of_one_is_captured_concretely():
    r = simulate(Request(load_model_config("qwen3-8b"), get_device("h100-sxm"), num_queries=1,
                         context_length=64, decode=True))
    assert r.capture_source == "concrete capture"
