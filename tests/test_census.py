"""The hardening census (``benchmarks/hardening_census.py``): a seed fixes its cases, every
population has cases that must be refused and cases that may be answered, the forms that broke
perfcast are always among them, its verdicts follow the promise, and cases run through its
forked workers answer as ``python -m perfcast.cli.main`` does (a hang is killed and counted)."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "hardening_census.py"


def _module():
    spec = importlib.util.spec_from_file_location("hardening_census", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # puts benchmarks/ on sys.path for census_cases
    return module


census = _module()
import census_cases  # noqa: E402


def test_a_seed_fixes_the_cases():
    keys = [c.key() for c in census_cases.generate(0)]
    assert keys == [c.key() for c in census_cases.generate(0)]
    assert keys != [c.key() for c in census_cases.generate(1)]
    assert len(set(keys)) == len(keys)
    assert 800 <= len(keys) <= 850


def test_every_population_has_cases_to_refuse_and_cases_to_answer():
    from perfcast.cli.main import build_parser

    commands = next(a for a in build_parser()._actions if isinstance(getattr(a, "choices", None), dict)).choices
    cases = census_cases.generate(0)
    for population in census_cases.POPULATIONS:
        mine = [c for c in cases if c.population == population]
        assert any(c.must_refuse for c in mine) and not all(c.must_refuse for c in mine), population
        assert {c.argv[0] for c in mine} <= set(commands), population


@pytest.mark.parametrize("seed", [0, 1])
def test_the_forms_that_broke_perfcast_are_always_drawn(seed):
    kinds = {(c.population, c.kind) for c in census_cases.generate(seed)}
    for named in [("databases", "the H200 database priced on h100-sxm"),
                  ("databases", "mapping table file ../../../../../../../../etc/passwd"),
                  ("configs", "qwen3-30b-a3b: num_experts = 0 (a dense model?)"),
                  ("configs", "llama-3.1-8b: num_hidden_layers = 1000000"),
                  ("devices", "hbm_capacity_bytes: 1:30"), ("devices", "alias bomb 10^9 as description"),
                  ("topologies", "alias bomb 5^5 as description"), ("topologies", "latin-1 byte"),
                  ("flags", "collective ad hoc --link-latency '-1'"), ("flags", "kernel --set H= 'nan'"),
                  ("flags", "collective --group-size '0'"), ("flags", "op --batch CSV no header")]:
        assert named in kinds


CASE = census_cases.Case("flags", "x", ("kernel", "flash-attention", "--json"), must_refuse=False)
MUST = census_cases.Case("flags", "x", ("kernel", "flash-attention", "--json"), must_refuse=True)
DB = census_cases.Case("databases", "x", ("op", "mm"), must_refuse=False, outside_s=7e-6)


@pytest.mark.parametrize("case, rc, out, err, ran_code, verdict", [
    (CASE, 2, "", "perfcast kernel: error: --set H: expected a finite number, got 'nan'\n", False, "answered"),
    (CASE, 2, "", "perfcast db: error: DIR: 2 problems\n  a\n  b\n", False, "answered"),
    (CASE, 0, '{"time_s": 1e-05}', "", False, "answered"),
    (MUST, 2, "", "perfcast kernel: error: --device given twice\n", False, "answered"),
    (CASE, 1, "", "Traceback (most recent call last):\n  File x\nKeyError: 'gelu_fancy'\n", False, "traceback"),
    (CASE, -9, "", "", False, "traceback"),  # killed (out of memory)
    (CASE, None, "", "", False, "hung"),
    (CASE, 0, '{"time_s": NaN}', "", False, "absurd"),
    (CASE, 0, '{"totals": {"time_s": -13.99825}}', "", False, "absurd"),
    (CASE, 0, '{"hbm_capacity_bytes": Infinity}', "", False, "absurd"),
    (CASE, 0, '{"free_memory_bytes": -5}', "", False, "answered"),  # a shortfall is signed
    (CASE, 0, "time: nan s\n", "", False, "absurd"),
    (MUST, 0, '{"time_s": 1e-05}', "", False, "absurd"),  # silently wrong
    (DB, 0, '{"performance_models": {"profiling": {"time_s": 7e-06}}}', "", False, "absurd"),
    (CASE, 2, "", "perfcast devices: error: " + "x" * 428_000 + "\n", False, "flood"),
    (CASE, 2, "", "perfcast db: error: DIR\n" + "  line\n" * 60, False, "flood"),
    (CASE, 2, "", "perfcast devices: error: line 15: tag refused\n", True, "absurd"),  # the tag ran code
    (CASE, 2, "DIR: latency_us must be positive\n", "", False, "mute"),
])
def test_verdicts(case, rc, out, err, ran_code, verdict):
    assert census.classify(case, rc, out, err, ran_code)[0] == verdict


def _run(*args):
    proc = subprocess.run([sys.executable, str(SCRIPT), "--json", "--workers", "1", *args],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_cases_run_in_forked_workers_as_python_m():
    doc = _run("--population", "devices", "--match", "as shipped", "--match", "hbm_capacity_bytes: 1:30")
    by = {(r["kind"], r["argv"][0]): r for r in doc["results"]}
    assert doc["counts"]["total"] == {"cases": 4, "answered": 4, "traceback": 0, "hung": 0, "absurd": 0,
                                      "flood": 0, "mute": 0}
    assert by["the file as shipped", "devices"]["rc"] == 0
    refused = by["hbm_capacity_bytes: 1:30", "kernel"]
    assert refused["rc"] == 2
    assert refused["why"].startswith("perfcast kernel: error: {dir}/device.yaml: ")  # no runpy warning before it


def test_a_case_past_its_time_is_killed_and_counted_hung():
    doc = _run("--population", "flags", "--limit", "1", "--timeout", "0.01")
    assert doc["counts"]["total"]["hung"] == 1
