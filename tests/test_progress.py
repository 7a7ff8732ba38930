"""Progress bars (:mod:`perfcast.cli.progress`): drawn on stderr when it is a terminal, after the
run has lasted a second; nothing at all on a pipe or a file, or under ``--json``."""

from __future__ import annotations

import contextlib
import io
import json
import time
from types import SimpleNamespace

import pytest
from rich.console import Console

from perfcast.cli import progress as progress_module
from perfcast.cli.main import main
from perfcast.cli.progress import Bar, progress, shown

#: a step whose capture is cached after the first run (about a second the first time)
STEP = ["text-generate", "llama-3.1-8b", "--decode", "--context-length", "1024", "--num-queries", "8"]


class Terminal(io.StringIO):
    """A stderr that says it is a terminal."""

    def isatty(self) -> bool:
        return True


def _terminal_console() -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, force_terminal=True, width=100), out


def _run(argv: list[str], stderr: io.StringIO, out: io.StringIO | None = None) -> tuple[int, str, str]:
    out = out if out is not None else Terminal()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(stderr):
        rc = main(argv)
    return rc, out.getvalue(), stderr.getvalue()


@pytest.fixture
def no_delay(monkeypatch):
    monkeypatch.setattr(progress_module, "DELAY_S", 0.0)
    monkeypatch.setenv("TERM", "xterm-256color")  # a dumb terminal gets no live display


def test_a_bar_is_drawn_on_a_terminal_with_its_counts_and_what_was_done(no_delay):
    console, out = _terminal_console()
    with progress(SimpleNamespace(json=False), "screening", console=console) as bar:
        bar(3, 8, "h100-sxm tp2")
        time.sleep(0.15)  # a refresh of the live display (10 per second)
    drawn = out.getvalue()
    assert "screening h100-sxm tp2" in drawn and "3/8" in drawn and "━" in drawn


def test_a_short_run_draws_nothing():
    console, out = _terminal_console()
    with progress(SimpleNamespace(json=False), "screening", console=console) as bar:  # DELAY_S: 1 s
        bar(1, 2)
    assert out.getvalue() == ""


def test_log_lines_stand_above_the_bar_or_alone_on_a_pipe(no_delay, capsys):
    console, out = _terminal_console()
    with progress(SimpleNamespace(), "profiling", lines=True, console=console) as bar:
        bar(1, 2, "[1/2] gemm: 3.0 µs")
    assert "[1/2] gemm: 3.0 µs" in out.getvalue() and "profiling" in out.getvalue()
    with progress(SimpleNamespace(), "profiling", lines=True) as bar:  # stderr is captured: not a terminal
        bar(1, 2, "[1/2] gemm: 3.0 µs")
        bar.log("a note")
    assert capsys.readouterr().err == "[1/2] gemm: 3.0 µs\na note\n"
    with progress(SimpleNamespace(), "profiling", lines=False) as bar:  # --quiet
        bar(1, 2, "[1/2] gemm: 3.0 µs")
    assert capsys.readouterr().err == ""


def test_where_a_bar_may_be_drawn(monkeypatch):
    monkeypatch.setattr("sys.stderr", Terminal())
    monkeypatch.setattr("sys.stdout", Terminal())
    assert shown(SimpleNamespace(json=False)) and shown(SimpleNamespace())
    assert not shown(SimpleNamespace(json=True))
    monkeypatch.setattr("sys.stdout", io.StringIO())   # output piped: no bar
    assert not shown(SimpleNamespace(json=False))
    monkeypatch.setattr("sys.stdout", Terminal())
    monkeypatch.setattr("sys.stderr", io.StringIO())
    assert not shown(SimpleNamespace(json=False))


def test_a_hook_without_a_terminal_does_nothing():
    bar = Bar("screening")
    bar(1, 2, "x")
    bar.log("kept only with lines")
    bar.close()
    assert not bar.drawn


def test_the_command_draws_its_bar_on_a_terminal_only_and_never_under_json(no_delay):
    main(STEP + ["--json"])  # the capture cached: the runs below take a fraction of a second
    rc, out, err = _run(STEP, Terminal())
    assert rc == 0 and "capturing and pricing llama-3.1-8b" in err and "tokens/s" in out
    assert "capturing" not in out
    rc, out, err = _run(STEP, io.StringIO())  # a pipe or a file
    assert rc == 0 and err == ""
    rc, out, err = _run(STEP, Terminal(), io.StringIO())  # the output piped, stderr still a terminal
    assert rc == 0 and err == ""
    rc, out, err = _run(STEP + ["--json"], Terminal())
    assert rc == 0 and err == "" and json.loads(out)["model"] == "llama-3.1-8b"
