"""The collector (``perfcast profile``): a tiny model's kernels are timed on the local torch
device, written as a profiling database that ProfilingDataSource loads, and re-pricing the same
model with it is measured; bad input is a one-line UserError."""

from pathlib import Path

import pytest
import yaml

from perfcast.ir import UserError
from perfcast.models import ModelConfig

TINY = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 1000,
        "max_position_embeddings": 2048, "tie_word_embeddings": False}


@pytest.fixture(scope="module")
def tiny():
    return ModelConfig("tiny-llama", TINY, Path("tiny-llama.json"), {})


@pytest.fixture(scope="module")
def database(tiny, tmp_path_factory):
    from perfcast.profiler import profile_model

    out = tmp_path_factory.mktemp("db")
    return profile_model(tiny, out, "cpu-local", query_length=16, dtype="fp32", repeats=3, device="cpu")


def test_layout_manifest_and_mapping(database):
    import torch

    assert database.parts[-3:] == ("cpu-local", "torch", str(torch.__version__))
    manifest = yaml.safe_load((database / "MANIFEST.yaml").read_text())
    for key in ("date", "python", "torch", "numpy", "device_name", "platform", "threads", "repeats"):
        assert key in manifest
    assert manifest["profiled"][0]["model"] == "tiny-llama"
    mapping = yaml.safe_load((database / "op_mapping.yaml").read_text())
    assert mapping["kernels"]["MatMul"]["keys"] == ["M", "K", "N", "dtype"]
    assert mapping["ops"]["aten.mm.default"] == {"category": "compute", "kernel_type": "MatMul"}
    assert mapping["ops"]["perfcast.attention.default"]["kernel_type"] == "Attention"
    # profiled as the eager engine runs it: one kernel per captured op, no fused kernels
    assert mapping["ops"]["aten.mul.Tensor"]["category"] == "elementwise"
    assert not [op for op in mapping["ops"] if op.startswith("fused[")]
    header = (database / "MatMul.csv").read_text().splitlines()[0].split(",")
    assert header[:5] == ["M", "K", "N", "dtype", "latency_us"] and "std_us" in header and "samples" in header


def test_repricing_the_profiled_model_is_measured(database, tiny):
    from perfcast.hardware import get_device
    from perfcast.inference.textgen import Request, simulate
    from perfcast.perf import Provenance
    from perfcast.perf.profiling import ProfilingDataSource

    ProfilingDataSource(database)  # loads without error
    res = simulate(Request(tiny, get_device("cpu-local"), query_length=16, dtype="fp32",
                           performance_models=("profiling",), profiling_database=str(database)))
    leaves = res.rollups["profiling"].leaves
    matmuls = [lt for lt in leaves if lt.leaf.kind == "matmul"]
    assert matmuls and all(lt.result.source is Provenance.MEASURED for lt in matmuls)
    assert res.evaluations["profiling"].provenance_shares() == {"measured": pytest.approx(1.0)}


def test_profiling_again_merges(database, tiny, tmp_path):
    import pandas as pd

    from perfcast.profiler import profile_model

    before = len(pd.read_csv(database / "MatMul.csv"))
    again = profile_model(tiny, database.parents[2], "cpu-local", query_length=8, dtype="fp32",
                          repeats=1, device="cpu")
    assert again == database
    rows = pd.read_csv(database / "MatMul.csv")
    assert len(rows) > before and set(rows["M"]) >= {8, 16}
    assert len(yaml.safe_load((database / "MANIFEST.yaml").read_text())["profiled"]) == 2


def _run(*argv):
    from perfcast.cli import profile
    from perfcast.cli.args import Parser

    parser = Parser(prog="perfcast")
    profile.add_parser(parser.add_subparsers(dest="command", parser_class=Parser))
    args = parser.parse_args(["profile", *argv])
    return args.run(args)


@pytest.mark.parametrize("argv, message", [
    (["no-such-model", "--device-name", "cpu-local"], "unknown model 'no-such-model'"),
    (["{cfg}", "--device-name", "CPU Local"], "--device-name 'CPU Local'"),
    (["{cfg}", "--device-name", "cpu-local", "--repeats", "0"], "--repeats must be at least 1"),
    (["{cfg}", "--device-name", "cpu-local", "--decode"], "--context-length must be"),
    (["{cfg}", "--device-name", "cpu-local", "--query-length", "0"], "--query-length must be at least 1"),
    (["{cfg}", "--device-name", "cpu-local", "--torch-device", "bogus"], "--torch-device 'bogus'"),
])
def test_cli_errors_are_one_line(tmp_path, argv, message):
    import json

    cfg = tmp_path / "tiny.json"
    cfg.write_text(json.dumps(TINY))
    argv = [a.replace("{cfg}", str(cfg)) for a in argv] + ["--out", str(tmp_path / "db")]
    with pytest.raises(UserError) as info:
        _run(*argv)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_cli_writes_a_database(tmp_path, capsys):
    import json

    cfg = tmp_path / "tiny.json"
    cfg.write_text(json.dumps(TINY))
    assert _run(str(cfg), "--device-name", "cpu-local", "--out", str(tmp_path / "db"),
                "--query-length", "4", "--repeats", "1", "--quiet") == 0
    root = Path(capsys.readouterr().out.strip())
    assert (root / "op_mapping.yaml").exists() and (root / "MANIFEST.yaml").exists()
