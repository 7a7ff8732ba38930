"""Argument parsing: one-line errors, each single-valued flag given at most once, numbers checked
where they enter (the ``type=`` of every numeric flag), ``SYM=VALUE`` and ``SYM=v1,v2`` values,
and which flags the user gave, so that a flag that does not apply is refused by name
(docs/design/cli.md)."""

from __future__ import annotations

import argparse
import math
import re
import sys

from perfcast.inputs import checked_number, excerpt
from perfcast.inputs.limits import MAX_BYTES, MAX_DEVICES, MAX_IMAGES, MAX_PIXELS, MAX_SEQUENCES, MAX_SIZE, MAX_TOKENS
from perfcast.ir import UserError, routing


class _Once:
    """An argparse action given at most once: a repeated single-valued flag (``--device a
    --device b``) is an error naming it, not a silent last-one-wins. Records every flag given
    (:func:`given`)."""

    def __call__(self, parser, namespace, values, option_string=None):
        if self.option_strings:
            seen = vars(namespace).setdefault(GIVEN, {})
            if self.dest in seen:
                what = "" if self.nargs == 0 else f" ({excerpt(getattr(namespace, self.dest))}, then {excerpt(values)})"
                parser.error(f"{option_string} given twice{what}; give it once")
            seen[self.dest] = option_string
        super().__call__(parser, namespace, values, option_string)


class _Append(argparse._AppendAction):
    """A repeatable flag; records that it was given (:func:`given`)."""

    def __call__(self, parser, namespace, values, option_string=None):
        vars(namespace).setdefault(GIVEN, {})[self.dest] = option_string
        super().__call__(parser, namespace, values, option_string)


#: the namespace attribute that holds the flags given, by dest
GIVEN = "_given_flags"
_ACTIONS = {
    None: type("Store", (_Once, argparse._StoreAction), {}),
    "store": type("Store", (_Once, argparse._StoreAction), {}),
    "store_const": type("StoreConst", (_Once, argparse._StoreConstAction), {}),
    "store_true": type("StoreTrue", (_Once, argparse._StoreTrueAction), {}),
    "store_false": type("StoreFalse", (_Once, argparse._StoreFalseAction), {}),
    "append": _Append,
}


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors (no usage dump), exit code 2, and flags that take one value
    refused when given twice."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        for name, action in _ACTIONS.items():
            self.register("action", name, action)

    def error(self, message: str):  # noqa: D102  (argparse API)
        # argparse says "argument --tp-size/-t: …"; perfcast's own errors say "--tp-size …"
        message = re.sub(r"^argument (--?[\w-]+)(?:/[\w-]+)*: ", r"\1: ", message)
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        raise SystemExit(2)


def given(args, flag: str) -> bool:
    """Whether the user gave ``flag`` (``--top``) on the command line, not its default."""
    return flag.lstrip("-").replace("-", "_") in vars(args).get(GIVEN, {})


def refuse(args, *rules: tuple[str, bool, str]) -> None:
    """``(flag, applies, why)``: a flag the user gave where it does not apply is an error naming
    it (a flag silently ignored would price something else than was asked)."""
    for flag, applies, why in rules:
        if not applies and given(args, flag):
            raise UserError(f"{flag}: {why}")


def written(flag: str, path: str, write, *args):
    """``write(*args)`` (its result), a file the user named with ``flag``: a file that cannot be
    written is a one-line error naming the flag and the path."""
    try:
        return write(*args)
    except OSError as e:
        raise UserError(f"{flag} {path}: cannot write ({e.strerror})") from None


# --- Numbers ---------------------------------------------------------------------------------------

def _parse(text: str) -> int | float:
    """``text`` as a Python int, else a float; a non-number is a ValueError."""
    try:
        return int(text)
    except ValueError:
        return float(text)


class Number:
    """An argparse ``type=``: a finite number (an integer when ``integer``) within bounds; each
    problem one line ``--flag: expected …, got …``. ``why`` says where the maximum comes from."""

    def __init__(self, *, integer: bool = False, minimum: float | None = None, positive: bool = False,
                 maximum: float | None = None, why: str = ""):
        self.integer, self.minimum, self.positive, self.maximum, self.why = integer, minimum, positive, maximum, why
        self.__name__ = "integer" if integer else "number"

    def __call__(self, text: str) -> int | float:
        try:
            value = _parse(text.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {'an integer' if self.integer else 'a number'}, "
                                             f"got {excerpt(text)}") from None
        if isinstance(value, float) and not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"expected a finite number, got {excerpt(text)}")
        try:
            value = checked_number(value, "value", integer=self.integer, minimum=self.minimum,
                                   positive=self.positive)
        except UserError as e:  # "value: expected …, got VALUE", said of the text given
            expected = str(e).removeprefix("value: ").rpartition(", got ")[0]
            raise argparse.ArgumentTypeError(f"{expected}, got {excerpt(text.strip())}") from None
        if self.maximum is not None and value > self.maximum:
            raise argparse.ArgumentTypeError(f"expected at most {_big(self.maximum)}"
                                             f"{f' ({self.why})' if self.why else ''}, got {excerpt(text.strip())}")
        return value


def _big(n: float) -> str:
    """2**31 - 1 as ``2,147,483,647``."""
    return f"{int(n):,}" if float(n).is_integer() else f"{n:g}"


def count(minimum: int = 1, maximum: int = MAX_SIZE, why: str = "counted in 32-bit integers") -> Number:
    """An integer flag: at least ``minimum``, at most ``maximum`` (every count perfcast takes, rows
    of a table included, fits the 32-bit integers sizes are counted in)."""
    return Number(integer=True, minimum=minimum, maximum=maximum, why=why)


def tokens(minimum: int = 1) -> Number:
    return count(minimum, MAX_TOKENS, "tokens are counted in 32-bit integers")


def sequences() -> Number:
    return count(1, MAX_SEQUENCES, "2**24 sequences")


def devices() -> Number:
    return count(1, MAX_DEVICES, "2**20 devices")


def pixels() -> Number:
    return count(1, MAX_PIXELS, "the largest image side a JPEG states")


def images() -> Number:
    return count(1, MAX_IMAGES, "2**16 images")


POSITIVE = Number(positive=True)
NON_NEGATIVE = Number(minimum=0)
BYTES = Number(positive=True, maximum=MAX_BYTES, why="2**64 bytes")


def number(text: str, flag: str, sym: str) -> int | float:
    """A finite number (``nan``, ``inf`` and values past the float range, ``1e400``, are errors)."""
    try:
        value = _parse(text)
    except ValueError:
        raise UserError(f"{flag} {sym}={text}: {excerpt(text)} is not a number") from None
    if not math.isfinite(value):
        raise UserError(f"{flag} {sym}={text}: {excerpt(text)} is not a finite number")
    return value


def assignment(text: str, flag: str) -> tuple[str, int | float]:
    sym, sep, value = text.partition("=")
    if not sep or not sym or not value:
        raise UserError(f"{flag} {excerpt(text)}: expected SYMBOL=VALUE")
    return sym.strip(), number(value.strip(), flag, sym.strip())


def sweep(text: str, flag: str) -> tuple[str, list[int | float]]:
    sym, sep, values = text.partition("=")
    if not sep or not sym or not values:
        raise UserError(f"{flag} {excerpt(text)}: expected SYMBOL=v1,v2,...")
    return sym.strip(), [number(v.strip(), flag, sym.strip()) for v in values.split(",")]


def design_value(flag: str, sym: str, value: int | float, *, size: bool) -> int | float:
    """A ``--set``/``--sweep`` value of a kernel symbol: a DSL size is a positive integer at most
    MAX_SIZE; a hardware parameter (``--symbolic-hw``) a positive number within the bounds of a
    device file's figures."""
    if value <= 0:
        raise UserError(f"{flag} {sym}={value:g}: {sym} is {'a size' if size else 'a hardware rate'}; "
                        f"expected a positive {'integer' if size else 'number'}")
    if not size:
        from perfcast.hardware.spec import MAX_FIGURE, MIN_FIGURE

        if not MIN_FIGURE <= value <= MAX_FIGURE:  # the bounds of every figure in a device file
            raise UserError(f"{flag} {sym}={value:g}: {sym} is a hardware rate; expected a number from "
                            f"{MIN_FIGURE:g} to {MAX_FIGURE:g}, as in a device file")
        return value
    if not float(value).is_integer():
        raise UserError(f"{flag} {sym}={value:g}: {sym} is a size; expected a positive integer")
    if value > MAX_SIZE:
        raise UserError(f"{flag} {sym}={value:g}: {sym} is a size; expected at most {MAX_SIZE:,} "
                        f"(extents are indexed with 32-bit integers)")
    return int(value)


# --- Figures and the page ----------------------------------------------------------------------------

#: the namespace attribute that holds the command line (after ``perfcast``), for the page's inputs
ARGV = "_argv"


def add_report_arguments(p) -> None:
    p.add_argument("--plot", metavar="DIR",
                   help="write the run's figures to DIR (created) as PNG and SVG (docs/design/plots.md)")
    p.add_argument("--html", metavar="FILE",
                   help="write the run as one self-contained HTML page: inputs, headline, figures, sortable tables, "
                        "provenance, missing data, notes and the JSON document (docs/design/report.md)")


def report_paths(args) -> None:
    """``--plot DIR`` made and ``--html FILE``'s directory checked before the run, so that a
    place that cannot be written is refused before any work is done."""
    import os
    from pathlib import Path

    if args.plot:
        path = Path(args.plot)
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise UserError(f"--plot {args.plot}: cannot create the directory ({e.strerror})") from None
        if not os.access(path, os.W_OK | os.X_OK):
            raise UserError(f"--plot {args.plot}: cannot write in the directory (permission denied)")
    if args.html:
        path = Path(args.html)
        parent = path.parent
        if path.is_dir():
            raise UserError(f"--html {args.html}: is a directory; give a file name")
        if not parent.is_dir():
            why = "not a directory" if parent.exists() else "no such directory"
            raise UserError(f"--html {args.html}: cannot write ({parent}: {why})")
        if not os.access(parent, os.W_OK | os.X_OK) or (path.exists() and not os.access(path, os.W_OK)):
            raise UserError(f"--html {args.html}: cannot write (permission denied)")


def report_files(args, doc: dict, make, *objs) -> list[str]:
    """``--plot DIR`` and ``--html FILE``: the figures ``make(*objs)`` draws
    (:mod:`perfcast.report.plots`, drawn once for both) written to DIR, and the page of the run —
    its JSON document ``doc`` and those figures (:mod:`perfcast.report.html`) — written to FILE;
    each figure the run cannot draw named on stderr with why. Returns the lines that name the
    files, to print after the report (none under ``--json``: stdout holds the document only)."""
    from pathlib import Path

    from perfcast.report import plots

    figures = make(*objs)
    paths = []
    if args.plot:
        paths, _ = written("--plot", args.plot, plots.write, figures, args.plot)
    flag = "--plot" if args.plot else "--html"
    for s in (f for f in figures.values() if isinstance(f, plots.Skipped)):
        sys.stderr.write(f"perfcast {args.command}: note: {flag}: no {s.name} figure: {s.why}\n")
    if args.html:
        from perfcast.report.document import versioned
        from perfcast.report.html import page

        text = page(args.command, versioned(doc), figures, vars(args).get(ARGV))
        written("--html", args.html, Path(args.html).write_text, text, "utf-8")
        paths.append(Path(args.html))
    return [] if getattr(args, "json", False) else [f"wrote {p}" for p in paths]


def add_moe_routing(p) -> None:
    """``--moe-routing``: how the step's routed tokens spread over the experts (perfcast.ir.routing)."""
    p.add_argument("--moe-routing", choices=routing.ROUTINGS, default=routing.DEFAULT,
                   help="MoE models: how routed tokens spread over the experts — random (default: each token's "
                        "top-k drawn uniformly and independently, E·(1 − (1 − k/E)^T) experts' weights read) or "
                        "balanced (as widely as possible, min(E, T·k): the measured MoE tables' balanced rows)")


def engine_options(texts) -> tuple[tuple[str, str], ...]:
    """``NAME=VALUE`` texts (``--engine-option``, repeatable) as sorted pairs, one per name."""
    out: dict[str, str] = {}
    for text in texts or ():
        key, sep, value = str(text).partition("=")
        if not sep or not key.strip() or not value.strip():
            raise UserError(f"--engine-option {text!r}: expected NAME=VALUE (e.g. moe_backend=TRTLLM)")
        if key.strip() in out:
            raise UserError(f"--engine-option {key.strip()}: given twice")
        out[key.strip()] = value.strip()
    return tuple(sorted(out.items()))
