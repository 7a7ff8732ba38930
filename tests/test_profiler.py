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
    return profile_model(tiny, out, "cpu-local", query_length=16, dtype="fp32", repeats=3, device="cpu",
                         progress=lambda *a: PROGRESS.append(a))


#: the progress hook's calls while the database was profiled
PROGRESS = []


def test_progress_counts_the_kernels_timed(database):
    total = len(PROGRESS)
    assert total > 1 and [(done, n) for done, n, _ in PROGRESS] == [(i + 1, total) for i in range(total)]
    assert all(line.startswith(f"[{done}/{total}] ") and " µs (" in line for done, _, line in PROGRESS)


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
    (["{cfg}", "--device-name", "cpu-local", "--decode"], "--context-length must be"),
    (["{cfg}", "--device-name", "cpu-local", "--decode", "--context-length", "8", "--query-length", "4"],
     "--query-length: a decode step runs one new token per sequence"),
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


@pytest.mark.parametrize("argv, message", [
    (["--repeats", "0"], "perfcast profile: error: --repeats: expected at least 1, got '0'"),
    (["--query-length", "0"], "perfcast profile: error: --query-length: expected at least 1, got '0'"),
    (["--rotate-bytes", "-1"], "perfcast profile: error: --rotate-bytes: expected at least 0, got '-1'"),
    (["--num-queries", "nan"], "perfcast profile: error: --num-queries: expected a finite number, got 'nan'"),
])
def test_cli_refuses_numbers_before_profiling(argv, message, capsys):
    with pytest.raises(SystemExit) as info:
        _run("tiny.json", "--device-name", "cpu-local", "--out", "db", *argv)
    assert info.value.code == 2 and capsys.readouterr().err == message + "\n"


def test_cli_writes_a_database(tmp_path, capsys):
    import json

    cfg = tmp_path / "tiny.json"
    cfg.write_text(json.dumps(TINY))
    assert _run(str(cfg), "--device-name", "cpu-local", "--out", str(tmp_path / "db"),
                "--query-length", "4", "--repeats", "1", "--quiet") == 0
    root = Path(capsys.readouterr().out.strip())
    assert (root / "op_mapping.yaml").exists() and (root / "MANIFEST.yaml").exists()


# Collector timing and L2 policy (CPU-only; a fake backend stands in for CUDA) ------------------
def test_weight_copies_cover_the_rotation_bytes():
    from perfcast.profiler.kernels import MAX_COPIES, copies_for

    mib = 2**20
    assert copies_for(32 * mib, 120 * mib) == 4  # a 4096x4096 bf16 weight against 2 x 60 MB of L2: ceil(120/32)
    assert copies_for(2**30, 120 * mib) == 1  # an lm_head larger than the rotation: one copy
    assert copies_for(32 * mib, 0) == 1 and copies_for(1, 10**12) == MAX_COPIES


def test_matmul_builder_cycles_its_weight_copies():
    import torch

    from perfcast.ir import Tensor, make_leaf
    from perfcast.profiler.kernels import build

    a, w, c = Tensor("a", (4, 64), "fp32"), Tensor("w", (64, 32), "fp32"), Tensor("c", (4, 32), "fp32")
    leaf = make_leaf("matmul", "mm", (a, w), (c,), op="aten.mm.default")
    fn, how = build(leaf, "cpu", rotate_bytes=3 * 32 * 64 * 4)  # three copies of the 8 KiB weight
    assert how == "matmul, 3 weight copies"
    outs = [fn() for _ in range(4)]
    assert not torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[3])  # copy 0, 1, 2, then 0 again
    assert build(leaf, "cpu")[1] == "matmul"


class _FakeCuda:
    """A CUDA-like backend: a call of the raw kernel costs 2 µs back to back, a graph replay of
    ``calls`` calls costs 1.5 µs per call (no host launches)."""

    kind, graphs, l2_bytes = "cuda", True, 60 * 2**20

    def time(self, fn, *, warmup=3, repeats=10, min_time_s=0.0, max_samples=1000, calls=1, before=None):
        per_call = 1.5e-6 * fn.calls if getattr(fn, "calls", None) else 2e-6
        return [per_call] * repeats

    def capture(self, fn, *, calls=1, warmup=3, before=None):
        def replay():
            pass
        replay.calls = calls
        return replay


def test_measure_back_to_back_and_graph_replay():
    from perfcast.profiler.collect import Options, measure, rotate_bytes

    events = measure(lambda: None, _FakeCuda(), Options(repeats=3))
    assert events["latency_us"] == pytest.approx(2.0)
    assert events["timing"] == "events, 100 back-to-back call(s) per sample"  # ceil(200 µs / 2 µs)
    graph = measure(lambda: None, _FakeCuda(), Options(repeats=3, timing="graph"))
    assert graph["latency_us"] == pytest.approx(1.5) and graph["timing"] == "graph replay of 100 call(s) per sample"
    assert rotate_bytes(_FakeCuda(), Options()) == 2 * 60 * 2**20 and rotate_bytes(_FakeCuda(), Options(rotate_bytes=0)) == 0


@pytest.mark.parametrize("argv, message", [
    (["--timing", "graph"], "--timing graph: needs a CUDA device"),
])
def test_collector_options_that_cannot_apply(tmp_path, argv, message):
    import json

    cfg = tmp_path / "tiny.json"
    cfg.write_text(json.dumps(TINY))
    with pytest.raises(UserError, match=message):
        _run(str(cfg), "--device-name", "cpu-local", "--torch-device", "cpu", "--out", str(tmp_path / "db"), *argv)


def test_dtype_defaults_to_fp32_on_a_cpu(database):
    manifest = yaml.safe_load((database / "MANIFEST.yaml").read_text())
    assert manifest["timing"] == "time.perf_counter per call" and manifest["l2"].startswith("no rotation")
    assert manifest["profiled"][0]["dtype"] == "fp32" and manifest["profiled"][0]["timing"] == "events"
