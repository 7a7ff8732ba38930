"""Numbers as they enter: finite, of the right kind, in range, or one line naming them."""

from __future__ import annotations

import math
import numbers

from perfcast.ir.errors import UserError


def checked_number(value: object, name: str, *, integer: bool = False, minimum: float | None = None,
                   positive: bool = False, maximum: float | None = None) -> int | float:
    """``value`` if it is a finite number (an ``int`` when ``integer``) within the bounds; else a
    :class:`UserError` naming ``name`` (a flag, ``file: key 'a.b'``, a CSV column) and what was
    expected. Booleans are not numbers here (YAML's ``yes`` is not 1)."""
    kind = "an integer" if integer else "a number"
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise UserError(f"{name}: expected {kind}, got {_short(value)}")
    if isinstance(value, float) and not math.isfinite(value):
        raise UserError(f"{name}: expected a finite number, got {value!r}")
    if integer and not isinstance(value, numbers.Integral):
        if not float(value).is_integer():
            raise UserError(f"{name}: expected an integer, got {value!r}")
        value = int(value)
    if positive and value <= 0:
        raise UserError(f"{name}: expected a positive number, got {value!r}")
    if minimum is not None and value < minimum:
        raise UserError(f"{name}: expected at least {minimum:g}, got {value!r}")
    if maximum is not None and value > maximum:
        raise UserError(f"{name}: expected at most {maximum:g}, got {value!r}")
    return value


def _short(value: object) -> str:
    from perfcast.inputs.text import excerpt

    return excerpt(value)
