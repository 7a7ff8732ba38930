"""``--plot DIR`` (docs/design/plots.md): every figure of a small real run of each command is written
as a valid PNG and SVG, and drawn again from the same result gives the same bytes (in another
process too); what a figure shows is the result's own numbers (the Pareto front, the step's time,
the memory); a figure a run cannot draw is named on stderr; a directory that cannot be written is one
error line and exit 2; and matplotlib is imported only when a figure is asked for."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

from fuzzing import run_cli
from perfcast.report import plots, plots_serving, plots_step, plots_validation

#: a capture and pricing on a loaded CI machine: the harness's hang limit is for fuzz cases
SLOW_S = 600
PNG = b"\x89PNG\r\n\x1a\n"
KERNEL = ["kernel", "flash-attention", "--sweep", "B=1,8,64", "--sweep", "T_kv=4096,32768"]

#: command → (argv, the module and name of its figures' function, the figures it draws)
RUNS = {
    "text-generate": (["text-generate", "llama-3.1-8b", "--decode", "--context-length", "1024", "--num-queries", "8"],
                      plots_step, "text_generate", ["roofline", "step-time", "memory"]),
    "serve": (["serve", "llama-3.1-8b", "--request-rate", "6", "--num-requests", "60", "--isl", "uniform:200-600",
               "--osl", "16", "--ttft-slo", "0.5"], plots_serving, "serve", ["serve-timeline", "serve-latency"]),
    "serve --disagg": (["serve", "llama-3.1-8b", "--request-rate", "4", "--num-requests", "30", "--osl", "8",
                        "--disagg", "1p1d"], plots_serving, "serve", ["serve-timeline", "serve-latency"]),
    "optimize": (["optimize", "llama-3.1-8b", "--devices", "h100-sxm", "--total-devices", "2", "--batch-sizes", "2,8",
                  "--isl", "512", "--osl", "32", "--serving-mode", "both"], plots_serving, "optimize", ["pareto"]),
    "validate": (["validate", "--population", "published-static", "--limit", "4"], plots_validation, "validate",
                 ["validate"]),
    "kernel": (KERNEL, plots_step, "kernel", ["kernel-roofline", "kernel-sweep"]),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """``runs(command)``: one run of the command with ``--plot`` (made once): its argv, directory,
    stdout and stderr, its figures' function and the arguments the command gave it."""
    done = {}

    def run(command: str) -> dict:
        if command not in done:
            argv, module, name, _ = RUNS[command]
            real = getattr(module, name)
            calls = []

            def recording(*args):
                calls.append(args)
                return real(*args)

            out_dir = tmp_path_factory.mktemp("plots") / "figures"  # made by --plot
            with pytest.MonkeyPatch.context() as mp:
                mp.setattr(module, name, recording)
                rc, out, err = run_cli(*argv, "--plot", str(out_dir), timeout_s=SLOW_S)
            assert rc == 0, err
            assert len(calls) == 1
            done[command] = {"command": command, "dir": out_dir, "out": out, "err": err, "draw": real,
                             "args": calls[0]}
        return done[command]
    return run


@pytest.fixture(params=list(RUNS))
def ran(request, runs):
    return runs(request.param)


def test_every_figure_is_written_as_a_png_and_an_svg(ran):
    from PIL import Image

    names = RUNS[ran["command"]][3]
    files = [ran["dir"] / f"{n}.{ext}" for n in names for ext in plots.FORMATS]
    assert sorted(p.name for p in ran["dir"].iterdir()) == sorted(p.name for p in files)
    for path in files:
        data = path.read_bytes()
        if path.suffix == ".png":
            assert data.startswith(PNG)
            with Image.open(path) as im:
                assert im.size == (1000, 600)  # SIZE_IN × DPI = (10 × 100, 6 × 100)
                im.verify()
        else:
            root = ET.fromstring(data)
            assert root.tag == "{http://www.w3.org/2000/svg}svg" and root.get("viewBox") == "0 0 720 432"
            assert b"<dc:date>" not in data and b"Matplotlib" not in data  # no date, no software stamp
    # the report, then the files it wrote, in order
    assert ran["out"].splitlines()[-len(files):] == [f"wrote {p}" for p in files]
    assert ran["err"] == ""


def test_the_same_result_draws_the_same_bytes(ran, tmp_path):
    again = tmp_path / "again"
    again.mkdir()
    paths, skipped = plots.write(ran["draw"](*ran["args"]), again)
    assert not skipped and paths
    for p in paths:
        assert p.read_bytes() == (ran["dir"] / p.name).read_bytes(), p.name


def test_another_process_draws_the_same_bytes(tmp_path):
    # another hash seed: no figure may depend on the order of a set of strings
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    one, two = tmp_path / "one", tmp_path / "two"
    rc, _, err = run_cli(*KERNEL, "--plot", str(one))
    assert rc == 0, err
    proc = subprocess.run([sys.executable, "-m", "perfcast.cli.main", *KERNEL, "--plot", str(two)], env=env,
                          capture_output=True, text=True, timeout=SLOW_S)
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in one.iterdir()) == sorted(p.name for p in two.iterdir())
    for p in one.iterdir():
        assert p.read_bytes() == (two / p.name).read_bytes(), p.name


def test_the_pareto_figure_draws_the_search_front(runs):
    result = runs("optimize")["args"][0]
    ax = plots_serving.pareto(result).axes[0]
    front, = [line for line in ax.lines if line.get_gid() == "front"]
    figs = sorted(((p.figures()["output_tokens_per_s_per_user"], p.figures()["output_tokens_per_s_per_device"])
                   for p in result.front))
    assert len(figs) >= 2 and front.get_xydata().tolist() == [list(f) for f in figs]
    # the chosen deployment, a star at its simulated figures
    star = [c for c in ax.collections if c.get_label().startswith("chosen: ")]
    best = result.best.figures("simulation")
    assert star[0].get_offsets().tolist() == [[best["output_tokens_per_s_per_user"],
                                               best["output_tokens_per_s_per_device"]]]


def test_the_step_time_figure_adds_up_to_the_step(runs):
    result = runs("text-generate")["args"][0]
    name = next(iter(result.rollups))
    ev = result.evaluations[name]
    by_op, by_part = plots_step.step_parts(result, name)
    assert sum(t for bounds in by_op.values() for t in bounds.values()) == pytest.approx(ev.time_s, rel=1e-12)
    # one layer of the 32 (Llama-3.1-8B's first layer's input norm is captured before the loop)
    assert list(by_part) == ["prologue", "layer 0 (×32)", "epilogue"]
    n = {"prologue": 1, "layer 0 (×32)": 32, "epilogue": 1}
    assert sum(n[k] * t for k, bounds in by_part.items() for t in bounds.values()) == \
        pytest.approx(ev.time_s, rel=1e-12)


def test_the_memory_figure_stacks_the_memory_report(runs):
    result = runs("text-generate")["args"][0]
    mem = result.memory
    ax = plots_step.step_memory(result).axes[0]
    widths = [round(p.get_width() * 1e9) for p in ax.patches]  # GB → bytes
    assert widths == [mem.weights_bytes, mem.kv_cache_bytes, mem.activation_peak_bytes, mem.reserved_bytes,
                      mem.free_bytes]


def test_the_latency_figure_draws_every_simulated_request(runs):
    report = runs("serve")["args"][0]
    samples = report.results["simulation"].samples
    ttft, tpot = (ax.lines[0].get_xdata() for ax in plots_serving.serve_latency(report).axes)
    assert sorted(set(ttft)) == pytest.approx(sorted({t * 1e3 for t in samples.ttft_s}), rel=1e-12)
    assert sorted(set(tpot)) == pytest.approx(sorted({t * 1e3 for t in samples.tpot_s}), rel=1e-12)


def test_json_stays_the_document_alone(tmp_path):
    rc, out, err = run_cli(*KERNEL, "--json", "--plot", str(tmp_path / "p"))
    assert rc == 0 and err == "", err
    assert json.loads(out)["kernel"] == "flash-attention"
    assert sorted(p.name for p in (tmp_path / "p").iterdir()) == ["kernel-roofline.png", "kernel-roofline.svg",
                                                                  "kernel-sweep.png", "kernel-sweep.svg"]


@pytest.mark.parametrize("argv, notes", [
    (["kernel", "flash-attention"], ["no kernel-sweep figure: no --sweep given"]),
    (["serve", "llama-3.1-8b", "--concurrency", "4", "--osl", "16", "--tier", "closed-form"],
     ["no serve-timeline figure: --tier closed-form runs no simulation",
      "no serve-latency figure: --tier closed-form runs no simulation"]),
])
def test_a_figure_a_run_cannot_draw_is_named_on_stderr(argv, notes, tmp_path):
    rc, out, err = run_cli(*argv, "--plot", str(tmp_path), timeout_s=SLOW_S)
    assert rc == 0, err
    assert err.splitlines() == [f"perfcast {argv[0]}: note: --plot: {n}" for n in notes]
    drawn = {p.name for p in tmp_path.iterdir()}
    assert all(not any(name.startswith(n.split()[1] + ".") for name in drawn) for n in notes)


@pytest.mark.parametrize("argv", [
    ["text-generate", "llama-3.1-8b"], ["serve", "llama-3.1-8b", "--concurrency", "4"],
    ["optimize", "llama-3.1-8b"], ["validate"], ["kernel", "flash-attention"]])
def test_a_directory_that_cannot_be_made_is_one_error_line(argv, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    bad = blocker / "figures"
    rc, out, err = run_cli(*argv, "--plot", str(bad))
    assert (rc, out) == (2, "")
    assert err == f"perfcast {argv[0]}: error: --plot {bad}: cannot create the directory (Not a directory)\n"


def test_matplotlib_is_imported_only_for_figures():
    code = ("import sys, contextlib, io\n"
            "from perfcast.cli.main import main\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            "    assert main(['kernel', 'flash-attention', '--json']) == 0\n"
            "assert 'matplotlib' not in sys.modules\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=SLOW_S)
    assert proc.returncode == 0, proc.stderr


def test_every_command_with_figures_takes_plot():
    from perfcast.cli.main import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(getattr(a, "choices", None), dict)).choices
    assert sorted(c for c, p in sub.items() if any("--plot" in a.option_strings for a in p._actions)) == \
        ["kernel", "optimize", "serve", "text-generate", "validate"]
