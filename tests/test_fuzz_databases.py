"""Hypothesis fuzzing of the profiling-database loader.

A small sound database — written by :mod:`perfcast.db.write` as ``perfcast db import`` writes
one: ``h200-sxm/trtllm/1.3.0rc20`` with a MatMul and an elementwise table, NCCL tables beside it
— is mutated (table cells, extra and missing cells, headers, NaN / inf / negative numbers,
binary bytes, truncation, gzip damage; mapping values, table paths that climb out, symlinks,
missing files; the device priced), then ``perfcast db check DIR`` and ``perfcast op mm …
--performance-model profiling --profiling-database DIR --json`` run in-process on it. Each must
answer as promised (:func:`fuzzing.check_answered`: exit 2 with a short error, or exit 0 with
finite figures), and beyond that:

- a database checks clean exactly when it loads (``db check`` runs the loader's own checks);
- a priced op never takes its time from the table kept *outside* the database (7 µs there,
  51.2 µs inside): nothing outside the database root is read;
- a database of another device never prices.

Examples are derandomized (the suite's default profile), so CI runs the same cases every time: 100 + 90 + 60 = 250.
"""

import gzip
import json
import os
import shutil
import tempfile
from pathlib import Path

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fuzzing import check_answered, run_cli
from perfcast.db.write import Kernel, write_csv, write_mapping
from perfcast.perf.profiling import load_database

INSIDE_US, OUTSIDE_US = 51.2, 7.0
FAST = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow])


def build(base: Path) -> Path:
    """The sound database under ``base`` (and a table outside it); returns its directory."""
    db = base / "h200-sxm" / "trtllm" / "1.3.0rc20"
    kernels = [Kernel("MatMul", ("M", "K", "N", "dtype"), ("M",), suffix=".csv"),
               Kernel("Mul", ("shape", "dtype"), suffix=".csv")]
    write_csv(pd.DataFrame({"M": [256, 512, 1024, 2048], "K": 4096, "N": 4096, "dtype": "bf16",
                            "latency_us": [12.8, 25.6, INSIDE_US, 102.4]}), db / "MatMul.csv")
    write_csv(pd.DataFrame({"shape": ["1024x4096", "2048x4096"], "dtype": "bf16", "latency_us": [40, 80]}),
              db / "Mul.csv")
    write_mapping(db / "op_mapping.yaml", "fuzz base",
                  {"schema": 1, "device": "h200-sxm", "framework": "trtllm", "version": "1.3.0rc20",
                   "communication": "../../nccl/2.0"}, kernels,
                  {"aten.mm.default": {"category": "compute", "kernel_type": "MatMul"},
                   "aten.mul.Tensor": {"category": "elementwise", "kernel_type": "Mul"},
                   "all_reduce": {"category": "communication", "kernel_type": "AllReduce"}})
    write_csv(pd.DataFrame({"devices": 8, "dtype": "bf16", "bytes": [2**20, 2**22], "latency_us": [20, 50]}),
              base / "h200-sxm" / "nccl" / "2.0" / "AllReduce.csv")
    write_csv(pd.DataFrame({"M": [1024], "K": 4096, "N": 4096, "dtype": "bf16", "latency_us": [OUTSIDE_US]}),
              base / "outside" / "MatMul.csv")
    return db


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    return build(tmp_path_factory.mktemp("pristine")).parents[2]


def fresh(pristine: Path) -> tuple[Path, Path]:
    """A copy of the sound database to mutate: (its base folder, the database directory)."""
    base = Path(tempfile.mkdtemp(dir=pristine.parent))
    shutil.copytree(pristine, base, dirs_exist_ok=True, symlinks=True)
    load_database.cache_clear()  # a path reused by a mutated copy must be read again
    return base, base / "h200-sxm" / "trtllm" / "1.3.0rc20"


def answer(base: Path, db: Path, device: str = "h200-sxm", case=None) -> None:
    """Run both commands on ``db`` and check every promise; remove the copy."""
    try:
        rc_check, out, err = run_cli("db", "check", str(db))
        check_answered(rc_check, out, err, case)
        rc, out, err = run_cli("op", "mm", "--shape", "1024x4096", "--shape", "4096x4096", "--device", device,
                               "--performance-model", "profiling", "--profiling-database", str(db), "--json")
        check_answered(rc, out, err, case)
        if rc == 0:
            priced = json.loads(out)["performance_models"]["profiling"]["time_s"]
            assert abs(priced - OUTSIDE_US * 1e-6) > 1e-9, f"priced from the table outside the database: {case!r}"
        if device != "h200-sxm":
            assert rc == 2, f"another device priced: {case!r}"
        elif rc_check != rc:
            raise AssertionError(f"db check exit {rc_check} but loading exit {rc} for {case!r}: {err}")
    finally:
        shutil.rmtree(base, ignore_errors=True)


# ---- tables -----------------------------------------------------------------------------------

CELLS = st.one_of(
    st.sampled_from(["nan", "NaN", "inf", "-inf", "1e400", "-1", "0", "-0", "1e308", "1e-320", "", " ", "x",
                     "None", "NA", "0x10", "1_000", "１", "\"", "a,b", "\"q\"", "\t", "1024x4096", "bf16",
                     "1024", "4096.0", "2e9", "True"]),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.integers(-2**70, 2**70).map(str),
    st.text(max_size=6),
)
TABLES = ("h200-sxm/trtllm/1.3.0rc20/MatMul.csv", "h200-sxm/trtllm/1.3.0rc20/Mul.csv", "h200-sxm/nccl/2.0/AllReduce.csv")


@st.composite
def table_edits(draw):
    """One or two edits of one table's text: a cell, an extra or a missing cell, the header, a
    duplicated or dropped row, bytes spliced in, a truncation, or gzip damage."""
    table = draw(st.sampled_from(TABLES))
    edits = draw(st.lists(st.sampled_from(["cell", "extra", "drop_cell", "header", "dup_row", "drop_rows",
                                           "bytes", "truncate", "gzip"]), min_size=1, max_size=2))
    return table, [(e, draw(st.integers(0, 10)), draw(st.integers(0, 10)), draw(CELLS),
                    draw(st.binary(min_size=1, max_size=12))) for e in edits]


def edit_table(path: Path, edits) -> None:
    data = path.read_bytes()
    for kind, i, j, cell, raw in edits:
        lines = data.decode("utf-8", "replace").split("\n")
        rows = [line.split(",") for line in lines]
        r = rows[i % len(rows)]
        if kind == "cell":
            r[j % len(r)] = cell
        elif kind == "extra":
            r.append(cell)
        elif kind == "drop_cell" and r:
            r.pop(j % len(r))
        elif kind == "header":
            rows[0][j % len(rows[0])] = cell
        elif kind == "dup_row" and len(rows) > 1:  # a table cut to its header has no row to repeat
            rows.append(list(rows[1 + i % (len(rows) - 1)]))
        elif kind == "drop_rows":
            rows = rows[:1 + i % 2]
        data = "\n".join(",".join(x) for x in rows).encode()
        if kind == "bytes":
            at = (i * 7 + j) % (len(data) + 1)
            data = data[:at] + raw + data[at:]
        elif kind == "truncate":
            data = data[:(i * 7 + j) % (len(data) + 1)]
    if any(kind == "gzip" for kind, *_ in edits):
        packed = gzip.compress(data, mtime=0)
        i, j = edits[0][1], edits[0][2]
        if i % 2:  # damage the stream
            packed = packed[:len(packed) - 1 - j % len(packed)] if j % 3 else packed[:10] + b"\xff" + packed[11:]
        path.unlink()
        path.with_name(path.name + ".gz").write_bytes(packed)
        mapping = path.parent / "op_mapping.yaml"
        if mapping.exists():
            mapping.write_text(mapping.read_text().replace(f"file: {path.name}", f"file: {path.name}.gz"))
        return
    path.write_bytes(data)


@settings(max_examples=100, **FAST)
@given(case=table_edits())
def test_fuzz_tables(pristine, case):
    base, db = fresh(pristine)
    table, edits = case
    edit_table(base / table, edits)
    answer(base, db, case=case)


# ---- the mapping, its paths, symlinks, missing files --------------------------------------------

VALUES = st.one_of(
    st.sampled_from([".nan", ".inf", "-.inf", "1e400", "-1", "0", "1.0", "true", "null", "~", "[1, 2]", "{a: 1}",
                     "''", "h100-sxm", "vllm", "1.2.0", "../../../../etc", "/etc", "x" * 500, "&a [1]", "*a",
                     "!!python/object/apply:os.system ['true']"]),
    st.text(max_size=12).map(json.dumps),
)
PATHS = st.one_of(
    st.sampled_from(["../../../../../../../../etc/passwd.csv", "/etc/passwd.csv", "../../../outside/MatMul.csv",
                     "../../nccl/2.0/AllReduce.csv", "../1.3.0rc20/Mul.csv", "nope.csv", "MatMul.csv.gz", "~/x.csv",
                     "../" * 60 + "x.csv", ".csv", "a/../../../../outside/MatMul.csv", "\\..\\x.csv"]),
    st.text(max_size=16).map(lambda s: s + ".csv"),
).map(json.dumps)
FIELDS = ["schema: 1", "device: h200-sxm", "framework: trtllm", "version: 1.3.0rc20",
          "communication: ../../nccl/2.0", "axes: [M]", "keys: [M, K, N, dtype]", "category: compute",
          "kernel_type: MatMul", "keys: [shape, dtype]", "category: elementwise", "kernel_type: AllReduce"]


@st.composite
def mapping_edits(draw):
    kind = draw(st.sampled_from(["value", "path", "communication", "symlink", "missing", "raw"]))
    if kind == "value":
        field = draw(st.sampled_from(FIELDS))
        return kind, field, f"{field.split(':')[0]}: {draw(VALUES)}"
    if kind == "path":
        return kind, draw(st.sampled_from(["file: MatMul.csv", "file: Mul.csv"])), draw(PATHS)
    if kind == "communication":
        return kind, "communication: ../../nccl/2.0", draw(PATHS.map(lambda p: p.replace(".csv", "")))
    if kind == "symlink":
        return kind, draw(st.sampled_from(["h200-sxm/trtllm/1.3.0rc20/MatMul.csv", "h200-sxm/nccl/2.0/AllReduce.csv",
                                           "h200-sxm/trtllm/1.3.0rc20/op_mapping.yaml"])), \
            draw(st.sampled_from(["outside/MatMul.csv", "/etc/passwd", "/dev/zero", "h200-sxm/trtllm/1.3.0rc20",
                                  "SELF", "missing.csv", "h200-sxm/trtllm/1.3.0rc20/Mul.csv"]))
    if kind == "missing":
        return kind, draw(st.sampled_from(["h200-sxm/trtllm/1.3.0rc20/MatMul.csv", "h200-sxm/trtllm/1.3.0rc20/Mul.csv",
                                           "h200-sxm/trtllm/1.3.0rc20/op_mapping.yaml", "h200-sxm/nccl/2.0/AllReduce.csv",
                                           "h200-sxm/nccl"])), ""
    # text appended to the YAML (its bytes — binary, not UTF-8 — are the YAML loader's own
    # tests': perfcast.hardware.spec.read_yaml reads every spec file)
    return kind, "", draw(st.text(max_size=40)).encode()


def edit_mapping(base: Path, db: Path, case) -> None:
    kind, target, value = case
    mapping = db / "op_mapping.yaml"
    if kind == "value":
        mapping.write_text(mapping.read_text().replace(target, value, 1))
    elif kind in ("path", "communication"):
        key = target.split(":")[0]
        mapping.write_text(mapping.read_text().replace(target, f"{key}: {value}", 1))
    elif kind == "symlink":
        link = base / target
        if link.exists():
            link.unlink()
        os.symlink(link if value == "SELF" else (value if value.startswith("/") else base / value), link)
    elif kind == "missing":
        path = base / target
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    else:
        mapping.write_bytes(mapping.read_bytes() + value)


@settings(max_examples=90, **FAST)
@given(case=mapping_edits())
def test_fuzz_mapping_paths_and_files(pristine, case):
    base, db = fresh(pristine)
    edit_mapping(base, db, case)
    answer(base, db, case=case)


# ---- the device priced, and both kinds of edits at once ---------------------------------------

@settings(max_examples=60, **FAST)
@given(device=st.sampled_from(["h200-sxm", "h100-sxm", "b200-sxm", "a100-sxm-80gb"]),
       table=st.one_of(st.none(), table_edits()), mapping=st.one_of(st.none(), mapping_edits()))
def test_fuzz_device_and_combined_edits(pristine, device, table, mapping):
    base, db = fresh(pristine)
    if mapping is not None:
        edit_mapping(base, db, mapping)
    if table is not None and (base / table[0]).is_file() and not (base / table[0]).is_symlink():
        edit_table(base / table[0], table[1])
    answer(base, db, device, case=(device, table, mapping))
