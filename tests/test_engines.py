"""Engine profiles: the schema's one-line errors, the device defaults, the kernels each engine
runs for a captured step, the launch model, and physical sanity across the model catalog."""

import contextlib
import copy
import io
import json
from functools import lru_cache

import pytest
import sympy
import yaml

from perfcast.capture.parallel import Layout
from perfcast.cli.main import main
from perfcast.engines import engine_names, get_engine, load_profile_file
from perfcast.engines.spec import profiles_dir
from perfcast.hardware import device_names, get_device
from perfcast.hardware.spec import SpecError
from perfcast.inference.textgen import Request, simulate
from perfcast.ir import Graph, Tensor, make_leaf
from perfcast.models import load_model_config
from perfcast.perf import AnalyticPerformanceModel
from perfcast.report.textgen import kernel_sequence
from perfcast.rollup import LaunchModel, rollup

CATALOG = ["llama-3.1-8b", "llama-3.1-70b", "llama-3.1-405b", "qwen3-8b", "qwen3-32b",
           "qwen3-30b-a3b", "qwen3-235b-a22b", "deepseek-v3", "mixtral-8x7b", "gpt-oss-120b"]
GPU_ENGINES = ["trtllm", "vllm", "sglang"]


@lru_cache(maxsize=None)
def _eager_with_fits_of(engine: str) -> str:
    """A copy of the eager profile whose kernels take ``engine``'s kernel fits (a profile file)."""
    import tempfile

    data = yaml.safe_load((profiles_dir() / "eager.yaml").read_text())
    data["calibration"] = {"framework": get_engine(engine).database.framework,
                           "reason": f"the test compares eager's kernel structure with {engine}'s at equal kernel speed"}
    path = f"{tempfile.mkdtemp(prefix='perfcast-eager-')}/eager-{engine}.yaml"
    with open(path, "w") as f:
        yaml.safe_dump(data, f)
    return path


@lru_cache(maxsize=None)
def sim(model: str, device: str, engine: str, decode: bool, tp: int = 1, topology: str | None = None,
        sequences: int = 8):
    shape = dict(num_queries=sequences, context_length=1024, decode=True) if decode else \
        dict(num_queries=2, query_length=512)
    return simulate(Request(load_model_config(model), get_device(device), engine=engine, layout=Layout(tp=tp),
                            topology=topology, **shape))


def run_cli(*argv) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(list(argv))
    return rc, out.getvalue(), err.getvalue()


# -- the profiles as data -------------------------------------------------------------------------

def test_every_shipped_profile_loads_and_cites_its_sources():
    assert engine_names() == ["eager", "eager-static", "sglang", "trtllm", "trtllm-cpp", "vllm", "vllm-ascend", "xla"]
    for name in engine_names():
        p = get_engine(name)
        assert p.name == name and p.framework and p.version
        for rule in p.rules:
            assert rule.sources and all(len(s) > 20 for s in rule.sources), (name, rule.rule)
        for phase in ("prefill", "decode"):
            assert all(len(s) > 20 for s in getattr(p.launch, phase).sources)
        assert all(len(h.source) > 20 for h in p.launch.host_launch_interval_s.values())
        assert len(p.leftover.sources[0]) > 20


BAD = [
    (lambda d: d.pop("framework"), "key 'framework': missing key"),
    (lambda d: d["rules"][1].update(colour="red"), "key 'rules.1.merge_gemms.colour': unknown key"),
    (lambda d: d["rules"][1].update(rule="smash"),
     "key 'rules.1': input tag 'smash' found using 'rule' does not match any of the expected tags"),
    (lambda d: d["rules"][1].pop("sources"), "key 'rules.1.merge_gemms.sources': missing key"),
    (lambda d: d["launch"].pop("host_launch_interval_s"),
     "key 'launch.host_launch_interval_s.NVIDIA': missing (the profile launches kernels eagerly on NVIDIA devices)"),
    (lambda d: d["launch"]["prefill"].update(mode="compiled", max_tokens=5),
     "key 'launch.prefill.max_tokens': only a cuda_graph launch has a capture size"),
    (lambda d: d["rules"][11].update(cache_write={"prefill": {"mode": "in_kernel"}, "decode": {"mode": "separate"}}),
     "key 'rules.11.attention.cache_write.decode.kernel': a separate cache write needs a kernel name"),
    (lambda d: d["scheduler"]["max_num_tokens"].update(by_memory=[{"from_gib": 35, "value": 8192}]),
     "key 'scheduler.max_num_tokens.by_memory': tiers from 0 GiB up, in ascending order"),
]


@pytest.mark.parametrize("mutate,message", BAD)
def test_a_bad_profile_is_one_line_naming_file_and_key(tmp_path, mutate, message):
    data = yaml.safe_load((profiles_dir() / "trtllm.yaml").read_text())
    mutate(data)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(SpecError) as e:
        load_profile_file(path)
    assert str(e.value).startswith(f"{path}: {message}") and "\n" not in str(e.value)
    rc, _, err = run_cli("engines", "--engine-file", str(path))
    assert rc == 2 and err.startswith(f"perfcast engines: error: {path}: ") and err.count("\n") == 1


def test_engines_command_lists_profiles_and_shows_rules():
    rc, out, _ = run_cli("engines", "--json")
    rows = json.loads(out)["engines"]
    assert rc == 0 and [r["name"] for r in rows] == engine_names()
    trt = next(r for r in rows if r["name"] == "trtllm")
    assert trt["database"]["version"] == "1.3.0rc20" and "h100-sxm" in trt["default_on"]
    assert trt["launch"] == {"prefill": "eager", "decode": "cuda graph ≤ 128 tokens"}
    rc, out, _ = run_cli("engines", "trtllm")
    assert rc == 0 and "fused_add_rmsnorm" in out and "across layers" in out
    doc = json.loads(run_cli("engines", "vllm", "--json")[1])
    assert doc["rules"][0]["rule"] == "drop" and doc["rules"][0]["sources"]
    rc, _, err = run_cli("engines", "tensorflow")
    assert rc == 2 and "unknown engine 'tensorflow'; known: eager, eager-static, sglang" in err


def test_every_device_declares_a_default_engine_it_can_run():
    from perfcast.engines import compatible

    want = {"h100-sxm": "trtllm", "h200-sxm": "trtllm", "b200-sxm": "trtllm", "a100-sxm-80gb": "trtllm",
            "mi300x": "vllm", "tpu-v5e": "xla", "tpu-v5p": "xla", "ascend-910b": "vllm-ascend",
            "ascend-910c-die": "vllm-ascend", "cpu-local": "eager", "gb200": "trtllm", "b300-sxm": "trtllm",
            "gb300": "trtllm", "mi325x": "vllm", "mi355x": "vllm"}
    for name in device_names():
        d = get_device(name)
        assert d.spec.default_engine is not None and d.spec.default_engine.reason, name
        assert compatible(get_engine(d.spec.default_engine.name), d), name
        if name in want:
            assert d.spec.default_engine.name == want[name]


@pytest.mark.parametrize("argv,message", [
    (["--device", "h100-sxm", "--engine", "xla"], "--engine xla: runs on Google devices; h100-sxm is NVIDIA"),
    (["--device", "ascend-910b", "--engine", "trtllm"], "--engine trtllm: runs on NVIDIA devices; ascend-910b is Huawei"),
    (["--no-fusion"], "use --engine eager"),
    (["--engine", "nope"], "unknown engine 'nope'"),
])
def test_engine_errors_are_one_line(argv, message):
    rc, _, err = run_cli("text-generate", "llama-3.1-8b", "--query-length", "16", *argv)
    assert rc == 2 and message in err and err.count("\n") == 1


# -- the kernels each engine runs ---------------------------------------------------------------

LLAMA_DECODE = {
    "trtllm": ["fused_qkv_gemm", "xqa", "gemm", "fused_add_rmsnorm", "fused_gate_up_gemm", "silu_and_mul", "gemm",
               "fused_add_rmsnorm"],
    "vllm": ["qkv_proj", "triton_rotary_embedding", "reshape_and_cache_flash", "flash_attn_varlen", "gemm",
             "triton_fused_add_rms_norm", "gate_up_proj", "triton_silu_and_mul", "gemm", "triton_fused_add_rms_norm"],
    "sglang": ["qkv_proj", "rotary_embedding", "store_cache", "fa3", "gemm", "fused_add_rmsnorm", "gate_up_proj",
               "silu_and_mul", "gemm", "fused_add_rmsnorm"],
}


@pytest.mark.parametrize("engine", GPU_ENGINES)
def test_llama_layer_kernels(engine):
    seq = kernel_sequence(sim("llama-3.1-8b", "h100-sxm", engine, True))
    assert seq["layers[0]×32"] == LLAMA_DECODE[engine]
    assert seq["prologue"][0] == "embedding" and seq["epilogue"] == ["lm_head_gemm"]
    prefill = kernel_sequence(sim("llama-3.1-8b", "h100-sxm", engine, False))["layers[0]×32"]
    if engine == "trtllm":  # prefill: RoPE + KV write before the context FMHA, not inside it
        assert prefill[:3] == ["fused_qkv_gemm", "qkv_preprocessing", "fmha_v2"]
    else:
        assert prefill == LLAMA_DECODE[engine]


def test_eager_runs_one_kernel_per_captured_op():
    r = sim("llama-3.1-8b", "h100-sxm", "eager", True)
    seq = kernel_sequence(r)
    layer = seq["layers[0]×32"]
    assert len(layer) == 39 and layer[8:11] == ["aten.mm"] * 3
    assert layer[21:23] == ["cat×2", "sdpa"]  # DynamicCache.update's torch.cat (keys, values), then sdpa
    # 38 captured ops and the cache copy per layer, run as two kernels (keys, values)
    assert r.launch.mode == "eager" and r.rollups["analytic"].kernels == 10 + 39 * 32 + 32 + 9


def _cache_leaf(engine: str, context: int):
    r = simulate(Request(load_model_config("llama-3.1-8b"), get_device("h200-sxm"), engine=engine, num_queries=8,
                         context_length=context, decode=True))
    return next(lt.leaf for lt in r.rollups["analytic"].leaves if lt.leaf.attr("kernel_class") == "cache_write")


def test_dynamic_cache_copies_the_whole_cache_every_step():
    """generate()'s DynamicCache: torch.cat([cached, new], dim=-2) for keys and values reads
    the C cached entries and the new one and writes all C + 1 (8 KV heads x 128 x 2 (K, V) x 2
    bytes = 4 KiB per token per layer for Llama-3.1-8B); a StaticCache writes the new entry."""
    from perfcast.ir import BYTES_HBM

    per_token = 8 * 128 * 2 * 2
    dynamic, static = _cache_leaf("eager", 4096), _cache_leaf("eager-static", 4096)
    assert dynamic.cost.get(BYTES_HBM) == 8 * per_token * (1 + 4096 + 4096 + 1)  # 8 sequences
    assert dynamic.attr("op") == "eager.cat" and dynamic.attr("launches") == 2
    assert static.cost.get(BYTES_HBM) == 8 * 2 * per_token and static.attr("op") == "eager-static.index_copy_"


def test_a_profile_extends_a_shipped_one(tmp_path):
    f = tmp_path / "mine.yaml"
    f.write_text("extends: eager-static\nname: mine\ndescription: eager with a static cache, renamed\n")
    p = load_profile_file(f)
    assert p.name == "mine" and p.rules == get_engine("eager-static").rules
    assert p.launch == get_engine("eager").launch  # through eager-static, from eager
    f = tmp_path / "eager.yaml"  # a file named as the profile it extends is no cycle
    f.write_text("extends: eager\nname: eager\n")
    assert load_profile_file(f).launch == get_engine("eager").launch
    f = tmp_path / "other.yaml"  # (profiles are read once per path)
    f.write_text("extends: tensorflow\nname: other\n")
    with pytest.raises(SpecError, match="key 'extends' is 'tensorflow'; expected a shipped engine"):
        load_profile_file(f)


def test_moe_layer_kernels():
    trt = kernel_sequence(sim("qwen3-30b-a3b", "h100-sxm", "trtllm", True))["layers[0]×48"]
    assert trt == ["fused_qkv_gemm", "fused_qk_norm_rope", "qkv_preprocessing", "xqa", "gemm", "fused_add_rmsnorm",
                   "router_gemm", "moe_routing", "cutlass_fused_moe×3", "fused_add_rmsnorm"]
    sgl = kernel_sequence(sim("qwen3-30b-a3b", "h100-sxm", "sglang", True))["layers[0]×48"]
    assert sgl[-5:] == ["fused_add_rmsnorm", "router_gemm", "topk", "fused_moe_triton×5", "fused_add_rmsnorm"]


def test_a_deepseek_router_that_casts_up_to_fp32_runs_as_a_bf16_gemm():
    """Hugging Face's DeepSeek-V3 router is ``F.linear(h.float(), W.float())``; the engines run it
    as a bf16 × bf16 GEMM with fp32 output (TensorRT-LLM and SGLang ``dsv3_router_gemm``, vLLM
    ``GateLinear``), so the kernel computes in bf16 and the bf16 GEMM fit prices it — not the fp32
    vector rate, which made it 2.5× dearer (15 µs a layer at 8 tokens on a B200)."""
    for engine in ("trtllm", "vllm", "sglang"):
        leaves = sim("deepseek-v3", "b200-sxm", engine, True, tp=8).rollups["analytic"].leaves
        router = [lt for lt in leaves if lt.leaf.attr("kernel") == "router_gemm"]
        assert router and all(lt.leaf.dtype == "bf16" for lt in router), engine
        assert all(any("calibrated gemm/bf16" in n for n in lt.result.notes) for lt in router), engine
        assert all(float(lt.time_s / lt.trips) < 8e-6 for lt in router), engine
    # a router that is bf16 already is as it was; GLM-5's fp32 router (hidden 6144: no dsv3_router_gemm)
    # stays fp32, as vLLM forces it for glm_moe_dsa and SGLang casts GLM's since 2026-03-30
    qwen = sim("qwen3-30b-a3b", "h100-sxm", "trtllm", True).rollups["analytic"].leaves
    assert {lt.leaf.dtype for lt in qwen if lt.leaf.attr("kernel") == "router_gemm"} == {"bf16"}
    glm = sim("glm-5", "b200-sxm", "sglang", True, tp=8).rollups["analytic"].leaves
    assert {lt.leaf.dtype for lt in glm if lt.leaf.attr("kernel") == "router_gemm"} == {"fp32"}


def test_tensor_parallel_all_reduce_fuses_the_next_norm():
    trt = kernel_sequence(sim("llama-3.1-70b", "h200-sxm", "trtllm", True, tp=8))["layers[0]×80"]
    assert trt.count("allreduce_residual_rmsnorm") == 2 and "fused_add_rmsnorm" not in trt
    # SGLang: one-stage below 256 KiB at 8 ranks (8 × 8192 × 2 B here), two-stage above (32 sequences)
    sgl = kernel_sequence(sim("llama-3.1-70b", "h200-sxm", "sglang", True, tp=8))["layers[0]×80"]
    assert sgl.count("custom_allreduce_1stage") == 2 and sgl.count("fused_add_rmsnorm") == 2
    sgl = kernel_sequence(sim("llama-3.1-70b", "h200-sxm", "sglang", True, tp=8, sequences=32))["layers[0]×80"]
    assert sgl.count("custom_allreduce_2stage") == 2
    leaves = sim("llama-3.1-70b", "h200-sxm", "trtllm", True, tp=8).rollups["analytic"].leaves
    assert {lt.leaf.attr("algorithm") for lt in leaves if lt.leaf.kind == "all_reduce"} == {"oneshot"}


def test_past_the_largest_cuda_graph_decode_launches_eagerly():
    small, big = sim("llama-3.1-8b", "h100-sxm", "trtllm", True), sim("llama-3.1-8b", "h100-sxm", "trtllm", True,
                                                                        sequences=256)
    assert small.launch.mode == "cuda_graph" and small.evaluations["analytic"].host_launch_s == 0
    assert big.launch.mode == "eager" and "256 tokens > the largest captured graph, 128" in big.launch.description


# -- the launch model ---------------------------------------------------------------------------

MODEL = AnalyticPerformanceModel(get_device("h100-sxm"))


def _graph():
    small = Tensor("t", (1024,), "bf16")
    a, b = Tensor("a", (8192, 8192), "bf16"), Tensor("b", (8192, 8192), "bf16")
    return Graph("g", (make_leaf("exp", "tiny", (small,), (small,)),
                       make_leaf("exp", "tiny3", (small,), (small,), launches=3),
                       make_leaf("matmul", "big", (a, b), (Tensor("c", (8192, 8192), "bf16"),))))


def test_an_eager_step_costs_the_max_of_its_gpu_time_and_its_launches():
    g, h = _graph(), sympy.Rational(7, 10**6)
    graph, eager = rollup(g, MODEL), rollup(g, MODEL, LaunchModel("eager", h))
    static = MODEL.launch_overhead().time_s
    assert graph.launch_time_s == 3 * static and graph.kernels == 5  # tiny3 launches 3 kernels
    device = sum(lt.result.time_s for lt in eager.leaves) + 3 * static
    assert eager.host_issue_s == 5 * h and sympy.simplify(eager.device_time_s - device) == 0
    assert device > 5 * h and eager.host_launch_s == 0 and eager.time_s == device  # the GEMM hides the host
    small = rollup(Graph("small", g.ops[:2]), MODEL, LaunchModel("eager", h))  # host-bound: 4 kernels
    gpu = sum(lt.result.time_s for lt in small.leaves) + 2 * static
    assert small.time_s == 4 * h and small.host_launch_s == 4 * h - gpu and small.launch_time_s == 4 * h - gpu + 2 * static


def test_measured_kernels_do_not_pay_the_static_launch_again():
    from dataclasses import replace

    class Measured(AnalyticPerformanceModel):
        def process_op(self, op, kernel=None):
            return replace(super().process_op(op, kernel=kernel), includes_launch=True)

    r = rollup(_graph(), Measured(get_device("h100-sxm")))
    assert r.launch_time_s == 0 and r.launches == 0


def test_layer_rotation_keeps_the_eager_cost_exact():
    """Rotating each layer to end with the next layer's input norm moves ops, never adds any."""
    from perfcast.capture.lower import lower
    from perfcast.engines import rotate
    from perfcast.inference.textgen import step_capture

    req = Request(load_model_config("qwen3-8b"), get_device("h100-sxm"), num_queries=2, query_length=64)
    cap, at, _ = step_capture(req)
    rotated, moved = rotate(cap)
    # the first layer's norm opens the step; model.norm's ops are replaced by the last layer's
    assert moved and len(rotated.records) == len(cap.records)
    priced = [rollup(lower(c, point=at, fusion=False).graph, MODEL).evaluate({}) for c in (cap, rotated)]
    assert priced[0].totals == priced[1].totals
    assert priced[0].time_s == pytest.approx(priced[1].time_s, rel=1e-12)


# -- physical sanity across the catalog --------------------------------------------------------

@pytest.mark.parametrize("model", CATALOG)
def test_catalog_sanity_under_every_engine(model):
    """No step beats the HBM roofline of what it must read, every engine keeps every matrix FLOP,
    and no engine is slower (or moves more bytes) than PyTorch eager running the same kernels —
    eager's structure (one kernel per op, host launches) priced with the engine's own kernel fits,
    so what is compared is what the engine fuses and replays, not whose kernels are faster."""
    d = load_model_config(model).data
    moe = d.get("num_local_experts") or d.get("num_experts") or d.get("n_routed_experts")
    sliding = "sliding_attention" in (d.get("layer_types") or [])
    for device in ("h100-sxm", "h200-sxm"):
        peak = float(get_device(device).hbm_bandwidth_bytes_per_s)
        for decode in (True, False):
            for engine in GPU_ENGINES:
                eager = sim(model, device, _eager_with_fits_of(engine), decode).evaluations["analytic"]
                r = sim(model, device, engine, decode)
                ev = r.evaluations["analytic"]
                where = (model, device, engine, "decode" if decode else "prefill")
                assert not r.lowered.unknown, where
                assert ev.time_s >= ev.totals["bytes.hbm"] / peak, where
                if not moe:  # every weight but the embedding table is read; decode reads the cache
                    embedding = 0 if d.get("tie_word_embeddings") else d["vocab_size"] * d["hidden_size"] * 2
                    floor = r.memory.weights_bytes - embedding
                    if decode and not sliding:
                        floor += r.memory.kv_cache_bytes_per_token * 8 * 1024
                    assert ev.time_s >= floor / peak, where
                assert ev.totals["flops.matrix"] == pytest.approx(eager.totals["flops.matrix"], rel=1e-9), where
                assert ev.totals["bytes.hbm"] <= eager.totals["bytes.hbm"] * (1 + 1e-9), where
                assert ev.time_s <= eager.time_s, where


def _a100_topology(tmp_path) -> str:
    data = yaml.safe_load((profiles_dir().parent.parent / "hardware" / "topologies" / "hgx-h100.yaml").read_text())
    data.update(name="hgx-a100-test", device="a100-sxm-80gb")
    path = tmp_path / "hgx-a100-test.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def test_every_rule_of_every_profile_claims_ops_somewhere(tmp_path):
    """No dead rule: across the catalog (and tensor-parallel steps for the all-reduce rules) every
    rule of every shipped profile claims some captured op."""
    scenarios = [(m, dev, e, dec, 1, None) for m in CATALOG for dec in (True, False)
                 for e, dev in (("trtllm", "h200-sxm"), ("vllm", "h200-sxm"), ("sglang", "h200-sxm"),
                                ("vllm-ascend", "ascend-910b"), ("xla", "tpu-v5p"))]
    a100 = _a100_topology(tmp_path)
    for m in ("llama-3.1-70b", "deepseek-v3"):
        scenarios += [(m, "h200-sxm", e, True, 8, None) for e in GPU_ENGINES]
        scenarios += [(m, "b200-sxm", "vllm", True, 8, None), (m, "a100-sxm-80gb", "vllm", True, 8, a100),
                      (m, "ascend-910b", "vllm-ascend", True, 8, None), (m, "tpu-v5p", "xla", True, 8, "tpu-v5p-4x4x4")]
    used: dict[str, set] = {}
    for m, dev, e, dec, tp, topo in scenarios:
        used.setdefault(e, set()).update(sim(m, dev, e, dec, tp, topo).rules_applied)
    # rules of a non-default option value: TensorRT-LLM's TRTLLM MoE backend on Blackwell
    for dec in (True, False):
        req = Request(load_model_config("deepseek-v3"), get_device("b200-sxm"), engine="trtllm", decode=dec,
                      engine_options=(("moe_backend", "TRTLLM"),), quantize="fp4",
                      **(dict(num_queries=8, context_length=1024) if dec else dict(num_queries=2, query_length=512)))
        used["trtllm"].update(simulate(req).rules_applied)
    # SGLang's DeepEP all-to-all: a decode step of attention-DP ranks sharing an expert-parallel MoE
    req = Request(load_model_config("deepseek-v3"), get_device("h200-sxm"), engine="sglang", decode=True,
                  layout=Layout(ep=8, dp=8, attention_dp=True), engine_options=(("moe_a2a_backend", "deepep"),),
                  num_queries=64, context_length=1024)
    used["sglang"].update(simulate(req).rules_applied)
    for e, seen in used.items():
        rules = get_engine(e).rules
        assert seen == set(range(len(rules))), (e, [(i, rules[i].rule) for i in sorted(set(range(len(rules))) - seen)])


def test_json_report_names_the_engine():
    rc, out, _ = run_cli("text-generate", "llama-3.1-8b", "--decode", "--context-length", "1024", "--num-queries",
                         "8", "--json")
    doc = json.loads(out)
    assert rc == 0 and doc["engine"]["name"] == "trtllm" and doc["engine"]["kernels_per_step"] == 259
    assert doc["engine"]["launch"]["mode"] == "cuda_graph" and len(doc["engine"]["rules_applied"]) == 10


def test_profile_copy_from_a_file_is_accepted_by_text_generate(tmp_path):
    data = copy.deepcopy(yaml.safe_load((profiles_dir() / "vllm.yaml").read_text()))
    data["name"] = "my-vllm"
    path = tmp_path / "my-vllm.yaml"
    path.write_text(yaml.safe_dump(data))
    mine = simulate(Request(load_model_config("llama-3.1-8b"), get_device("h100-sxm"), engine=str(path),
                            num_queries=8, context_length=1024, decode=True))
    assert mine.engine.name == "my-vllm"
    assert mine.evaluations["analytic"].time_s == sim("llama-3.1-8b", "h100-sxm", "vllm", True).evaluations[
        "analytic"].time_s


def test_sglangs_host_interval_reproduces_the_eager_step_it_was_derived_from():
    # sgl-project/sglang PR #12160 logs DeepSeek-V3 prefilling one new token eagerly in 82.64 ms
    # ("forward cost", 23.10 ms as a CUDA-graph replay): host-bound. sglang.yaml's interval is that
    # time over the kernels perfcast prices the step with, so perfcast prices the step at it.
    r = simulate(Request(load_model_config("deepseek-v3"), get_device("h200-sxm"), engine="sglang",
                         layout=Layout(tp=8), num_queries=1, query_length=1))
    ro, ev = r.rollups["analytic"], r.evaluations["analytic"]
    assert int(ro.kernels) == 1445 and r.launch.mode == "eager"
    assert float(r.launch.host_interval_s) == 5.719e-5
    assert ev.time_s == pytest.approx(82.64e-3, abs=0.01e-3) and ev.host_launch_s > 0.85 * ev.time_s


def test_the_serving_engines_host_intervals_are_their_own():
    # TensorRT-LLM: NVIDIA/TensorRT-LLM PR #12653 ("CPU dispatch interval (~35us)"); SGLang: derived
    # above; the bare PyTorch figure (7 µs) stays with the engines that launch aten ops or compiled code
    want = {"trtllm": 35e-6, "sglang": 5.719e-5, "vllm": 7e-6, "eager": 7e-6}
    for name, h in want.items():
        got = get_engine(name).launch.host_launch_interval_s["NVIDIA"]
        assert got.value_s == h and got.source


def test_engines_shows_each_profiles_host_time_per_eager_kernel():
    rc, out, _ = run_cli("engines")
    assert rc == 0 and "host per eager" in out and "NVIDIA 57.19 µs" in out
    rc, out, _ = run_cli("engines", "trtllm")
    assert rc == 0 and "host per eager kernel, NVIDIA: 35 µs" in out and "TensorRT-LLM PR #12653" in " ".join(out.split())


def test_sglang_captures_512_sequence_graphs_on_every_device_of_160_gb_or_more():
    # server_args.py sets cuda_graph_max_bs by the GPU's memory: 512 from 160 GB (B200, MI300 and up)
    decode = get_engine("sglang").launch.decode
    for device in device_names():
        spec = get_device(device).spec
        if spec.vendor not in ("NVIDIA", "AMD") or device == "cpu-local":
            continue
        if spec.datasheet.hbm_capacity_bytes >= 160e9:
            assert decode.capture_limit(device) == 512, device


def test_vllm_s_budget_and_batch_follow_the_device_s_memory_and_name():
    # arg_utils.py get_batch_defaults: 8192 tokens and 1024 sequences for the OpenAI server where
    # device_memory >= 70 GiB and "a100" not in the device's name; 2048 and 256 elsewhere
    from perfcast.serving.scheduler import scheduler_config

    for device in device_names():
        d = get_device(device)
        big = d.hbm_capacity_bytes >= 70 * 2**30 and "a100" not in device
        cfg = scheduler_config("vllm", device=d)
        assert (cfg.max_num_tokens, cfg.max_num_seqs) == ((8192, 1024) if big else (2048, 256)), device
    assert scheduler_config("vllm", device=get_device("a100-sxm-80gb")).max_num_tokens == 2048   # 80 GB, yet 2048
    assert scheduler_config("vllm", device=get_device("h100-sxm")).max_num_tokens == 8192        # 74.5 GiB
    assert (scheduler_config("vllm").max_num_tokens, scheduler_config("vllm").max_num_seqs) == (8192, 1024)


def test_sglang_chunks_prefill_by_the_device_s_memory():
    # server_args.py _handle_chunked_prefill_size: 2048 under 35 GiB, 8192 under 160 GiB, else 16384
    # (gpu_mem in MiB against 35 * 1024 and 160 * 1024)
    from perfcast.serving.scheduler import scheduler_config

    for device in device_names():
        mib = get_device(device).spec.datasheet.hbm_capacity_bytes / 2**20
        want = 2048 if mib < 35 * 1024 else 8192 if mib < 160 * 1024 else 16384
        assert scheduler_config("sglang", device=get_device(device)).max_num_tokens == want, device
    assert scheduler_config("sglang").max_num_tokens == 8192   # (no device: the profile's value)
    assert scheduler_config("sglang", device=get_device("b200-sxm"), max_num_tokens=4096).max_num_tokens == 4096


def test_a_grace_host_scales_every_engines_host_interval():
    """GB200 and GB300 carry host_issue_scale 1.73 (SGLang's eager attention modules measured 1.73×
    slower on their Grace hosts than on B200 / B300's x86 ones, docs/design/engines.md "Launches"):
    every engine's eager interval is scaled there, and the note and source say so; B200 keeps the
    engine's own."""
    from perfcast.engines.launch import launch_for

    for engine, base in (("sglang", 5.719e-5), ("trtllm", 3.5e-5), ("vllm", 7e-6)):
        profile = get_engine(engine)
        b200 = launch_for(profile, decode=False, tokens=1024, device=get_device("b200-sxm"))
        for name in ("gb200", "gb300"):
            grace = launch_for(profile, decode=False, tokens=1024, device=get_device(name))
            assert grace.mode == b200.mode == "eager"
            assert grace.host_interval_s == sympy.Rational(repr(base)) * sympy.Rational("1.73"), (engine, name)
            assert f"1.73 × the engine's {base * 1e6:g} µs on {name}'s host" in grace.description
            assert grace.host_source.endswith(f"({name}.yaml datasheet.host_issue_scale)")
        assert b200.host_interval_s == sympy.Rational(repr(base)) and "host_issue_scale" not in b200.host_source
