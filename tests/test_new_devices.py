"""The Blackwell (GB200, B300, GB300) and CDNA 3/4 (MI325X, MI355X) devices: exact datasheet
figures, their topologies (an NVL72 rack is one NVLink domain, an HGX B300 board is eight),
their kernel calibrations pricing a step, and the AMD parts borrowing a lender's fits and
saying so."""

import json

import pytest
import sympy

from perfcast.capture.parallel import Layout
from perfcast.hardware import get_device
from perfcast.hardware.calibration import find_calibration, load_calibration_file
from perfcast.hardware.topology import get_topology
from perfcast.inference.textgen import Request, default_topology, simulate
from perfcast.ir import Tensor, make_leaf
from perfcast.models import load_model_config
from perfcast.perf import AnalyticPerformanceModel
from perfcast.perf.calibrated import kernel_calibration

NEW = ("gb200", "b300-sxm", "gb300", "mi325x", "mi355x")
MEASURED = ("gb200", "b300-sxm", "gb300")  # aiconfigurator-core 0.12.0 has kernel tables for these
ENGINE_VERSIONS = {"trtllm": "1.3.0rc20", "vllm": "0.24.0", "sglang": "0.5.14"}  # the engine profiles'


def test_exact_datasheet_figures():
    gb200, b300, gb300 = get_device("gb200"), get_device("b300-sxm"), get_device("gb300")
    # GB200 NVL72: 360 PFLOPS sparse BF16 per 72 GPUs → 5 sparse, 2.5 dense per GPU; 576 TB/s / 72 = 8 TB/s
    assert gb200.matrix_flops_per_s("bf16") == sympy.Integer(2_500_000_000_000_000)
    assert gb200.hbm_bandwidth_bytes_per_s == sympy.Integer(8_000_000_000_000)
    # HGX B300: 108 PFLOPS dense FP4 / 8 GPUs = 13.5; 62 TB/s / 8 = 7.75 TB/s; 288 GB per GPU, which
    # nvidia-smi reports as 275,040 MiB (the total the engines size their KV cache from)
    assert b300.matrix_flops_per_s("fp4") == sympy.Integer(13_500_000_000_000_000)
    assert b300.hbm_bandwidth_bytes_per_s == sympy.Integer(7_750_000_000_000)
    assert b300.hbm_capacity_bytes == sympy.Integer(275_040 * 2**20)
    # Blackwell Ultra cuts INT8: 307 TOPS sparse / 2 = 153.5 TOPS dense, far below B200's 4.5 POPS
    assert b300.matrix_flops_per_s("int8") == sympy.Integer(153_500_000_000_000)
    # GB300: 15 PFLOPS dense NVFP4 (Inside NVIDIA Blackwell Ultra)
    assert gb300.matrix_flops_per_s("fp4") == sympy.Integer(15_000_000_000_000_000)
    mi325x, mi355x = get_device("mi325x"), get_device("mi355x")
    # MI325X: 304 CUs x 2048 x 2.1 GHz = 1,307.4 TFLOPS dense BF16; 256 GiB = 274.878e9 B, written 274.88e9
    assert mi325x.matrix_flops_per_s("bf16") == sympy.Integer(1_307_400_000_000_000)
    assert mi325x.hbm_capacity_bytes == sympy.Integer(274_880_000_000)
    # MI355X: 256 CUs x 4096 x 2.4 GHz = 2,516.6 TFLOPS; MXFP4 256 x 16,384 x 2.4 GHz = 10,066.3
    assert mi355x.matrix_flops_per_s("bf16") == sympy.Integer(2_516_600_000_000_000)
    assert mi355x.matrix_flops_per_s("fp4") == sympy.Integer(10_066_300_000_000_000)
    with pytest.raises(ValueError, match="no matrix rate for tf32"):  # CDNA 4 has no TF32 matrix rate
        mi355x.matrix_flops_per_s("tf32")
    with pytest.raises(ValueError, match="no matrix rate for fp4"):  # CDNA 3 has no FP4
        mi325x.matrix_flops_per_s("fp4")


@pytest.mark.parametrize("name", NEW)
def test_unpublished_figures_are_labelled_estimates(name):
    d = get_device(name)
    sources = d.spec.sources
    if d.spec.vendor == "NVIDIA":  # NVIDIA publishes neither SM count nor clock of these parts
        assert sources["clock_hz"].startswith("estimate:") and sources["compute_units"].startswith("estimate:")
    else:  # AMD publishes both: 2.1 / 2.4 GHz peak engine clock, 304 / 256 CUs
        assert "datasheet" in sources["clock_hz"] and not sources["compute_units"].startswith("estimate:")
    assert d.spec.default_engine.reason


@pytest.mark.parametrize("device, topology", [("gb200", "gb200-nvl72"), ("gb300", "gb300-nvl72"),
                                              ("b300-sxm", "hgx-b300"), ("mi325x", "mi325x-platform"),
                                              ("mi355x", "mi355x-platform")])
def test_each_device_has_exactly_one_default_topology(device, topology):
    assert default_topology(device).name == topology


@pytest.fixture(scope="module")
def moe(tmp_path_factory):
    """A small MoE model with 288 routed experts (divisible by 16, 32 and 72)."""
    path = tmp_path_factory.mktemp("moe") / "config.json"
    path.write_text(json.dumps({
        "model_type": "qwen3_moe", "hidden_size": 256, "num_attention_heads": 16, "num_key_value_heads": 16,
        "head_dim": 32, "intermediate_size": 512, "moe_intermediate_size": 128, "num_experts": 288,
        "num_experts_per_tok": 4, "num_hidden_layers": 2, "vocab_size": 576, "max_position_embeddings": 4096,
        "norm_topk_prob": True, "decoder_sparse_step": 1, "mlp_only_layers": [], "tie_word_embeddings": False}))
    return load_model_config(str(path))


def _layout_note(model, device, layout) -> str:
    r = simulate(Request(model, get_device(device), layout=layout, performance_models=("analytic",),
                         num_queries=18, query_length=64))
    (note,) = [n for n in r.notes if n.startswith("layout:")]
    return note


@pytest.mark.parametrize("layout, axes", [
    (Layout(tp=16, ep=16), "tp: 16 on nvlink; ep: 16 on nvlink"),
    (Layout(tp=16, ep=32, dp=2, attention_dp=True), "tp: 16 on nvlink; dp: 2 on nvlink; ep: 32 on nvlink"),
    (Layout(tp=8, ep=72, dp=9, attention_dp=True), "tp: 8 on nvlink; dp: 9 on nvlink; ep: 72 on nvlink"),
])
def test_nvl72_layouts_up_to_a_rack_stay_on_nvlink(moe, layout, axes):
    note = _layout_note(moe, "gb200", layout)
    assert f"on {layout.num_devices} devices of gb200-nvl72 — {axes}" in note
    assert "infiniband" not in note


def test_hgx_b300_at_16_gpus_crosses_the_scale_out_network(moe):
    note = _layout_note(moe, "b300-sxm", Layout(tp=8, ep=16, dp=2, attention_dp=True))
    assert "on 16 devices of hgx-b300 — tp: 8 on nvlink; dp: 2 on infiniband; ep: 8 on nvlink × 2 on infiniband" in note


def test_an_ep_group_of_two_racks_crosses_infiniband():
    # 144 GPUs = 2 racks of 72: NVLink inside each rack, then InfiniBand between them
    assert [(t.name, k) for t, k in get_topology("gb200-nvl72").span(144)] == [("nvlink", 72), ("infiniband", 2)]


@pytest.mark.parametrize("device", MEASURED)
@pytest.mark.parametrize("framework", sorted(ENGINE_VERSIONS))
def test_calibrations_exist_for_the_engine_profiles_versions_and_price_a_gemm(device, framework):
    version = ENGINE_VERSIONS[framework]
    path = find_calibration(device, framework, version)
    assert path is not None and path.name == f"{framework}-{version}.yaml"
    cal_file = load_calibration_file(path)
    assert cal_file.device == device and cal_file.framework == framework
    gemm = cal_file.fits["gemm/bf16"]
    assert gemm.rows > 1000 and gemm.out_of_sample.folds == 5 and gemm.out_of_sample.median < 0.15
    d = get_device(device)
    cal = kernel_calibration(d, framework, version)
    assert cal.label == f"{framework} {version} fit on {device} measurements"  # its own, not borrowed
    mm = make_leaf("matmul", "mm", (Tensor("x", (8, 4096), "bf16"), Tensor("w", (4096, 4096), "bf16")),
                   (Tensor("y", (8, 4096), "bf16"),), op="aten.mm.default")
    r = AnalyticPerformanceModel(d, calibration=cal).process_op(mm)
    # a batch-8 decode GEMM streams its 33.7 MB of weights: at most HBM speed (33,685,504 B / 8e12
    # B/s = 4.2 µs), and well under 50 µs
    assert 33_685_504 / d.hbm_bandwidth_bytes_per_s < r.time_s < sympy.Rational(50, 10**6)
    assert any(f"fit on {device} measurements" in n for n in r.notes)


@pytest.mark.parametrize("device, lender", [("mi325x", "h200-sxm"), ("mi355x", "gb200")])
def test_amd_parts_borrow_the_nearest_calibrated_device_and_say_so(device, lender):
    d = get_device(device)
    assert d.lender == lender  # nearest in log bf16 peak and log HBM bandwidth
    assert kernel_calibration(d, "vllm", "0.24.0").label == \
        f"vllm 0.24.0 fit on {lender} measurements, borrowed for {device}"
    req = Request(model=load_model_config("llama-3.1-8b"), device=d, num_queries=8, query_length=1,
                  context_length=1088, decode=True)
    r = simulate(req)
    assert r.engine.name == "vllm"  # the device's default engine
    assert any(f"borrowed for {device}" in n for n in r.notes)


def test_nvlink_tiers_carry_nccl_fits_and_gb300_holds_out_its_rows():
    """hgx-b300 and gb200-nvl72 are fitted on their own NCCL rows; gb300-nvl72 takes GB200's
    values unchanged, so its rows are held out: their overall median |error| (all-reduce,
    all-gather, reduce-scatter) is under the 10 % target where the datasheet is over 50 % off."""
    import runpy
    from pathlib import Path

    import perfcast

    ops = {"all_reduce", "all_gather", "reduce_scatter", "all_to_all"}
    nvlink = {n: get_topology(n).tiers[0] for n in ("hgx-b300", "gb200-nvl72", "gb300-nvl72")}
    assert all({op for op, _ in t.calibration} == ops for t in nvlink.values())
    assert nvlink["gb300-nvl72"].calibration == nvlink["gb200-nvl72"].calibration
    assert nvlink["hgx-b300"].calibration != nvlink["gb200-nvl72"].calibration
    bench = runpy.run_path(str(Path(perfcast.__file__).parents[2] / "benchmarks" / "nccl_accuracy.py"))
    (overall,) = [line for line in bench["summary"](device="gb300") if line[:2] == ("overall", "all sizes")]
    _, _, rows, median, _, datasheet_median, _ = overall
    assert rows == 3 * 84 and median < 0.10 and datasheet_median > 0.5
