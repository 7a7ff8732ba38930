"""Engine options (``--engine-option NAME=VALUE``): TensorRT-LLM's MoE backend, its rules and
kernel class, its measured fits and tables, the refusals, and the InferenceX DeepSeek-R1
settings that set it (docs/design/engines.md, "Engine options")."""

from __future__ import annotations

import json
from functools import lru_cache

import pytest
import yaml

from fuzzing import run_cli
from silicon_rows import case
from perfcast.engines import get_engine, resolve
from perfcast.engines.spec import load_profile_file, profiles_dir
from perfcast.hardware import get_device
from perfcast.hardware.calibration import load_calibration_file
from perfcast.hardware.spec import SpecError
from perfcast.inference import silicon
from perfcast.inference.textgen import Request, simulate
from perfcast.capture.parallel import Layout
from perfcast.models import load_model_config
from perfcast.perf.calibrated import to_fit
from perfcast.perf.classify import classify
from perfcast.perf.kernel_classes import CLASSES, MOE_TRTLLM_GEN

TRTLLM_MOE = (("moe_backend", "TRTLLM"),)


@lru_cache(maxsize=None)
def _step(device: str, options=TRTLLM_MOE, decode: bool = True, models=("analytic",)):
    shape = dict(num_queries=8, context_length=1024) if decode else dict(num_queries=1, query_length=4096)
    return simulate(Request(load_model_config("deepseek-v3"), get_device(device), engine="trtllm", decode=decode,
                            quantize="fp4", engine_options=options, performance_models=models,
                            layout=Layout(tp=8, ep=8), moe_routing="balanced", **shape))  # the tables' routing


def _experts(result, model: str = "analytic"):
    return [lt for lt in result.rollups[model].leaves if lt.leaf.kind == "grouped_matmul"]


def test_the_default_is_the_engines_and_the_option_swaps_the_experts_kernel():
    assert get_engine("trtllm").options["moe_backend"].value == "CUTLASS"
    cutlass, gen = _step("b200-sxm", options=()), _step("b200-sxm")
    kernels = lambda r: {str(lt.leaf.attr("kernel")) for lt in r.rollups["analytic"].leaves}  # noqa: E731
    assert {"cutlass_fused_moe", "moe_routing"} <= kernels(cutlass)
    # TRTLLMGenFusedMoE routes inside its runner op: no routing kernel of its own
    assert "fused_moe_trtllm_gen" in kernels(gen) and not {"cutlass_fused_moe", "moe_routing"} & kernels(gen)
    assert {lt.leaf.attr("kernel_class") for lt in _experts(gen)} == {"moe.trtllm_gen"}
    assert any("engine option moe_backend: TRTLLM (trtllm moe_config.backend; set by --engine-option; default "
               "CUTLASS)" == n for n in gen.notes)
    assert any("engine option moe_backend: CUTLASS (trtllm moe_config.backend; the engine's default)" == n
               for n in cutlass.notes)


def test_the_experts_are_priced_by_the_trtllm_backends_own_fit_exactly():
    gen = _step("b200-sxm")
    lt = _experts(gen)[0]
    cls, shape = classify(lt.leaf)
    assert cls is MOE_TRTLLM_GEN and CLASSES["moe.trtllm_gen"].fallback == "moe"
    cal = load_calibration_file(profiles_dir().parent.parent / "hardware" / "calibration" / "b200-sxm" /
                                "trtllm-1.3.0rc20.yaml")
    fit = to_fit(cal.fits["moe.trtllm_gen/fp4"])
    dev = get_device("b200-sxm")
    work = cls.work(shape, dev.spec.datasheet.compute_units)
    rate = dev.spec.datasheet.matrix_flops_per_s["fp4"]
    want = fit.time(work, rate, dev.spec.datasheet.hbm_bandwidth_bytes_per_s)
    assert float(lt.result.time_s) == pytest.approx(float(want), rel=1e-12)
    assert any("moe.trtllm_gen/fp4 ×" in n for n in gen.notes)


@pytest.mark.parametrize("device, kin", [("b300-sxm", "b200-sxm"), ("gb300", "gb200")])
def test_a_device_without_the_backends_table_borrows_its_predecessors_fit_labelled_derived(device, kin):
    # calibration.classes_from: the trtllm-gen kernels were measured on Blackwell only; Blackwell
    # Ultra takes its predecessor's fit at its own peaks (not its own CUTLASS NVFP4 fit), derived
    step = _step(device)
    lt = _experts(step)[0]
    cls, shape = classify(lt.leaf)
    assert get_device(device).spec.calibration.classes_from == {"moe.trtllm_gen": kin}
    cal = load_calibration_file(profiles_dir().parent.parent / "hardware" / "calibration" / kin /
                                "trtllm-1.3.0rc20.yaml")
    dev = get_device(device)
    want = to_fit(cal.fits["moe.trtllm_gen/fp4"]).time(cls.work(shape, dev.spec.datasheet.compute_units),
                                                       dev.spec.datasheet.matrix_flops_per_s["fp4"],
                                                       dev.spec.datasheet.hbm_bandwidth_bytes_per_s)
    assert float(lt.result.time_s) == pytest.approx(float(want), rel=1e-12)
    assert {lt.result.source.value for lt in _experts(step)} == {"derived"}
    assert any(f"fit on {kin} measurements, borrowed for {device} (device spec calibration.classes_from: its own "
               f"measured tables have no moe.trtllm_gen)): moe.trtllm_gen/fp4 ×" in " ".join(n.split()) for n in step.notes)
    # the device's own classes stay its own
    assert any(f"fit on {device} measurements): " in n for n in step.notes)


def test_a_class_lender_must_name_a_kernel_class_and_a_known_device():
    from perfcast.hardware.device import Device
    from perfcast.ir import UserError
    from perfcast.perf.calibrated import kernel_calibration

    dev = get_device("b300-sxm")

    def lending(classes_from):
        cal = dev.spec.calibration.model_copy(update={"classes_from": classes_from})
        return Device(dev.spec.model_copy(update={"calibration": cal}), dev.path)

    with pytest.raises(SpecError, match="device b300-sxm: calibration.classes_from: 'moe.fastest' is not a kernel "
                                        "class"):
        kernel_calibration(lending({"moe.fastest": "b200-sxm"}), "trtllm")
    with pytest.raises(UserError, match="b250"):
        kernel_calibration(lending({"moe.trtllm_gen": "b250"}), "trtllm")
    # and a source, like every number of a device spec
    from perfcast.hardware.spec import Calibration
    data = dev.spec.calibration.model_dump()
    del data["sources"]["classes_from.moe.trtllm_gen"]
    with pytest.raises(ValueError, match="classes_from.moe.trtllm_gen"):
        Calibration.model_validate(data)


def test_block_fp8_experts_take_the_backends_nvfp4_fit_at_their_own_bytes_and_rate():
    # the trtllm-gen block-FP8 runner has no measured table: its own class's NVFP4 fit prices it at
    # block-FP8's bytes and FP8 rate, labelled derived — not the default backend's DeepGEMM fit
    fp8 = simulate(Request(load_model_config("deepseek-v3"), get_device("b200-sxm"), engine="trtllm", decode=True,
                           engine_options=TRTLLM_MOE, layout=Layout(tp=8), num_queries=32, context_length=1500))
    lt = _experts(fp8)[0]
    cls, shape = classify(lt.leaf)
    assert cls is MOE_TRTLLM_GEN and cls.variant(shape) == "fp8_block"
    assert dict(cls.siblings) == {"fp8_block": ("fp4",)}
    cal = load_calibration_file(profiles_dir().parent.parent / "hardware" / "calibration" / "b200-sxm" /
                                "trtllm-1.3.0rc20.yaml")
    dev = get_device("b200-sxm")
    want = to_fit(cal.fits["moe.trtllm_gen/fp4"]).time(cls.work(shape, dev.spec.datasheet.compute_units),
                                                       dev.spec.datasheet.matrix_flops_per_s["fp8"],
                                                       dev.spec.datasheet.hbm_bandwidth_bytes_per_s)
    assert float(lt.result.time_s) == pytest.approx(float(want), rel=1e-12)
    assert lt.result.source.value == "derived"
    assert any("moe.trtllm_gen/fp8_block derived from moe.trtllm_gen/fp4" in n for n in fp8.notes)
    # the default backend (no trtllm-gen kernels) keeps its own block-FP8 fit
    cutlass = simulate(Request(load_model_config("deepseek-v3"), get_device("b200-sxm"), engine="trtllm", decode=True,
                               layout=Layout(tp=8), num_queries=32, context_length=1500))
    assert any("moe/fp8_block ×" in n for n in cutlass.notes)


def test_the_profiling_model_reads_the_backends_table_or_says_it_has_none():
    moe = _experts(_step("b200-sxm", models=("profiling",)), "profiling")
    assert moe and all("GroupedMatMulMinLatency" in " ".join(lt.result.notes) for lt in moe)
    miss = _experts(_step("b300-sxm", models=("profiling",)), "profiling")
    assert miss and all("kernel class moe.trtllm_gen is measured in table GroupedMatMulMinLatency, which this "
                        "database lacks" in " ".join(lt.result.notes) for lt in miss)


def test_the_tables_favour_the_trtllm_kernels_at_decode_sizes_and_cutlass_at_prefill_sizes():
    # the measured curves (balanced routing, DeepSeek's experts at ep 8): 57 vs 119 µs at 8 tokens,
    # 522 vs 330 µs at 4,096; the fits keep the first, not the second (docs/design/engines.md)
    def moe(r, model="analytic"):
        return sum(float(lt.time_s) for lt in _experts(r, model))

    assert moe(_step("b200-sxm")) < moe(_step("b200-sxm", options=()))  # 8 sequences
    prof = ("profiling",)
    assert moe(_step("b200-sxm", models=prof), "profiling") < moe(_step("b200-sxm", (), models=prof), "profiling")
    assert moe(_step("b200-sxm", decode=False, models=prof), "profiling") > \
        moe(_step("b200-sxm", (), decode=False, models=prof), "profiling")  # 4,096 tokens


@pytest.mark.parametrize("argv, message", [
    (["deepseek-v3", "--device", "h200-sxm", "--quantize", "fp4", "--engine-option", "moe_backend=TRTLLM"],
     "--engine-option moe_backend=TRTLLM: trtllm's moe_config.backend TRTLLM runs on b200-sxm, b300-sxm, gb200, "
     "gb300, not h200-sxm"),
    (["deepseek-v3", "--device", "b200-sxm", "--quantize", "fp4", "--engine-option", "moe_backend=WIDEEP"],
     "--engine-option moe_backend=WIDEEP: expected one of CUTLASS, TRTLLM (engine trtllm's moe_config.backend)"),
    (["deepseek-v3", "--device", "b200-sxm", "--engine-option", "colour=red"],
     "--engine-option colour=red: engine trtllm has no option 'colour' (its options: moe_backend, moe_exchange)"),
    (["deepseek-v3", "--device", "b200-sxm", "--engine", "vllm", "--engine-option", "moe_backend=TRTLLM"],
     "--engine-option moe_backend=TRTLLM: engine vllm has no option 'moe_backend' (its options: "
     "allreduce_rms_fusion, moe_mxfp4_activations)"),
    (["gpt-oss-120b", "--device", "h200-sxm", "--engine", "vllm", "--engine-option", "moe_mxfp4_activations=mxfp8"],
     "--engine-option moe_mxfp4_activations=mxfp8: vllm's VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8 (environment: mxfp8 "
     "when 1) mxfp8 runs on b200-sxm, b300-sxm, gb200, gb300, not h200-sxm"),
    (["llama-3.1-8b", "--device", "b200-sxm", "--engine", "vllm", "--engine-option", "moe_mxfp4_activations=mxfp8"],
     "--engine-option moe_mxfp4_activations=mxfp8: llama-3.1-8b has no routed experts"),
    (["qwen3-30b-a3b", "--device", "b200-sxm", "--engine", "vllm", "--engine-option", "moe_mxfp4_activations=mxfp8"],
     "--engine-option moe_mxfp4_activations=mxfp8: vLLM's MXFP4 MoE backends serve MXFP4 experts, and "
     "qwen3-30b-a3b's experts are unquantized here"),
    (["llama-3.1-8b", "--device", "b200-sxm", "--engine-option", "moe_backend=TRTLLM"],
     "--engine-option moe_backend=TRTLLM: llama-3.1-8b has no routed experts"),
    (["deepseek-v3", "--device", "b200-sxm", "--quantize", "none", "--engine-option", "moe_backend=TRTLLM"],
     "--engine-option moe_backend=TRTLLM: TensorRT-LLM's TRTLLM MoE backend serves block-FP8, NVFP4 or MXFP4 "
     "experts, and deepseek-v3's experts are unquantized here (pass --quantize)"),
    (["deepseek-v3", "--device", "b200-sxm", "--engine-option", "moe_backend"],
     "--engine-option 'moe_backend': expected NAME=VALUE (e.g. moe_backend=TRTLLM)"),
    (["deepseek-v3", "--device", "b200-sxm", "--engine-option", "moe_backend=TRTLLM", "--engine-option",
      "moe_backend=CUTLASS"], "--engine-option moe_backend: given twice"),
])
def test_an_option_that_cannot_apply_is_one_line(argv, message):
    rc, out, err = run_cli("text-generate", *argv[:1], "--decode", "--context-length", "64", *argv[1:])
    assert (rc, out, err) == (2, "", f"perfcast text-generate: error: {message}\n")


def test_a_rule_naming_an_undeclared_option_value_is_refused(tmp_path):
    data = {"extends": "trtllm", "name": "mine",
            "rules": [r for r in yaml.safe_load((profiles_dir() / "trtllm.yaml").read_text())["rules"]]}
    data["rules"][0] = {**data["rules"][0], "option": {"moe_backend": "DEEPGEMM"}}
    path = tmp_path / "mine.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(SpecError, match=r"mine.yaml: key 'rules.0.option.moe_backend': 'DEEPGEMM' is not a value of "
                                        r"a declared option \(moe_backend: \['CUTLASS', 'TRTLLM'\], moe_exchange: \['auto', "
                                        r"'all_to_all', 'gather'\]\)$"):
        load_profile_file(path)


def test_the_option_is_matched_case_insensitively_and_keeps_the_profile_apart():
    dev = get_device("b200-sxm")
    a = resolve("trtllm", dev, (("moe_backend", "trtllm"),))
    assert a.options["moe_backend"].value == "TRTLLM" and get_engine("trtllm").options["moe_backend"].value == "CUTLASS"
    assert repr(a) != repr(resolve("trtllm", dev))  # step caches key on the profile


def test_serve_takes_the_option_and_a_deployment_file_carries_it(tmp_path):
    argv = ["--device", "b200-sxm", "--quantize", "fp4", "--tp-size", "8", "--ep-size", "8", "--isl", "256",
            "--osl", "16", "--concurrency", "4", "--tier", "closed-form", "--json"]
    rc, out, err = run_cli("serve", "deepseek-v3", *argv, "--engine-option", "moe_backend=TRTLLM")
    assert rc == 0, err
    rc0, out0, _ = run_cli("serve", "deepseek-v3", *argv)
    assert json.loads(out)["tpot_s"]["mean"] < json.loads(out0)["tpot_s"]["mean"]
    dep = tmp_path / "d.yaml"
    dep.write_text(yaml.safe_dump({"perfcast_deployment": 1, "model": "deepseek-v3", "device": "b200-sxm",
                                   "engine": "trtllm", "quantize": "fp4", "engine_options": {"moe_backend": "TRTLLM"},
                                   "layout": {"tp": 8, "ep": 8}}))
    rc2, out2, err2 = run_cli("serve", "--deployment", str(dep), "--isl", "256", "--osl", "16", "--concurrency", "4",
                              "--tier", "closed-form", "--json")
    assert rc2 == 0, err2
    assert json.loads(out2)["tpot_s"]["mean"] == json.loads(out)["tpot_s"]["mean"]
    rc3, _, err3 = run_cli("serve", "--deployment", str(dep), "--engine-option", "moe_backend=CUTLASS", "--isl", "9")
    assert rc3 == 2 and "--engine-option: --deployment" in err3


# -- the InferenceX DeepSeek-R1 settings ---------------------------------------------------------

DSR1 = {"model_path": "deepseek-ai/DeepSeek-R1", "system": "b200_sxm", "precision": "fp4", "gemm_quant_mode": "nvfp4",
        "moe_quant_mode": "nvfp4", "tp_size": "8", "moe_ep_size": "8"}


def _row(**over) -> silicon.Case:
    return case(**{**DSR1, **over})


def test_deepseek_r1_nvfp4_rows_on_b200_take_the_scripts_moe_backend():
    c = _row()
    assert c.predictable, c.reason
    assert (c.engine_options, c.kv_dtype, c.memory_fraction) == (TRTLLM_MOE, "fp8", 0.8)
    # (the script's max(8192, CONC + ISL + 64 rounded up to 64): 8192 at ISL 1,024)
    assert c.notes[-1].startswith("engine settings of the InferenceX script: KV cache fp8, max num tokens 8192, "
                                  "memory fraction 0.8, moe_backend TRTLLM, CUDA graphs up to "
                                  f"{c.concurrency} sequences (the concurrency) (")
    from perfcast.inference.validation import command
    assert command(c).endswith("--kv-cache-dtype fp8 --engine-option moe_backend=TRTLLM --cuda-graph-max-batch-size "
                               f"{c.concurrency}")
    # with attention DP the scripts switch to CUTLASS
    dp = _row(tp_size="1", attention_dp_size="8", batch_size="4")
    assert dp.predictable, dp.reason
    assert dp.engine_options == (("moe_backend", "CUTLASS"),)
    # FP8 rows: the scripts' MoE backends differ, so the engine's default is kept; H200: CUTLASS
    fp8 = _row(precision="fp8", gemm_quant_mode="fp8_block", moe_quant_mode="fp8_block")
    assert (fp8.engine_options, fp8.kv_dtype, fp8.memory_fraction) == ((), "fp8", None)
    h200 = _row(system="h200_sxm", precision="fp8", gemm_quant_mode="fp8_block", moe_quant_mode="fp8_block")
    assert (h200.engine_options, h200.memory_fraction) == ((("moe_backend", "CUTLASS"),), 0.75)
    assert _row(benchmark="gap-analysis").engine_options == ()


def test_disaggregated_runs_take_their_srt_slurm_recipe_not_the_single_node_scripts():
    # the transcribed scripts launch one single-node server; the campaign's disaggregated runs come
    # from its multi-node configs and their srt-slurm recipes (perfcast.inference.multinode)
    frame = silicon.read()[0]
    row = frame[frame.id == "2026_03_25_deepseek_r1_b200_sxm_trtllm_fp8_disagg_1024x1024_c1920_tp8_0_ep8_0_364"]
    c = silicon.map_row(row.to_dict("records")[0])
    assert c.mode == "disagg" and c.benchmark == "inferencex" and c.predictable
    # its recipe's decode workers: KV cache fp8, the DeepGEMM MoE (not priced: the default stays);
    # no memory fraction of the single-node script
    assert (c.engine_options, c.kv_dtype, c.memory_fraction) == ((), "fp8", None)
    assert any("MoE backend DEEPGEMM, which perfcast's trtllm profile does not price" in n for n in c.notes)


# -- the search ---------------------------------------------------------------------------------

def test_optimize_applies_the_option_to_every_candidate_and_writes_it_out(tmp_path):
    # instances of 2 devices: four layouts (tensor, expert and attention-data parallel), each compiled in seconds
    rc, out, err = run_cli("optimize", "qwen3-30b-a3b", "--devices", "b200-sxm", "--total-devices", "8", "--isl", "1024",
                           "--osl", "64", "--quantize", "fp4", "--engine-option", "moe_backend=trtllm", "--batch-sizes",
                           "8", "--instance-sizes", "2", "--save-dir", str(tmp_path), "--json", timeout_s=600)
    assert rc == 0, err
    doc = json.loads(out)  # the value as the engine names it, whatever its case on the command line
    assert doc["engine_options"] == {"moe_backend": "TRTLLM"} and doc["best"] is not None
    launches = sorted((tmp_path / "launch").iterdir())
    assert len(launches) > 1
    for launch in launches:
        assert yaml.safe_load((launch / "deployment.yaml").read_text())["engine_options"] == {"moe_backend": "TRTLLM"}
        extra = yaml.safe_load((launch / "extra-llm-api-config-serve.yml").read_text())
        assert extra["moe_config"] == {"backend": "TRTLLM"}
    # one without attention DP: serve runs several instances of such a layout as replicas
    first = next(x for x in launches if not yaml.safe_load((x / "deployment.yaml").read_text())["layout"]["attention_dp"])
    rc, out, err = run_cli("serve", "--deployment", str(first / "deployment.yaml"), "--tier", "closed-form", "--json")
    assert rc == 0, err


@pytest.mark.parametrize("command, argv, message", [
    ("optimize", ["llama-3.1-8b", "--devices", "b200-sxm"],
     "--engine-option moe_backend=TRTLLM: llama-3.1-8b has no routed experts"),
    ("optimize", ["qwen3-30b-a3b", "--devices", "h200-sxm,b200-sxm"],
     "--engine-option moe_backend=TRTLLM: trtllm's moe_config.backend TRTLLM runs on b200-sxm, b300-sxm, gb200, gb300, "
     "not h200-sxm; drop it from --devices or drop the option"),
    ("recommend", ["qwen3-30b-a3b", "--devices", "h100-sxm", "--concurrency", "8"],
     "--engine-option moe_backend=TRTLLM: trtllm's moe_config.backend TRTLLM runs on b200-sxm, b300-sxm, gb200, gb300, "
     "not h100-sxm; drop it from --devices or drop the option"),
    ("sensitivity", ["qwen3-30b-a3b", "--device", "h200-sxm", "--concurrency", "8"],
     "--engine-option moe_backend=TRTLLM: trtllm's moe_config.backend TRTLLM runs on b200-sxm, b300-sxm, gb200, gb300, "
     "not h200-sxm"),
])
def test_a_search_whose_option_cannot_apply_everywhere_is_one_line(command, argv, message):
    rc, out, err = run_cli(command, *argv, "--engine-option", "moe_backend=TRTLLM")
    assert (rc, out, err) == (2, "", f"perfcast {command}: error: {message}\n")


# -- vLLM's MXFP4 MoE activations ----------------------------------------------------------------

def _gptoss_vllm(options=()):
    return simulate(Request(load_model_config("gpt-oss-120b"), get_device("b200-sxm"), engine="vllm", decode=True,
                            num_queries=32, context_length=2048, engine_options=options, layout=Layout(tp=2)))


def test_vllm_mxfp4_moe_activations_pick_the_experts_kernel():
    """vLLM on SM100 runs gpt-oss's MXFP4 experts with bf16 activations (SM100_FI_MXFP4_BF16) unless
    VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8=1 (``moe_mxfp4_activations=mxfp8``): then MXFP4 × MXFP8,
    priced by vLLM's own W4A8 MXFP4 fit; attention, router and lm_head stay bf16."""
    base, mx = _gptoss_vllm(), _gptoss_vllm((("moe_mxfp4_activations", "mxfp8"),))
    kernels = {r.quantization["groups"][i]["group"]: r.quantization["groups"][i]["kernel_format"]
               for r in (mx,) for i in range(len(r.quantization["groups"]))}
    assert kernels["experts"] == "w4a8_mxfp4_mxfp8" and kernels.get("attention", "bf16") == "bf16"
    assert {g["group"]: g["kernel_format"] for g in base.quantization["groups"]}["experts"] == "w4a16_mxfp4"
    assert {classify(lt.leaf)[1]["dtype"] for lt in _experts(mx)} == {"w4a8_mxfp4_mxfp8"}
    assert "derived" not in mx.evaluations["analytic"].provenance_shares()  # vLLM's own fit of the format
    assert mx.evaluations["analytic"].time_s < 0.85 * base.evaluations["analytic"].time_s


def test_inferencex_gpt_oss_vllm_b200_rows_take_the_scripts_mxfp8_moe():
    """gptoss_fp4_b200.sh exports VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8=1 (since 5e92867f4); the H200 and
    H100 scripts run vLLM's defaults."""
    over = dict(model_path="openai/gpt-oss-120b", backend="vllm", precision="fp4", gemm_quant_mode="nvfp4",
                moe_quant_mode="nvfp4", tp_size="2", moe_tp_size="2", batch_size="32")
    b200 = case(system="b200_sxm", **over)
    assert b200.predictable, b200.reason
    # (and its compilation config's all-reduce + RMSNorm fusion: docs/design/engines.md, allreduce_rms_fusion)
    assert b200.engine_options == (("allreduce_rms_fusion", "on"), ("moe_mxfp4_activations", "mxfp8"))
    assert "moe_mxfp4_activations mxfp8" in b200.notes[-1]
    from perfcast.inference.validation import command
    assert command(b200).endswith("--engine-option allreduce_rms_fusion=on --engine-option moe_mxfp4_activations=mxfp8")
    assert case(system="h200_sxm", **over).engine_options == ()


def test_the_vllm_launch_command_sets_the_mxfp4_mxfp8_environment():
    from perfcast.search.launch import _command
    from perfcast.search.optimize import SearchSpec
    from perfcast.serving.types import SLO

    def argv(options):
        spec = SearchSpec("gpt-oss-120b", ("b200-sxm",), 8, 1024, 1024, SLO(ttft_s=2.0, tpot_s=0.05), engine="vllm",
                          engine_options=options)
        return _command("vllm", "openai/gpt-oss-120b", Layout(tp=2), 64, {}, spec, 0.9, None)[0]

    assert argv((("moe_mxfp4_activations", "mxfp8"),))[:3] == ["VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8=1", "vllm", "serve"]
    assert argv(())[:2] == ["vllm", "serve"]


def test_the_trtllm_launch_command_forces_the_moe_exchange_it_was_priced_with():
    from perfcast.search.launch import _command
    from perfcast.search.optimize import SearchSpec
    from perfcast.serving.types import SLO

    def argv(options, layout=Layout(dp=8, ep=8, attention_dp=True)):
        spec = SearchSpec("deepseek-v3", ("b200-sxm",), 8, 1024, 1024, SLO(ttft_s=2.0, tpot_s=0.05), engine="trtllm",
                          engine_options=options)
        return _command("trtllm", "deepseek-ai/DeepSeek-V3", layout, 64, {}, spec, 0.9, None)[0]

    assert argv((("moe_exchange", "all_to_all"),))[:2] == ["TRTLLM_FORCE_COMM_METHOD=NVLINK_ONE_SIDED", "trtllm-serve"]
    assert argv((("moe_exchange", "gather"),))[0] == "TRTLLM_FORCE_COMM_METHOD=ALLGATHER"
    assert argv((("moe_exchange", "auto"),))[0] == argv(())[0] == "trtllm-serve"  # the engine's own choice


@pytest.mark.parametrize("flag, mode, says", [
    ("16", "cuda_graph", "graphs captured up to 16 tokens"),
    ("4", "eager", "8 tokens > the largest captured graph, 4"),
    ("0", "eager", "decode: eager launches;"),
])
def test_the_cuda_graph_capture_size_is_the_deployments_launch_setting(flag, mode, says):
    rc, out, err = run_cli("text-generate", "llama-3.1-8b", "--decode", "--num-queries", "8", "--context-length", "100",
                           "--engine", "trtllm", "--cuda-graph-max-batch-size", flag, "--json")
    assert rc == 0, err
    launch = json.loads(out)["engine"]["launch"]
    assert launch["mode"] == mode and says in launch["description"]


@pytest.mark.parametrize("argv, says", [
    (("--engine", "eager", "--cuda-graph-max-batch-size", "4"), "engine eager launches its decode steps eager"),
    (("--engine", "trtllm", "--cuda-graph-max-batch-size", "-1"), "--cuda-graph-max-batch-size"),
])
def test_a_cuda_graph_size_that_cannot_apply_is_one_line(argv, says):
    rc, out, err = run_cli("text-generate", "llama-3.1-8b", "--decode", "--num-queries", "8", "--context-length", "100",
                           *argv)
    assert rc == 2 and out == "" and says in err and len(err.strip().splitlines()) == 1


def test_serve_takes_the_cuda_graph_capture_size_too():
    from perfcast.serving.step import Deployment, compile_step
    from perfcast.serving.types import Mix

    eager = compile_step(Deployment("llama-3.1-8b", "h100-sxm", "trtllm", cuda_graph_max=0), max_tokens=256)
    graphs = compile_step(Deployment("llama-3.1-8b", "h100-sxm", "trtllm"), max_tokens=256)
    assert eager.host_floor_s(True, 8) > 0 == graphs.host_floor_s(True, 8)
    assert eager.step_s(Mix(8, 8 * 512)) > graphs.step_s(Mix(8, 8 * 512))


def test_the_figures_that_choose_the_trtllm_backends_fits_are_the_benchmarks():
    """The evidence docs/design/engines.md, calibration.md and the B300/GB300 specs quote for
    pricing the TRTLLM backend by its own kernel family and by its predecessor device:
    ``benchmarks/kernel_accuracy.py --cross-format`` and its cross-device transfer (MoE family)."""
    import runpy
    from pathlib import Path

    import perfcast

    bench = runpy.run_path(str(Path(perfcast.__file__).parents[2] / "benchmarks" / "kernel_accuracy.py"))
    pairs = {(r["device"], r["target"], r["fit"]): (round(r["median"] * 100, 1), round(r["signed_median"] * 100, 1))
             for d in ("b200-sxm", "gb200") for r in bench["cross_format"](d, "trtllm", {"moe"})}
    assert pairs["b200-sxm", "moe.trtllm_gen/fp4", "moe/fp4"] == (62.0, 60.0)
    assert pairs["gb200", "moe.trtllm_gen/fp4", "moe/fp4"] == (55.5, 51.6)
    assert pairs["b200-sxm", "moe.trtllm_gen/fp4", "moe/fp8_block"] == (44.5, 31.8)
    assert pairs["b200-sxm", "moe.trtllm_gen/fp4", "moe/fp8"][0] == 33.7
    assert pairs["b200-sxm", "moe/fp8", "moe/bf16"][0] == 9.2 and pairs["b200-sxm", "moe/fp8", "moe/fp4"][0] == 31.4
    for src, dst, lo, hi in (("b200-sxm", "b300-sxm", 3.9, 13.0), ("gb200", "gb300", 2.8, 13.7)):
        medians = [round(r["model"]["median"] * 100, 1) for r in bench["transfer"](src, dst, "trtllm", {"moe"})]
        assert (min(medians), max(medians)) == (lo, hi)
    (gen,) = [r for r in bench["transfer"]("b200-sxm", "gb200", "trtllm", {"moe"}) if r["class"] == "moe.trtllm_gen"]
    assert round(gen["model"]["median"] * 100, 1) == 15.8


def test_vllm_all_reduce_rmsnorm_fusion_is_an_option_and_off_is_one_more_kernel_per_norm():
    def step(options):
        return simulate(Request(load_model_config("llama-3.1-70b"), get_device("h100-sxm"), engine="vllm", decode=True,
                                num_queries=16, context_length=1536, layout=Layout(tp=8), engine_options=options))

    from perfcast.report.textgen import kernel_sequence

    on, off = step(()), step((("allreduce_rms_fusion", "off"),))
    body = lambda r: kernel_sequence(r)["layers[0]×80"]  # noqa: E731
    assert body(on).count("flashinfer_allreduce_rmsnorm") == 2 and "flashinfer_allreduce_rmsnorm" not in body(off)
    assert body(off).count("triton_fused_add_rms_norm") == 2 and len(body(off)) == len(body(on)) + 2
    assert off.evaluations["analytic"].time_s > on.evaluations["analytic"].time_s
    assert get_engine("vllm").options["allreduce_rms_fusion"].value == "on"


def test_vllm_rows_of_releases_before_0_17_run_without_the_fusion():
    import pandas as pd

    def row(version, measured):
        return {"id": f"r{version}{measured}", "backend": "vllm", "backend_version": version,
                "model_path": "meta-llama/Llama-3.1-70B", "system": "h100_sxm", "precision": "fp8", "mode": "agg",
                "isl": "1024", "osl": "1024", "gemm_quant_mode": "fp8", "moe_quant_mode": "fp8", "batch_size": "16",
                "tp_size": "8", "pp_size": "1", "attention_dp_size": "1", "moe_tp_size": "8", "moe_ep_size": "1",
                "silicon_ttft_ms": "90", "silicon_tpot_ms": "11", "concurrency": "16", "benchmark": "gap-analysis",
                "collection": "x.csv", "measured": measured}

    rows = [row("0.16.0", "2026-03-01"), row("0.17.0", "2026-03-20"), row("nightly-5b8c30d6", ""),
            row("", "2025-10-29"), row("", "2026-03-25"), row("", "")]
    cases = [c.engine_options for c in silicon.map_frame(pd.DataFrame(rows))]
    off = (("allreduce_rms_fusion", "off"),)
    assert cases == [off, (), (), off, (), ()]   # an unstated version: dated by its day against the merge


def test_the_vllm_launch_command_turns_the_fusion_off_where_it_was_priced_off():
    from perfcast.search.launch import _command
    from perfcast.search.optimize import SearchSpec
    from perfcast.serving.types import SLO

    spec = SearchSpec("llama-3.1-70b", ("h100-sxm",), 8, 1024, 1024, SLO(ttft_s=2.0, tpot_s=0.05), engine="vllm",
                      engine_options=(("allreduce_rms_fusion", "off"),))
    argv = _command("vllm", "meta-llama/Llama-3.1-70B-Instruct", Layout(tp=8), 64, {}, spec, 0.9, None)[0]
    assert argv[argv.index("--compilation-config") + 1] == '{"pass_config": {"fuse_allreduce_rms": false}}'
