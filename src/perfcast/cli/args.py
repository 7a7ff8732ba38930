"""Argument parsing helpers: one-line errors, ``SYM=VALUE`` and ``SYM=v1,v2`` values."""

from __future__ import annotations

import argparse
import sys

from perfcast.ir import UserError


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors (no usage dump) and exit code 2."""

    def error(self, message: str):  # noqa: D102  (argparse API)
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        raise SystemExit(2)


def number(text: str, flag: str, sym: str) -> int | float:
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        raise UserError(f"{flag} {sym}={text}: {text!r} is not a number") from None


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
