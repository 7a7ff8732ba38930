"""The fuzzing harness: run ``perfcast ARGS`` in this process under a time limit and check the
promise every input path makes — exit 2 with one short line on stderr, or exit 0 with a
plausible result (no NaN, no infinity, no negative time, size or memory) — never a traceback,
a hang or a flood.

In-process (not a subprocess per case) so that a thousand generated cases fit in CI's budget.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import re
import signal

#: a case that takes longer than this hangs (a capture of a small model takes about a second)
CASE_TIMEOUT_S = 30
#: an error line longer than this is a flood (it quotes the bad content instead of an excerpt)
MAX_LINE_CHARS = 400
#: a file's report of everything wrong in it may list several problems, each on its own line
MAX_ERROR_LINES = 40


class Hang(Exception):
    pass


@contextlib.contextmanager
def time_limit(seconds: float):
    """Raise :class:`Hang` in this (the main) thread after ``seconds``."""
    def alarm(signum, frame):
        raise Hang(f"no answer after {seconds} s")

    old = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def run_cli(*argv: str, timeout_s: float = CASE_TIMEOUT_S) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of ``perfcast ARGV`` run in this process. A traceback is not
    caught: it fails the test that ran the case, with the case in hypothesis' report."""
    from perfcast.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    with time_limit(timeout_s), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main(list(argv))
        except SystemExit as e:  # argparse's own errors
            rc = e.code if isinstance(e.code, int) else 2
    return rc, out.getvalue(), err.getvalue()


_NONNEGATIVE = re.compile(r"(_s|_ms|_us|_bytes|_flops|bytes|seconds|time|latency|memory|capacity|"
                          r"tokens_per_s|throughput|count|size)$")
#: figures that are signed by meaning (an error, a shortfall shown as free memory below zero)
_SIGNED = re.compile(r"(error|signed|delta|free|margin|residual|offset|diff)", re.I)


def figure_problems(doc, where: str = "$") -> list[str]:
    """Where ``doc`` (a parsed JSON document) holds a non-finite number, or a negative number
    under a key that names a time, size, memory or count."""
    problems = []
    if isinstance(doc, dict):
        for k, v in doc.items():
            key = str(k)
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                if isinstance(v, float) and not math.isfinite(v):
                    problems.append(f"{where}.{key} = {v}")
                elif v < 0 and _NONNEGATIVE.search(key) and not _SIGNED.search(key):
                    problems.append(f"{where}.{key} = {v} (negative)")
            else:
                problems += figure_problems(v, f"{where}.{key}")
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            problems += figure_problems(v, f"{where}[{i}]")
    elif isinstance(doc, float) and not math.isfinite(doc):
        problems.append(f"{where} = {doc}")
    return problems


def json_documents(text: str) -> list:
    """The JSON documents of a command's output: one, or one per line (JSON lines)."""
    text = text.strip()
    if not text or text[0] not in "[{":
        return []
    try:
        return [json.loads(text, parse_constant=lambda c: float(c))]
    except json.JSONDecodeError:  # JSON lines (op --batch --json)
        return [json.loads(line, parse_constant=lambda c: float(c)) for line in text.splitlines() if line.strip()]


def check_answered(rc: int, out: str, err: str, case: object = None) -> None:
    """The promise: exit 2 with a short error (one line; a file's report may list several
    problems, one per line), or exit 0 with finite, plausible figures."""
    lines = err.splitlines()
    assert rc in (0, 2), f"exit {rc} for {case!r}: {err[-2000:]}"
    assert "Traceback" not in err, f"traceback for {case!r}: {err[-2000:]}"
    assert all(len(line) <= MAX_LINE_CHARS for line in lines), \
        f"a flood for {case!r}: {max(len(line) for line in lines):,} chars in a line"
    if rc == 2:
        assert lines, f"exit 2 without a word for {case!r}"
        assert len(lines) <= MAX_ERROR_LINES, f"{len(lines)} error lines for {case!r}"
        assert "error" in lines[0], f"exit 2 but the first line is not an error for {case!r}: {lines[0]}"
        return
    for doc in json_documents(out):
        bad = figure_problems(doc)
        assert not bad, f"absurd figures for {case!r}: {bad[:5]}"
    assert not re.search(r"\b(nan|inf|-inf|Infinity)\b", out, re.I) or out.lstrip().startswith(("{", "[")), \
        f"a non-finite figure printed for {case!r}"
