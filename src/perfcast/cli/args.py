"""Argument parsing helpers: one-line errors, ``SYM=VALUE`` and ``SYM=v1,v2`` values."""

from __future__ import annotations

import argparse
import math
import sys

from perfcast.ir import UserError


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors (no usage dump) and exit code 2."""

    def error(self, message: str):  # noqa: D102  (argparse API)
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        raise SystemExit(2)


def number(text: str, flag: str, sym: str) -> int | float:
    """A finite number (``nan``, ``inf`` and values past the float range, ``1e400``, are errors)."""
    try:
        return int(text)
    except ValueError:
        pass
    try:
        value = float(text)
    except ValueError:
        raise UserError(f"{flag} {sym}={text}: {text!r} is not a number") from None
    if not math.isfinite(value):
        raise UserError(f"{flag} {sym}={text}: {text!r} is not a finite number")
    return value


def bounded(text: str, flag: str, sym: str, *, positive: bool) -> int | float:
    """A finite number that is positive (``positive``) or at least zero."""
    value = number(text, flag, sym)
    if value < 0 or (positive and value == 0):
        raise UserError(f"{flag} {text}: expected a {'positive' if positive else 'non-negative'} number")
    return value


def assignment(text: str, flag: str) -> tuple[str, int | float]:
    sym, sep, value = text.partition("=")
    if not sep or not sym or not value:
        raise UserError(f"{flag} {text!r}: expected SYMBOL=VALUE")
    return sym.strip(), number(value.strip(), flag, sym)


def sweep(text: str, flag: str) -> tuple[str, list[int | float]]:
    sym, sep, values = text.partition("=")
    if not sep or not sym or not values:
        raise UserError(f"{flag} {text!r}: expected SYMBOL=v1,v2,...")
    return sym.strip(), [number(v.strip(), flag, sym) for v in values.split(",")]
