"""Reading a JSON file a user names (a config.json, a preprocessor or quantization config):
strict where Python's ``json`` is lenient.

Python's parser accepts what no JSON producer writes and what perfcast must not take in: the
non-standard constants ``NaN``, ``Infinity`` and ``-Infinity`` (RFC 8259 §6 has no such numbers),
numbers beyond a double (``1e400`` becomes infinity), integers of thousands of digits, a key
given twice in one object (RFC 8259 §4: names SHOULD be unique; Python keeps the last silently),
and nesting deep enough to exhaust the interpreter's stack. Each is one line naming the file.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from perfcast.inputs.text import MAX_TEXT_BYTES, excerpt, read_text
from perfcast.ir.errors import UserError

#: Deepest nesting of objects and arrays perfcast reads. A Hugging Face config nests four levels
#: (``quantization_config.config_groups.group_0.weights``); deeper is not a config.
MAX_JSON_DEPTH = 32
#: Digits of the longest integer literal perfcast reads (2⁶⁴ has 20; beyond Python refuses
#: 4,300 digits with an error of its own).
MAX_INT_DIGITS = 40


def read_json(path: Path | str, *, limit_bytes: int = MAX_TEXT_BYTES, max_depth: int = MAX_JSON_DEPTH):
    """The JSON document of ``path`` (UTF-8, bounded: :func:`perfcast.inputs.read_text`); what
    is not strict JSON is a :class:`UserError` naming the file."""
    return parse_json(read_text(path, limit_bytes=limit_bytes), str(path), max_depth=max_depth)


def parse_json(text: str, where: str, *, max_depth: int = MAX_JSON_DEPTH):
    """``text`` parsed as strict JSON; ``where`` names it in errors."""

    def constant(name: str):
        raise UserError(f"{where}: {name} is not a JSON number (expected a finite number)")

    def floating(s: str) -> float:
        value = float(s)
        if not math.isfinite(value):
            raise UserError(f"{where}: the number {excerpt(s)} is beyond a double (expected a finite number)")
        return value

    def integer(s: str) -> int:
        if len(s.lstrip("-")) > MAX_INT_DIGITS:
            raise UserError(f"{where}: an integer of {len(s.lstrip('-')):,} digits (expected at most "
                            f"{MAX_INT_DIGITS})")
        return int(s)

    def unique(pairs: list) -> dict:
        out = {}
        for k, v in pairs:
            if k in out:
                raise UserError(f"{where}: key {excerpt(k)} appears twice in one object (expected unique keys)")
            out[k] = v
        return out

    try:
        doc = json.loads(text, parse_constant=constant, parse_float=floating, parse_int=integer,
                         object_pairs_hook=unique)
    except json.JSONDecodeError as e:
        raise UserError(f"{where}: not valid JSON at line {e.lineno} column {e.colno}: {e.msg}") from None
    except RecursionError:
        raise UserError(f"{where}: nested too deeply (expected at most {max_depth} levels)") from None
    depth = nesting(doc)
    if depth > max_depth:
        raise UserError(f"{where}: nested {depth} levels deep (expected at most {max_depth})")
    return doc


def nesting(doc) -> int:
    """How deeply objects and arrays nest in ``doc`` (a scalar is 0), without recursion."""
    deepest, stack = 0, [(doc, 1)]
    while stack:
        node, depth = stack.pop()
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else None
        if children is None:
            continue
        deepest = max(deepest, depth)
        stack.extend((c, depth + 1) for c in children if isinstance(c, (dict, list)))
    return deepest
