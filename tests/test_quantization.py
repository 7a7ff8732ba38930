"""Quantization as the checkpoint says: per-leaf formats, weight-only fp4 on Hopper, the report."""

import json
from fractions import Fraction

import pytest

from perfcast.capture.parallel import Layout
from perfcast.hardware import get_device
from perfcast.inference.textgen import Request, simulate
from perfcast.ir import Leaf, itemsize, walk
from perfcast.models import load_model_config
from perfcast.perf.classify import classify


def _linears(result) -> dict[str, Leaf]:
    """The first leaf of each GEMM module in the priced step."""
    out = {}
    for v in walk(result.lowered.graph):
        if isinstance(v.op, Leaf) and v.op.kind in ("matmul", "grouped_matmul"):
            out.setdefault(str(v.op.attr("module")), v.op)
    return out


def _step(model, device, **kw):
    return simulate(Request(model, get_device(device), num_queries=8, context_length=1024, decode=True, **kw))


def _write(tmp_path, base: str, quantization_config=None, hf_quant_config=None):
    data = dict(load_model_config(base).data)
    if quantization_config is not None:
        data["quantization_config"] = quantization_config
    (tmp_path / "config.json").write_text(json.dumps(data))
    if hf_quant_config is not None:
        (tmp_path / "hf_quant_config.json").write_text(json.dumps(hf_quant_config))
    return str(tmp_path / "config.json")


def test_scaled_storage_types_count_their_scales():
    assert itemsize("fp4+fp8/16") == Fraction(1, 2) + Fraction(1, 16)  # NVFP4: 9/16 byte
    assert itemsize("fp4+e8m0/32") == Fraction(17, 32)  # MXFP4
    assert itemsize("fp8+fp32/16384") == 1 + Fraction(4, 128 * 128)  # 128×128 blocks
    assert itemsize("int4+fp16/128+int4/128") == Fraction(1, 2) + Fraction(2, 128) + Fraction(1, 256)
    with pytest.raises(ValueError):
        itemsize("fp4+fp8")


def test_gpt_oss_experts_mxfp4_attention_bf16():
    m = load_model_config("gpt-oss-120b")
    r = _step(m, "h200-sxm")
    leaves = _linears(r)
    experts, qkv = leaves["model.layers.0.mlp.experts"], leaves["model.layers.0.self_attn"]
    # experts: MXFP4 weights (17/32 byte with the E8M0 scale per 32), bf16 activations and math
    assert [t.dtype for t in experts.inputs[:3]] == ["bf16", "fp4+e8m0/32", "fp4+e8m0/32"]
    assert classify(experts)[1]["dtype"] == "w4a16_mxfp4" and experts.dtype == "bf16"
    # attention, router and lm_head are in modules_to_not_convert: bf16 GEMMs
    for name in ("model.layers.0.self_attn", "model.layers.0.self_attn.o_proj", "model.layers.0.mlp.router", "lm_head"):
        assert classify(leaves[name])[1]["dtype"] == "bf16" and leaves[name].attr("quant_format") is None
    assert qkv.inputs[-1].dtype == "bf16"
    # weights: 36 layers × 128 experts × 2880 × (5760 + 2880) expert elements at 17/32 byte, the
    # rest as in bf16: the checkpoint's bytes are bf16's less 114,661,785,600 × (2 − 17/32)
    bf16 = _step(m, "h200-sxm", quantize="none")
    experts_elems = 36 * 128 * 2880 * (5760 + 2880)
    assert experts_elems == 114_661_785_600
    assert bf16.memory.weights_bytes - r.memory.weights_bytes == experts_elems * 47 // 32 == 168_409_497_600
    assert r.memory.weights_bytes == 65_248_815_744


def test_gpt_oss_on_blackwell_takes_the_engines_kernel():
    # TensorRT-LLM quantizes an MXFP4 checkpoint's activations to MXFP8 on SM ≥ 100
    # (ModelConfig.get_mxfp4_quant_algo); vLLM's default keeps them bf16
    m = load_model_config("gpt-oss-120b")
    trt = _linears(_step(m, "b200-sxm", engine="trtllm"))["model.layers.0.mlp.experts"]
    vllm = _linears(_step(m, "b200-sxm", engine="vllm"))["model.layers.0.mlp.experts"]
    assert (classify(trt)[1]["dtype"], trt.inputs[0].dtype, trt.dtype) == ("w4a8_mxfp4_mxfp8", "fp8+e8m0/32", "fp8")
    assert (classify(vllm)[1]["dtype"], vllm.inputs[0].dtype) == ("w4a16_mxfp4", "bf16")
    # MXFP8 activations: 1 + 1/32 byte per element, as the fit's format counts them
    assert classify(trt)[1]["bytes_per_element"][0] == 1 + Fraction(1, 32)


def test_deepseek_fp8_block_scaled_with_bf16_lm_head():
    m = load_model_config("deepseek-v3")  # DeepSeek-V3/R1: quant_method fp8, weight_block_size [128, 128]
    r = simulate(Request(m, get_device("h200-sxm"), num_queries=8, context_length=1024, decode=True,
                         layout=_layout(tp=8, ep=8)))
    leaves = _linears(r)
    q_a = leaves["model.layers.0.self_attn"]  # q_a_proj + kv_a_proj_with_mqa, one fused GEMM
    assert q_a.attr("quant_format") == "fp8_block" and q_a.dtype == "fp8"
    # one fp32 scale per 128×128 weight block and per 1×128 activation tile
    assert q_a.inputs[-1].dtype == "fp8+fp32/16384" and q_a.inputs[0].dtype == "fp8+fp32/128"
    assert classify(leaves["model.layers.3.mlp.experts"])[1]["dtype"] == "fp8_block"
    assert classify(leaves["lm_head"])[1]["dtype"] == "bf16"
    assert classify(leaves["model.layers.3.mlp.gate"])[1]["dtype"] != "fp8_block"  # the router
    assert any("gemm/fp8_block" in n and "moe/fp8_block" in n for n in r.notes)


@pytest.mark.parametrize("name", ["deepseek-v3.2", "glm-5-fp8"])
def test_dsa_indexer_weights_proj_stays_unquantized(name):
    """transformers keeps the model class's ``_keep_in_fp32_modules`` out of every quantizer
    (DeepSeek-V3.2, GLM-5: ``indexer.weights_proj``; quantizers/base.py get_modules_to_not_convert),
    which the checkpoints' own lists do not name in transformers' module names: the architecture
    row's ``keep_unquantized`` keeps it in the model dtype, the indexer's other projections FP8."""
    from perfcast.models.quant_configs import read

    q = read(load_model_config(name))
    assert q.scheme("model.layers.3.self_attn.indexer.weights_proj", "attention") is None
    assert q.scheme("model.layers.3.self_attn.indexer.wk", "attention") is not None
    assert q.scheme("model.layers.3.self_attn.indexer.wq_b", "attention") is not None
    # a row without keep_unquantized adds nothing (DeepSeek-V3: lm_head aside, every linear FP8)
    assert read(load_model_config("deepseek-v3")).rules == ()


def _layout(**kw):
    from perfcast.capture.parallel import Layout
    return Layout(**kw)


NVFP4 = {"producer": {"name": "modelopt"},
         "quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": "FP8", "group_size": 16,
                          "exclude_modules": ["lm_head"]}}


def test_nvfp4_weight_only_on_hopper_native_on_blackwell(tmp_path):
    m = load_model_config(_write(tmp_path, "qwen3-32b", hf_quant_config=NVFP4))
    h100, b200 = _step(m, "h100-sxm"), _step(m, "b200-sxm")
    hq, bq = _linears(h100)["model.layers.0.mlp.down_proj"], _linears(b200)["model.layers.0.mlp.down_proj"]
    # Hopper: NVFP4 weights widened inside the GEMM (vLLM Marlin NVFP4), bf16 activations and rate
    assert (hq.attr("quant_format"), hq.dtype, hq.inputs[0].dtype, hq.inputs[-1].dtype) == \
        ("w4a16_nvfp4", "bf16", "bf16", "fp4+fp8/16")
    # Blackwell: FP4 × FP4 tensor cores, activations quantized to NVFP4 too
    assert (bq.attr("quant_format"), bq.dtype, bq.inputs[0].dtype) == ("fp4", "fp4", "fp4+fp8/16")
    assert any("gemm/w4a16_nvfp4 derived from gemm/bf16" in n for n in h100.notes)
    # no w4a16_nvfp4 fit on H100: the bf16 GEMM's fit prices it, and the time says derived
    assert "derived" in h100.evaluations["analytic"].provenance_shares()
    assert "derived" not in b200.evaluations["analytic"].provenance_shares()
    assert any("weight-only" in n and n.startswith("mlp:") for n in h100.notes)
    assert any("fp4 × fp4" in n and n.startswith("mlp:") for n in b200.notes)
    # weights alike on both: 64 layers × 487,587,840 linear elements at 9/16 byte instead of 2
    bf16 = _step(m, "h100-sxm", quantize="none")
    linear = 64 * (5120 * 8192 * 2 + 5120 * 1024 * 2 + 3 * 5120 * 25600)
    assert linear == 31_205_621_760
    assert bf16.memory.weights_bytes - h100.memory.weights_bytes == linear * 23 // 16 == 44_858_081_280
    assert h100.memory.weights_bytes == b200.memory.weights_bytes
    # kv_cache_quant_algo FP8: 64 layers × 8 KV heads × 128 × (K, V) × 1 byte per token
    assert h100.memory.kv_cache_bytes_per_token == 64 * 8 * 128 * 2 == 131_072
    assert bf16.memory.kv_cache_bytes_per_token == 131_072  # --quantize leaves the stated KV dtype
    assert _step(m, "h100-sxm", kv_dtype="bf16").memory.kv_cache_bytes_per_token == 262_144


@pytest.mark.parametrize("group, per_element", [
    (128, Fraction(1, 2) + Fraction(2, 128) + Fraction(1, 2 * 128)),  # int4, fp16 scale, int4 zero
    (64, Fraction(1, 2) + Fraction(2, 64) + Fraction(1, 2 * 64)),
])
def test_awq_group_size_in_weight_bytes(tmp_path, group, per_element):
    qc = {"quant_method": "awq", "bits": 4, "group_size": group, "zero_point": True, "version": "gemm"}
    m = load_model_config(_write(tmp_path, "llama-3.1-8b", quantization_config=qc))
    r = simulate(Request(m, get_device("h100-sxm"), num_queries=1, query_length=256))
    linear = 32 * 218_103_808  # q, k, v, o, gate, up, down; embeddings and lm_head stay bf16
    assert r.memory.weights_bytes == 16_060_522_496 - linear * (2 - per_element)
    leaf = _linears(r)["model.layers.0.mlp.down_proj"]
    assert classify(leaf)[1]["dtype"] == "w4a16" and leaf.inputs[-1].dtype == f"int4+fp16/{group}+int4/{group}"


def test_quantize_overrides_the_checkpoint():
    m = load_model_config("gpt-oss-120b")
    none = _step(m, "h100-sxm", quantize="none")
    assert all(leaf.attr("quant_format") is None for leaf in _linears(none).values())
    assert none.quantization["method"] == "none" and none.quantization["source"] == "--quantize none"
    assert any("overridden by --quantize" in n for n in none.notes)
    # one group only: the experts in FP8, attention as the checkpoint keeps it (bf16)
    mixed = _step(m, "h100-sxm", quantize="experts=fp8")
    leaves = _linears(mixed)
    assert classify(leaves["model.layers.0.mlp.experts"])[1]["dtype"] == "fp8"  # the fused MoE's own FP8
    assert classify(leaves["model.layers.0.self_attn"])[1]["dtype"] == "bf16"
    # an unquantized checkpoint keeps --quantize's meaning: every linear but lm_head
    llama = _step(load_model_config("llama-3.1-8b"), "h100-sxm", quantize="fp8")
    groups = {g["group"]: g["kernel_format"] for g in llama.quantization["groups"]}
    # (the H100's default engine, TensorRT-LLM: per-tensor FP8 with static activation scales)
    assert groups == {"attention": "fp8_static", "mlp": "fp8_static", "lm_head": "bf16"}


def test_report_states_the_quantization_per_group(cli):
    proc = cli("text-generate", "gpt-oss-120b", "--device", "h200-sxm", "--decode", "--context-length", "64",
               "--json", check=True)
    q = json.loads(proc.stdout)["quantization"]
    assert q["method"] == "mxfp4" and q["source"].endswith("gpt-oss-120b.json: quantization_config")
    groups = {g["group"]: g for g in q["groups"]}
    assert groups["experts"]["kernel_format"] == "w4a16_mxfp4" and groups["experts"]["weight_dtype"] == "fp4+e8m0/32"
    assert groups["attention"]["kernel_format"] == groups["lm_head"]["kernel_format"] == "bf16"
    assert q["kv_cache"] == {"dtype": "bf16", "source": "the model dtype"}
    text = cli("text-generate", "gpt-oss-120b", "--device", "h200-sxm", "--decode", "--context-length", "64",
               check=True).stdout
    assert "bf16 · mxfp4 (checkpoint)" in text and "quantization: mxfp4 (from" in " ".join(text.split())


@pytest.mark.parametrize("qc, message", [
    ({"quant_method": "squeezellm"}, "quantization_config: key 'quant_method': 'squeezellm' is not read by perfcast"),
    ({"quant_method": "awq", "bits": 3, "group_size": 128}, "quantization_config: key 'bits': expected one of (4,)"),
    ({"quant_method": "fp8", "weight_block_size": [128]}, "key 'weight_block_size': expected two positive integers"),
    ("fp8", "quantization_config: expected a mapping, got str"),
])
def test_bad_quantization_config_is_one_line(cli, tmp_path, qc, message):
    proc = cli("text-generate", _write(tmp_path, "llama-3.1-8b", quantization_config=qc))
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr


@pytest.mark.parametrize("flag, message", [
    ("fp5", "--quantize 'fp5': expected one of none, fp8"),
    ("experts=fp8,experts=none", "group experts given twice"),
    ("router=fp8", "unknown group 'router'"),
])
def test_bad_quantize_flag_is_one_line(cli, flag, message):
    proc = cli("text-generate", "llama-3.1-8b", "--quantize", flag)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def _read(tmp_path, qc=None, hf=None, base="qwen3-30b-a3b"):
    from perfcast.models.quant_configs import read
    return read(load_model_config(_write(tmp_path, base, quantization_config=qc, hf_quant_config=hf)))


QKV, DOWN, EXPERTS, LM = (("model.layers.0.self_attn.q_proj", "attention"), ("model.layers.0.mlp.down_proj", "mlp"),
                          ("model.layers.0.mlp.experts", "experts"), ("lm_head", "lm_head"))


def _weights(q, *modules):
    return [s.weight if (s := q.scheme(m, g)) is not None else None for m, g in modules]


def test_gptq_groups_zero_points_and_listed_layers(tmp_path):
    q = _read(tmp_path, {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False, "sym": True})
    # int4 with an fp16 scale and a packed 4-bit zero per 128 (qzeros is stored even when sym)
    assert _weights(q, QKV, DOWN, LM) == ["int4+fp16/128+int4/128", "int4+fp16/128+int4/128", None]
    q = _read(tmp_path, {"quant_method": "gptq", "bits": 8, "group_size": -1, "lm_head": True,
                         "modules_in_block_to_quantize": [["self_attn.q_proj"], ["mlp.down_proj"]]})
    # 8-bit per channel; only the listed layers and lm_head
    assert _weights(q, QKV, DOWN, ("model.layers.0.self_attn.o_proj", "attention"), LM) == ["int8", "int8", None, "int8"]


def test_compressed_tensors_groups_ignore_and_kv_scheme(tmp_path):
    w4a16 = {"quant_method": "compressed-tensors", "format": "pack-quantized", "ignore": ["lm_head", "re:.*self_attn.*"],
             "config_groups": {"group_0": {"targets": ["Linear"], "input_activations": None,
                                           "weights": {"num_bits": 4, "type": "int", "symmetric": True,
                                                       "strategy": "group", "group_size": 128}}}}
    q = _read(tmp_path, w4a16)
    assert _weights(q, QKV, DOWN, EXPERTS, LM) == [None, "int4+fp16/128", "int4+fp16/128", None]
    assert q.scheme(*EXPERTS).weight_only == "w4a16"
    fp8 = {"quant_method": "compressed-tensors", "format": "float-quantized", "ignore": ["lm_head"],
           "kv_cache_scheme": {"num_bits": 8, "type": "float", "strategy": "tensor"},
           "config_groups": {"group_0": {"targets": ["Linear"],
                                         "weights": {"num_bits": 8, "type": "float", "strategy": "channel"},
                                         "input_activations": {"num_bits": 8, "type": "float", "dynamic": True,
                                                               "strategy": "token"}}}}
    q = _read(tmp_path, fp8)
    s = q.scheme(*DOWN)
    assert (s.name, s.weight, s.activation, s.kernel, q.kv_cache) == ("fp8", "fp8", "fp8", "fp8", "fp8")
    nvfp4 = {**fp8, "config_groups": {"g": {"targets": ["Linear"],
                                            "weights": {"num_bits": 4, "type": "float", "strategy": "tensor_group",
                                                        "group_size": 16},
                                            "input_activations": {"num_bits": 4, "type": "float",
                                                                  "strategy": "tensor_group", "group_size": 16}}}}
    s = _read(tmp_path, nvfp4).scheme(*DOWN)  # llm-compressor's NVFP4 preset
    assert (s.name, s.weight, s.activation, s.kernel, s.weight_only) == \
        ("nvfp4", "fp4+fp8/16", "fp4+fp8/16", "fp4", "w4a16_nvfp4")


def test_modelopt_mixed_precision_per_layer(tmp_path):
    hf = {"quantization": {"quant_algo": "MIXED_PRECISION", "kv_cache_quant_algo": None,
                           "quantized_layers": {"model.layers.0.self_attn.q_proj": {"quant_algo": "FP8"},
                                                "model.layers.0.mlp.experts*": {"quant_algo": "NVFP4", "group_size": 16}}}}
    q = _read(tmp_path, hf=hf)
    assert _weights(q, QKV, DOWN, EXPERTS, LM) == ["fp8", None, "fp4+fp8/16", None]
    assert q.kv_cache is None


@pytest.mark.parametrize("qc, hf, message", [
    (None, {"quantization": {"quant_algo": "NVFP4", "group_size": 32}}, "key 'group_size': expected 16"),
    (None, {"quantization": {"quant_algo": "FP6"}}, "key 'quant_algo': expected one of FP8,"),
    ({"quant_method": "compressed-tensors", "config_groups": {}}, None, "key 'config_groups': expected a mapping"),
    ({"quant_method": "bitsandbytes"}, None, "neither load_in_4bit nor load_in_8bit is true"),
])
def test_bad_statements_name_file_and_key(tmp_path, qc, hf, message):
    from perfcast.ir import UserError
    with pytest.raises(UserError, match=None) as e:
        _read(tmp_path, qc, hf)
    assert message in str(e.value) and str(tmp_path) in str(e.value)


def test_a_layer_stored_differently_is_counted_exactly_and_said(tmp_path):
    # fp8 everywhere but layer 1's attention: the decoder layers are captured once (layer 0
    # prices them all), so the step says so; the memory counts layer 1 as stored
    qc = {"quant_method": "fp8", "activation_scheme": "dynamic", "modules_to_not_convert": ["model.layers.1.self_attn"]}
    m = load_model_config(_write(tmp_path, "llama-3.1-8b", quantization_config=qc))
    r = simulate(Request(m, get_device("h100-sxm"), num_queries=1, query_length=256))
    assert "layer 1 stores self_attn.k_proj differently from layer 0, which prices it (memory counts layer 1 as stored)" in r.notes
    attention = 4096 * 4096 * 2 + 4096 * 1024 * 2  # q, o and k, v of one layer, 1 byte more each in bf16
    fp8 = simulate(Request(m, get_device("h100-sxm"), num_queries=1, query_length=256, quantize="fp8"))
    assert r.memory.weights_bytes - fp8.memory.weights_bytes == attention == 41_943_040


@pytest.mark.parametrize("where, statement, static", [
    ("qc", {"quant_method": "fp8", "activation_scheme": "static"}, True),
    ("qc", {"quant_method": "fp8", "activation_scheme": "dynamic"}, False),
    ("qc", {"quant_method": "fp8"}, False),  # vLLM Fp8Config's default: dynamic
    ("hf", {"quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": None}}, True),  # ModelOpt: input_scale
    ("qc", {"quant_method": "compressed-tensors", "config_groups": {"g": {
        "targets": ["Linear"], "weights": {"num_bits": 8, "type": "float", "strategy": "tensor"},
        "input_activations": {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False}}}}, True),
    ("qc", {"quant_method": "compressed-tensors", "config_groups": {"g": {
        "targets": ["Linear"], "weights": {"num_bits": 8, "type": "float", "strategy": "tensor"},
        "input_activations": {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": True}}}}, False),
])
def test_per_tensor_fp8_static_scales_take_trtllm_static_gemm(tmp_path, where, statement, static):
    """A checkpoint that ships its activation scales runs TensorRT-LLM's static FP8 GEMM
    (fp8_static); one that does not, the dynamic one (fp8); vLLM has one FP8 kernel for both."""
    from perfcast.capture.quant import QuantPlan

    q = _read(tmp_path, statement) if where == "qc" else _read(tmp_path, hf=statement)
    native = frozenset(get_device("h100-sxm").spec.datasheet.matrix_flops_per_s)
    kernels = {e: QuantPlan(q, native, engine=e).format(*DOWN).kernel for e in ("trtllm", "vllm", "sglang")}
    assert kernels == {"trtllm": "fp8_static" if static else "fp8", "vllm": "fp8", "sglang": "fp8"}
    assert ("static scale" in q.scheme(*DOWN).detail) is static


def test_quantize_fp8_is_static_fp8_dynamic_is_not():
    """``--quantize fp8`` is ModelOpt's per-tensor FP8 (static activation scales): on TensorRT-LLM
    a B200 decode of Llama-3.1-70B at TP 4 drops the scale computation from each of its 320
    FP8 GEMMs; ``--quantize fp8_dynamic`` keeps it; vLLM prices both alike."""
    model = load_model_config("llama-3.1-70b")

    def step(engine, flag):
        return simulate(Request(model, get_device("b200-sxm"), num_queries=8, context_length=5000, decode=True,
                                layout=Layout(tp=4), engine=engine, quantize=flag))

    static, dynamic = step("trtllm", "fp8"), step("trtllm", "fp8_dynamic")
    assert {leaf.attr("quant_format") for leaf in _linears(static).values() if leaf.kind == "matmul"} >= {"fp8_static"}
    assert {leaf.attr("quant_format") for leaf in _linears(dynamic).values() if leaf.kind == "matmul"} >= {"fp8"}
    assert "derived" not in static.evaluations["analytic"].provenance_shares()  # its own calibrated fit
    saved = dynamic.evaluations["analytic"].time_s - static.evaluations["analytic"].time_s
    assert 0.15 < saved / dynamic.evaluations["analytic"].time_s < 0.4
    assert step("vllm", "fp8").evaluations["analytic"].time_s == step("vllm", "fp8_dynamic").evaluations["analytic"].time_s


def test_a_price_read_from_derived_rows_says_derived():
    """The profiling model reads TensorRT-LLM's fp8_static GEMMs from rows computed from two
    measurements: their share of the step is labelled derived, never measured."""
    model = load_model_config("llama-3.1-8b")

    def step(flag):
        r = simulate(Request(model, get_device("h200-sxm"), num_queries=8, context_length=1024, decode=True,
                             engine="trtllm", quantize=flag, performance_models=("profiling",)))
        return r.evaluations["profiling"].provenance_shares()

    static, dynamic = step("fp8"), step("fp8_dynamic")
    assert static.get("derived", 0) > 0.3 and "derived" not in dynamic
    assert dynamic.get("measured", 0) + dynamic.get("interpolated", 0) > static.get("measured", 0) + static.get(
        "interpolated", 0)


def test_ignore_patterns_match_as_before_and_compile_once():
    """A checkpoint's exclusion patterns (transformers' regex-or-suffix, compressed-tensors ``re:``,
    ModelOpt globs), each compiled once however many a checkpoint lists (GLM-5-FP8: 712)."""
    from perfcast.ir import UserError
    from perfcast.models.quantization import _regex, matches

    assert matches("model.layers.0.self_attn", "model.layers.0.self_attn.q_proj")  # up to a module boundary
    assert not matches("model.layers.1", "model.layers.10.mlp")
    assert matches("q_proj", "model.layers.3.self_attn.q_proj")  # a suffix
    assert matches("re:.*mlp\\.gate$", "model.layers.3.mlp.gate", "compressed-tensors")
    assert matches("model.layers.*.mlp.gate", "model.layers.7.mlp.gate", "glob")
    assert matches("lm_head(", "lm_head(")  # not a regex: compared as a name
    _regex.cache_clear()
    patterns = [f"model.layers.{i}.mlp.gate" for i in range(700)]
    assert sum(matches(p, "model.layers.699.mlp.gate") for p in patterns) == 1
    assert sum(matches(p, "model.layers.3.mlp.gate") for p in patterns) == 1
    assert _regex.cache_info().misses == 700  # each pattern compiled once, re's 512-entry cache notwithstanding
    with pytest.raises(UserError, match=r"ignore pattern 're:\(\*bad': not a regular expression"):
        matches("re:(*bad", "lm_head", "compressed-tensors")
