"""The shipped profiling databases: real slices of aiconfigurator-core 0.12.0's tables
(``tests/fixtures/aiconfigurator``, cut by ``tools/slice_aiconfigurator.py``) imported here
give exactly the shipped rows; every shipped database checks clean; ``find_database`` picks by
device, framework and version; MLA and custom all-reduce leaves hit their tables."""

import json
from pathlib import Path

import pandas as pd
import pytest
import yaml

from perfcast.cli.main import main
from perfcast.db.aiconfigurator import import_aiconfigurator
from perfcast.db.check import inspect
from perfcast.hardware import SpecError
from perfcast.inputs.versions import version_key
from perfcast.ir import Tensor, make_leaf
from perfcast.perf import Provenance
from perfcast.perf.databases import databases, find_database, shipped_root, version_key
from perfcast.perf.empirical import Miss
from perfcast.perf.profiling import load_database

FIXTURES = Path(__file__).parent / "fixtures" / "aiconfigurator"
SHIPPED = shipped_root()
#: device → framework → version: the newest with GEMM and attention tables (the same versions
#: aiconfigurator-core 0.12.0's systems/query_versions.yaml names ``current``)
VERSIONS = {"h100-sxm": {"trtllm": "1.3.0rc20", "vllm": "0.24.0", "sglang": "0.5.14"},
            "h200-sxm": {"trtllm": "1.3.0rc20", "vllm": "0.24.0", "sglang": "0.5.14"},
            "b200-sxm": {"trtllm": "1.3.0rc20", "vllm": "0.24.0", "sglang": "0.5.14"},
            "b300-sxm": {"trtllm": "1.3.0rc20", "vllm": "0.24.0", "sglang": "0.5.14"},
            "gb200": {"trtllm": "1.3.0rc20", "vllm": "0.24.0", "sglang": "0.5.14"},
            "gb300": {"trtllm": "1.3.0rc20", "vllm": "0.24.0", "sglang": "0.5.14"},
            "a100-sxm-80gb": {"trtllm": "1.0.0", "vllm": "0.14.0", "sglang": "0.5.10"}}
SYSTEMS = {"h200-sxm": "h200_sxm", "b200-sxm": "b200_sxm", "a100-sxm-80gb": "a100_sxm"}


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    """The slices, back in parquet as an installed aiconfigurator_core, imported."""
    site = tmp_path_factory.mktemp("site")
    root = site / "aiconfigurator_core"
    (site / "aiconfigurator_core-0.12.0.dist-info").mkdir()
    for csv in FIXTURES.rglob("*.csv"):
        path = root / "systems" / "data" / csv.relative_to(FIXTURES).with_suffix(".parquet")
        path.parent.mkdir(parents=True, exist_ok=True)
        pd.read_csv(csv).to_parquet(path)
    out = tmp_path_factory.mktemp("db")
    done = {}
    for device, framework in (("h200-sxm", "trtllm"), ("h200-sxm", "vllm"), ("h200-sxm", "sglang"),
                              ("b200-sxm", "trtllm"), ("b200-sxm", "sglang"), ("a100-sxm-80gb", "trtllm")):
        done[device, framework] = import_aiconfigurator(root, SYSTEMS[device], framework, None, out, device)
    return done


def _table(path: Path) -> pd.DataFrame:
    return pd.read_csv(path, dtype=str)


def _manifest(device, framework) -> dict:
    return yaml.safe_load((SHIPPED / device / framework / VERSIONS[device][framework] / "MANIFEST.yaml").read_text())


def test_imported_slices_are_the_shipped_rows(imported):
    """Every row imported from a slice is, key and latency, a row of the shipped table."""
    checked = 0
    for (device, framework), got in imported.items():
        assert got["version"] == VERSIONS[device][framework]
        for directory in filter(None, (got["root"], got["communication"])):  # NCCL: sliced for H200 only
            shipped_dir = SHIPPED / directory.relative_to(directory.parents[2])
            for path in sorted(directory.glob("*.csv.gz")):
                mine, theirs = _table(path), _table(shipped_dir / path.name)
                keys = [c for c in mine.columns if c not in ("latency_us", "kernel_source")]
                both = mine.merge(theirs, on=keys, how="left", suffixes=("", "_shipped"))
                assert both["latency_us_shipped"].notna().all(), f"{path.name}: rows not shipped"
                assert (both["latency_us"] == both["latency_us_shipped"]).all(), path.name
                checked += len(mine)
    assert checked > 250


def test_slices_select_every_kernel_type(imported):
    h200 = imported["h200-sxm", "trtllm"]["root"]
    mm = _table(h200 / "MatMul.csv.gz")
    # block-scaled FP8 kept apart; fp8_static derived from fp8 and ComputeScale
    assert set(mm.dtype) == {"bf16", "fp8", "fp8_block", "fp8_static"}
    # (the B200 slice has no ComputeScale table: nothing to derive fp8_static from)
    assert set(_table(imported["b200-sxm", "trtllm"]["root"] / "MatMul.csv.gz").dtype) == {"bf16", "fp8", "fp8_block", "fp4"}
    # A100 TensorRT-LLM 1.0.0: weight-only int4/int8 plugins and SmoothQuant (int8 W8A8)
    assert set(_table(imported["a100-sxm-80gb", "trtllm"]["root"] / "MatMul.csv.gz").dtype) == {
        "bf16", "w4a16", "w8a16", "int8"}
    moe = _table(h200 / "GroupedMatMul.csv.gz")
    assert set(moe.routing) == {"balanced", "power_law_1.01", "power_law_1.2"}
    assert set(moe.dtype) == {"bf16", "fp8", "fp8_block", "w4a16_mxfp4"}
    manifest = yaml.safe_load((h200 / "MANIFEST.yaml").read_text())
    assert manifest["tables"]["GroupedMatMul"]["dropped_nongated"] == len(
        pd.read_csv(FIXTURES / "h200_sxm/moe/trtllm/1.3.0rc20/moe_perf.csv").query("kernel_source.str.contains('nongated')"))
    fast = _table(imported["b200-sxm", "trtllm"]["root"] / "GroupedMatMulMinLatency.csv.gz")
    assert list(fast.tokens) == ["64", "128"] and set(fast.dtype) == {"fp4"}
    gen = _table(h200 / "GenerationMLA.csv.gz")
    assert {tuple(r) for r in gen[["heads", "kv_heads", "head_dim", "v_head_dim", "shared_kv"]].values} == {
        ("16", "1", "576", "512", "1")}
    ctx = _table(h200 / "ContextMLA.csv.gz")  # TensorRT-LLM prefill: expanded per-head K/V
    assert {tuple(r) for r in ctx[["heads", "kv_heads", "head_dim", "v_head_dim", "shared_kv"]].values} == {
        ("16", "16", "192", "128", "0")}
    sglang_ctx = _table(imported["h200-sxm", "sglang"]["root"] / "ContextMLA.csv.gz")  # Hopper FA3: absorbed
    assert set(sglang_ctx.head_dim) == {"576"} and set(sglang_ctx.shared_kv) == {"1"}
    ar = _table(h200 / "CustomAllReduce.csv.gz")
    assert list(ar.bytes.astype(int)) == [2 * 128 * 2**i for i in range(10)]  # message_size 128 … 65536 bf16
    vllm = imported["h200-sxm", "vllm"]["root"]
    assert len(_table(vllm / "CustomAllReduce.csv.gz")) == len(_table(vllm / "CustomAllReduceEager.csv.gz")) == 10
    assert list(_table(h200 / "ScaleMatrix.csv.gz")["shape"]) == ["16x4096", "1x4096", "4096x4096"]
    b200 = yaml.safe_load((imported["b200-sxm", "sglang"]["root"] / "MANIFEST.yaml").read_text())["tables"]
    assert b200["ContextAttention"]["superseded_other_kernel"] == 2  # flashinfer rows behind trtllm_mha
    assert b200["ContextAttention"]["kernel_sources"] == {"trtllm_mha": 2}


# ---- every shipped database -----------------------------------------------------------------

def test_shipped_databases_are_the_documented_ones():
    assert [(d.device, d.framework, d.version) for d in databases()] == [
        (device, fw, v) for device in sorted(VERSIONS) for fw, v in VERSIONS[device].items()]
    assert (SHIPPED / "LICENSE").read_text().lstrip().startswith("Apache License")
    notice = (SHIPPED / "NOTICE").read_text()
    assert "aiconfigurator-core 0.12.0" in notice and "NVIDIA CORPORATION" in notice
    for device, frameworks in VERSIONS.items():
        for framework, version in frameworks.items():
            manifest = _manifest(device, framework)
            assert manifest["source"]["licence"] == "Apache-2.0" and manifest["source"]["version"] == version
            assert manifest["source"]["version_choice"].startswith(f"the newest {framework} version")
            for name, table in manifest["tables"].items():
                assert table["framework"] == framework, (device, framework, name)
                # a table the version lacks comes from the nearest older version, and says so (SGLang's DeepEP
                # tables were measured under 0.5.12 and 0.5.6.post2)
                assert table["version"] == version or (version_key(table["version"]) < version_key(version)
                                                       and "backward fill" in table["version_note"]), (device, name)
                assert sum(table["kernel_sources"].values()) == table["rows"]


def test_every_shipped_database_checks_clean():
    """226 kernel tables in 21 databases and 28 NCCL tables: the sizes docs/design/profiling.md
    states (B300, GB200, GB300 add 34 + 35 + 34 kernel tables — GB200 also has TensorRT-LLM's
    min-latency MoE table — and 4 NCCL tables each; every database but the A100's TensorRT-LLM
    and vLLM ones holds Gated DeltaNet's scan and recurrence, the A100's SGLang one the recurrence
    only; the six SGLang 0.5.14 ones DSA's sparse prefill, DeepEP's low-latency dispatch and combine, of SGLang
    0.5.12, and the expert compute behind it, of SGLang 0.5.10)."""
    report = inspect(SHIPPED)
    assert report.problems == []
    assert (report.tables, report.rows) == (266, 6_772_252)
    assert {p.parts[-3]: p.name for p in SHIPPED.glob("*/nccl/*")} == {
        "h100-sxm": "2.29.2", "h200-sxm": "2.29.2", "b200-sxm": "2.29.2", "a100-sxm-80gb": "2.27.3",
        "b300-sxm": "2.29.2", "gb200": "2.29.2", "gb300": "2.29.2"}
    biggest = max((sum(_table_rows(d.path)), d.path.relative_to(SHIPPED).as_posix()) for d in databases())
    assert biggest == (490_488, "gb200/trtllm/1.3.0rc20")
    assert sum(_table_rows(SHIPPED / "b200-sxm" / "nccl" / "2.29.2")) == 504
    assert sum(_table_rows(SHIPPED / "gb200" / "nccl" / "2.29.2")) == 336  # 2 and 4 GPUs of one tray: 490,824


def _table_rows(root: Path):
    from perfcast.db.listing import count_rows

    return [count_rows(p) for p in root.glob("*.csv.gz")]


def test_vllm_has_no_mla_tables_and_says_why():
    manifest = _manifest("h200-sxm", "vllm")
    assert manifest["missing"]["generation_mla_perf.parquet"] == (
        "no mla/vllm/<version>/generation_mla_perf.parquet at 0.24.0 or older")


# ---- find_database --------------------------------------------------------------------------

def test_find_database_selection():
    assert find_database("h200-sxm") == SHIPPED / "h200-sxm" / "trtllm" / "1.3.0rc20"  # trtllm first
    assert find_database("h200-sxm", framework="vllm") == SHIPPED / "h200-sxm" / "vllm" / "0.24.0"
    assert find_database("b200-sxm", framework="sglang", version="0.5.14") == SHIPPED / "b200-sxm" / "sglang" / "0.5.14"
    assert find_database("a100-sxm-80gb") == SHIPPED / "a100-sxm-80gb" / "trtllm" / "1.0.0"
    direct = SHIPPED / "h100-sxm" / "vllm" / "0.24.0"
    assert find_database("anything", direct) == direct
    assert find_database("h100-sxm", direct, framework="vllm", version="0.24.0") == direct


@pytest.mark.parametrize("kwargs, message", [
    (dict(device="h200-sxm", framework="tgi"),
     "no tgi profiling database for h200-sxm shipped with perfcast (have: trtllm 1.3.0rc20, vllm 0.24.0, sglang 0.5.14)"),
    (dict(device="h200-sxm", framework="vllm", version="0.19.0"),
     "no vllm 0.19.0 profiling database for h200-sxm shipped with perfcast (have: vllm 0.24.0)"),
    (dict(device="mi300x"), "databases exist for: a100-sxm-80gb, b200-sxm, b300-sxm, gb200, gb300, h100-sxm, h200-sxm"),
    (dict(device="h100-sxm", path=SHIPPED / "h100-sxm" / "vllm" / "0.24.0", framework="trtllm"),
     "op_mapping.yaml: a vllm 0.24.0 database, not trtllm"),
])
def test_find_database_errors_name_what_exists(kwargs, message):
    with pytest.raises(SpecError) as e:
        find_database(**kwargs)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_newest_version_by_release_order(tmp_path):
    for v in ("1.3.0rc20", "1.3.0", "1.3.0rc23", "1.2.1"):
        (tmp_path / "dev" / "trtllm" / v).mkdir(parents=True)
        (tmp_path / "dev" / "trtllm" / v / "op_mapping.yaml").write_text("schema: 1\n")
    assert find_database("dev", tmp_path).name == "1.3.0"  # a release follows its release candidates
    assert sorted(["0.5.14", "0.5.6.post2", "0.5.6", "0.1.dev19262"], key=version_key) == [
        "0.1.dev19262", "0.5.6", "0.5.6.post2", "0.5.14"]


# ---- MLA and custom all-reduce lookups on the shipped databases -----------------------------

def _mla_decode(batch, past, heads=16, rank=512, rope=64, kv="bf16"):
    """The absorbed decode leaf of ``capture/substitutions.py`` ``mla_forward``: one latent KV head."""
    q = Tensor("q", (batch, heads, 1, rank + rope), "bf16")
    k = Tensor("kv", (batch, 1, past + 1, rank + rope), kv)
    v = Tensor("latent", (batch, 1, past + 1, rank), kv)
    return make_leaf("attention", "mla", (q, k, v), (Tensor("o", (batch, 1, heads, rank), "bf16"),),
                     op="perfcast.attention.default", past=past, causal=True, window=0, shared_kv=True,
                     cache_width=0)


def _row(path: Path, **key) -> float:
    df = _table(path)
    (hit,) = df[(df[list(key)] == pd.Series({k: str(v) for k, v in key.items()})).all(axis=1)].to_dict("records")
    return float(hit["latency_us"])


def test_mla_decode_hits_the_generation_mla_table():
    """DeepSeek-V3 at TP 8: 128 / 8 = 16 heads per device."""
    root = find_database("h200-sxm")
    db = load_database(root)
    r = db.lookup(_mla_decode(64, 4095))
    assert (r.source, r.note) == (Provenance.MEASURED, "GenerationMLA: exact")
    assert r.latency_us == _row(root / "GenerationMLA.csv.gz", batch=64, heads=16, kv_len=4096, kv_dtype="bf16")
    between = db.lookup(_mla_decode(64, 6143))  # kv_len 6144, between the measured 4096 and 8192
    assert between.source is Provenance.INTERPOLATED and "GenerationMLA: 1-D in kv_len" in between.note
    assert db.lookup(_mla_decode(64, 4095, kv="fp8")).source is Provenance.MEASURED


def test_mla_misses_say_why():
    db = load_database(find_database("h200-sxm"))
    miss = db.lookup(_mla_decode(64, 4095, rank=256))  # not DeepSeek's latent width
    assert isinstance(miss, Miss)
    assert "GenerationAttention[batch=64, heads=16, kv_heads=1, q_len=1, kv_len=4096, head_dim=320" in miss.reason
    assert "GenerationMLA[batch=64, heads=16, kv_heads=1, q_len=1, kv_len=4096, head_dim=320" in miss.reason
    vllm = load_database(find_database("h200-sxm", framework="vllm")).lookup(_mla_decode(64, 4095))
    assert isinstance(vllm, Miss) and "GenerationMLA" not in vllm.reason  # vLLM ships no MLA table


def test_deepseek_v3_capture_prices_its_mla_from_the_tables():
    """A real capture's MLA leaves (decode absorbed, prefill expanded) hit the H200 TensorRT-LLM
    tables exactly."""
    from perfcast.capture import capture, hf_config, lower
    from perfcast.ir.op import Leaf
    from perfcast.models import load_model_config

    def attention_leaf(node):
        stack = [node]
        while stack:
            n = stack.pop()
            if isinstance(n, Leaf) and str(n.attr("op")).endswith("attention.default"):
                return n
            stack.extend(getattr(n, "ops", ()) or ([n.body] if hasattr(n, "body") else []))

    cfg = hf_config(load_model_config("deepseek-v3"))
    db = load_database(find_database("h200-sxm"))
    decode = attention_leaf(lower(capture(cfg, batch=32, new_tokens=1, past=4095, decode=True)).graph)
    prefill = attention_leaf(lower(capture(cfg, batch=1, new_tokens=1024, past=0, decode=False)).graph)
    assert (db.lookup(decode).source, db.lookup(decode).note) == (Provenance.MEASURED, "GenerationMLA: exact")
    assert (db.lookup(prefill).source, db.lookup(prefill).note) == (Provenance.MEASURED, "ContextMLA: exact")


def _all_reduce(devices, nbytes, op="custom_all_reduce"):
    x = Tensor("x", (nbytes // 2,), "bf16")
    return make_leaf("all_reduce", "ar", (x,), (x,), op=op, group_size=devices, axis="tp")


def test_custom_all_reduce_hits_the_engine_table():
    root = find_database("h200-sxm")
    db = load_database(root)
    r = db.lookup(_all_reduce(8, 2**20))  # 512 Ki bf16 elements
    assert (r.source, r.note) == (Provenance.MEASURED, "CustomAllReduce: exact")
    assert r.latency_us == _row(root / "CustomAllReduce.csv.gz", devices=8, bytes=2**20)
    nccl = db.lookup(_all_reduce(8, 2**20, op="all_reduce"))  # the plain collective stays NCCL's
    assert nccl.note == "AllReduce: exact; measured in fp16 (same element size as bf16)" and nccl.latency_us != r.latency_us
    between = db.lookup(_all_reduce(8, 3 * 2**19))
    assert between.source is Provenance.INTERPOLATED and between.note.startswith("CustomAllReduce: 1-D in bytes")
    eager = load_database(find_database("h200-sxm", framework="vllm")).lookup(_all_reduce(8, 2**20, "custom_all_reduce_eager"))
    assert eager.note == "CustomAllReduceEager: exact"


def test_custom_all_reduce_beyond_a_node_misses_both_tables():
    miss = load_database(find_database("h200-sxm")).lookup(_all_reduce(16, 2**20))
    assert isinstance(miss, Miss)
    assert "CustomAllReduce[devices=16" in miss.reason and "AllReduce[devices=16" in miss.reason


# ---- perfcast db list -----------------------------------------------------------------------

def test_db_list_json(capsys):
    assert main(["db", "list", "--json", "--device", "h200-sxm"]) == 0
    rows = json.loads(capsys.readouterr().out)["databases"]
    assert [(r["framework"], r["version"]) for r in rows] == [("trtllm", "1.3.0rc20"), ("vllm", "0.24.0"),
                                                              ("sglang", "0.5.14")]
    manifest = _manifest("h200-sxm", "trtllm")
    assert rows[0]["kernels"] == {name: t["rows"] for name, t in manifest["tables"].items()}
    assert rows[0]["communication"]["tables"]["AllReduce"] == 126 and rows[0]["source"] == "aiconfigurator-core 0.12.0"


def test_db_list_errors(tmp_path, capsys):
    assert main(["db", "list", "--device", "tpu-v5e"]) == 2
    assert capsys.readouterr().err.strip() == "perfcast db: error: no profiling databases shipped for tpu-v5e"
    assert main(["db", "list", "--dir", str(tmp_path / "nope")]) == 2
    assert "--dir" in capsys.readouterr().err


FP8_STATIC_DEVICES = ("h100-sxm", "h200-sxm", "b200-sxm", "b300-sxm", "gb200", "gb300")


@pytest.mark.parametrize("device", FP8_STATIC_DEVICES)
def test_trtllm_fp8_static_is_the_dynamic_gemm_less_its_scale_computation(device):
    """TensorRT-LLM's ``fp8_static`` rows are its measured ``fp8`` rows (dynamic quantization:
    aiconfigurator's collector gives the Linear no input_scale) minus ``ComputeScale`` at the
    same m × k, one per fp8 row; the MANIFEST counts them; no other framework has the format."""
    root = SHIPPED / device / "trtllm" / VERSIONS[device]["trtllm"]
    mm = pd.read_csv(root / "MatMul.csv.gz")
    cs = pd.read_csv(root / "ComputeScale.csv.gz")
    m_k = cs["shape"].str.split("x", expand=True).astype(int)
    scale = pd.Series(cs.latency_us.to_numpy(), index=pd.MultiIndex.from_arrays([m_k[0], m_k[1]], names=["M", "K"]))
    fp8 = mm[mm.dtype == "fp8"].set_index(["M", "K", "N"]).latency_us.sort_index()
    static = mm[mm.dtype == "fp8_static"].set_index(["M", "K", "N"]).latency_us.sort_index()
    assert len(static) == len(fp8) > 30_000 and (static.index == fp8.index).all()
    expect = fp8 - scale.reindex(fp8.index.droplevel("N")).to_numpy()
    assert ((static - expect).abs() <= 1e-4 * fp8).all()
    assert (static > 0).all() and (static < fp8).all()
    counts = _manifest(device, "trtllm")["tables"]["MatMul"]
    assert counts["fp8_static_derived"] == len(static) and counts["fp8_static_no_compute_scale"] == 0
    for framework in ("vllm", "sglang"):
        other = pd.read_csv(SHIPPED / device / framework / VERSIONS[device][framework] / "MatMul.csv.gz")
        assert "fp8_static" not in set(other.dtype)


def test_b200_decode_gemm_static_and_dynamic_as_documented():
    """docs/design/models.md: on the B200, 8 × 8,192 × 2,560 takes 20.64 µs dynamic, 12.40 µs
    static (bf16 10.85 µs), the scale computation 8.25 µs."""
    root = SHIPPED / "b200-sxm" / "trtllm" / VERSIONS["b200-sxm"]["trtllm"]
    mm = pd.read_csv(root / "MatMul.csv.gz")
    row = mm[(mm.M == 8) & (mm.K == 8192) & (mm.N == 2560)].set_index("dtype").latency_us
    cs = pd.read_csv(root / "ComputeScale.csv.gz").set_index("shape").latency_us
    assert [round(row[d], 2) for d in ("fp8", "fp8_static", "bf16")] == [20.64, 12.40, 10.85]
    assert round(cs["8x8192"], 2) == 8.25


def test_fp8_static_derivation_counts_what_it_cannot_derive():
    from perfcast.db.aic_tables import with_fp8_static
    from perfcast.db.write import Kernel

    mm = pd.DataFrame({"M": [1, 1, 2, 4], "K": [64, 64, 64, 64], "N": [8, 8, 8, 8],
                       "dtype": ["bf16", "fp8", "fp8", "fp8"], "latency_us": [2.0, 9.0, 3.0, 9.5]})
    cs = pd.DataFrame({"shape": ["1x64", "2x64"], "dtype": ["fp8", "fp8"], "latency_us": [7.0, 4.0]})
    kernel = Kernel("MatMul", ("M", "K", "N", "dtype"), counts={"rows": 4})
    tables = [(kernel, mm), (Kernel("ComputeScale", ("shape", "dtype")), cs)]
    with_fp8_static(tables, "vllm")
    assert tables[0][1] is mm  # other frameworks: as measured
    with_fp8_static(tables, "trtllm")
    out = tables[0][1]
    assert out[out.dtype == "fp8_static"][["M", "latency_us"]].values.tolist() == [[1, 2.0]]
    assert (kernel.counts["fp8_static_derived"], kernel.counts["fp8_static_not_positive"],
            kernel.counts["fp8_static_no_compute_scale"], kernel.counts["rows"]) == (1, 1, 1, 5)
    assert "fp8_static (derived, TensorRT-LLM)" in kernel.selection
