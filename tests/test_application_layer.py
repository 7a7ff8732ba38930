"""Application logic lives in one place: the inference layer prices a step and derives its
figures (step time, tokens/s, overlap and slow roll-ups); ``report/`` only formats them and
``cli/`` only maps flags to a request."""

import ast
import json
from pathlib import Path

import pytest

import perfcast
from perfcast.capture.parallel import Layout
from perfcast.hardware import get_device
from perfcast.inference.textgen import Request, pipeline_time_s, simulate
from perfcast.models import load_model_config
from perfcast.report import textgen as report

ROOT = Path(perfcast.__file__).parent


def test_pipeline_time_worked_example():
    # one pass per micro-batch: 2 s × 4 micro-batches + a 1 s encoder = 9 s
    assert pipeline_time_s(2.0, None, 4, 1.0) == 9.0
    # GPipe fill and drain: all stages once (3 + 5 + 4 = 12), then the slowest (5) for each of
    # the 4 − 1 further micro-batches: 12 + 3·5 = 27; the encoder runs before: 28
    assert pipeline_time_s(2.0, [3.0, 5.0, 4.0], 4) == 27.0
    assert pipeline_time_s(2.0, [3.0, 5.0, 4.0], 4, 1.0) == 28.0


@pytest.fixture(scope="module")
def dense(tmp_path_factory):
    path = tmp_path_factory.mktemp("dense") / "config.json"
    path.write_text(json.dumps({
        "model_type": "llama", "hidden_size": 512, "num_attention_heads": 8, "num_key_value_heads": 4,
        "intermediate_size": 1024, "num_hidden_layers": 4, "vocab_size": 1024,
        "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
        "bos_token_id": 1, "eos_token_id": 2}))
    return load_model_config(str(path))


@pytest.mark.parametrize("overlap", [(), ("double-buffer", "weight-prefetch")])
def test_the_report_reads_the_results_figures(dense, overlap):
    r = simulate(Request(dense, get_device("h200-sxm"), num_queries=4, query_length=64, layout=Layout(pp=2),
                         overlap=overlap, rollup="both"))
    doc = report.to_json(r)
    m = doc["performance_models"]["analytic"]
    assert m["total_time_s"] == r.step_time_s("analytic", overlap=True)
    assert m["tokens_per_s_per_device"] == r.tokens_per_s_per_device("analytic", overlap=True)
    assert doc["tokens_per_s_per_device"] == m["tokens_per_s_per_device"]
    # the step time is the pipeline formula over the stages' times (after overlap when asked)
    stages = r.overlaps["analytic"].stage_times_s if overlap else r.stage_times_s["analytic"]
    assert m["stage_times_s"] == stages
    assert m["total_time_s"] == pipeline_time_s(0.0, stages, r.request.micro_batches)
    assert m["tokens_per_s_per_device"] == r.request.tokens / m["total_time_s"] / r.request.devices
    # the slow roll-up is set beside the fast step time without overlap
    slow = doc["slow"]["analytic"]
    assert slow == r.slow_comparison("analytic").as_dict()
    assert slow["fast_time_s"] == r.step_time_s("analytic")
    assert slow["resource_bound_time_s"] <= slow["time_s"] <= slow["serial_time_s"]


def test_fast_request_runs_no_other_rollup(dense):
    r = simulate(Request(dense, get_device("h200-sxm"), num_queries=2, query_length=64))
    assert r.overlaps == {} and r.slow == {}
    assert r.step_time_s("analytic", overlap=True) == r.step_time_s("analytic")


def _source(package: str):
    for path in sorted((ROOT / package).rglob("*.py")):
        yield path, path.read_text()


def test_the_pipeline_formula_is_written_once():
    # "(micro-batches − 1) × the slowest stage" in code: one function, in the inference layer
    hits = [f"{p.relative_to(ROOT)}" for pkg in ("inference", "report", "cli", "serving", "profiler")
            for p, text in _source(pkg) if "micro_batches - 1" in text]
    assert hits == ["inference/textgen.py"]


def test_report_and_cli_run_no_rollup():
    """Neither layer builds an overlap or slow roll-up: they read the application's result."""
    built = []
    for pkg in ("report", "cli"):
        for path, text in _source(pkg):
            for node in ast.walk(ast.parse(text)):
                if isinstance(node, ast.Call) and isinstance(node.func, (ast.Name, ast.Attribute)):
                    name = node.func.id if isinstance(node.func, ast.Name) else node.func.attr
                    if name in ("SlowRollup", "OverlapRollup"):
                        built.append(f"{path.relative_to(ROOT)}:{node.lineno} {name}")
    assert not built, built
