"""A profiling database as hostile or broken input: the device and engine it was measured with,
the paths it names, what its tables and its mapping hold, and ``op --batch`` files. Every case
is one line naming the file (and line and column) and exit 2 — or, for ``db check``, a count
then every problem — never a traceback, a file read outside the database, or a wrong number."""

import gzip
import json
import os
import random
from pathlib import Path

import pytest

from fuzzing import run_cli
from perfcast.hardware import SpecError
from perfcast.perf.databases import shipped_root
from perfcast.perf.profiling import ProfilingDataSource, load_database

MAPPING = """\
schema: 1
device: h200-sxm
framework: trtllm
version: 1.3.0rc20
communication: ../../nccl/2.0
kernels:
  MatMul: {file: MatMul.csv, keys: [M, K, N, dtype], axes: [M]}
  Mul: {file: Mul.csv, keys: [shape, dtype]}
ops:
  aten.mm.default: {category: compute, kernel_type: MatMul}
  aten.mul.Tensor: {category: elementwise, kernel_type: Mul}
  all_reduce: {category: communication, kernel_type: AllReduce}
"""
MATMUL = "M,K,N,dtype,latency_us\n1024,4096,4096,bf16,50\n2048,4096,4096,bf16,90\n"
SHIPPED_H200 = shipped_root() / "h200-sxm" / "trtllm" / "1.3.0rc20"


@pytest.fixture
def db(tmp_path):
    """``h200-sxm/trtllm/1.3.0rc20`` with two kernel tables and an NCCL directory beside it."""
    root = tmp_path / "h200-sxm" / "trtllm" / "1.3.0rc20"
    root.mkdir(parents=True)
    (root / "op_mapping.yaml").write_text(MAPPING)
    (root / "MatMul.csv").write_text(MATMUL)
    (root / "Mul.csv").write_text("shape,dtype,latency_us\n1024x4096,bf16,40\n")
    comm = tmp_path / "h200-sxm" / "nccl" / "2.0"
    comm.mkdir(parents=True)
    (comm / "AllReduce.csv").write_text("devices,dtype,bytes,latency_us\n8,bf16,1048576,20\n8,bf16,4194304,50\n")
    load_database.cache_clear()
    return root


def mm(database, *extra, device="h200-sxm"):
    return run_cli("op", "mm", "--shape", "1024x4096", "--shape", "4096x4096", "--device", device,
                   "--performance-model", "profiling", "--profiling-database", str(database), "--json", *extra)


def one_error(rc, out, err) -> str:
    assert rc == 2 and out == "" and len(err.splitlines()) == 1, (rc, out, err)
    return err


def test_a_sound_database_prices_and_checks(db):
    rc, out, err = mm(db)
    doc = json.loads(out)["performance_models"]["profiling"]
    assert rc == 0 and doc["time_s"] == pytest.approx(50e-6) and doc["source"] == "measured"
    assert doc["notes"] == ["MatMul: exact"]  # the engine's own framework and version: nothing to say
    assert run_cli("db", "check", str(db)) == (0, "ok: 3 kernel tables, 5 rows\n", "")


# ---- the device and the engine the database was measured with ------------------------------

def test_a_database_of_another_device_is_refused():
    """The H200 database priced an H100 with 57 % of the time "measured"."""
    err = one_error(*mm(SHIPPED_H200, device="h100-sxm"))
    assert err == (f"perfcast op: error: {SHIPPED_H200 / 'op_mapping.yaml'}: a database measured on h200-sxm, "
                   f"not on h100-sxm (the device priced); a profiling database prices only the device it was "
                   f"measured on\n")


def test_text_generate_refuses_a_database_of_another_device(db, tmp_path):
    cfg = tmp_path / "tiny.json"
    cfg.write_text(json.dumps({"model_type": "llama", "hidden_size": 256, "intermediate_size": 512,
                               "num_hidden_layers": 1, "num_attention_heads": 8, "num_key_value_heads": 2,
                               "head_dim": 32, "vocab_size": 1000, "max_position_embeddings": 4096}))
    err = one_error(*run_cli("text-generate", str(cfg), "--device", "h100-sxm", "--num-queries", "2",
                             "--performance-model", "profiling", "--profiling-database", str(db)))
    assert "a database measured on h200-sxm, not on h100-sxm (the device priced)" in err


def test_calibrate_refuses_another_device(db, tmp_path):
    err = one_error(*run_cli("calibrate", str(db), "--device", "h100-sxm", "--out", str(tmp_path / "c.yaml")))
    assert err.startswith("perfcast calibrate: error: ") and "measured on h200-sxm, not on h100-sxm" in err
    assert not (tmp_path / "c.yaml").exists()


def test_a_database_of_another_framework_is_refused_under_the_engine():
    vllm = shipped_root() / "h200-sxm" / "vllm" / "0.24.0"
    err = one_error(*mm(vllm))
    assert "a vllm 0.24.0 database, but engine trtllm runs trtllm 1.3.0rc20 kernels" in err
    rc, out, _ = mm(vllm, "--engine", "vllm")  # the engine it was measured with
    assert rc == 0 and json.loads(out)["performance_models"]["profiling"]["source"] == "measured"


def test_another_version_of_the_engine_framework_is_a_note(db):
    (db / "op_mapping.yaml").write_text(MAPPING.replace("version: 1.3.0rc20", "version: 1.2.0"))
    assert "op_mapping.yaml: declares h200-sxm/trtllm/1.2.0 but lies in 'h200-sxm/trtllm/1.3.0rc20'/" \
        in one_error(*mm(db))
    db = db.rename(db.parent / "1.2.0")
    rc, out, _ = mm(db)
    notes = json.loads(out)["performance_models"]["profiling"]["notes"]
    assert rc == 0 and notes[0] == ("engine trtllm runs trtllm 1.3.0rc20 kernels; they are priced from the "
                                    "trtllm 1.2.0 measurements")
    rc, out, _ = mm(db, "--engine", "eager")  # an engine with no database of its own
    assert json.loads(out)["performance_models"]["profiling"]["notes"][0] == (
        "engine eager (torch 2.13.0) names no database of its own: its kernels are priced from trtllm 1.2.0's "
        "measurements")


def test_the_folders_and_the_manifest_must_agree_with_the_mapping(db):
    (db / "MANIFEST.yaml").write_text("device: h100-sxm\n")
    rc, _, err = run_cli("db", "check", str(db))
    assert rc == 2 and f"{db / 'MANIFEST.yaml'}: key 'device': 'h100-sxm', but " in err
    (db / "MANIFEST.yaml").unlink()
    moved = db.parents[2] / "h100-sxm" / "trtllm" / "1.3.0rc20"
    moved.parent.mkdir(parents=True)
    db.rename(moved)
    with pytest.raises(SpecError, match="declares h200-sxm/trtllm/1.3.0rc20 but lies in 'h100-sxm/trtllm/1.3.0rc20'/"):
        ProfilingDataSource(moved)


# ---- paths: nothing outside the database root is opened --------------------------------------

@pytest.fixture
def outside(tmp_path):
    """A well-formed table outside the database: were it read, the op would price at 7 µs."""
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "MatMul.csv").write_text("M,K,N,dtype,latency_us\n1024,4096,4096,bf16,7\n")
    return secret / "MatMul.csv"


@pytest.mark.parametrize("file, message", [
    ("../../../../../../../../etc/passwd.csv", "leads to /etc/passwd.csv, outside the database root"),
    ("../../../secret/MatMul.csv", "leads to {outside}, outside the database root"),
    ("/etc/passwd.csv", "key 'kernels.MatMul.file': '/etc/passwd.csv' is an absolute path"),
    ("../../../../../../../../etc/passwd", "'../../../../../../../../etc/passwd' is not a table"),
])
def test_a_table_path_that_leaves_the_database_is_refused(db, outside, file, message):
    (db / "op_mapping.yaml").write_text(MAPPING.replace("file: MatMul.csv", f"file: {file}"))
    message = message.format(outside=outside)
    assert message in one_error(*mm(db))
    rc, _, err = run_cli("db", "check", str(db))
    assert rc == 2 and message in err


def test_a_symlink_out_of_the_database_is_refused(db, outside):
    (db / "MatMul.csv").unlink()
    (db / "MatMul.csv").symlink_to(outside)
    assert f"'MatMul.csv' leads to {outside}, outside the database root {db.parents[1]}" in one_error(*mm(db))
    comm = db.parents[1] / "nccl" / "2.0"
    os.symlink(outside, comm / "AllGather.csv")
    rc, _, err = run_cli("db", "check", str(db))
    assert rc == 2 and f"{comm}: table AllGather: 'AllGather.csv' leads to {outside}" in err
    assert err.splitlines()[0] == f"perfcast db: error: {db}: 2 problems"


def test_communication_and_the_mapping_itself_stay_inside(db, outside, tmp_path):
    (db / "op_mapping.yaml").write_text(MAPPING.replace("../../nccl/2.0", "../../../secret"))
    assert "key 'communication': '../../../secret' leads to" in one_error(*mm(db))
    elsewhere = tmp_path / "mapping.yaml"
    elsewhere.write_text(MAPPING)
    (db / "op_mapping.yaml").unlink()
    (db / "op_mapping.yaml").symlink_to(elsewhere)
    assert "'op_mapping.yaml' leads to" in one_error(*mm(db))


def test_folders_named_otherwise_than_the_mapping_keep_the_database_in_its_own_folder(db):
    """The device folder is the root only when the folders are named as the mapping names
    device, framework and version; else a mapping could reach the folders above it."""
    renamed = db.parents[2] / "h200" / "custom" / "1.3.0rc20"
    renamed.parent.mkdir(parents=True)
    db.rename(renamed)
    (db.parents[1] / "nccl").rename(renamed.parents[1] / "nccl")
    assert (f"key 'communication': '../../nccl/2.0' leads to {renamed.parents[1] / 'nccl' / '2.0'}, outside the "
            f"database root {renamed}") in one_error(*mm(renamed))


def test_a_flat_database_keeps_its_files_in_its_own_folder(tmp_path, outside):
    """Not under a folder named for its device: its own folder is the root."""
    flat = tmp_path / "flat"
    flat.mkdir()
    (flat / "op_mapping.yaml").write_text(MAPPING.replace("communication: ../../nccl/2.0\n", "")
                                          .replace("  all_reduce: {category: communication, kernel_type: AllReduce}\n", "")
                                          .replace("file: MatMul.csv", "file: ../secret/MatMul.csv"))
    (flat / "Mul.csv").write_text("shape,dtype,latency_us\n1024x4096,bf16,40\n")
    assert f"outside the database root {flat}" in one_error(*mm(flat))


# ---- tables -----------------------------------------------------------------------------------

HEAD = "M,K,N,dtype,latency_us\n"


@pytest.mark.parametrize("text, message", [
    (HEAD + "1024,4096,4096,bf16,50,9\n", "MatMul.csv: line 2: 6 cells, more than the header's 5"),
    (HEAD + "1024,4096,4096,bf16,50\n1,2,3,bf16\n1,2,4,bf16\n", "line 3: 4 cells, fewer than the header's 5 (2 rows)"),
    (HEAD + "x,4096,4096,bf16,50\n", "line 2: column 'M': expected a non-negative number, got 'x'"),
    (HEAD + "-1024,4096,4096,bf16,50\n", "line 2: column 'M': expected a non-negative number, got '-1024'"),
    (HEAD + "1024,4096,4096,bf16,nan\n", "line 2: column 'latency_us': expected a positive number of microseconds up "
                                         "to 1e+09, got 'nan'"),
    (HEAD + "1024,4096,4096,bf16,inf\n", "column 'latency_us': expected a positive number of microseconds up to 1e+09, "
                                         "got 'inf'"),
    (HEAD + "1024,4096,4096,bf16,-5\n", "got '-5'"),
    (HEAD + "1024,4096,4096,bf16,0\n2048,4096,4096,bf16,0\n", "line 2: column 'latency_us': expected a positive "
                                                              "number of microseconds up to 1e+09, got '0' (2 rows)"),
    (HEAD + "1024,4096,4096,bf16,2e9\n", "got '2000000000.0'"),
    (HEAD + "1024,4096,4096,,50\n", "line 2: column 'dtype': expected a name, got an empty cell"),
    (HEAD, "MatMul.csv: no rows, only the header (expected one measurement per line)"),
    ("", "MatMul.csv: empty; expected a header line (the key columns and latency_us) and rows"),
    ("M,K,dtype,latency_us\n1,2,bf16,3\n", "missing column 'N' (expected M, K, N, dtype, latency_us)"),
    ("M,K,N,N,dtype,latency_us\n1,2,3,3,bf16,4\n", "line 1: column 'N' is named twice"),
    ("M,K,,N,dtype,latency_us\n1,2,3,3,bf16,4\n", "line 1: a column without a name"),
    (HEAD + "1024,4096,4096,bf16,50\n1024.0,4096,4096,bf16,60\n",
     "line 3: repeats the key of line 2 (M=1024, K=4096, N=4096, dtype=bf16)"),
    (HEAD + "\n1024,4096,4096,bf16,50\n\n2048,4096,4096,bf16,x\n", "line 5: column 'latency_us'"),  # blank lines counted
    (HEAD + '1024,4096,"4096",bf16,50,"a,b"\n', "line 2: 6 cells, more than the header's 5"),  # quoted cells
    (HEAD + "1024,4096\r4096,bf16,50\n", "line 2: a carriage return inside the line"),
])
def test_each_table_problem_is_one_line_naming_line_and_column(db, text, message):
    (db / "MatMul.csv").write_text(text)
    assert message in one_error(*mm(db))
    rc, out, err = run_cli("db", "check", str(db))
    lines = err.splitlines()
    assert (rc, out, len(lines)) == (2, "", 2) and lines[0] == f"perfcast db: error: {db}: 1 problem"
    assert message in lines[1]


@pytest.mark.parametrize("data, message", [
    (b"M,K,N,dtype,latency_us\n1024,4096,4096,bf16\x00,50\n", "line 2: a binary file (NUL byte at offset 42)"),
    (b"M,K,N,dtype,latency_us\n1024,4096,4096,bf\xff16,50\n", "line 2: not UTF-8 text (byte 0xff at offset 40)"),
    (random.Random(0).randbytes(64).replace(b"\x00", b"\x01") + b"\x00", "a binary file"),
], ids=["nul", "not-utf8", "random-bytes"])
def test_binary_and_non_utf8_tables(db, data, message):
    (db / "MatMul.csv").write_bytes(data)
    assert message in one_error(*mm(db))


def test_gzip_tables_are_checked_alike(db):
    (db / "op_mapping.yaml").write_text(MAPPING.replace("file: MatMul.csv", "file: MatMul.csv.gz"))
    (db / "MatMul.csv").unlink()
    (db / "MatMul.csv.gz").write_bytes(gzip.compress((HEAD + "1024,4096,4096,bf16,inf\n").encode()))
    assert "MatMul.csv.gz: line 2: column 'latency_us'" in one_error(*mm(db))
    (db / "MatMul.csv.gz").write_bytes(MATMUL.encode())  # not gzip at all
    assert "MatMul.csv.gz: cannot read as gzip" in one_error(*mm(db))
    (db / "MatMul.csv.gz").write_bytes(gzip.compress(MATMUL.encode())[:-12])  # truncated
    assert "MatMul.csv.gz: cannot read as gzip" in one_error(*mm(db))


def test_a_table_that_inflates_past_the_limit_is_refused(db, monkeypatch):
    monkeypatch.setattr("perfcast.perf.table_csv.MAX_TABLE_BYTES", 1000)
    (db / "op_mapping.yaml").write_text(MAPPING.replace("file: MatMul.csv", "file: MatMul.csv.gz"))
    (db / "MatMul.csv.gz").write_bytes(gzip.compress(HEAD.encode() + b"1,2,3,bf16,4\n" * 1000))
    assert "MatMul.csv.gz: more than 1,000 bytes once decompressed" in one_error(*mm(db))


def test_collective_tables(db):
    comm = db.parents[1] / "nccl" / "2.0"
    (comm / "AllReduce.csv").write_text("latency_us\n5\n")  # latency only: nothing to key on
    assert (f"{comm / 'AllReduce.csv'}: no key columns, only latency_us (expected e.g. devices, dtype, bytes, "
            f"latency_us)") in one_error(*mm(db))
    (comm / "AllReduce.csv").write_text("devices,dtype,bytes,latency_us\n8,bf16,1048576,20,1\n")
    assert "AllReduce.csv: line 2: 5 cells, more than the header's 4" in one_error(*mm(db))


def test_shapes_and_log_axes(db):
    (db / "Mul.csv").write_text("shape,dtype,latency_us\n1024*4096,bf16,40\n")
    assert "Mul.csv: line 2: column 'shape': expected a shape like 1024x4096, got '1024*4096'" in one_error(*mm(db))
    (db / "Mul.csv").write_text("shape,dtype,latency_us\n1024x4096,bf16,40\n")
    (db / "op_mapping.yaml").write_text(MAPPING.replace("axes: [M]", "axes: [M], transform: {M: log}"))
    (db / "MatMul.csv").write_text(HEAD + "0,4096,4096,bf16,50\n")
    assert "column 'M': expected a positive number (the axis is interpolated in log), got '0'" in one_error(*mm(db))


def test_db_check_lists_every_problem_after_a_count(db):
    (db / "MatMul.csv").write_text("M,K,latency_us\n1,2,inf\n")
    (db / "Mul.csv").write_text("shape,dtype,latency_us\n")
    (db.parents[1] / "nccl" / "2.0" / "AllReduce.csv").write_text("latency_us\n5\n")
    (db / "op_mapping.yaml").write_text(MAPPING.replace("kernel_type: Mul}", "kernel_type: Mull}"))
    rc, out, err = run_cli("db", "check", str(db))
    lines = err.splitlines()
    assert rc == 2 and out == "" and lines[0] == f"perfcast db: error: {db}: 6 problems"
    expected = ["MatMul.csv: missing column 'N'", "MatMul.csv: missing column 'dtype'",
                "MatMul.csv: line 2: column 'latency_us'", "Mul.csv: no rows, only the header",
                "kernel type 'Mull' is not under 'kernels'", "AllReduce.csv: no key columns"]
    assert [any(e in line for line in lines[1:]) for e in expected] == [True] * 6
    assert all(line.startswith("  ") for line in lines[1:])


def test_db_check_of_a_missing_directory(tmp_path):
    assert run_cli("db", "check", str(tmp_path / "nope")) == (
        2, "", f"perfcast db: error: {tmp_path / 'nope'}: not a directory (expected a profiling database, or a tree of them)\n")


def test_db_check_shortens_a_long_list(db):
    kernels = "".join(f"  K{i}: {{file: K{i}.csv, keys: [M]}}\n" for i in range(40))
    (db / "op_mapping.yaml").write_text(MAPPING.replace("kernels:\n", "kernels:\n" + kernels))
    rc, _, err = run_cli("db", "check", str(db))
    lines = err.splitlines()
    assert rc == 2 and lines[0].endswith(": 40 problems") and len(lines) == 32 and lines[-1] == "  … and 10 more"


# ---- the mapping's schema ---------------------------------------------------------------------

@pytest.mark.parametrize("edit, message", [
    (("schema: 1", "schema: 1.0"), "key 'schema': expected the integer 1, got 1.0"),
    (("schema: 1", "schema: true"), "key 'schema': expected the integer 1, got True"),
    (("schema: 1", "schema: .nan"), "key 'schema': expected the integer 1, got nan"),
    (("device: h200-sxm", "device: ../../h200"),
     "key 'device': expected a name of letters, digits and . _ + - (at most 100 characters), got '../../h200'"),
    (("category: compute", "category: magic"), "key 'ops.aten.mm.default.category': expected one of composite, "
                                               "zero_cost, accepted_miss, communication"),
    (("axes: [M]", "axes: [M, B]"), "key 'kernels.MatMul.axes': 'B' is not one of the keys"),
    (("axes: [M]", "axes: [dtype]"), "key 'kernels.MatMul.axes': 'dtype' holds names, not numbers to interpolate in"),
    (("axes: [M]", "axes: [M], transform: {K: log}"), "key 'kernels.MatMul.transform': 'K' is not one of the axes"),
    (("keys: [M, K, N, dtype]", "keys: [M, K, M, dtype]"), "key 'kernels.MatMul.keys': a column is named twice"),
    (("{category: compute, kernel_type: MatMul}", "{category: compute}"),
     "key 'ops.aten.mm.default.kernel_type': missing (a compute op is priced from a kernel table)"),
    (("keys: [shape, dtype]", "keys: [shape]"),
     "key 'ops.aten.mul.Tensor': an elementwise op's kernel Mul must be keyed on dtype (its keys: shape)"),
])
def test_the_mapping_schema_refuses(db, edit, message):
    (db / "op_mapping.yaml").write_text(MAPPING.replace(*edit))
    assert message in one_error(*mm(db))


def test_an_elementwise_table_in_a_format_without_an_element_size_is_skipped(db):
    """A table row in fp8_block has no bytes per element: the byte-ratio derivation passes it
    over instead of failing."""
    from perfcast.ir import Tensor, make_leaf

    (db / "Mul.csv").write_text("shape,dtype,latency_us\n1024x4096,fp8_block,40\n1024x4096,bf16,30\n")
    x = Tensor("x", (1024, 4096), "fp32")
    r = ProfilingDataSource(db).lookup(make_leaf("elementwise", "mul", (x, x), (x,), op="aten.mul.Tensor"))
    assert (r.latency_us, r.note) == (60.0, "Mul: derived from bf16 by byte ratio 2")


def test_calibrate_names_a_column_a_fit_needs(db, tmp_path):
    (db / "op_mapping.yaml").write_text(MAPPING.replace("keys: [M, K, N, dtype], axes: [M]", "keys: [M, K, dtype], axes: [M]"))
    (db / "MatMul.csv").write_text("M,K,dtype,latency_us\n1,2,bf16,3\n")
    err = one_error(*run_cli("calibrate", str(db), "--out", str(tmp_path / "c.yaml")))
    assert "kernel MatMul is fitted as gemm, which needs key column 'N' (its keys: M, K, dtype)" in err


def test_db_list_refuses_a_path_out_of_the_database(db, outside):
    (db / "op_mapping.yaml").write_text(MAPPING.replace("file: MatMul.csv", "file: ../../../secret/MatMul.csv"))
    err = one_error(*run_cli("db", "list", "--dir", str(db.parents[2])))
    assert f"leads to {outside}, outside the database root" in err


# ---- op --batch -------------------------------------------------------------------------------

@pytest.mark.parametrize("data, message", [
    (b"mm,1024x4096;4096x4096,bf16\n", "line 1: expected a header naming the columns op,shapes,dtype (and optionally "
                                        "args), got 'mm,1024x4096;4096x4096,bf16' (no column 'op')"),
    (b"op,shapes,dtype\n", "no ops, only the header (expected one op per line)"),
    (b"", "empty; expected a header naming the columns op,shapes,dtype"),
    (b"\x00\x01\xff", "a binary file (NUL byte at offset 0)"),
    (b"op,shapes,dtype\nmm,1x2;2x3,b\xfff16\n", "not UTF-8 text (byte 0xff at offset 28)"),
    (b"op,shapes,dtype,note\nmm,1x2;2x3,bf16,x\n", "line 1: column 'note' is unknown or repeated"),
    (b"op,shapes,dtype\nmm,1x2;2x3,bf16,9\n", "line 2: 4 cells, the header has 3"),
    (b"op,shapes,dtype\n,1x2;2x3,bf16\n", "line 2: column 'op': empty"),
    (b"op,shapes,dtype\nmm,1x2;2x3,fp8\n", "line 2: column 'dtype': 'fp8': expected one of bf16, fp16, fp32"),
    (b"op,shapes,dtype\nmm,0x2;2x3,bf16\n", "line 2: column 'shapes': shape '0x2': expected dims of at least 1"),
    (b"op,shapes,dtype\nmm,1xq;2x3,bf16\n", "line 2: column 'shapes': shapes '1xq;2x3': expected dims like"),
    (b"op,shapes,dtype,args\naten._softmax,8x16,fp16,-1;nan\n", "line 2: column 'args': 'nan' is not a finite number"),
    (b"op,shapes,dtype\nmm,1x2;2x3,bf16\nfrob,1x2,bf16\n", "line 3: unknown op 'frob'"),
    (b"op,shapes,dtype\nmm,1x2;5x3,bf16\n", "line 2: mm on shapes [(1, 2), (5, 3)]"),
])
def test_op_batch_problems_name_the_line_and_column(tmp_path, data, message):
    f = tmp_path / "ops.csv"
    f.write_bytes(data)
    assert message in one_error(*run_cli("op", "--batch", str(f)))


def test_op_batch_prices_quoted_rows_in_order(tmp_path):
    f = tmp_path / "ops.csv"
    f.write_text('op,shapes,dtype,args\nmm,"1024x4096;4096x4096",bf16,\n\naten._softmax,8x16,fp16,"-1;false"\n')
    rc, out, err = run_cli("op", "--batch", str(f), "--json")
    rows = [json.loads(line) for line in out.splitlines()]
    assert rc == 0 and [r["op"] for r in rows] == ["mm", "aten._softmax"]
    assert rows[0]["shapes"] == [[1024, 4096], [4096, 4096]]


def test_the_biggest_shipped_database_passes_the_checks_with_every_row():
    """The checks run on every load of the biggest shipped database (490,488 kernel rows, 470 of them
    Gated DeltaNet's, and 336 NCCL rows): they find nothing there, and every row is read."""
    src = ProfilingDataSource(shipped_root() / "gb200" / "trtllm" / "1.3.0rc20")
    assert sum(len(t.rows) for t in src.tables.values()) == 490_824
    assert src.tables["MatMul"].rows[(1, 4096, 4096, "bf16")] > 0
    assert Path(src.tables["MatMul"].source).name == "MatMul.csv.gz"
