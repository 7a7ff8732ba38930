"""ARCHITECTURE.md §7 WE-4 and the profiling database's dispatch and error paths."""

import pytest
import sympy

from perfcast.hardware import SpecError, get_device
from perfcast.ir import Tensor, make_leaf
from perfcast.perf import Provenance
from perfcast.perf.empirical import EmpiricalPerformanceModel, QueryResult
from perfcast.perf.profiling import ProfilingDataSource

MAPPING = """\
schema: 1
device: h200-sxm
framework: trtllm
version: "0"
kernels:
  MatMul: {file: MatMul.csv, keys: [M, K, N, dtype], axes: [M]}
  Mul: {file: Mul.csv, keys: [shape, dtype]}
ops:
  aten.mm.default: {category: compute, kernel_type: MatMul}
  aten.mul.Tensor: {category: elementwise, kernel_type: Mul}
  aten.view.default: {category: zero_cost}
  aten.arange.default: {category: accepted_miss, reason: host-side index setup}
"""


@pytest.fixture
def db(tmp_path):
    (tmp_path / "op_mapping.yaml").write_text(MAPPING)
    (tmp_path / "MatMul.csv").write_text("M,K,N,dtype,latency_us\n1024,4096,4096,bf16,50\n2048,4096,4096,bf16,90\n")
    (tmp_path / "Mul.csv").write_text("shape,dtype,latency_us\n1024x4096,bf16,40\n")
    return tmp_path


def mm(m, k=4096, n=4096, dtype="bf16"):
    a, b, c = Tensor("a", (m, k), dtype), Tensor("b", (k, n), dtype), Tensor("c", (m, n), dtype)
    return make_leaf("matmul", f"mm{m}", (a, b), (c,), op="aten.mm.default")


def mul(dtype):
    x = Tensor("x", (1024, 4096), dtype)
    return make_leaf("elementwise", "mul", (x, x), (x,), op="aten.mul.Tensor")


@pytest.fixture
def model(db):
    return EmpiricalPerformanceModel(get_device("h200-sxm"), ProfilingDataSource(db))


def test_we4_exact_hit_is_measured(model):
    r = model.process_op(mm(1024))
    assert r.time_s == sympy.Rational(50, 10**6) and r.source is Provenance.MEASURED


def test_we4_between_rows_is_interpolated(model):
    r = model.process_op(mm(1536))
    # 50 + (90 − 50)·(1536 − 1024)/(2048 − 1024) = 70 µs
    assert r.time_s == sympy.Rational(70, 10**6) and r.source is Provenance.INTERPOLATED


def test_we4_outside_the_range_falls_back_with_the_reason(model):
    r = model.process_op(mm(8192))
    assert r.source is Provenance.ANALYTIC
    assert any("M=8192 outside the measured range [1024, 2048]" in n for n in r.notes)
    assert model.misses[-1].op == "aten.mm.default"


def test_we4_elementwise_in_another_dtype_scales_by_bytes(model):
    r = model.process_op(mul("fp32"))
    assert r.time_s == sympy.Rational(80, 10**6) and r.source is Provenance.INTERPOLATED
    assert "derived from bf16 by byte ratio 2" in r.notes[0]
    assert model.process_op(mul("bf16")).time_s == sympy.Rational(40, 10**6)


def test_zero_cost_and_accepted_miss_say_why(db):
    src = ProfilingDataSource(db)
    x = Tensor("x", (8,), "bf16")
    view = make_leaf("copy", "v", (x,), (x,), op="aten.view.default")
    arange = make_leaf("copy", "a", (x,), (x,), op="torch.ops.aten.arange.default")
    assert src.lookup(view) == QueryResult(0.0, Provenance.MAPPED, "aten.view.default: zero cost by mapping")
    assert "host-side index setup" in src.lookup(arange).note


def test_unmapped_and_symbolic_ops_miss(model):
    x = Tensor("x", (8,), "bf16")
    r = model.process_op(make_leaf("elementwise", "e", (x,), (x,), op="aten.exp.default"))
    assert r.source is Provenance.ANALYTIC and "no mapping for aten.exp.default" in r.notes[-1]
    from perfcast.ir import dim

    r = model.process_op(mm(dim("M")))
    assert r.source is Provenance.ANALYTIC and "symbolic shapes" in r.notes[-1]


@pytest.mark.parametrize("edit, message", [
    (lambda p: (p / "MatMul.csv").unlink(), "names MatMul.csv, which is missing"),
    (lambda p: (p / "MatMul.csv").write_text("M,K,dtype,latency_us\n1,2,bf16,3\n"), "missing column 'N'"),
    (lambda p: (p / "MatMul.csv").write_text("M,K,N,dtype,latency_us\n1,2,3,bf16,0\n"),
     "line 2: column 'latency_us': expected a positive number of microseconds up to 1e+09, got '0'"),
    (lambda p: (p / "MatMul.csv").write_text("M,K,N,dtype,latency_us\n1,2,3,bf16,4\n1,2,3,bf16,5\n"),
     "line 3: repeats the key of line 2 (M=1, K=2, N=3, dtype=bf16)"),
    (lambda p: (p / "op_mapping.yaml").unlink(), "op_mapping.yaml: missing"),
    (lambda p: (p / "op_mapping.yaml").write_text(MAPPING.replace("kernel_type: Mul", "kernel_type: Mull")), "kernel type 'Mull' is not under 'kernels'"),
    (lambda p: (p / "op_mapping.yaml").write_text(MAPPING.replace("category: compute", "category: magic")), "ops.aten.mm.default.category"),
])
def test_database_errors_are_one_line(db, edit, message):
    edit(db)
    with pytest.raises(SpecError) as info:
        ProfilingDataSource(db)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_missing_directory(tmp_path):
    with pytest.raises(SpecError, match="profiling database directory not found"):
        ProfilingDataSource(tmp_path / "nope")


def test_measured_leaf_includes_its_launch(model):
    from perfcast.ir import Graph
    from perfcast.rollup import rollup

    r = rollup(Graph("g", (mm(1024), mm(8192))), model)
    assert r.launches == 1  # only the analytic fallback kernel pays a modelled launch
    ev = r.evaluate({})
    assert ev.provenance_shares()["measured"] == pytest.approx(50e-6 / ev.time_s)


def test_text_generate_prices_with_both_models_side_by_side(db, cli, tmp_path):
    import json

    cfg = tmp_path / "tiny.json"
    cfg.write_text(json.dumps({"model_type": "llama", "hidden_size": 256, "intermediate_size": 512,
                               "num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 2,
                               "head_dim": 32, "vocab_size": 1000, "max_position_embeddings": 4096,
                               "tie_word_embeddings": False}))
    # q_proj and o_proj of a 2-sequence decode: M = 2, K = N = 256.
    (db / "MatMul.csv").write_text("M,K,N,dtype,latency_us\n2,256,256,bf16,3.5\n4,256,256,bf16,4.5\n")
    metrics = tmp_path / "metrics.json"
    doc = json.loads(cli("text-generate", str(cfg), "--decode", "--context-length", "16", "--num-queries", "2",
                         "--device", "h200-sxm", "--performance-model", "analytic", "--performance-model",
                         "profiling", "--profiling-database", str(db), "--export-empirical-metrics",
                         str(metrics), "--json", check=True).stdout)
    prof = doc["performance_models"]["profiling"]
    assert set(doc["performance_models"]) == {"analytic", "profiling"}
    assert 0 < prof["provenance_shares_by_count"]["measured"] < 1
    assert prof["missed_ops"] and all(m["reason"] for m in prof["missed_ops"])
    assert all(set(op["time_s"]) == {"analytic", "profiling"} for op in doc["ops"])
    exported = json.loads(metrics.read_text())["performance_models"]["profiling"]
    assert exported["provenance_by_count"] == prof["provenance_shares_by_count"]


def test_profiling_without_a_database_is_a_clear_error(cli, tmp_path):
    proc = cli("text-generate", "qwen3-8b", "--device", "tpu-v5e", "--performance-model", "profiling")
    assert proc.returncode == 2 and "no profiling database for tpu-v5e" in proc.stderr
    proc = cli("text-generate", "qwen3-8b", "--performance-model", "profiling", "--profiling-database",
               str(tmp_path / "missing"))
    assert proc.returncode == 2 and "no profiling database for h100-sxm under" in proc.stderr


def test_attention_special_tries_alternate_kernel_types_in_order(tmp_path):
    (tmp_path / "op_mapping.yaml").write_text("""\
schema: 1
device: h200-sxm
framework: test
version: "0"
kernels:
  Gen: {file: Gen.csv, keys: [batch, heads, kv_heads, q_len, kv_len, head_dim, dtype], axes: [kv_len], transform: {kv_len: sqrt}}
  Ctx: {file: Ctx.csv, keys: [batch, heads, kv_heads, q_len, kv_len, head_dim, dtype]}
  Experts: {file: Experts.csv, keys: [tokens, hidden, inter, experts, top_k, dtype], axes: [tokens]}
ops:
  perfcast.attention.default: {category: attention_special, kernel_type: Gen, alternate_kernel_types: [Ctx]}
  perfcast.moe_experts.default: {category: moe_fused, kernel_type: Experts}
  fused[add+mul]: {category: composite}
""")
    (tmp_path / "Gen.csv").write_text("batch,heads,kv_heads,q_len,kv_len,head_dim,dtype,latency_us\n"
                                      "8,32,8,1,1024,128,bf16,20\n8,32,8,1,4096,128,bf16,40\n")
    (tmp_path / "Ctx.csv").write_text("batch,heads,kv_heads,q_len,kv_len,head_dim,dtype,latency_us\n"
                                      "1,32,8,512,512,128,bf16,100\n")
    (tmp_path / "Experts.csv").write_text("tokens,hidden,inter,experts,top_k,dtype,latency_us\n"
                                          "64,1024,512,8,2,bf16,30\n128,1024,512,8,2,bf16,50\n")
    src = ProfilingDataSource(tmp_path)

    def attn(b, s, past):
        q = Tensor("q", (b, 32, s, 128), "bf16")
        kv = Tensor("k", (b, 8, s, 128), "bf16")
        out = Tensor("o", (b, s, 32, 128), "bf16")
        return make_leaf("attention", "a", (q, kv, kv), (out,), op="perfcast.attention.default",
                         past=past, causal=True, window=0, shared_kv=False, cache_width=0)

    # decode at kv_len 2501: interpolated in √kv_len between 1024 and 4096 (√: 32 → 64, 50.01 → 30.0…)
    r = src.lookup(attn(8, 1, 2500))
    assert r.source is Provenance.INTERPOLATED and r.latency_us == pytest.approx(20 + 20 * (2501 ** 0.5 - 32) / 32)
    # prefill: Gen (q_len 1 only) misses, the alternate Ctx hits exactly
    r = src.lookup(attn(1, 512, 0))
    assert r.source is Provenance.MEASURED and r.latency_us == 100 and r.note.startswith("Ctx")
    hidden, gate_up, down = Tensor("h", (96, 1024), "bf16"), Tensor("g", (8, 1024, 1024), "bf16"), Tensor("d", (8, 1024, 512), "bf16")
    moe = make_leaf("grouped_matmul", "m", (hidden, gate_up, down, Tensor("i", (96, 2), "int64")), (hidden,),
                    op="perfcast.moe_experts.default", top_k=2, num_experts=8, routing="balanced")
    assert src.lookup(moe).latency_us == pytest.approx(40)  # tokens 96: halfway between 64 and 128
    x = Tensor("x", (4, 4), "bf16")
    fused = make_leaf("fused", "f", (x,), (x,), op="fused[add+mul]", flops=0)
    assert "composite lookup is not available" in src.lookup(fused).reason


def test_we4_all_reduce_is_interpolated_in_bytes(tmp_path):
    """8 devices, one tier: 20 µs at 1 MiB, 50 µs at 4 MiB → α = 10 µs, β = 10 µs/MiB → 2 MiB: 30 µs."""
    db = tmp_path / "h200-sxm" / "test" / "0"
    comm = tmp_path / "h200-sxm" / "nccl" / "2.0"
    db.mkdir(parents=True)
    comm.mkdir(parents=True)
    (db / "op_mapping.yaml").write_text("""\
schema: 1
device: h200-sxm
framework: test
version: "0"
communication: ../../nccl/2.0
kernels: {}
ops:
  all_reduce: {category: communication, kernel_type: AllReduce}
""")
    mib = 1 << 20
    (comm / "AllReduce.csv").write_text(f"devices,dtype,bytes,latency_us\n8,bf16,{mib},20\n8,bf16,{4 * mib},50\n")
    model = EmpiricalPerformanceModel(get_device("h200-sxm"), ProfilingDataSource(db))
    x = Tensor("x", (mib,), "bf16")  # 2 MiB of bf16
    leaf = make_leaf("all_reduce", "ar", (x,), (x,), group_size=8, axis="tp")
    assert leaf.cost["bytes.link:tp"] == 2 * mib * 2 * 7 // 8  # ring: 2(n−1)/n of the message
    r = model.process_op(leaf)
    assert r.time_s == sympy.Rational(30, 10**6) and r.source is Provenance.INTERPOLATED
    assert set(r.breakdown) == {"comm"}
    big = Tensor("x", (8 * mib,), "bf16")
    with pytest.raises(Exception, match="outside the measured range.*cannot price it: .*needs a topology"):
        model.process_op(make_leaf("all_reduce", "ar", (big,), (big,), group_size=8, axis="tp"))


def test_composite_fused_kernel_decomposes_into_members(db):
    x = Tensor("x", (1024, 4096), "bf16")
    mul_leaf = make_leaf("elementwise", "m", (x, x), (x,), op="aten.mul.Tensor")
    exp_leaf = make_leaf("elementwise", "e", (x,), (x,), op="aten.exp.default")
    model = EmpiricalPerformanceModel(get_device("h200-sxm"), ProfilingDataSource(db))
    both = make_leaf("fused", "f", (x,), (x,), op="fused[mul+mul]", flops=0, members=(mul_leaf, mul_leaf))
    r = model.process_op(both)
    assert r.source is Provenance.MEASURED and r.time_s == sympy.Rational(80, 10**6)  # 40 + 40 µs
    partial = make_leaf("fused", "f", (x,), (x,), op="fused[mul+exp]", flops=0, members=(mul_leaf, exp_leaf))
    r = model.process_op(partial)
    fallback = model._fallback().process_op(exp_leaf).time_s
    assert r.source is Provenance.PARTIAL and r.time_s == sympy.Rational(40, 10**6) + fallback
    assert "1 priced by the fallback" in r.notes[0]


def test_fallback_is_labelled_as_such_in_shares(db, cli, tmp_path):
    import json

    doc = json.loads(cli("text-generate", "qwen3-8b", "--device", "h200-sxm", "--decode", "--context-length",
                         "64", "--num-queries", "2", "--performance-model", "analytic", "--performance-model",
                         "profiling", "--profiling-database", str(db), "--json", check=True).stdout)
    assert set(doc["performance_models"]["profiling"]["provenance_shares"]) <= {"measured", "interpolated", "partial", "fallback"}
    assert "fallback" in doc["performance_models"]["profiling"]["provenance_shares"]
    assert set(doc["performance_models"]["analytic"]["provenance_shares"]) == {"analytic"}
