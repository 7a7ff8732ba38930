"""Calibrated kernel forms: the fitted form's arithmetic, kernel classes' work counts, fitting
on synthetic kernels, the calibration files' loader, and the analytic model's use of a fit."""

import math

import numpy as np
import pytest
import sympy

from perfcast.hardware import get_device
from perfcast.hardware.calibration import CalibrationFile, load_calibration_file
from perfcast.hardware.spec import SpecError
from perfcast.ir import Tensor, dim, make_leaf
from perfcast.perf.classify import classify
from perfcast.perf.kernel_classes import CLASSES
from perfcast.perf.kernel_fit import KernelFit, KernelWork, Ramp, Residual


def test_ramp_rises_to_its_peak_fraction():
    r = Ramp(0.8, 1e-6, 1.0)  # half the peak fraction at the bytes the peak moves in 1 µs
    assert r(1e6, 1e12) == pytest.approx(0.4)  # 1 µs at 1e12 B/s = 1e6 B
    assert r(2e6, 2e12) == pytest.approx(0.4)  # twice the bandwidth: twice the bytes in flight
    assert r(1e12, 1e12) == pytest.approx(0.8, rel=1e-5)
    assert r(1e3, 1e12) == pytest.approx(0.8 / 1001)


def test_fit_time_is_static_plus_p_norm():
    fit = KernelFit(static_s=2e-6, overlap=2.0, compute=Ramp(1.0, 1e-300, 1.0), memory=Ramp(1.0, 1e-300, 1.0),
                    item_s={"wave": 1e-9})
    w = KernelWork(flops=3e9, bytes=4e6, items={"wave": 0.0})
    # compute 3e9 / 1e15 = 3 µs, memory 4e6 / 1e12 = 4 µs: sqrt(3² + 4²) = 5 µs, + 2 µs
    assert float(fit.time(w, 1e15, 1e12)) == pytest.approx(7e-6)
    w2 = KernelWork(flops=0.0, bytes=0.0, items={"wave": 12000.0})  # 12000 × 1 ns = 12 µs
    assert float(fit.time(w2, 1e15, 1e12)) == pytest.approx(14e-6)


def test_residual_is_bilinear_between_centres_and_flat_beyond():
    res = Residual(("a", "b"), ((0.0, 2.0), (0.0, 2.0)), ((0.0, 0.0), (math.log(2), math.log(2))))
    assert float(res(2.0, 1.0)) == pytest.approx(math.log(2) / 2)  # log2(2) = 1: halfway along a
    assert float(res(1024.0, 1.0)) == pytest.approx(math.log(2))  # beyond the last centre: flat
    fit = KernelFit(0.0, 1.0, memory=Ramp(1.0, 1e-300, 1.0), residual=res)
    w = KernelWork(flops=0, bytes=1e6, axes={"a": 4.0, "b": 4.0})
    assert float(fit.time(w, 1.0, 1e12)) == pytest.approx(2e-6)  # 1 µs × exp(log 2)


def test_residual_matches_scipys_regular_grid_interpolator():
    from scipy.interpolate import RegularGridInterpolator

    rng = np.random.default_rng(0)
    c1, c2 = (0.0, 1.5, 4.0, 9.0), (-2.0, 3.0, 5.0)
    grid = rng.normal(size=(4, 3))
    res = Residual(("a", "b"), (c1, c2), tuple(tuple(row) for row in grid))
    x1, x2 = 2.0 ** rng.uniform(-3, 12, 500), 2.0 ** rng.uniform(-5, 8, 500)  # inside and beyond
    ref = RegularGridInterpolator((np.array(c1), np.array(c2)), grid, method="linear")
    pts = np.stack([np.clip(np.log2(x1), c1[0], c1[-1]), np.clip(np.log2(x2), c2[0], c2[-1])], axis=1)
    assert np.allclose(res(x1, x2), ref(pts), rtol=0, atol=1e-12)
    assert res(np.full((2, 3), 4.0), 8.0).shape == (2, 3)  # broadcasts like the interpolator's reshape


def test_gemm_work_counts():
    w = CLASSES["gemm"].work({"M": 8.0, "N": 4096.0, "K": 4096.0, "dtype": "bf16"}, 132)
    assert w.flops == 2 * 8 * 4096 * 4096  # 268,435,456
    assert w.bytes == 8 * 4096 * 2 + 4096 * 4096 * 2 + 8 * 4096 * 2  # activations, weights, output
    # 1 × 32 output tiles of 128×128 fit on 132 SMs in one wave: the K loop is the serial work
    assert w.items == {"wave": 4096.0}
    fp8 = CLASSES["gemm"].work({"M": 8.0, "N": 4096.0, "K": 4096.0, "dtype": "fp8"}, 132)
    assert fp8.bytes == 8 * 4096 + 4096 * 4096 + 8 * 4096 * 2  # 1-byte operands, bf16 output


def test_generation_attention_counts_ctas_by_the_engines_kernel_choice():
    shape = {"batch": 64.0, "heads": 32.0, "kv_heads": 8.0, "q_len": 1.0, "kv_len": 4096.0, "head_dim": 128.0,
             "v_head_dim": 128.0, "window": 0, "dtype": "bf16", "kv_dtype": "bf16"}
    w = CLASSES["attention.generation"].work(shape, 132)
    assert w.bytes == 64 * 8 * 4096 * 256 * 2 + 64 * 32 * 256 * 2  # the KV cache read once per KV head
    # group 4: XQA, one CTA per (sequence, KV head); 512 CTAs ≥ 132 SMs: no split of the KV length
    assert (w.items["xqa"], w.items["mmha"], w.items["mmha_kernel"], w.items["chain"]) == (64 * 8, 0, 0, 4096)
    wide = CLASSES["attention.generation"].work({**shape, "heads": 64.0, "kv_heads": 1.0}, 132)
    assert (wide.items["xqa"], wide.items["mmha"], wide.items["mmha_kernel"]) == (0, 64 * 64, 1)  # group 64 > 32
    mha = CLASSES["attention.generation"].work({**shape, "batch": 1.0, "kv_heads": 32.0}, 132)
    # plain MHA runs the multi-head kernel too; 32 CTAs on 132 SMs split each KV run in 4
    assert (mha.items["xqa"], mha.items["mmha"], mha.items["chain"]) == (0, 32, 1024)


def _mm(m, k, n, dtype="bf16"):
    x, w = Tensor("x", (m, k), dtype), Tensor("w", (k, n), dtype)
    return make_leaf("matmul", "mm", (x, w), (Tensor("y", (m, n), "bf16"),), op="aten.mm.default")


def test_classify_reads_gemm_shapes_off_leaves_including_addmm():
    cls, shape = classify(_mm(dim("B"), 4096, 6144))
    assert cls.name == "gemm" and shape["M"] == dim("B") and (shape["N"], shape["K"]) == (6144, 4096)
    bias, x, w = Tensor("b", (1024,), "bf16"), Tensor("x", (16, 4096), "bf16"), Tensor("w", (4096, 1024), "bf16")
    # the lowering orders addmm's inputs (x, bias, W): K is the activation's width
    addmm = make_leaf("matmul", "k_proj", (x, bias, w), (Tensor("y", (16, 1024), "bf16"),), op="aten.addmm.default")
    cls, shape = classify(addmm)
    assert shape["K"] == 4096 and addmm.cost["flops.matrix"] == 2 * 16 * 1024 * 4096  # not the bias width


def test_classify_attention_phases_and_memory_bound_kinds():
    q = Tensor("q", (8, 32, 1, 128), "bf16")
    kv = Tensor("k", (8, 8, 1, 128), "bf16")
    out = Tensor("o", (8, 1, 32, 128), "bf16")
    dec = make_leaf("attention", "a", (q, kv, kv), (out,), past=1023, causal=True, window=0)
    assert classify(dec)[0].name == "attention.generation" and classify(dec)[1]["kv_len"] == 1024
    mla = make_leaf("attention", "m", (Tensor("q", (8, 16, 1, 576), "bf16"), Tensor("k", (8, 1, 1, 576), "bf16"),
                                       Tensor("v", (8, 1, 1, 512), "bf16")), (Tensor("o", (8, 1, 16, 512), "bf16"),),
                    past=100, causal=True, window=0, shared_kv=True)
    assert classify(mla)[0].name == "mla.generation"
    x = Tensor("x", (8, 4096), "bf16")
    norm = make_leaf("norm", "n", (x,), (x.renamed("y"),))
    cls, shape = classify(norm)
    assert cls.name == "vector" and shape["bytes"] == 2 * 8 * 4096 * 2
    assert classify(make_leaf("all_reduce", "ar", (x,), (x,), axis="tp", group_size=8)) is None  # NCCL: topology


def test_fitting_recovers_a_known_kernel_family():
    from perfcast.db.calibrate import fit_core

    true = KernelFit(static_s=2.5e-6, overlap=3.0, compute=Ramp(0.7, 3e-5, 0.9), memory=Ramp(0.85, 6e-6, 1.1),
                     item_s={"wave": 2e-10})
    rng = np.random.default_rng(1)
    m, n, k = (2.0 ** rng.integers(0, 15, 400), 2.0 ** rng.integers(7, 15, 400), 2.0 ** rng.integers(7, 15, 400))
    work = KernelWork(2 * m * n * k, 2 * (m * k + k * n + m * n), {"wave": k * np.ceil(np.ceil(m / 128) * np.ceil(n / 128) / 132)})
    t = true.time(work, 989.4e12, 3.35e12)
    got = fit_core(work, t, 989.4e12, 3.35e12)
    err = np.abs(got.time(work, 989.4e12, 3.35e12) / t - 1)
    assert np.median(err) < 0.01 and got.static_s == pytest.approx(2.5e-6, rel=0.1)


#: a GEMM fit of plausible H100 figures, for the tests that need a calibration file
_SYNTHETIC_GEMM_FIT = {"static_s": 2.5e-6, "overlap": 2.5,
                       "compute": {"peak_fraction": 0.75, "half_time_s": 3e-5, "slope": 0.8},
                       "memory": {"peak_fraction": 0.85, "half_time_s": 6e-6, "slope": 1.0}, "item_s": {"wave": 1e-10},
                       "rows": 100, "out_of_sample": {"folds": 5, "median": 0.05, "p90": 0.2}, "source": "synthetic"}


def _gemm_sample(variant, latency_s):
    from perfcast.db.calibrate import Sample

    m = np.array([1.0, 8.0, 64.0, 512.0])
    shapes = {"M": m, "N": np.full(4, 4096.0), "K": np.full(4, 4096.0), "dtype": variant}
    return Sample(CLASSES["gemm"], variant, shapes, np.asarray(latency_s, dtype=float), "MatMul")


def test_a_quantized_gemm_table_slower_than_its_own_bf16_gemms_is_rejected():
    from perfcast.db.calibrate import QUANTIZED_SLOWDOWN, rejection, slowdown

    bf16 = _gemm_sample("bf16", [12.6e-6, 12.6e-6, 12.0e-6, 23.4e-6])  # vLLM 0.24.0 on H200, 4096 x 4096
    native = _gemm_sample("fp8", [12.0e-6, 10.5e-6, 10.8e-6, 22.0e-6])
    slow = _gemm_sample("fp8_block", [61.1e-6, 60.2e-6, 84.0e-6, 83.3e-6])
    assert slowdown(slow, bf16) == (pytest.approx(4.813, rel=1e-3), 4)  # median of 3.56, 4.78, 4.85, 7.0
    assert rejection(native, bf16) is None and rejection(bf16, bf16) is None
    why = rejection(slow, bf16)
    assert why.startswith("its fp8_block GEMMs take a median 4.8x its bf16 GEMMs of the same 4 shapes")
    assert f"more than {QUANTIZED_SLOWDOWN:g}x" in why
    assert rejection(slow, None) is None  # no bf16 table to hold it against: fitted as measured


def test_a_rejected_table_is_priced_by_another_engines_fit_and_says_why():
    from perfcast.perf import AnalyticPerformanceModel
    from perfcast.perf.calibrated import KernelCalibration

    h100 = get_device("h100-sxm")
    fit = _SYNTHETIC_GEMM_FIT
    own = CalibrationFile.model_validate({"schema": 1, "device": "h100-sxm", "framework": "vllm", "version": "v",
                                          "database": "synthetic", "fits": {"gemm/fp8": fit},
                                          "rejected": {"gemm/bf16": "MatMul: too slow"}})
    other = CalibrationFile.model_validate({"schema": 1, "device": "h100-sxm", "framework": "trtllm", "version": "t",
                                            "database": "synthetic", "fits": {"gemm/bf16": fit}})
    model = AnalyticPerformanceModel(h100, calibration=KernelCalibration(h100, own, None, 132, others=(other,)))
    got = model.process_op(_mm(8, 4096, 6144))
    assert ("calibrated gemm/bf16 (trtllm t fit on h100-sxm measurements; vllm v's own table rejected: "
            "MatMul: too slow)") in got.notes


def test_calibration_files_are_strict(tmp_path):
    bad = tmp_path / "x.yaml"
    bad.write_text("schema: 1\ndevice: h100-sxm\nframework: trtllm\nversion: '1'\ndatabase: d\n"
                   "fits: {gemm: {static_s: 1.0e-6, overlap: 2.0, rows: 10, source: s, "
                   "out_of_sample: {folds: 5, median: 0.1, p90: 0.2}}}\n")
    with pytest.raises(SpecError, match=r"key 'fits.gemm': expected '<kernel class>/<variant>'"):
        load_calibration_file(bad)
    bad.write_text(bad.read_text().replace("fits: {gemm:", "fits: {gemm/bf16:").replace("rows: 10", "rows: -1"))
    with pytest.raises(SpecError, match=r"key 'fits.gemm/bf16.rows'"):
        load_calibration_file(bad)


def test_a_symbolic_leaf_is_an_opaque_application_that_realizes_to_the_numeric_price():
    from perfcast.perf import AnalyticPerformanceModel
    from perfcast.perf.calibrated import KernelCalibration

    h100 = get_device("h100-sxm")
    fit = _SYNTHETIC_GEMM_FIT
    cal = CalibrationFile.model_validate({"schema": 1, "device": "h100-sxm", "framework": "trtllm", "version": "t",
                                          "database": "synthetic", "fits": {"gemm/bf16": fit}})
    model = AnalyticPerformanceModel(h100, calibration=KernelCalibration(h100, cal, None, 132))
    sym = model.process_op(_mm(dim("B"), 4096, 6144))
    num = model.process_op(_mm(8, 4096, 6144))
    assert not sym.time_s.is_number and sym.includes_launch
    assert model.realize(sym.time_s.xreplace({dim("B"): 8})) == num.time_s
    f = sympy.lambdify([dim("B")], sym.time_s, modules=[model.numpy_functions(), "numpy"])
    assert f(np.array([8.0]))[0] == pytest.approx(float(num.time_s))
    assert "calibrated gemm/bf16 (trtllm t fit on h100-sxm measurements)" in num.notes
