"""The ``perfcast`` command. Subcommands import what they need only when they run, so a command
that needs no model capture never imports torch."""

from __future__ import annotations

import sys

from perfcast.cli.args import ARGV, Parser
from perfcast.ir import UserError
from perfcast.report.document import ReportBoundaryError

#: exit status of an internal error (sysexits.h EX_SOFTWARE): perfcast computed a figure it must not
#: print; 2 stays the user's error
INTERNAL_ERROR = 70


def build_parser() -> Parser:
    parser = Parser(prog="perfcast", description="Predict how fast ML models run, and how much "
                                                  "memory they need, on hardware you do not own.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    from perfcast.cli import (calibrate, collective, db, devices, engines, kernel, kernels, models, op,
                              optimize, profile, recommend, schema, sensitivity, serve, textgen, validate)

    for module in (devices, engines, kernels, kernel, models, textgen, serve, optimize, recommend, sensitivity, op,
                   profile, db, calibrate, collective, validate, schema):
        module.add_parser(sub)
    devices.add_topologies_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    vars(args)[ARGV] = list(sys.argv[1:] if argv is None else argv)
    try:
        return args.run(args)
    except UserError as e:
        # one line; a file's report of everything wrong in it lists each problem on a line of its own
        first, *more = str(e).splitlines() or [""]
        sys.stderr.write(f"perfcast {args.command}: error: {first}\n" + "".join(f"  {line}\n" for line in more))
        return 2
    except BrokenPipeError:
        return 0
    except ReportBoundaryError as e:
        sys.stderr.write(f"perfcast {args.command}: internal error: {e} — a bug in perfcast; the result "
                         f"was not printed\n")
        return INTERNAL_ERROR


def run() -> None:
    """The ``perfcast`` process: :func:`main`, then out without the interpreter's teardown. A
    search leaves a heap of a million objects (step models' tables, SymPy's caches) that the
    interpreter frees one by one at exit — a third of a second on a 2-core machine — before the
    operating system drops the whole address space anyway. So, where only the main thread is left,
    the streams are flushed and the exit handlers run as at a normal exit (``atexit``: logging,
    multiprocessing, ``weakref.finalize``), and the process ends with ``os._exit`` (the habit of
    Instagram's Django workers, "Dismissing Python Garbage Collection at Instagram", 2017)."""
    import atexit
    import os
    import threading

    code = main()
    if any(t is not threading.main_thread() and not t.daemon for t in threading.enumerate()):
        raise SystemExit(code)
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except OSError:   # a closed pipe: the interpreter's own exit reports it, as before
        raise SystemExit(code) from None
    atexit._run_exitfuncs()   # the handlers a normal exit runs, in its order
    os._exit(code)


if __name__ == "__main__":
    run()
