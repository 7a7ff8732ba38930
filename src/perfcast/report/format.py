"""Number formatting shared by the terminal reports."""

from __future__ import annotations

_SI = ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))


def si(x: float, unit: str = "") -> str:
    """``2.7e11, "FLOP"`` → ``"274.9 GFLOP"``."""
    for scale, prefix in _SI:
        if abs(x) >= scale:
            return f"{x / scale:.4g} {prefix}{unit}"
    return f"{x:.4g} {unit}".rstrip()


def seconds(t: float) -> str:
    for scale, unit in ((1, "s"), (1e-3, "ms"), (1e-6, "µs")):
        if t >= scale:
            return f"{t / scale:.4g} {unit}"
    return f"{t / 1e-9:.4g} ns"


def percent(x: float) -> str:
    return f"{100 * x:.1f}%"


def integer(x: float) -> str:
    return f"{int(x):,}" if float(x).is_integer() else f"{x:.6g}"
