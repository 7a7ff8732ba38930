"""Profiling databases: the aiconfigurator importer's logic (on synthetic parquet tables laid
out like aiconfigurator-core 0.12.0's, so no aiconfigurator is needed: versions, backward fill,
row selection, kernel-source collisions) and ``db check``. Real slices and the shipped databases:
``test_db_shipped.py``."""

import csv
import gzip
import io
from pathlib import Path

import pandas as pd
import pytest
import yaml

from perfcast.cli.main import main
from perfcast.db.aiconfigurator import import_aiconfigurator
from perfcast.db.check import check_database, inspect
from perfcast.ir import Tensor, UserError, make_leaf
from perfcast.perf import Provenance
from perfcast.perf.features import features
from perfcast.perf.profiling import ProfilingDataSource

HEAD = {"framework": "TRTLLM", "version": "1.0", "device": "NVIDIA TEST", "kernel_source": "torch_flow"}


def _write(root: Path, rel: str, rows: list[dict]) -> None:
    path = root / "systems" / "data" / "test_sys" / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame([{**HEAD, **r} for r in rows]).to_parquet(path)


def _attn(batch, isl, step, latency, beam=1, dtype="bfloat16", kv="bfloat16"):
    return {"batch_size": batch, "isl": isl, "num_heads": 32, "num_key_value_heads": 8,
            "head_dim": 128, "window_size": 0, "beam_width": beam, "attn_dtype": dtype,
            "kv_cache_dtype": kv, "step": step, "latency": latency}


def _moe(latency, tp=1, ep=1, dist="balanced", source="moe_torch_flow_cutlass", dtype="bfloat16"):
    return {"kernel_source": source, "moe_dtype": dtype, "num_tokens": 64, "hidden_size": 2048,
            "inter_size": 768, "topk": 8, "num_experts": 128, "moe_tp_size": tp, "moe_ep_size": ep,
            "distribution": dist, "latency": latency}


def _mla(isl, step, source="default"):
    return {"kernel_source": source, "mla_dtype": "bfloat16", "kv_cache_dtype": "fp8", "num_heads": 16,
            "batch_size": 4, "isl": isl, "tp_size": 8, "step": step, "latency": 0.02}


def _nccl(op, dtype, size, latency):
    return {"op_name": op, "kernel_source": "NCCL", "nccl_dtype": dtype, "num_gpus": 8,
            "message_size": size, "latency": latency}


def _gemm(dt, m, lat):
    return {"op_name": "gemm", "gemm_dtype": dt, "m": m, "n": 32, "k": 64, "latency": lat}


@pytest.fixture
def aic(tmp_path):
    """A fake installed aiconfigurator_core: one system, trtllm 0.9 (custom all-reduce only),
    1.0 (GEMM, attention, MoE, MLA) and 1.1 (quantize only: not a version), NCCL 2.0 and 2.1."""
    root = tmp_path / "site" / "aiconfigurator_core"
    (tmp_path / "site" / "aiconfigurator_core-0.12.0.dist-info").mkdir(parents=True)
    gemm = _gemm
    _write(root, "gemm/trtllm/1.0/gemm_perf.parquet", [
        gemm("bfloat16", 16, 0.01), gemm("bfloat16", 16, 0.03),  # a repeated key: median 20 µs
        gemm("bfloat16", 32, 0.05), gemm("fp8", 16, 0.008),
        gemm("fp8_block", 16, 0.009), gemm("int4_wo", 16, 0.007),  # block-scaled fp8; weight-only w4a16
        gemm("fp6", 16, 0.009),  # not a perfcast dtype: dropped
        gemm("bfloat16", 64, 0.0), gemm("bfloat16", 128, -1.0)])  # non-positive: dropped
    _write(root, "attention/trtllm/1.0/context_attention_perf.parquet", [
        _attn(4, 128, 0, 0.1), _attn(8, 128, 0, 0.2), _attn(8, 128, 0, 0.9, beam=2),
        _attn(8, 128, 0, 0.15, dtype="fp8", kv="fp8")])
    _write(root, "attention/trtllm/1.0/generation_attention_perf.parquet", [
        _attn(8, 1, 127, 0.012), _attn(8, 1, 255, 0.02), _attn(8, 1, 127, 0.011, kv="fp8")])
    _write(root, "moe/trtllm/1.0/moe_perf.parquet", [
        _moe(0.05), _moe(0.04, dtype="fp8"), _moe(0.03, tp=2), _moe(0.03, ep=8),
        _moe(0.06, dist="power_law_1.01"), _moe(0.02, source="moe_torch_flow_nongated"),
        _moe(0.02, source="moe_torch_flow", dtype="w4a16_mxfp4"),
        _moe(0.01, source="moe_torch_flow_min_latency", dtype="nvfp4")])
    _write(root, "mla/trtllm/1.0/context_mla_perf.parquet", [_mla(256, 0)])
    _write(root, "mla/trtllm/1.0/generation_mla_perf.parquet", [_mla(1, 255)])
    _write(root, "comm/trtllm/0.9/custom_allreduce_perf.parquet", [
        {"op_name": "all_reduce", "kernel_source": "TRTLLM", "allreduce_dtype": "bfloat16", "num_gpus": 8,
         "message_size": n, "latency": lat, "implementation": "trtllm"} for n, lat in ((1024, 0.004), (4096, 0.006))])
    _write(root, "quantize/trtllm/1.1/scale_matrix_perf.parquet", [
        {"op_name": "scale_matrix", "kernel_source": "torch_ops", "m": 16, "k": 64, "quant_dtype": "fp8",
         "latency": 0.003}])
    _write(root, "comm/nccl/2.0/nccl_perf.parquet", [_nccl("all_reduce", "half", 1024, 9.0)])
    _write(root, "comm/nccl/2.1/nccl_perf.parquet", [
        _nccl("all_reduce", "half", 1024, 0.01), _nccl("all_reduce", "int8", 1024, 0.008),
        _nccl("all_gather", "half", 2048, 0.012), _nccl("alltoall", "half", 256, 0.0),
        _nccl("reduce_scatter", "float64", 256, 0.01)])
    return root


def _imported(aic, out, version="1.0", **kw):
    return import_aiconfigurator(aic, "test_sys", "trtllm", version, out, "h200-sxm", **kw)


def _mm(m, k=64, n=32, dtype="bf16"):
    a, b, c = Tensor("a", (m, k), dtype), Tensor("b", (k, n), dtype), Tensor("c", (m, n), dtype)
    return make_leaf("matmul", f"mm{m}", (a, b), (c,), op="aten.mm.default")


def _attention(b, s, past, dtype="bf16", kv="bf16"):
    q, o = Tensor("q", (b, 32, s, 128), dtype), Tensor("o", (b, 32, s, 128), dtype)
    k, v = Tensor("k", (b, 8, past + s, 128), kv), Tensor("v", (b, 8, past + s, 128), kv)
    return make_leaf("attention", "attn", (q, k, v), (o,), op="perfcast.attention.default",
                     past=past, window=0)


def _experts(tokens=64, dtype="bf16", routing="balanced"):
    h, gu = Tensor("h", (tokens, 2048), dtype), Tensor("gu", (128, 2048, 2 * 768), dtype)
    d, i = Tensor("d", (128, 768, 2048), dtype), Tensor("i", (tokens, 8), "int64")
    return make_leaf("grouped_matmul", "moe", (h, gu, d, i), (h,), op="perfcast.moe_experts.default",
                     num_experts=128, top_k=8, routing=routing)


def _csv(path: Path) -> list[dict]:
    if path.name.endswith(".gz"):
        return list(csv.DictReader(io.StringIO(gzip.decompress(path.read_bytes()).decode())))
    with path.open() as f:
        return list(csv.DictReader(f))


def test_import_writes_the_layout_and_counts(aic, tmp_path):
    got = _imported(aic, tmp_path / "db")
    root = tmp_path / "db" / "h200-sxm" / "trtllm" / "1.0"
    assert got["root"] == root and got["communication"] == tmp_path / "db" / "h200-sxm" / "nccl" / "2.1"
    assert got["tables"] == {"MatMul": 5, "ContextAttention": 3, "GenerationAttention": 3, "GroupedMatMul": 6,
                             "GroupedMatMulMinLatency": 1, "ContextMLA": 1, "GenerationMLA": 1,
                             "CustomAllReduce": 2}
    assert got["collectives"] == {"AllGather": 1, "AllReduce": 2, "AllToAll": 0, "ReduceScatter": 0}
    assert _csv(root / "MatMul.csv.gz")[0] == {"M": "16", "K": "64", "N": "32", "dtype": "bf16", "latency_us": "20"}
    assert {r["dtype"] for r in _csv(root / "MatMul.csv.gz")} == {"bf16", "fp8", "fp8_block", "w4a16"}
    assert [r["q_len"] for r in _csv(root / "GenerationAttention.csv.gz")] == ["1", "1", "1"]
    assert {r["kv_len"] for r in _csv(root / "GenerationAttention.csv.gz")} == {"128", "256"}
    allreduce = _csv(got["communication"] / "AllReduce.csv.gz")
    assert [(r["dtype"], r["bytes"]) for r in allreduce] == [("fp16", "2048"), ("int8", "1024")]
    mapping = (root / "op_mapping.yaml").read_text()
    assert "communication: ../../nccl/2.1" in mapping and "not mapped: GroupedMatMulMinLatency" in mapping
    assert ("perfcast.attention.default: {category: attention_special, kernel_type: GenerationAttention, "
            "alternate_kernel_types: [ContextAttention, GenerationMLA, ContextMLA]}") in mapping
    assert ("custom_all_reduce: {category: communication, kernel_type: CustomAllReduce, "
            "alternate_kernel_types: [AllReduce]}") in mapping
    assert "custom_all_reduce_eager" not in mapping  # TensorRT-LLM's table has no eager rows
    manifest = yaml.safe_load((root / "MANIFEST.yaml").read_text())
    assert manifest["source"]["package"] == "aiconfigurator-core" and manifest["source"]["version_choice"] == "given"
    assert manifest["source"]["package_version"] == "0.12.0" and manifest["source"]["licence"] == "Apache-2.0"
    mm = manifest["tables"]["MatMul"]
    assert (mm["rows_read"], mm["dropped_unknown_dtype"], mm["dropped_latency"], mm["merged_duplicates"],
            mm["rows"]) == (9, 1, 2, 1, 5)
    assert mm["unknown_dtypes_dropped"] == ["fp6"] and mm["kernel_sources"] == {"torch_flow": 5}
    assert (mm["framework"], mm["version"], mm["file"]) == ("trtllm", "1.0", "MatMul.csv.gz")
    moe = manifest["tables"]["GroupedMatMul"]
    # 8 rows: 1 non-gated dropped, 1 min-latency row to its own table, 6 kept (every distribution)
    assert (moe["rows_read"], moe["dropped_nongated"], moe["rows_selected"], moe["rows"]) == (8, 1, 6, 6)
    assert manifest["missing"] == {
        "computescale_perf.parquet": "no quantize/trtllm/<version>/computescale_perf.parquet at 1.0 or older",
        "gdn_perf.parquet": "no linear_attention/trtllm/<version>/gdn_perf.parquet at 1.0 or older",
        "glm5_dsa_attn_module_perf.parquet": "no sparse_attention/trtllm/<version>/glm5_dsa_attn_module_perf.parquet "
                                             "at 1.0 or older",
        "scale_matrix_perf.parquet": "no quantize/trtllm/<version>/scale_matrix_perf.parquet at 1.0 or older "
                                     "(only newer: 1.1; never filled forward)",
        "wideep_deepep_ll_perf.parquet": "no comm/trtllm/<version>/wideep_deepep_ll_perf.parquet at 1.0 or older",
        "wideep_generation_moe_perf.parquet": "no moe/trtllm/<version>/wideep_generation_moe_perf.parquet at 1.0 or "
                                              "older"}
    assert not (got["communication"] / "AllToAll.csv.gz").exists()  # no rows left: not written
    assert check_database(tmp_path / "db") == []


def test_version_default_and_backward_fill(aic, tmp_path):
    """No version: the newest with GEMM and attention (1.0; 1.1 has only a quantize table). The
    custom all-reduce exists only under 0.9: taken from there, and MANIFEST.yaml says so."""
    got = _imported(aic, tmp_path / "db", version=None)
    assert got["version"] == "1.0" and got["root"].name == "1.0"
    manifest = yaml.safe_load((got["root"] / "MANIFEST.yaml").read_text())
    assert manifest["source"]["version_choice"] == "the newest trtllm version with GEMM and attention tables (of 1.0)"
    ar = manifest["tables"]["CustomAllReduce"]
    assert ar["version"] == "0.9" and ar["source"].endswith("comm/trtllm/0.9/custom_allreduce_perf.parquet")
    assert ar["version_note"].startswith("no custom_allreduce_perf.parquet under 1.0: taken from 0.9")
    assert manifest["tables"]["MatMul"]["version"] == "1.0" and "version_note" not in manifest["tables"]["MatMul"]
    # bytes = message_size (elements) x 2 (bf16)
    assert [(r["devices"], r["bytes"], r["latency_us"]) for r in _csv(got["root"] / "CustomAllReduce.csv.gz")] == [
        ("8", "2048", "4"), ("8", "8192", "6")]


def test_reimport_replaces_the_tables(aic, tmp_path):
    got = _imported(aic, tmp_path / "db", compress=False)
    assert (got["root"] / "MatMul.csv").exists()
    got = _imported(aic, tmp_path / "db")
    assert not (got["root"] / "MatMul.csv").exists() and (got["root"] / "MatMul.csv.gz").exists()
    assert not (got["communication"] / "AllReduce.csv").exists()
    assert check_database(got["root"]) == []


def test_gzip_tables_are_deterministic(aic, tmp_path):
    one = _imported(aic, tmp_path / "a")["root"] / "GroupedMatMul.csv.gz"
    two = _imported(aic, tmp_path / "b")["root"] / "GroupedMatMul.csv.gz"
    assert one.read_bytes() == two.read_bytes()


def test_mla_rows_take_the_form_their_kernel_ran(aic, tmp_path):
    """TensorRT-LLM (``default``) prefill is expanded (per-head K/V, 192/128 wide); decode
    absorbed (one latent head, 576/512, shared_kv). SGLang's Hopper FlashAttention MLA rows are
    absorbed in both phases; a kernel source of unknown form is refused."""
    root = _imported(aic, tmp_path / "db")["root"]
    (ctx,) = _csv(root / "ContextMLA.csv.gz")
    assert (ctx["heads"], ctx["kv_heads"], ctx["head_dim"], ctx["v_head_dim"], ctx["shared_kv"]) == (
        "16", "16", "192", "128", "0")
    (gen,) = _csv(root / "GenerationMLA.csv.gz")
    assert (gen["heads"], gen["kv_heads"], gen["head_dim"], gen["v_head_dim"], gen["shared_kv"], gen["kv_len"]) == (
        "16", "1", "576", "512", "1", "256")
    _write(aic, "mla/trtllm/1.0/context_mla_perf.parquet", [_mla(256, 0, source="flash_attention")])
    (ctx,) = _csv(_imported(aic, tmp_path / "db2")["root"] / "ContextMLA.csv.gz")
    assert (ctx["kv_heads"], ctx["head_dim"], ctx["v_head_dim"], ctx["shared_kv"]) == ("1", "576", "512", "1")
    _write(aic, "mla/trtllm/1.0/context_mla_perf.parquet", [_mla(256, 0, source="mystery_mla")])
    with pytest.raises(UserError, match="MLA kernel source mystery_mla: no known MLA form"):
        _imported(aic, tmp_path / "db3")


def test_kernel_source_collisions(aic, tmp_path):
    """Two kernels timing one key: SGLang's default (trtllm_mha on Blackwell) is kept and the
    file records each row's kernel; a collision with no stated preference is an error."""
    for rel in ("gemm/sglang/0.5/gemm_perf.parquet",):
        _write(aic, rel, [_gemm("bfloat16", 16, 0.01)])
    _write(aic, "attention/sglang/0.5/context_attention_perf.parquet", [
        {**_attn(4, 128, 0, 0.1), "kernel_source": "trtllm_mha"}, {**_attn(4, 128, 0, 0.3), "kernel_source": "triton"},
        {**_attn(8, 128, 0, 0.5), "kernel_source": "triton"}])
    _write(aic, "attention/sglang/0.5/generation_attention_perf.parquet", [
        {**_attn(8, 1, 127, 0.01), "kernel_source": "fa3"}, {**_attn(8, 1, 127, 0.02), "kernel_source": "triton"}])
    with pytest.raises(UserError, match="GenerationAttention: 2 rows share keys across kernel sources fa3, triton"):
        import_aiconfigurator(aic, "test_sys", "sglang", None, tmp_path / "db", "h200-sxm")
    _write(aic, "attention/sglang/0.5/generation_attention_perf.parquet", [{**_attn(8, 1, 127, 0.01), "kernel_source": "fa3"}])
    got = import_aiconfigurator(aic, "test_sys", "sglang", None, tmp_path / "db", "h200-sxm")
    rows = _csv(got["root"] / "ContextAttention.csv.gz")
    assert [(r["batch"], r["latency_us"], r["kernel_source"]) for r in rows] == [("4", "100", "trtllm_mha"),
                                                                              ("8", "500", "triton")]
    table = yaml.safe_load((got["root"] / "MANIFEST.yaml").read_text())["tables"]["ContextAttention"]
    assert table["superseded_other_kernel"] == 1 and table["kernel_sources"] == {"trtllm_mha": 1, "triton": 1}
    assert ProfilingDataSource(got["root"]).lookup(_attention(4, 128, 0)).latency_us == 100  # kernel_source: not a key


def test_import_keeps_expert_split_rows_per_device(aic, tmp_path):
    """moe_tp 2 of inter_size 768: each device's experts are 384 wide; moe_ep rows keep their split."""
    root = _imported(aic, tmp_path / "db")["root"]
    rows = {(r["moe_tp"], r["moe_ep"], r["routing"], r["dtype"]): (r["tokens"], r["inter"], r["experts"], r["latency_us"])
            for r in _csv(root / "GroupedMatMul.csv.gz")}
    assert rows == {("1", "1", "balanced", "bf16"): ("64", "768", "128", "50"),
                    ("1", "1", "balanced", "fp8"): ("64", "768", "128", "40"),
                    ("2", "1", "balanced", "bf16"): ("64", "384", "128", "30"),
                    ("1", "8", "balanced", "bf16"): ("64", "768", "128", "30"),
                    ("1", "1", "power_law_1.01", "bf16"): ("64", "768", "128", "60"),
                    ("1", "1", "balanced", "w4a16_mxfp4"): ("64", "768", "128", "20")}
    assert "keys: [tokens, hidden, inter, experts, top_k, moe_tp, moe_ep, routing, dtype]" in (
        root / "op_mapping.yaml").read_text()
    selection = yaml.safe_load((root / "MANIFEST.yaml").read_text())["tables"]["GroupedMatMul"]["selection"]
    assert "collect_moe.py, run_moe_torch" in selection and "inter_size / moe_tp_size -> inter" in selection


def test_imported_database_prices_leaves(aic, tmp_path):
    src = ProfilingDataSource(_imported(aic, tmp_path / "db")["root"])
    r = src.lookup(_mm(16))
    assert (r.latency_us, r.source) == (20.0, Provenance.MEASURED)
    assert src.lookup(_mm(24)).source is Provenance.INTERPOLATED
    decode = src.lookup(_attention(8, 1, 127))
    assert decode.latency_us == pytest.approx(12.0) and decode.note == "GenerationAttention: exact"
    prefill = src.lookup(_attention(8, 128, 0))
    assert prefill.latency_us == pytest.approx(200.0) and prefill.note == "ContextAttention: exact"
    assert src.lookup(_attention(6, 128, 0)).latency_us == pytest.approx(150.0)  # 1-D in batch
    assert src.lookup(_attention(8, 1, 191)).source is Provenance.INTERPOLATED  # kv_len 192 (sqrt)
    assert src.lookup(_experts()).latency_us == pytest.approx(50.0)
    assert src.lookup(_experts(dtype="fp8")).latency_us == pytest.approx(40.0)
    assert src.lookup(_experts(routing="power_law_1.01")).latency_us == pytest.approx(60.0)
    assert "routing=power_law_1.2" in src.lookup(_experts(routing="power_law_1.2")).reason
    # perfcast's default routing is measured by no table: the miss names the values that are
    assert "no measurement at routing=random (measured: balanced, power_law_1.01)" in src.lookup(
        _experts(routing="random")).reason


def test_addmm_is_keyed_on_its_reduction_width():
    """``addmm(bias, a, b)``: K is a's width (256), not the bias's (64): 16 x 256 @ 256 x 64."""
    bias, a, b = Tensor("bias", (64,), "bf16"), Tensor("a", (16, 256), "bf16"), Tensor("b", (256, 64), "bf16")
    leaf = make_leaf("matmul", "k_proj", (bias, a, b), (Tensor("c", (16, 64), "bf16"),), op="aten.addmm.default")
    assert features(leaf) == {"M": 16, "N": 64, "K": 256, "dtype": "bf16"}


def test_weight_only_and_block_fp8_gemms_select_their_rows(aic, tmp_path):
    """A w4a16 leaf (int4 weights, bf16 compute) is the weight-only row, not the bf16 GEMM; a
    block-scaled fp8 leaf (compute_dtype fp8_block) is not the per-tensor fp8 row."""
    src = ProfilingDataSource(_imported(aic, tmp_path / "db")["root"])
    a, w, c = Tensor("a", (16, 64), "bf16"), Tensor("w", (64, 32), "int4"), Tensor("c", (16, 32), "bf16")
    assert src.lookup(make_leaf("matmul", "mm", (a, w), (c,), op="aten.mm.default")).latency_us == pytest.approx(7.0)
    a8, w8 = Tensor("a", (16, 64), "fp8"), Tensor("w", (64, 32), "fp8")
    block = make_leaf("matmul", "mm", (a8, w8), (c,), op="aten.mm.default", compute_dtype="fp8_block")
    assert src.lookup(block).latency_us == pytest.approx(9.0)
    assert src.lookup(_mm(16, dtype="fp8")).latency_us == pytest.approx(8.0)


def test_prefill_never_matches_the_decode_table(aic, tmp_path):
    src = ProfilingDataSource(_imported(aic, tmp_path / "db")["root"])
    miss = src.lookup(_attention(8, 128, 128))  # q_len 128, kv_len 256: a decode kv_len, not q_len
    assert "GenerationAttention" in miss.reason and "ContextAttention" in miss.reason


def test_dtype_filter_and_nccl_version(aic, tmp_path):
    got = _imported(aic, tmp_path / "db", dtypes=["bf16"], nccl_version="2.0")
    assert {r["dtype"] for r in _csv(got["root"] / "MatMul.csv.gz")} == {"bf16"}
    assert got["tables"]["GenerationAttention"] == 2 and got["tables"]["ContextMLA"] == 0
    assert "ContextMLA" not in (got["root"] / "op_mapping.yaml").read_text()
    assert check_database(got["root"]) == []
    assert _csv(got["communication"] / "AllReduce.csv.gz")[0]["latency_us"] == "9000"
    assert "dtype_filter" in yaml.safe_load((got["root"] / "MANIFEST.yaml").read_text())


@pytest.mark.parametrize("system, version, message", [
    ("nope", "1.0", "no such system (have: test_sys)"),
    ("test_sys", "9.9", "no trtllm 9.9 tables with GEMM and attention (versions: 1.0)"),
    ("test_sys", "1.1", "no trtllm 1.1 tables with GEMM and attention (versions: 1.0)"),
])
def test_import_errors(aic, tmp_path, system, version, message):
    with pytest.raises(UserError, match=message.replace("(", r"\(").replace(")", r"\)")):
        import_aiconfigurator(aic, system, "trtllm", version, tmp_path / "db", "h200-sxm")


# ---- db check -------------------------------------------------------------------------------

MAPPING = """\
schema: 1
device: h200-sxm
framework: test
version: "0"
communication: ../../nccl/1
kernels:
  MatMul: {file: MatMul.csv, keys: [M, K, N, dtype], axes: [M]}
  Mul: {file: Mul.csv, keys: [shape, dtype]}
ops:
  aten.mm.default: {category: compute, kernel_type: MatMul}
  aten.mul.Tensor: {category: elementwise, kernel_type: Mul}
"""


@pytest.fixture
def db(tmp_path):
    root = tmp_path / "h200-sxm" / "test" / "0"
    root.mkdir(parents=True)
    (root / "op_mapping.yaml").write_text(MAPPING)
    (root / "MatMul.csv").write_text("M,K,N,dtype,latency_us\n1024,4096,4096,bf16,50\n2048,4096,4096,bf16,90\n")
    (root / "Mul.csv").write_text("shape,dtype,latency_us\n1024x4096,bf16,40\n")
    (tmp_path / "h200-sxm" / "nccl" / "1").mkdir(parents=True)
    (tmp_path / "h200-sxm" / "nccl" / "1" / "AllReduce.csv").write_text("devices,dtype,bytes,latency_us\n8,fp16,2048,10\n")
    return root


def test_check_good_database(db, tmp_path):
    report = inspect(tmp_path)  # a tree: every op_mapping.yaml under it
    assert report.problems == [] and (report.tables, report.rows) == (3, 4)
    assert check_database(db) == []


@pytest.mark.parametrize("edit, message", [
    (lambda p: (p / "MatMul.csv").unlink(), "kernel MatMul names MatMul.csv, which is missing"),
    (lambda p: (p / "MatMul.csv").write_text("M,K,dtype,latency_us\n1,2,bf16,3\n"), "missing column 'N'"),
    (lambda p: (p / "MatMul.csv").write_text("M,K,N,dtype,latency_us\n1,2,3,bf16,0\n1,2,4,bf16,-1\n"),
     "line 2: column 'latency_us': expected a positive number of microseconds up to 1e+09, got '0' (2 rows)"),
    (lambda p: (p / "MatMul.csv").write_text("M,K,N,dtype,latency_us\n1,2,3,bf16,4\n1,2,3,bf16,5\n"),
     "line 3: repeats the key of line 2 (M=1, K=2, N=3, dtype=bf16)"),
    (lambda p: (p / "op_mapping.yaml").write_text(MAPPING.replace("kernel_type: Mul", "kernel_type: Mull")),
     "kernel type 'Mull' is not under 'kernels'"),
    (lambda p: (p / "op_mapping.yaml").write_text(MAPPING.replace("category: compute", "category: magic")),
     "key 'ops.aten.mm.default.category'"),
    (lambda p: (p / "op_mapping.yaml").write_text(MAPPING.replace("nccl/1", "nccl/2")), "is not a directory"),
    (lambda p: (p.parent.parent / "nccl" / "1" / "AllReduce.csv").write_text("devices,bytes,latency_us\n8,2,0\n"),
     "AllReduce.csv: line 2: column 'latency_us': expected a positive number"),
    (lambda p: (p / "op_mapping.yaml").write_text("schema: [1\n"), "not valid YAML"),
])
def test_check_reports_each_problem(db, edit, message):
    edit(db)
    problems = check_database(db)
    assert len(problems) == 1 and message in problems[0], problems


def test_check_reports_all_problems_at_once(db):
    (db / "op_mapping.yaml").write_text(MAPPING.replace("version: \"0\"\n", "")
                                        .replace("category: compute", "category: magic"))
    (db / "MatMul.csv").write_text("M,K,latency_us\n1,2,0\n")
    (db / "Mul.csv").write_text("shape,dtype,latency_us\n1x2,bf16,1\n1x2,bf16,2\n")
    problems = "\n".join(check_database(db))
    for message in ("key 'version': missing key", "key 'ops.aten.mm.default.category'",
                    "missing column 'N'", "missing column 'dtype'",
                    "Mul.csv: line 3: repeats the key of line 2 (shape=1x2, dtype=bf16)"):
        assert message in problems
    assert len(check_database(db)) == 6


def test_check_empty_and_missing(tmp_path):
    assert check_database(tmp_path) == [f"{tmp_path}: no op_mapping.yaml at or under it"]
    assert "directory not found" in check_database(tmp_path / "nope")[0]


def test_cli_check_and_import(db, aic, tmp_path, capsys):
    assert main(["db", "check", str(db)]) == 0
    assert capsys.readouterr().out.strip() == "ok: 3 kernel tables, 4 rows"
    (db / "Mul.csv").write_text("shape,dtype,latency_us\n1x2,bf16,0\n")
    assert main(["db", "check", str(db)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0] == f"perfcast db: error: {db}: 1 problem"
    assert err[1].startswith(f"  {db / 'Mul.csv'}: line 2: column 'latency_us': expected a positive number")
    assert main(["db", "import", "aiconfigurator", "--system", "test_sys", "--backend", "trtllm",
                 "--out", str(tmp_path / "out"), "--aic-root", str(aic), "--uncompressed"]) == 0
    out = capsys.readouterr().out
    assert "GroupedMatMul: 6 rows" in out and "missing scale_matrix_perf.parquet" in out
    assert (tmp_path / "out" / "test-sys" / "trtllm" / "1.0" / "MatMul.csv").exists()
    assert main(["db", "check", str(tmp_path / "out")]) == 0


def test_cli_import_without_aiconfigurator(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr("perfcast.db.aiconfigurator.default_root", lambda: None)
    assert main(["db", "import", "aiconfigurator", "--system", "h200_sxm", "--backend", "trtllm",
                 "--version", "1.3.0rc20", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "pip install aiconfigurator-core==0.12.0" in err and err.count("\n") == 1


def test_check_and_load_gzip_tables(db, tmp_path):
    """Tables may be gzip-compressed (``*.csv.gz``): loaded, checked and counted alike; a table
    present in both forms is a problem, never a silent choice."""
    for path in (db / "MatMul.csv", tmp_path / "h200-sxm" / "nccl" / "1" / "AllReduce.csv"):
        path.with_name(path.name + ".gz").write_bytes(gzip.compress(path.read_bytes()))
        path.unlink()
    (db / "op_mapping.yaml").write_text(MAPPING.replace("file: MatMul.csv", "file: MatMul.csv.gz"))
    report = inspect(tmp_path)
    assert report.problems == [] and (report.tables, report.rows) == (3, 4)
    src = ProfilingDataSource(db)
    assert src.lookup(_mm(1536, k=4096, n=4096)).latency_us == pytest.approx(70.0)  # 50 + 40 * 512/1024
    assert sorted(src.tables) == ["AllReduce", "MatMul", "Mul"]
    (tmp_path / "h200-sxm" / "nccl" / "1" / "AllReduce.csv").write_text("devices,dtype,bytes,latency_us\n8,fp16,2048,10\n")
    problems = check_database(db)
    assert len(problems) == 1 and "table AllReduce is both AllReduce.csv and AllReduce.csv.gz; keep one" in problems[0]
