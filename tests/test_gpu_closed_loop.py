"""The GPU closed loop (``benchmarks/gpu_closed_loop.py``) on the CPU path, and its bookkeeping on
injected measurements: kernel families, trace parsing, the comparison arithmetic, points, device
names, the engine switch, the time budget, and the real serving steps it times."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from perfcast.ir import UserError
from perfcast.profiler import closed_loop as cl
from perfcast.profiler.families import ATTENTION, ELEMENTWISE, GEMM, OTHER, measured_family
from perfcast.profiler.timing import KernelRecord, cpu_ops, device_kernels

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu_closed_loop.py"


def _script():
    spec = importlib.util.spec_from_file_location("gpu_closed_loop", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# The CPU path, end to end ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("loop")
    proc = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--tiny",
                           "--models", "llama-3.1-8b,qwen3-30b-a3b", "--points", "prefill:1x16,decode:2@32",
                           "--repeats", "2", "--warmup", "1", "--threads", "1", "--out", str(out)],
                          capture_output=True, text=True, timeout=600)
    return proc, out


def _step(doc, model, point):
    return next(r for r in doc["steps"] if r["model"] == model and r["point"] == point)


def test_cpu_run_measures_predicts_and_writes(cpu_run):
    proc, out = cpu_run
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads((out / "results.json").read_text())
    assert doc["status"] == "complete" and doc["device"]["kind"] == "cpu"
    assert doc["perfcast_device"] == "cpu-local" and doc["dtype"] == "fp32"
    assert doc["engine"] == cl.engines_label("static")
    assert len(doc["steps"]) == 4 and all(r["status"] == "ok" for r in doc["steps"]), \
        [r["errors"] for r in doc["steps"]]
    for r in doc["steps"]:
        m = r["measured"]
        assert m["eager_s"] > 0 and len(m["eager_samples_s"]) == 2 and m["graph"] == "cpu: no graphs"
        assert m["host_reads"] == {} and m["kernels"] > 0
        # the roofline: the same-run baseline; profiling: over the run's own kernels
        assert set(r["predicted"]) == {"analytic", "roofline", "profiling"}
        assert r["step"]["analytic"]["error_eager"] == pytest.approx(
            r["predicted"]["analytic"]["step_s"] / m["eager_s"] - 1)
    for r in doc["steps"]:  # each decode also timed with generate()'s DynamicCache, eager, and priced
        dyn = r["measured"].get("dynamic")
        assert (dyn is not None) == (r["phase"] == "decode")
        assert dyn is None or (dyn["eager_s"] > 0 and dyn["kernels"] > 0 and "DynamicCache" in dyn["step"])
        if dyn is not None:  # by the engine of that cache, which copies the cache every step
            row = r["dynamic"]["analytic"]
            assert row["error_eager"] == pytest.approx(row["predicted_s"] / dyn["eager_s"] - 1)
            assert row["predicted_kernels_s"] > r["predicted"]["analytic"]["kernels_s"]
    assert {"eager (DynamicCache)", "kernels (DynamicCache)"} <= {a["against"] for a in doc["accuracy"]}
    decode = _step(doc, "llama-3.1-8b-tiny", "decode:2@32")["measured"]["step"]
    assert "StaticCache" in decode and "32 cached" in decode
    assert "GPU closed loop on cpu" in proc.stdout and "Kernel families (analytic)" in proc.stdout
    assert "llama-3.1-8b-tiny prefill:1x16: eager" in proc.stderr  # timestamped progress


def test_cpu_run_kernel_families_count_the_real_kernels(cpu_run):
    _, out = cpu_run
    doc = json.loads((out / "results.json").read_text())
    for point in ("prefill:1x16", "decode:2@32"):
        fams = {f["family"]: f for f in _step(doc, "llama-3.1-8b-tiny", point)["families"]["analytic"]}
        # 2 layers x 7 projections (q, k, v, o, gate, up, down) + lm_head = 15 GEMMs, measured and predicted
        assert fams[GEMM]["measured_count"] == fams[GEMM]["predicted_count"] == 15
        assert fams[ATTENTION]["measured_count"] == fams[ATTENTION]["predicted_count"] == 2  # one per layer
        assert fams["total"]["measured_count"] == sum(fams[f]["measured_count"] for f in cl.FAMILIES)
    moe = {f["family"]: f for f in _step(doc, "qwen3-30b-a3b-tiny", "decode:2@32")["families"]["analytic"]}
    # 2 layers x (q, k, v, o, router, one grouped expert GEMM) + lm_head = 13 predicted GEMM kernels
    assert moe[GEMM]["predicted_count"] == 13 and moe[ATTENTION]["measured_count"] == 2


def test_cpu_run_csv_files(cpu_run):
    import csv

    _, out = cpu_run
    kernels = list(csv.DictReader((out / "kernels.csv").open()))
    q_and_o = [r for r in kernels if r["model"] == "llama-3.1-8b-tiny" and r["point"] == "prefill:1x16"
               and r["performance_model"] == "analytic" and r["op"] == "mm" and r["shape"] == "16x256x256"]
    # q_proj and o_proj (256 -> 256) in each of 2 layers: 4 calls of M x K x N = 16 x 256 x 256
    assert len(q_and_o) == 1 and q_and_o[0]["measured_count"] == q_and_o[0]["predicted_count"] == "4"
    steps = list(csv.DictReader((out / "steps.csv").open()))
    assert len(steps) == 4 * 3 and {s["performance_model"] for s in steps} == {"analytic", "roofline", "profiling"}
    manifests = list((out / "kernel-db").glob("cpu-local/torch/*/MANIFEST.yaml"))
    assert len(manifests) == 1 and "time.perf_counter per call" in manifests[0].read_text()


def test_cpu_run_keeps_the_measured_kernel_keys(cpu_run):
    """The traced kernels are kept per key in results.json, whether or not a prediction succeeded:
    a run measured on a lent GPU can be priced again anywhere (--repredict)."""
    _, out = cpu_run
    doc = json.loads((out / "results.json").read_text())
    for r in doc["steps"]:
        keys = cl.keys_from_json(r["measured"]["kernel_keys"])
        assert sum(n for n, _ in keys.values()) == r["measured"]["kernels"]
        assert sum(us for _, us in keys.values()) == pytest.approx(r["measured"]["kernels_us"])


def test_repredict_reproduces_the_run_and_names_its_source(cpu_run, tmp_path):
    _, out = cpu_run
    again = tmp_path / "again"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--repredict", str(out), "--out", str(again),
                           "--profiling-database", str(out / "kernel-db")],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    first, second = (json.loads((d / "results.json").read_text()) for d in (out, again))
    assert second["repredicted"]["from"] == str(out / "results.json")
    assert "re-priced from" in proc.stdout
    for a, b in zip(first["steps"], second["steps"], strict=True):
        assert a["measured"] == b["measured"] and set(b["step"]) == {"analytic", "roofline", "profiling"}
        # the analytic price is the run's; the profiling one may differ, as the run priced each
        # point over the database as it stood then (it grows point by point)
        assert all(a[k]["analytic"] == b[k]["analytic"] for k in ("step", "families", "kernels"))


def test_repredict_of_a_run_whose_predictions_failed(cpu_run, tmp_path):
    """A run whose predictions all failed (a GPU's torch could not capture) gets them here; the
    kernel profile's errors stay."""
    _, out = cpu_run
    doc = json.loads((out / "results.json").read_text())
    for r in doc["steps"]:
        r.update(predicted={}, step={}, families={}, kernels={}, status="error",
                 errors=["kernel profile: RuntimeError: x", "prediction: RuntimeError: x"])
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "results.json").write_text(json.dumps(doc))
    repriced = _script().repredict(SimpleNamespace(repredict=str(broken), out=str(tmp_path / "fixed"),
                                                   perfcast_device=None, dtype=None, profiling_database=None))
    for r in repriced["steps"]:
        assert r["errors"] == ["kernel profile: RuntimeError: x"] and r["status"] == "error"
        assert set(r["step"]) == {"analytic", "roofline"} and r["families"]["analytic"][-1]["measured_count"] > 0


@pytest.mark.parametrize("argv, message", [
    (["--repredict", "/nonexistent"], "--repredict /nonexistent: /nonexistent/results.json is not a closed-loop"),
    (["--repredict", "/tmp", "--tiny"], "--repredict prices the models and points of the earlier run"),
    (["--no-dynamic", "--decode-cache", "dynamic"], "--no-dynamic: with --decode-cache dynamic"),
])
def test_repredict_bad_input(argv, message, capsys):
    assert _script().main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err


def test_run_database_is_named_for_the_priced_device(tmp_path):
    """The run's kernels land in a database named for the perfcast device it prices (a profiling
    database prices only the device it is named for; on a GPU the database had been named for the
    GPU's name, and every profiling price failed)."""
    proc = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--tiny", "--models", "llama-3.1-8b",
                           "--points", "decode:2@32", "--repeats", "1", "--warmup", "0", "--threads", "1",
                           "--perfcast-device", "h200-sxm", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert [p.parts[-4] for p in tmp_path.glob("kernel-db/*/torch/*/MANIFEST.yaml")] == ["h200-sxm"]
    step = json.loads((tmp_path / "results.json").read_text())["steps"][0]
    assert set(step["step"]) == {"analytic", "roofline", "profiling"} and step["errors"] == []


def test_cuda_without_a_gpu_is_one_clear_line():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    proc = subprocess.run([sys.executable, str(SCRIPT), "--device", "cuda", "--tiny"], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "--device cuda: CUDA is not available" in proc.stderr


@pytest.mark.parametrize("argv, message", [
    (["--points", "prefill:1x0"], "--points 'prefill:1x0': batch, tokens and context must be at least 1"),
    (["--points", "decode:8"], "--points 'decode:8': expected prefill:BATCHxTOKENS or decode:BATCH@CONTEXT"),
    (["--models", "no-such-model"], "unknown model 'no-such-model'"),
    (["--set", "num_hidden_layers"], "--set 'num_hidden_layers': expected KEY=VALUE"),
    (["--repeats", "0"], "--repeats must be at least 1"),
    (["--perfcast-device", "no-such-device"], "no-such-device"),
    (["--no-kernel-db", "--profiling-database", "x"], "exclude each other"),
])
def test_bad_input_is_one_line_and_exit_2(argv, message, capsys):
    assert _script().main(["--device", "cpu", "--tiny", *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err


def test_budget_stops_cleanly_with_partial_results(tmp_path, monkeypatch):
    module = _script()
    now = [0.0]
    real = module.run_point

    def slow_point(*a, **k):  # every point "takes" 200 s of the 360 s budget
        rec = real(*a, **k)
        now[0] += 200
        return rec

    monkeypatch.setattr(module, "run_point", slow_point)
    args = module.parse_args(["--device", "cpu", "--tiny", "--models", "llama-3.1-8b,qwen3-8b", "--points",
                              "prefill:1x8,decode:2@16", "--repeats", "1", "--warmup", "0", "--threads", "1",
                              "--no-kernel-db", "--out", str(tmp_path)])
    doc = module.run(args, clock=lambda: now[0])
    # after the first point 160 s are left, less than 1.25 x 200 s for the next: stop there
    assert doc["status"] == "partial (time budget)" and len(doc["steps"]) == 1
    assert doc["skipped"] == ["llama-3.1-8b-tiny decode:2@16: time budget", "qwen3-8b-tiny prefill:1x8: time budget",
                              "qwen3-8b-tiny decode:2@16: time budget"]
    written = json.loads((tmp_path / "results.json").read_text())
    assert written["status"] == doc["status"] and len(written["steps"]) == 1


# Kernel families and trace parsing --------------------------------------------------------------
@pytest.mark.parametrize("op, kernel, family", [
    ("aten::mm", "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", GEMM),
    (None, "nvjet_tst_64x8_64x16_4x1_v_bz_TNT", GEMM),  # cuBLAS on Hopper, inside a graph replay
    (None, "splitKreduce_kernel", GEMM),
    ("aten::_grouped_mm", "void cutlass::device_kernel<...>", GEMM),
    (None, "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 64>>", ATTENTION),
    ("aten::_efficient_attention_forward", "fmha_cutlassF_bf16_aligned_64x128_rf_sm80", ATTENTION),
    ("aten::_scaled_dot_product_flash_attention_for_cpu", "aten::_scaled_dot_product_flash_attention_for_cpu", ATTENTION),
    (None, "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16>>", ELEMENTWISE),
    ("aten::index_copy_", "void at::native::index_copy_kernel_impl", ELEMENTWISE),  # the KV-cache write
    ("aten::mean", "void at::native::reduce_kernel<512, 1>", ELEMENTWISE),
    (None, "Memset (Device)", ELEMENTWISE),
    ("aten::embedding", "void at::native::indexSelectLargeIndex", OTHER),
    ("aten::sort", "void at_cuda_detail::cub::DeviceRadixSortOnesweepKernel", OTHER),
    ("aten::histc", "void at::cuda::kernelHistogram1D", OTHER),
])
def test_measured_family(op, kernel, family):
    assert measured_family(op, kernel) == family


class _Event(SimpleNamespace):
    """A torch.profiler FunctionEvent, as far as the parsers read one."""

    def __init__(self, name, device="CPU", id=0, linked=0, shapes=(), us=0.0, children=()):
        super().__init__(name=name, device_type=SimpleNamespace(name=device), id=id, linked_correlation_id=linked,
                         input_shapes=[list(s) for s in shapes], cpu_children=list(children),
                         time_range=SimpleNamespace(elapsed_us=lambda: us))


def test_device_kernels_are_linked_to_the_op_that_launched_them():
    events = [
        _Event("aten::linear", id=1), _Event("aten::mm", id=2, shapes=[(8, 4096), (4096, 4096)]),
        _Event("cudaLaunchKernel", id=900, linked=2),  # a runtime call: not an op, links to aten::mm
        _Event("nvjet_tst_64x8", "CUDA", id=900, linked=2, us=16.4),
        _Event("void pytorch_flash::flash_fwd_kernel", "CUDA", id=901, linked=0, us=5.0),  # no op
        # a launch-queue stall CUPTI reports on the device's track (torch 2.11, H200): no kernel
        _Event("Command Buffer Full", "CUDA", id=902, linked=2, us=760.0),
    ]
    assert device_kernels(events) == [
        KernelRecord("nvjet_tst_64x8", "aten::mm", ((8, 4096), (4096, 4096)), 16.4),
        KernelRecord("void pytorch_flash::flash_fwd_kernel", None, (), 5.0)]


def test_device_kernels_without_links_come_from_the_ops_kernel_lists():
    mm = _Event("aten::mm", id=2, shapes=[(8, 4096), (4096, 4096)])
    mm.kernels = [SimpleNamespace(name="nvjet_tst_64x8", duration=16.4)]
    gemm = _Event("nvjet_tst_64x8", "CUDA", us=16.4)
    del gemm.linked_correlation_id  # a torch whose events carry no link
    assert device_kernels([mm, gemm]) == [KernelRecord("nvjet_tst_64x8", "aten::mm", ((8, 4096), (4096, 4096)), 16.4)]


def test_cpu_ops_are_the_innermost_working_ops():
    mm = _Event("aten::mm", shapes=[(16, 256), (256, 256)], us=30.0)
    t = _Event("aten::t", children=[_Event("aten::transpose", children=[_Event("aten::as_strided")])])
    linear = _Event("aten::linear", children=[t, _Event("aten::matmul", children=[mm])], us=40.0)
    narrow = _Event("aten::narrow", children=[_Event("aten::slice")])
    add = _Event("aten::add", shapes=[(1, 16, 256), (1, 16, 256)], us=2.0)
    events = [linear, t, mm, narrow, add, _Event("aten::to")]
    assert [(r.op, r.duration_us) for r in cpu_ops(events)] == [("aten::mm", 30.0), ("aten::add", 2.0)]


# The comparison arithmetic ----------------------------------------------------------------------
def _injected():
    shapes = ((8, 4096), (4096, 4096))
    records = [KernelRecord("nvjet_a", "aten::mm", shapes, 16.0), KernelRecord("nvjet_b", "aten::mm", shapes, 18.0),
               KernelRecord("flash_fwd_kernel", "aten::_flash_attention_forward", ((8, 32, 1, 128),), 10.0),
               KernelRecord("vectorized_elementwise_kernel", "aten::add", ((8, 4096), (8, 4096)), 2.0),
               KernelRecord("Memset (Device)", None, (), 1.0)]
    pred = cl.Prediction("analytic", step_s=50e-6, launch_s=10e-6, launches=4, kernels={
        (GEMM, "mm", "8x4096x4096"): [2, 30.0], (ATTENTION, "attention", ""): [1, 12.0],
        (ELEMENTWISE, "add", "8x4096"): [1, 3.0]})
    return records, pred


def test_family_rows_on_injected_measurements():
    records, pred = _injected()
    rows = {r["family"]: r for r in cl.family_rows(records, pred)}
    assert (rows[GEMM]["measured_count"], rows[GEMM]["measured_us"]) == (2, 34.0)  # 16 + 18 µs
    assert rows[GEMM]["error"] == pytest.approx(30 / 34 - 1)  # −11.8 %
    assert rows[ATTENTION]["error"] == pytest.approx(12 / 10 - 1)  # +20 %
    # the add (2 µs) and the memset (1 µs, linked to no op, classed by its name) against 3 µs predicted
    assert (rows[ELEMENTWISE]["measured_count"], rows[ELEMENTWISE]["measured_us"], rows[ELEMENTWISE]["error"]) == (2, 3.0, 0.0)
    assert rows[OTHER]["error"] is None and rows[OTHER]["measured_count"] == 0
    assert (rows["total"]["measured_us"], rows["total"]["predicted_us"], rows["total"]["predicted_count"]) == (47.0, 45.0, 4)


def test_kernel_rows_match_by_key_largest_first():
    records, pred = _injected()
    rows = cl.kernel_rows(records, pred)
    assert [(r["family"], r["op"], r["shape"]) for r in rows] == [
        (GEMM, "mm", "8x4096x4096"), (ATTENTION, "attention", ""), (ELEMENTWISE, "add", "8x4096"),
        (ELEMENTWISE, "(no op)", "")]
    assert (rows[0]["measured_count"], rows[0]["predicted_count"]) == (2, 2)
    # the memset: measured (1 µs) but not predicted — perfcast misses all of it, 0 / 1 − 1 = −100 %
    assert (rows[-1]["predicted_count"], rows[-1]["error"]) == (0, -1.0)


def test_step_row_arithmetic():
    records, pred = _injected()
    row = cl.step_row(60e-6, 48e-6, pred, sum(r.duration_us for r in records))
    assert row["predicted_kernels_s"] == pytest.approx(40e-6)  # 50 µs less 10 µs of launches
    assert row["error_eager"] == pytest.approx(50 / 60 - 1) and row["error_graph"] == pytest.approx(40 / 48 - 1)
    assert row["measured_gap_eager_s"] == pytest.approx(13e-6)  # 60 µs − 47 µs of kernels
    assert cl.step_row(None, None, pred, None)["error_eager"] is None


def test_gemm_keys_agree_between_profiler_and_capture():
    # profiler: aten::addmm(bias, x, w.t()); capture: the leaf's inputs in the same order
    assert cl.kernel_key(GEMM, "addmm", ((1024,), (8, 4096), (4096, 1024))) == (GEMM, "addmm", "8x4096x1024")
    assert cl.kernel_key(GEMM, "bmm", ((32, 1, 128), (32, 128, 4097))) == (GEMM, "bmm", "32x128x4097")
    assert cl.kernel_key(GEMM, "_grouped_mm", ((512, 2048),)) == (GEMM, "grouped_mm", "")


# Points, devices, engine, budget --------------------------------------------------------------
def test_default_points():
    points = cl.parse_points(cl.DEFAULT_POINTS)
    assert [p.label for p in points] == ["prefill:1x512", "prefill:1x2048", "decode:1@1024", "decode:8@1024",
                                         "decode:64@1024", "decode:1@4096", "decode:8@4096", "decode:64@4096"]
    assert points[3] == cl.Point("decode", 8, 1, 1024) and points[1] == cl.Point("prefill", 1, 2048, 0)
    with pytest.raises(UserError, match="given twice"):
        cl.parse_points("decode:8@1024,decode:8@1024")


@pytest.mark.parametrize("name, device", [("NVIDIA H100 80GB HBM3", "h100-sxm"), ("NVIDIA H200", "h200-sxm"),
                                          ("NVIDIA B200", "b200-sxm")])
def test_perfcast_device_from_the_gpu_name(name, device):
    assert cl.perfcast_device_for(name) == device
    assert cl.perfcast_device_for(name, "h100-sxm") == "h100-sxm"  # a given name wins


@pytest.mark.parametrize("name", ["NVIDIA H100 PCIe", "NVIDIA H200 NVL", "NVIDIA A100-SXM4-80GB"])
def test_other_gpus_need_a_perfcast_device(name):
    with pytest.raises(UserError, match="--perfcast-device: no perfcast device is known to be a"):
        cl.perfcast_device_for(name)


def test_engine_switch_is_one_place():
    """A prefill fills a DynamicCache (``eager``); a decode runs over the loop's cache."""
    assert cl.engine_options() == ({"engine": "eager-static"}, "--engine eager-static")
    assert cl.engine_options(cl.Point("prefill", 1, 16, 0)) == ({"engine": "eager"}, "--engine eager")
    assert cl.engine_options(cl.Point("decode", 2, 1, 16), "dynamic")[0] == {"engine": "eager"}
    assert cl.engines_label("dynamic") == "--engine eager"


def test_budget():
    now = [100.0]
    b = cl.Budget(60, lambda: now[0])
    now[0] = 130.0
    assert (b.elapsed(), b.left(), b.allows(30), b.allows(31)) == (30.0, 30.0, True, False)


# The serving steps --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_llama():
    import torch

    from perfcast.models import load_model_config
    from perfcast.profiler import steps

    torch.set_num_threads(1)
    m = load_model_config("llama-3.1-8b")
    data = {**m.data, **_script().TINY, "bos_token_id": 1, "eos_token_id": 2}
    return steps.build(type(m)("tiny", data, m.path, {}), "fp32", "cpu")


def test_build_gives_random_weights(tiny_llama):
    assert tiny_llama.attention == "sdpa" and tiny_llama.experts is None
    assert tiny_llama.weight_std == pytest.approx(0.02, rel=0.1)  # transformers' init: normal, std 0.02
    # 1024 x 256 embedding + lm_head, 2 layers of 256·(256 + 128 + 128 + 256) + 3·256·512 + 2·256 norms, final norm
    assert tiny_llama.parameters == 2 * 1024 * 256 + 2 * (256 * 768 + 3 * 256 * 512 + 2 * 256) + 256


def test_decode_step_static_cache_is_repeatable_and_matches_dynamic(tiny_llama):
    import torch

    from perfcast.profiler import steps

    static = steps.DecodeStep(tiny_llama.model, 2, 16, "static")
    assert static.cached_tokens() == 16
    first = static()
    assert static.cached_tokens() == 17  # the step wrote slot 16
    static.reset()
    assert static.cached_tokens() == 16 and torch.equal(static(), first)
    dynamic = steps.DecodeStep(tiny_llama.model, 2, 16, "dynamic")
    dynamic.filled = [(s.keys[..., :16, :].clone(), s.values[..., :16, :].clone())  # the same 16 cached tokens
                      for s in static.cache.layers]
    dynamic.reset()
    assert torch.allclose(dynamic(), first, atol=1e-5)
    assert dynamic.cached_tokens() == 17
    dynamic.reset()
    # back to the filled tensors themselves: contiguous, as generate()'s cache is (a slice of the
    # step's 17-token output is not, and torch.cat reads a strided input several times slower)
    assert dynamic.cached_tokens() == 16
    assert all(d.keys is k and d.keys.is_contiguous() for d, (k, _) in zip(dynamic.cache.layers, dynamic.filled))
    assert torch.allclose(dynamic(), first, atol=1e-5)
    dynamic.reset()
    static.reset()
    static.cache.layers[0].keys[:, :, 0].add_(1.0)  # the first cached token matters: it is attended
    assert not torch.allclose(static(), first, atol=1e-5)


def test_steps_exchange_no_data_with_the_host(tiny_llama):
    import torch

    from perfcast.profiler import steps

    prefill = steps.PrefillStep(tiny_llama.model, 1, 8)
    assert steps.host_reads(prefill) == {} and steps.host_reads(steps.DecodeStep(tiny_llama.model, 2, 8)) == {}
    reference = tiny_llama.model(input_ids=prefill.ids, use_cache=False, logits_to_keep=1).logits
    assert torch.equal(prefill(), reference) and prefill.cached_tokens() == 8
    x = torch.ones(3)
    with steps.HostReads() as mode:
        (x + torch.tensor([1.0, 2.0, 3.0])).sum().item()
        torch.nonzero(x)
    assert dict(mode.found) == {"aten.lift_fresh": 1, "aten._local_scalar_dense": 1, "aten.nonzero": 1}


# The CUDA backend's logic, on a stand-in for torch.cuda -------------------------------------------
def _stand_in_cuda():
    """torch as far as CudaBackend uses it, on the CPU: events read the wall clock, a graph
    records the calls made while capturing and replays them. Calls are logged."""
    import contextlib

    import torch

    log = []

    class Event:
        def __init__(self, enable_timing=False):
            self.t = None

        def record(self):
            import time
            self.t = time.perf_counter()

        def synchronize(self):
            log.append("sync")

        def elapsed_time(self, end):
            return (end.t - self.t) * 1e3  # ms, as torch.cuda.Event.elapsed_time

    class CUDAGraph:
        def __init__(self):
            self.calls, self.capturing = [], False

        def replay(self):
            log.append("replay")
            for fn in self.calls:
                fn()

    @contextlib.contextmanager
    def graph(g):
        log.append("capture")
        g.capturing = True
        yield
        g.capturing = False

    @contextlib.contextmanager
    def stream(s):
        log.append("side stream")
        yield

    def side_stream(device=None):
        return type("Stream", (), {"wait_stream": lambda self, other: None})()

    cuda = SimpleNamespace(Event=Event, CUDAGraph=CUDAGraph, graph=graph, stream=stream, Stream=side_stream,
                           current_stream=side_stream, synchronize=lambda device=None: None,
                           empty_cache=lambda: log.append("empty_cache"), get_device_name=lambda d=None: "Stand-in GPU")
    return SimpleNamespace(no_grad=torch.no_grad, cuda=cuda, __version__=torch.__version__,
                           version=SimpleNamespace(cuda="0.0")), log


def _cuda_backend():
    from perfcast.profiler.timing import CpuBackend, CudaBackend

    bk = CudaBackend("cpu")
    bk.torch, log = _stand_in_cuda()
    bk.trace = CpuBackend("cpu").trace  # torch.profiler's CPU side stands in for CUPTI
    return bk, log


def test_cuda_backend_times_with_resets_outside_the_samples():
    bk, log = _cuda_backend()
    resets = []
    samples = bk.time(lambda: log.append("call"), before=lambda: resets.append(1), warmup=2, repeats=3)
    assert len(samples) == 3 and len(resets) == 2 + 3  # before every warm-up call and every sample
    assert log.count("call") == 5 and log.count("sync") == 3  # one synchronisation per sample


def test_cuda_backend_capture_and_its_errors():
    from perfcast.profiler.timing import GraphUnavailable

    bk, log = _cuda_backend()
    replay = bk.capture(lambda: log.append("call"), warmup=2)
    # two warm-up calls on a side stream, then the capture, which runs the Python once more
    assert log == ["side stream", "call", "call", "capture", "call"]
    replay()
    assert log[-1] == "replay"

    def broken():
        raise RuntimeError("operation not permitted when stream is capturing\nsecond line")

    with pytest.raises(GraphUnavailable, match=r"^capture failed: RuntimeError: operation not permitted when "
                                               r"stream is capturing$"):
        bk.capture(broken, warmup=0)


def test_run_point_graph_path(tiny_llama):
    from perfcast.hardware import get_device
    from perfcast.models import load_model_config

    module = _script()
    bk, log = _cuda_backend()

    def capture(fn, *, before=None, calls=1, warmup=3):  # a "replay" that runs the step again
        if before:
            before()
        return lambda: fn()

    bk.capture = capture
    args = module.parse_args(["--device", "cpu", "--repeats", "2", "--warmup", "1", "--no-kernel-db"])
    ctx = {"backend": bk, "args": args, "device": get_device("h200-sxm"), "dtype": "fp32", "kernel_db": None,
           "db_name": "stand-in-gpu"}
    m = load_model_config("llama-3.1-8b")
    cfg = type(m)("tiny", {**m.data, **module.TINY, "bos_token_id": 1, "eos_token_id": 2}, m.path, {})
    rec = module.run_point(ctx, tiny_llama, cfg, cl.Point("decode", 2, 1, 16))
    assert rec["status"] == "ok", rec["errors"]
    meas = rec["measured"]
    assert meas["graph"] == "replayed" and len(meas["graph_samples_s"]) == 2
    assert meas["graph_kernels"] == meas["kernels"]  # the replay runs the same ops
    assert rec["step"]["analytic"]["error_graph"] == pytest.approx(
        rec["predicted"]["analytic"]["kernels_s"] / meas["graph_s"] - 1)
    assert "empty_cache" in log  # memory handed back after the point
    args = module.parse_args(["--device", "cpu", "--repeats", "1", "--warmup", "0", "--no-kernel-db",
                              "--decode-cache", "dynamic"])
    rec = module.run_point({**ctx, "args": args}, tiny_llama, cfg, cl.Point("decode", 2, 1, 16))
    assert rec["measured"]["graph"].startswith("not captured: a DynamicCache concatenates")


def test_defaults_the_docs_state():
    module = _script()
    args = module.parse_args([])
    assert (args.device, args.budget_s, args.repeats, args.warmup, args.decode_cache) == ("cuda", 360.0, 10, 3, "static")
    assert args.models == "llama-3.1-8b,qwen3-8b,qwen3-30b-a3b" and args.points == cl.DEFAULT_POINTS
    assert (module.TINY["num_hidden_layers"], module.TINY["hidden_size"]) == (2, 256)
    assert (module.TINY_MOE["num_experts"], module.TINY_MOE["num_experts_per_tok"]) == (8, 2)


def test_accuracy_summary_on_injected_steps():
    """Median, p90 and signed median of |error| per performance model and measurement, over the
    steps that model priced, out of those measured."""
    def rec(eager, graph, errs):
        return {"measured": {"eager_s": eager, "graph_s": graph},
                "step": {m: {"error_eager": e, "error_graph": g} for m, (e, g) in errs.items()}}

    doc = {"steps": [rec(1.0, 0.5, {"analytic": (-0.1, 0.2), "roofline": (-0.5, -0.4)}),
                     rec(1.0, None, {"analytic": (0.3, None)}),
                     rec(1.0, 0.5, {"analytic": (-0.2, -0.1), "roofline": (-0.7, -0.6)})]}
    rows = {(r["performance_model"], r["against"]): r for r in cl.accuracy(doc)}
    a = rows["analytic", "eager"]
    assert (a["steps"], a["of"]) == (3, 3) and a["median"] == pytest.approx(0.2)
    assert a["signed_median"] == pytest.approx(-0.1)
    g = rows["analytic", "graph"]
    assert (g["steps"], g["of"]) == (2, 2) and g["median"] == pytest.approx(0.15) and g["signed_median"] == pytest.approx(0.05)
    r = rows["roofline", "eager"]
    assert (r["steps"], r["of"]) == (2, 3) and r["p90"] == pytest.approx(0.5 + 0.9 * 0.2)


def test_cupti_overhead_of_a_kept_run_is_not_counted_as_kernels():
    """The second H200 run (benchmarks/measured/h200-2026-12-04b) traced 'Command Buffer Full'
    stalls among the kernels: 203 of them, 47.2 ms, in Llama's 8,192-token prefill — the traced
    kernels (321.2 ms) then exceeded the step's graph replay (259.0 ms). Comparing drops them."""
    doc = json.loads((ROOT / "benchmarks/measured/h200-2026-12-04b/results.json").read_text())
    rec = next(r for r in doc["steps"] if r["model"] == "llama-3.1-8b" and r["point"] == "prefill:1x8192")
    assert round(rec["measured"]["kernels_us"] / 1e3, 1) == 321.2
    meas = cl.drop_overhead(rec["measured"])
    assert meas["cupti_overhead"][0] == 203 and round(meas["cupti_overhead"][1] / 1e3, 1) == 47.2
    assert round(meas["kernels_us"] / 1e3, 1) == 274.0
    assert not [k for k in meas["kernel_keys"] if k[1] == "Command Buffer Full"]
    assert cl.drop_overhead(meas) == meas  # a second pass changes nothing


def test_one_kernel_under_two_op_names_has_one_key():
    """A captured cast (``_to_copy``) is traced as the ``aten::copy_`` inside it; ``cat`` (a
    tensor list, traced without shapes) and ``index_copy_`` (traced with the cache it writes into,
    captured as the new entries it copies) are keyed by op alone — also in a run kept before."""
    el = ELEMENTWISE
    assert cl.kernel_key(el, "_to_copy", ((8, 1, 4096),)) == cl.kernel_key(el, "copy_", ((8, 1, 4096),)) \
        == (el, "copy_", "8x1x4096")
    assert cl.kernel_key(el, "cat", ((8, 8, 16, 128), (8, 8, 1, 128))) == (el, "cat", "")
    kept = [[el, "index_copy_", "1x8x1025x128", 64, 141.4], [el, "index_copy_", "8x8x1025x128", 64, 165.7],
            [el, "_to_copy", "4", 1, 2.0]]
    assert cl.keys_from_json(kept) == {(el, "index_copy_", ""): [128, pytest.approx(307.1)],
                                       (el, "copy_", "4"): [1, 2.0]}
