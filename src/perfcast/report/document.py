"""The output contract (docs/design/output.md): every JSON document perfcast prints or writes
goes through :func:`emit`, :func:`emit_lines`, :func:`write` or :func:`write_trace`, which

- put ``schema_version`` and ``perfcast_version`` first (a Chrome trace: in its ``otherData``),
- check the report boundary — only JSON values, every number finite, and none negative unless
  its key is signed by meaning (:data:`SIGNED`) — before a byte is written, and
- dump with ``allow_nan=False``, so no ``NaN`` or ``Infinity`` can reach a reader.

A document that fails the check is a bug in perfcast (the input was accepted), not a user
error: it raises :class:`ReportBoundaryError` (an ``AssertionError``) naming the offending key's
path, and the command prints one ``internal error`` line and exits 70 instead of a wrong number.
The terminal reports are checked the same way (:func:`check`) on the document they are drawn
from.

Every number a report holds is a time, a size, a memory figure, a rate, a count, a share or a
design-point value, so the check is closed by default: a negative number is refused wherever it
stands, and only the keys in :data:`SIGNED` may hold one.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Iterable

import perfcast

#: The version of the documents' layout; see docs/design/output.md for when it changes.
SCHEMA_VERSION = 1

#: Keys whose numbers are signed by meaning: the signed median of relative errors
#: (predicted − measured) / measured in ``perfcast validate`` (> 0: perfcast predicts slower), and
#: the median rank correlation of its decisions (−1 … 1).
SIGNED = frozenset({"signed_median", "median_rho"})
#: Keys whose every number is signed by meaning: derivatives and elasticities (``perfcast
#: sensitivity``: a time falls as a bandwidth grows).
SIGNED_SECTIONS = frozenset({"elasticity", "derivative"})

#: Problems listed in one error, at most (the first is the one to fix).
_MOST = 3


class ReportBoundaryError(AssertionError):
    """A document about to be printed or written holds a non-JSON value, a NaN, an infinity or
    a negative figure: perfcast computed something wrong."""


def metadata() -> dict:
    """The fields every document carries, first."""
    return {"schema_version": SCHEMA_VERSION, "perfcast_version": perfcast.__version__}


def versioned(body: dict) -> dict:
    clash = metadata().keys() & body.keys()
    if clash:
        raise ReportBoundaryError(f"report boundary: the document already holds {', '.join(sorted(clash))}")
    return {**metadata(), **body}


def problems(doc, path: str = "$", key: str | None = None) -> list[str]:
    """Where ``doc`` breaks the boundary, as ``$.a.b[2].c = value: why`` lines; ``key`` is the
    dict key the value stands under (a list's items stand under their list's key)."""
    if doc is None or isinstance(doc, (str, bool)):
        return []
    if isinstance(doc, (int, float)):
        if isinstance(doc, float) and not math.isfinite(doc):
            return [f"{path} = {doc}: not a finite number"]
        if doc < 0 and key not in SIGNED:
            return [f"{path} = {doc}: negative (a time, size, memory, rate, count or share)"]
        return []
    if isinstance(doc, dict):
        out = []
        for k, v in doc.items():
            if not isinstance(k, str):
                out.append(f"{path}: key {k!r} is not a string")
            if k in SIGNED_SECTIONS and isinstance(v, dict):  # signed numbers, still finite
                out += [f"{path}.{k}.{kk} = {vv}: not a finite number" for kk, vv in v.items()
                        if isinstance(vv, float) and not math.isfinite(vv)]
                continue
            out += problems(v, f"{path}.{k}", str(k))
        return out
    if isinstance(doc, (list, tuple)):
        return [p for i, v in enumerate(doc) for p in problems(v, f"{path}[{i}]", key)]
    return [f"{path}: {type(doc).__name__} is not a JSON value"]


def check(doc):
    """``doc`` unchanged, or :class:`ReportBoundaryError` with the first problems' paths."""
    found = problems(doc)
    if found:
        more = f" (and {len(found) - _MOST} more)" if len(found) > _MOST else ""
        raise ReportBoundaryError("report boundary: " + "; ".join(found[:_MOST]) + more)
    return doc


def dumps(doc, indent: int | None = 2) -> str:
    """``doc`` as JSON after :func:`check` (no ``NaN``/``Infinity`` tokens: ``allow_nan=False``)."""
    return json.dumps(check(doc), indent=indent, allow_nan=False)


def emit(body: dict, stream=None) -> int:
    """Print ``body`` with the version fields; 0, the command's exit code."""
    text = dumps(versioned(body))
    (stream or sys.stdout).write(text + "\n")
    return 0


def emit_lines(bodies: Iterable[dict], stream=None) -> int:
    """JSON lines: each body on a line of its own with the version fields; all are checked
    before the first is printed."""
    lines = [dumps(versioned(b), indent=None) for b in bodies]
    (stream or sys.stdout).write("".join(line + "\n" for line in lines))
    return 0


def write(body: dict | list, path: str, key: str | None = None, indent: int | None = 2) -> None:
    """Write ``body`` with the version fields to ``path`` (a list under ``key``); nothing is
    written when the check fails. ``OSError`` is the caller's to report."""
    text = dumps(versioned(body if key is None else {key: body}), indent)
    with open(path, "w") as f:
        f.write(text + "\n")


def write_trace(events: list[dict], path: str, time_unit: str) -> None:
    """A Trace Event Format file (Perfetto, chrome://tracing): the version fields go in its
    ``otherData`` object, the format's place for metadata, so the file stays a valid trace."""
    text = dumps({"traceEvents": events, "displayTimeUnit": time_unit, "otherData": metadata()}, indent=None)
    with open(path, "w") as f:
        f.write(text)


def schema_names() -> list[str]:
    """The documents with a shipped JSON Schema (``perfcast schema`` lists them)."""
    return sorted(p.name.removesuffix(".schema.json") for p in _schemas().iterdir()
                  if p.name.endswith(".schema.json"))


def schema_text(name: str) -> str:
    """The JSON Schema of the document ``name`` (see :func:`schema_names`), as shipped."""
    return (_schemas() / f"{name}.schema.json").read_text(encoding="utf-8")


def _schemas():
    from importlib.resources import files

    return files("perfcast.report") / "schemas"
