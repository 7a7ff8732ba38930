"""DeepSeek sparse attention's prefill kernel measured and fitted (docs/design/calibration.md, "DSA
sparse attention"): aiconfigurator-core's GLM-5 ``glm5_dsa_attn_module`` tables converted with the
heads the kernel ran, the class that pads a rank's heads to FlashMLA's tile, its fits in the
shipped SGLang calibration files, and the dense path SGLang takes at or below ``index_topk``
cached tokens."""

from __future__ import annotations

import pandas as pd
import pytest
import sympy

from perfcast.db.aic_tables import SPARSE_MLA, kernel_heads, sparse_mla
from perfcast.hardware import get_device
from perfcast.inputs import load_yaml
from perfcast.ir import Tensor, UserError, make_leaf
from perfcast.perf import AnalyticPerformanceModel
from perfcast.perf.calibrated import kernel_calibration
from perfcast.perf.classify import classify
from perfcast.perf.databases import shipped_root
from perfcast.perf.kernel_classes_dsa import DSA_SPARSE_PREFILL, head_tile, sparse_prefill_work


def leaf(b, s, past, heads=8):
    """GLM-5's sparse attention on one TP-8 rank: 8 of 64 heads, latent 512 + rope 64, top 2,048."""
    ins = (Tensor("q", (b, heads, s, 576), "bf16"), Tensor("kv", (b, 1, past + s, 576), "bf16"),
           Tensor("v", (b, 1, past + s, 512), "bf16"), Tensor("idx", (b, s, 2048), "int32"))
    return make_leaf("sparse_attention", "dsa", ins, (Tensor("o", (b, heads, s, 512), "bf16"),),
                     op="perfcast.sparse_attention.default", past=past, shared_kv=True, cache_width=576, topk=2048)


def measured(device, **key):
    d = pd.read_csv(shipped_root() / device / "sglang" / "0.5.14" / "SparseMLAPrefill.csv.gz")
    for k, v in key.items():
        d = d[d[k] == v]
    assert len(d) == 1
    return float(d.latency_us.iloc[0])


def test_the_converter_keeps_prefill_rows_with_the_heads_the_kernel_ran():
    raw = pd.DataFrame({"device": ["NVIDIA H200", "NVIDIA H200", "NVIDIA B200"], "num_heads": 64,
                        "batch_size": [1, 8, 1], "isl": [1024, 1, 8192], "step": [0, 4096, 0],
                        "mla_dtype": "bfloat16", "kernel_source": "flash_mla_sparse_fwd", "latency": [0.48, 0.06, 4.0]})
    (k, df), = sparse_mla(raw[raw.device == "NVIDIA H200"], "sglang")
    assert k.name == "SparseMLAPrefill" and k.keys == SPARSE_MLA and k.counts["dropped_decode_rows"] == 1
    assert df[["seq_len", "past", "heads", "topk", "head_dim", "v_head_dim"]].values.tolist() == [[1024, 0, 64, 2048, 576, 512]]
    (_, df), = sparse_mla(raw[raw.device == "NVIDIA B200"], "sglang")
    assert df.heads.tolist() == [128]  # the collector pads to 128 on SM100+
    assert kernel_heads("NVIDIA H100 80GB HBM3", 64) == 64 and kernel_heads("NVIDIA GB300", 64) == 128
    with pytest.raises(UserError, match="not an NVIDIA GPU"):
        kernel_heads("AMD Instinct MI300X", 64)


def test_the_shipped_sglang_databases_hold_the_table():
    for device, heads in (("h100-sxm", 64), ("h200-sxm", 64), ("b200-sxm", 128), ("gb300", 128)):
        d = pd.read_csv(shipped_root() / device / "sglang" / "0.5.14" / "SparseMLAPrefill.csv.gz")
        assert set(d.heads) == {heads} and (d.seq_len > 1).all() and len(d) > 2800, device
    # measured on one rank of 64 heads: the time follows the tokens, not the context
    assert measured("h200-sxm", batch=1, seq_len=8192, past=0) == pytest.approx(
        measured("h200-sxm", batch=1, seq_len=8192, past=32768), rel=0.05)


def test_a_rank_pads_its_heads_to_the_device_tile():
    assert head_tile(get_device("h200-sxm")) == {"head_tile": 64}
    assert head_tile(get_device("b300-sxm")) == {"head_tile": 128}
    assert head_tile(get_device("a100-sxm-80gb")) == {} and head_tile(get_device("mi300x")) == {}
    cls, shape = classify(leaf(1, 4096, 0))
    assert cls is DSA_SPARSE_PREFILL and shape["heads"] == 8
    eight = sparse_prefill_work({**shape, "head_tile": 64}, 132)
    full = sparse_prefill_work({**shape, "heads": 64}, 132)
    assert eight.flops == full.flops == 2 * 4096 * 64 * 2048 * (576 + 512)
    assert classify(leaf(8, 1, 4096)) is None  # a decode step runs other kernels


@pytest.mark.parametrize("device", ["h200-sxm", "b200-sxm"])
def test_the_fit_prices_a_tp8_rank_as_the_measured_full_tile(device):
    d = get_device(device)
    model = AnalyticPerformanceModel(d, calibration=kernel_calibration(d, "sglang", "0.5.14"))
    for s, past in ((8192, 0), (4096, 4096)):
        r = model.process_op(leaf(1, s, past))
        want = measured(device, batch=1, seq_len=s, past=past)
        assert float(r.time_s) == pytest.approx(want * 1e-6, rel=0.1), (s, past)
        assert r.notes[0].startswith("calibrated dsa.sparse_prefill/bf16 (sglang 0.5.14")
    # before: the rule's 8 heads at the efficiency curves, a tenth of the measured kernel
    assert float(AnalyticPerformanceModel(d).process_op(leaf(1, 8192, 0)).time_s) < 0.15 * measured(
        device, batch=1, seq_len=8192, past=0) * 1e-6


def test_sglang_attends_short_contexts_densely():
    h200 = get_device("h200-sxm")
    cal = AnalyticPerformanceModel(h200, calibration=kernel_calibration(h200, "sglang", "0.5.14"))
    plain = AnalyticPerformanceModel(h200)
    short = leaf(1, 1024, 1024)  # 2,048 tokens of context: SGLang's MHA_ONE_SHOT
    assert cal.process_op(short).time_s == plain.process_op(short).time_s
    assert "SGLang's MHA_ONE_SHOT" in cal.process_op(short).notes[-1]
    assert cal.resource_times(short) == plain.resource_times(short)
    # a symbolic chunk prices both paths, switched at index_topk
    s, p = sympy.symbols("S P", positive=True, integer=True)
    r = cal.process_op(leaf(1, s, p))
    assert isinstance(r.time_s, sympy.Piecewise) and any("dsa.sparse_prefill where" in n for n in r.notes)
    at = {s: 1024, p: 1024}
    assert float(cal.realize(r.time_s.subs(at))) == pytest.approx(float(plain.process_op(short).time_s + cal.launch_overhead().time_s))
    assert float(cal.realize(r.time_s.subs({s: 4096, p: 4096}))) == pytest.approx(float(cal.process_op(leaf(1, 4096, 4096)).time_s))


def test_every_fit_names_its_out_of_sample_error():
    found = 0
    for path in sorted((shipped_root().parent.parent / "hardware" / "calibration").glob("*/sglang-0.5.14.yaml")):
        fits = load_yaml(path)["fits"]
        if "dsa.sparse_prefill/bf16" in fits:
            found += 1
            assert fits["dsa.sparse_prefill/bf16"]["out_of_sample"]["median"] < 0.05, path
    assert found == 6
