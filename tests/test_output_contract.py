"""The output contract (docs/design/output.md): every JSON document perfcast prints or writes
carries its schema version and the perfcast version, validates against the JSON Schema shipped
for it, and holds no NaN, infinity or negative figure — checked before anything is printed."""

import dataclasses
import json
import math

import pytest
from jsonschema import Draft202012Validator

import perfcast
from fuzzing import run_cli
from perfcast.inference.memory import MemoryReport
from perfcast.report.document import (SCHEMA_VERSION, ReportBoundaryError, check, dumps, emit_lines,
                                      schema_names, schema_text, write_trace)

#: a capture and pricing on a loaded CI machine: the harness's hang limit is for fuzz cases
SLOW_S = 600


def validator(name: str) -> Draft202012Validator:
    schema = json.loads(schema_text(name))
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema)


def assert_valid(name: str, doc) -> None:
    errors = sorted(validator(name).iter_errors(doc), key=lambda e: list(e.absolute_path))
    assert not errors, [f"{'/'.join(map(str, e.absolute_path))}: {e.message[:200]}" for e in errors[:5]]


def documents(text: str) -> list:
    """The document printed (JSON lines: each line's), parsed strictly: NaN and Infinity refused."""
    def refuse(token):
        raise AssertionError(f"{token} in the output")

    lines = text.splitlines() if text.startswith("{\"") else [text]
    return [json.loads(line, parse_constant=refuse) for line in lines if line.strip()]


# ---- every command, on real inputs, against its schema ----------------------------------------

@pytest.fixture(scope="module")
def batch_csv(tmp_path_factory):
    f = tmp_path_factory.mktemp("op") / "ops.csv"
    f.write_text("op,shapes,dtype,args\nmm,1024x4096;4096x4096,bf16,\naten._softmax,8x4096,fp16,-1;false\n")
    return str(f)


#: (schema, perfcast arguments): each command's --json output on cheap real inputs
COMMANDS = [
    ("devices", ["devices"]),
    ("topologies", ["topologies"]),
    ("engines", ["engines"]),
    ("engine", ["engines", "vllm"]),
    ("kernels", ["kernels"]),
    ("models", ["models"]),
    ("db-list", ["db", "list"]),
    ("collective", ["collective", "all_reduce", "--topology", "hgx-h200", "--bytes", "1e9"]),
    ("collective", ["collective", "all-gather", "--topology", "torus:2x2x2", "--link-bandwidth", "50e9",
                    "--bytes", "1.2e9"]),
    ("collective", ["collective", "all_reduce", "--topology", "tpu-v5p-4x4x4", "--bytes", "1e9",
                    "--group-size", "128"]),
    ("op", ["op", "mm", "--shape", "4096x4096", "--shape", "4096x14336", "--device", "h200-sxm"]),
    ("kernel", ["kernel", "flash-attention", "--sweep", "B=1,2,4"]),
    ("kernel", ["kernel", "flash-attention", "--padded", "--set", "T_q=4000", "--overlap", "double-buffer",
                "--symbolic-hw", "hbm_bandwidth_bytes_per_s"]),
    ("kernel", ["kernel", "deepseek-moe", "--topology", "hgx-h200", "--overlap", "all", "--sweep", "T=1024,4096"]),
    ("kernel", ["kernel", "modulo-reference", "--rollup", "slow", "--set", "n=8"]),
    ("kernel", ["kernel", "pi0", "--device", "h200-sxm", "--rollup", "both", "--sweep", "k=5,10"]),
    ("text-generate", ["text-generate", "llama-3.1-8b", "--query-length", "512"]),
    ("text-generate", ["text-generate", "llama-3.1-8b", "--decode", "--context-length", "2048", "--num-queries", "16",
                       "--rollup", "both"]),
    ("text-generate", ["text-generate", "llama-3.1-8b", "--decode", "--context-length", "1024", "--num-queries", "8",
                       "--tp-size", "2", "--pp-size", "2", "--overlap", "all"]),
    ("text-generate", ["text-generate", "qwen3-30b-a3b", "--decode", "--context-length", "1024", "--num-queries", "8",
                       "--overlap", "all"]),
    ("explain", ["explain", "llama-3.1-8b", "--decode"]),
    ("serve", ["serve", "llama-3.1-8b", "--concurrency", "8", "--num-requests", "40", "--osl", "32"]),
    ("serve", ["serve", "llama-3.1-8b", "--engine", "vllm", "--request-rate", "1000", "--num-requests", "200",
               "--osl", "16", "--isl", "uniform:200-400"]),
    ("serve", ["serve", "llama-3.1-8b", "--request-rate", "4", "--num-requests", "60", "--osl", "16",
               "--disagg", "1p1d", "--speculative", "mtp:2", "--acceptance", "0.8,0.5"]),
    ("optimize", ["optimize", "llama-3.1-8b", "--devices", "h100-sxm", "--total-devices", "2", "--batch-sizes", "2,8",
                  "--isl", "512", "--osl", "32", "--serving-mode", "both"]),
    ("recommend", ["recommend", "llama-3.1-8b", "--devices", "h100-sxm", "--request-rate", "5", "--batch-sizes", "8",
                   "--isl", "512", "--osl", "32", "--max-instance-size", "2"]),
    ("sensitivity", ["sensitivity", "llama-3.1-8b", "--concurrency", "8", "--isl", "256", "--osl", "16"]),
]


@pytest.mark.parametrize("schema, args", COMMANDS, ids=[" ".join(a[:3]) for _, a in COMMANDS])
def test_every_command_prints_what_its_schema_says(schema, args):
    rc, out, err = run_cli(*args, "--json", timeout_s=SLOW_S)
    assert rc == 0, err
    for doc in documents(out):
        assert (doc["schema_version"], doc["perfcast_version"]) == (SCHEMA_VERSION, perfcast.__version__)
        assert list(doc)[:2] == ["schema_version", "perfcast_version"]
        assert_valid(schema, doc)


def test_op_batch_prints_one_versioned_document_per_line(batch_csv):
    rc, out, err = run_cli("op", "--batch", batch_csv, "--json")
    assert rc == 0, err
    docs = documents(out)
    assert [d["op"] for d in docs] == ["mm", "aten._softmax"] and len(out.splitlines()) == 2
    for doc in docs:
        assert_valid("op", doc)


def test_a_model_that_does_not_fit_has_nothing_free_and_a_shortfall():
    rc, out, err = run_cli("text-generate", "llama-3.1-405b", "--device", "h100-sxm", "--query-length", "128", "--json",
                           timeout_s=SLOW_S)
    assert rc == 0, err
    doc, = documents(out)
    assert_valid("text-generate", doc)
    m = doc["memory"]
    assert (m["fits"], m["free_bytes"], doc["deployable"]) == (False, 0, False)
    assert m["shortfall_bytes"] == (m["weights_bytes"] + m["kv_cache_bytes"] + m["activation_peak_bytes"]
                                    + m["reserved_bytes"] - m["capacity_bytes"]) > 700e9


def test_memory_report_never_holds_a_negative_figure():
    # 60 + 30 + 5 + 10 = 105 bytes used of 100: 5 short, nothing free
    short = MemoryReport(capacity_bytes=100, weights_bytes=60, kv_cache_bytes=30, kv_cache_bytes_per_token=1,
                         activation_peak_bytes=5, reserved_bytes=10, parameters=30)
    assert (short.fits, short.free_bytes, short.shortfall_bytes) == (False, 0, 5)
    assert short.as_dict()["free_bytes"] == 0 and short.as_dict()["shortfall_bytes"] == 5
    exact = dataclasses.replace(short, kv_cache_bytes=25)  # 100 of 100: fits, nothing free, nothing short
    assert (exact.fits, exact.free_bytes, exact.shortfall_bytes) == (True, 0, 0)
    roomy = dataclasses.replace(short, weights_bytes=20)  # 65 of 100
    assert (roomy.fits, roomy.free_bytes, roomy.shortfall_bytes) == (True, 35, 0)


def test_the_files_perfcast_writes_follow_their_schemas(tmp_path):
    trace, slow_trace, metrics = tmp_path / "t.json", tmp_path / "s.json", tmp_path / "m.json"
    serve_trace, figures = tmp_path / "serve.json", tmp_path / "figures"
    # the profiling model beside the analytic one: its JSON, its trace, its hits and misses and its
    # figures (stdout holds the document alone)
    rc, out, err = run_cli("text-generate", "qwen3-8b", "--device", "h200-sxm", "--decode", "--context-length", "512",
                           "--num-queries", "4", "--performance-model", "analytic", "--performance-model", "profiling",
                           "--chrome-trace", str(trace), "--export-empirical-metrics", str(metrics), "--json",
                           "--plot", str(figures), timeout_s=SLOW_S)
    assert rc == 0 and err == "", err
    assert len(list(figures.iterdir())) == 6  # roofline, step-time, memory: PNG and SVG (tests/test_plots.py)
    doc, = documents(out)
    assert_valid("text-generate", doc)
    assert set(doc["performance_models"]) == {"analytic", "profiling"}
    rc, _, err = run_cli("kernel", "modulo-reference", "--rollup", "slow", "--chrome-trace", str(slow_trace))
    assert rc == 0, err
    rc, _, err = run_cli("serve", "llama-3.1-8b", "--request-rate", "4", "--num-requests", "30", "--osl", "8",
                         "--disagg", "1p1d", "--chrome-trace", str(serve_trace))
    assert rc == 0, err
    for path in (trace, slow_trace, serve_trace):
        doc, = documents(path.read_text())
        assert_valid("chrome-trace", doc)
        # a Trace Event Format file still: the versions stand in its metadata, not beside traceEvents
        assert set(doc) == {"traceEvents", "displayTimeUnit", "otherData"}
        assert doc["otherData"] == {"schema_version": SCHEMA_VERSION, "perfcast_version": perfcast.__version__}
    doc, = documents(metrics.read_text())
    assert_valid("empirical-metrics", doc)
    assert 0 < doc["performance_models"]["profiling"]["provenance_by_count"]["measured"] < 1


def test_validate_summary_and_rows_follow_their_schemas(tmp_path):
    rows = tmp_path / "rows.json"
    # the static first-token rows (osl 1) have no measured TPOT: null, where NaN was written before
    rc, out, err = run_cli("validate", "--population", "published-static", "--limit", "4", "--json",
                           "--rows", str(rows), timeout_s=SLOW_S)
    assert rc == 0, err
    doc, = documents(out)
    assert_valid("validate", doc)
    assert doc["rows"]["selected"] == 4
    records, = documents(rows.read_text())
    assert_valid("validate-rows", records)
    assert len(records["rows"]) == 4


def test_every_schema_is_exercised_and_declares_the_version():
    tested = {s for s, _ in COMMANDS} | {"chrome-trace", "empirical-metrics", "validate", "validate-rows",
                                         "optimize-points"}  # optimize-points: tests/test_search.py
    assert set(schema_names()) == tested
    for name in schema_names():
        schema = json.loads(schema_text(name))
        Draft202012Validator.check_schema(schema)
        header = schema["properties"].get("otherData", schema)["properties"]
        assert header["schema_version"] == {"const": SCHEMA_VERSION, "description": header["schema_version"]["description"]}
        assert schema["title"].startswith("perfcast ")


def test_the_engine_schema_is_the_profile_model_s():
    # `perfcast engines NAME --json` dumps the pydantic model: its schema's $defs are the model's own
    from perfcast.engines.spec import EngineProfile

    model = EngineProfile.model_json_schema(mode="serialization")
    shipped = json.loads(schema_text("engine"))
    assert shipped["$defs"] == model["$defs"], "regenerate engine.schema.json's $defs from EngineProfile"
    assert {k: v for k, v in shipped["properties"].items()
            if k not in ("schema_version", "perfcast_version", "file")} == model["properties"]


def test_perfcast_schema_prints_a_shipped_schema_and_lists_them():
    rc, out, _ = run_cli("schema", "collective")
    assert rc == 0 and json.loads(out) == json.loads(schema_text("collective"))
    rc, out, _ = run_cli("schema")
    assert rc == 0 and out.splitlines()[0] == f"schema_version {SCHEMA_VERSION}"
    assert [line.split()[0] for line in out.splitlines()[1:]] == schema_names()
    rc, out, err = run_cli("schema", "nope")
    assert (rc, out) == (2, "") and err.startswith("perfcast schema: error: unknown document 'nope'; known: chrome-trace")


# ---- the report boundary ---------------------------------------------------------------------

@pytest.mark.parametrize("doc, message", [
    ({"a": {"time_s": -1.5}}, "report boundary: $.a.time_s = -1.5: negative"),
    ({"rows": [{"bytes": 1}, {"bytes": float("nan")}]}, "report boundary: $.rows[1].bytes = nan: not a finite number"),
    ({"x": [0, float("inf")]}, "report boundary: $.x[1] = inf: not a finite number"),
    ({"calls": -3}, "report boundary: $.calls = -3: negative"),
    ({"point": {"B": object()}}, "report boundary: $.point.B: object is not a JSON value"),
    ({"a": -1, "b": -2, "c": -3, "d": -4}, "(and 1 more)"),
])
def test_the_boundary_names_the_offending_key(doc, message):
    with pytest.raises(ReportBoundaryError) as e:
        check(doc)
    assert message in str(e.value)
    assert isinstance(e.value, AssertionError)  # a bug, not a user error


def test_signed_figures_are_the_named_exceptions():
    doc = {"ttft": {"n": 3, "median_abs": 0.2, "p90_abs": 0.3, "signed_median": -0.2}, "ok": [0, 0.0, None, True]}
    assert check(doc) is doc
    with pytest.raises(ReportBoundaryError, match=r"\$\.ttft\.median_abs = -0.2: negative"):
        check({"ttft": {"median_abs": -0.2}})


def test_dumps_never_writes_a_nan_token():
    assert dumps({"t": 0.5}, indent=None) == '{"t": 0.5}'
    with pytest.raises(ReportBoundaryError):
        dumps({"t": math.nan})


def test_nothing_is_printed_or_written_past_a_violation(tmp_path, capsys):
    with pytest.raises(ReportBoundaryError):
        emit_lines([{"op": "mm", "time_s": 1.0}, {"op": "mm", "time_s": -1.0}])
    assert capsys.readouterr().out == ""  # the first line, fine alone, is not printed either
    path = tmp_path / "t.json"
    with pytest.raises(ReportBoundaryError):
        write_trace([{"name": "k", "ph": "X", "ts": 0.0, "dur": -2.0, "pid": 1, "tid": 1}], str(path), "ms")
    assert not path.exists()


@pytest.mark.parametrize("json_flag", [["--json"], []])
@pytest.mark.parametrize("bad, why", [(-1e-3, "-0.001: negative"), (math.nan, "nan: not a finite number")])
def test_a_wrong_figure_is_an_internal_error_not_a_number(monkeypatch, json_flag, bad, why):
    from perfcast.perf import collectives

    real = collectives.topology_cost
    monkeypatch.setattr(collectives, "topology_cost", lambda *a: dataclasses.replace(real(*a), time_s=bad))
    rc, out, err = run_cli("collective", "all_reduce", "--topology", "hgx-h200", "--bytes", "1e6", *json_flag)
    assert (rc, out) == (70, "")
    assert err == (f"perfcast collective: internal error: report boundary: $.time_s = {why} (a time, size, memory, "
                   f"rate, count or share) — a bug in perfcast; the result was not printed\n"
                   if bad < 0 else
                   f"perfcast collective: internal error: report boundary: $.time_s = {why} — a bug in perfcast; "
                   f"the result was not printed\n")
