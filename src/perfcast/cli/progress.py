"""Progress on stderr for the commands' long runs — a capture, a search, a validation, a
profiling run, a Ray sweep: one rich bar, drawn only on a terminal and never under ``--json``
(stdout holds the document alone, and a log or a pipe gets no control codes), and only once the
run has lasted :data:`DELAY_S` (a run that ends sooner draws nothing: no flash of a bar)."""

from __future__ import annotations

import contextlib
import sys
import threading

#: seconds a run lasts before its bar is drawn
DELAY_S = 1.0


class Bar:
    """A progress hook: ``bar(done, total, what)`` after each unit of work (``total`` None while
    unknown; ``what``: the unit just done, or with ``lines`` a line of the run's log), and
    ``bar.log(line)``. A log line is kept: printed above the bar on a terminal, else on stderr as
    it is when ``lines`` (a command asked to be quiet passes ``lines=False``)."""

    def __init__(self, label: str, console=None, lines: bool = False, delay_s: float | None = None):
        self.label, self.lines = label, lines
        self._progress = self._task = self._timer = None
        self._started = False
        self._lock = threading.Lock()
        if console is None:
            return
        from rich.progress import (BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn,
                                   TimeElapsedColumn)

        # no redirection of sys.stdout / sys.stderr (rich's default): the bar changes nothing outside it
        self._progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                  TimeElapsedColumn(), console=console, transient=True, redirect_stdout=False,
                                  redirect_stderr=False)
        self._task = self._progress.add_task(label, total=None)
        delay_s = DELAY_S if delay_s is None else delay_s
        if delay_s <= 0:
            self._start()
        else:
            self._timer = threading.Timer(delay_s, self._start)
            self._timer.daemon = True
            self._timer.start()

    @property
    def drawn(self) -> bool:
        return self._progress is not None

    def _start(self) -> None:
        with self._lock:
            if self._progress is not None and not self._started:
                self._progress.start()
                self._started = True

    def __call__(self, done: int, total: int | None = None, what: str | None = None) -> None:
        if self.lines and what:  # a line of the run's log, not a name for the bar
            self.log(what)
            what = None
        if self._progress is not None:
            self._progress.update(self._task, completed=done, total=total,
                                  description=f"{self.label} {what}" if what else self.label)

    def log(self, line: str) -> None:
        if self._progress is not None:
            self._progress.console.print(line, markup=False, highlight=False, soft_wrap=True)
        elif self.lines:
            print(line, file=sys.stderr, flush=True)

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer.join()
        with self._lock:
            if self._started:
                self._progress.stop()
            self._progress = None


def shown(args) -> bool:
    """Whether a bar may be drawn: stdout and stderr are both a terminal (output piped or written
    to a file is a scripted run: no bar) and ``--json`` was not given."""
    return not getattr(args, "json", False) and sys.stdout.isatty() and sys.stderr.isatty()


@contextlib.contextmanager
def progress(args, label: str, *, lines: bool = False, console=None):
    """The run's :class:`Bar` on stderr (a hook that draws nothing where :func:`shown` is false,
    or a ``console`` given, e.g. a test's). ``lines``: the run's log lines go to stderr where no
    bar is drawn."""
    if console is None and shown(args):
        from rich.console import Console

        console = Console(stderr=True)
    bar = Bar(label, console, lines)
    try:
        yield bar
    finally:
        bar.close()
