"""A step model's attention rows, and the rows a process computed kept beside its step-cache entry.

:class:`~perfcast.serving.step.StepModel` prices attention from rows on the 16-token context grid
(:data:`~perfcast.serving.step_grid.GRID`), each grown lazily: a row of ``n`` points is one call of
the compiled attention part on ``0, 16, …, 16 (n − 1)``, at 64 points first and doubling (or as
far as a context needs). Those first evaluations are a large share of a new process's screening,
so the rows a process computed are kept on disk (:mod:`perfcast.serving.step_cache`'s format,
a ``.rows`` entry beside the step model's, with the step model's whole key): a row by its key
*and its length* — the part, the batch (and prefill chunk), ``n`` — the very call it stands for.
A later process takes a kept row only where it would make that call itself, so a row it reads is
the row it would have computed, bit for bit.

The rows computed in forked workers (:func:`perfcast.serving.forked.forked_map`) are sent back to
the parent (:func:`harvest`, :func:`adopt`), which writes every entry with rows it did not read
(:func:`flush`, at the end of a search). An entry holds at most :data:`MAX_FLOATS` values: past
that, only the rows the writing process read or computed are kept.
"""

from __future__ import annotations

import json
import weakref

import numpy as np

from perfcast.capture.cache import Unreadable
from perfcast.serving import step_cache
from perfcast.serving.step_grid import GRID, on_row

#: The most row values one entry keeps (8 bytes each, before compression).
MAX_FLOATS = 2_000_000

#: This process's rows by their entry's path, as long as their step model lives; and the rows
#: forked workers sent back for entries of step models this process does not hold, until written.
_LIVE: weakref.WeakValueDictionary[str, Rows] = weakref.WeakValueDictionary()
_ADOPTED: dict[str, Rows] = {}


class Rows:
    """One step model's rows: ``live`` (the grown rows, by part key), the kept rows read from the
    cache (by part key and length), the ones this process computed (``new``) or read (``used``)."""

    def __init__(self, entry_key: dict | None):
        self.entry_key = entry_key   # the step model's cache key; None: rows neither read nor kept
        self.live: dict[tuple, list[float]] = {}
        self.new: dict[tuple, list[float]] = {}
        self.used: set[tuple] = set()
        self.grown = 0   # rows grown in ``live`` so far (a worker's screening says which it grew)
        self._kept: dict[tuple, list[float]] | None = None
        if entry_key is not None:
            _LIVE[_path(entry_key)] = self

    @property
    def kept(self) -> dict[tuple, list[float]]:
        if self._kept is None:
            self._kept = load(self.entry_key) if self.entry_key is not None else {}
        return self._kept

    def at(self, key: tuple, context: float, fn, *args) -> float:
        """Row ``key`` at ``context``, linear between grid points; the row is ``fn(*args, grid)`` on
        the grid, grown to reach ``context`` (to twice its length, at least 64 points)."""
        row = self.live.get(key)
        if row is None or len(row) < context // GRID + 2:
            row = self._grow(key, row, int(context // GRID) + 2, fn, args)
        return on_row(row, context)

    def _grow(self, key: tuple, live: list[float] | None, need: int, fn, args: tuple) -> list[float]:
        """Row ``key`` (now ``live``, None before its first use) grown to at least ``need`` points: the
        kept row of its new length if there is one, else ``fn(*args, grid)``; it becomes the live row."""
        n = max(need, 2 * len(live) if live else 64)
        sized = (*key, n)
        row = self.kept.get(sized)
        if row is None:
            grid = np.arange(n, dtype=float) * GRID
            values = fn(*args, grid)
            row = (values if np.shape(values) == grid.shape else np.broadcast_to(values, grid.shape)).tolist()
            if all(type(k) is int for k in key):
                self.new[sized] = row
        else:
            self.used.add(sized)
        self.live[key] = row
        self.grown += 1
        return row


def harvest() -> dict[str, tuple[dict, dict]]:
    """The rows this process computed, by entry path (a forked worker's, sent to its parent),
    taken out of this process's records."""
    out = {}
    for path, rows in _LIVE.items():
        if rows.new:
            out[path] = (rows.entry_key, rows.new)
            rows.new = {}
    return out


def adopt(harvested: dict[str, tuple[dict, dict]]) -> None:
    """Rows a worker computed, to be kept with this process's at :func:`flush`."""
    for path, (key, new) in harvested.items():
        rows = _LIVE.get(path) or _ADOPTED.get(path)
        if rows is None:
            rows = _ADOPTED[path] = Rows(key)
        rows.new.update(new)


def flush() -> None:
    """Write every entry that gained rows: the kept ones and the new (only the ones this process
    read or computed, past :data:`MAX_FLOATS`)."""
    for rows in [*_LIVE.values(), *_ADOPTED.values()]:
        if not rows.new:
            continue
        merged = {**rows.kept, **rows.new}
        if sum(k[-1] for k in merged) > MAX_FLOATS:
            merged = {**{k: rows.kept[k] for k in rows.used}, **rows.new}
        store(rows.entry_key, merged)
        rows.kept.update(rows.new)
        rows.new = {}
    _ADOPTED.clear()


def load(entry_key: dict) -> dict[tuple, list[float]]:
    """The rows kept for the step model of ``entry_key``; none where there is no such entry or it
    cannot be read (debug note)."""
    rows = step_cache.read(_rows_key(entry_key), "rows", decode)
    return {} if rows is None else rows


def store(entry_key: dict, rows: dict[tuple, list[float]]) -> None:
    """Keep ``rows`` for the step model of ``entry_key`` (an unwritable cache only costs speed)."""
    step_cache.write(_rows_key(entry_key), "rows", rows, encode)


def _rows_key(entry_key: dict) -> dict:
    """The key of the rows entry kept beside the step model's entry ``entry_key``."""
    return {**entry_key, "kind": entry_key["kind"] + ".rows"}


def encode(rows: dict[tuple, list[float]]) -> dict:
    """``{"keys": [[*key, n], …], "data": <base64 doubles, the rows one after another>}``."""
    keys = list(rows)
    return {"keys": [list(k) for k in keys], "data": step_cache.packed([x for k in keys for x in rows[k]])}


def decode(doc: dict) -> dict[tuple, list[float]]:
    """The inverse of :func:`encode`; :class:`~perfcast.capture.cache.Unreadable` unless every key
    is integers ending in a positive length and the lengths add up to the data."""
    keys = doc["keys"]
    if type(keys) is not list or not all(type(k) is list and len(k) in (4, 5) and all(type(x) is int for x in k)
                                         and k[-1] > 0 for k in keys):
        raise Unreadable("row keys that are not lists of integers ending in a length")
    values = step_cache.unpacked(doc["data"], sum(k[-1] for k in keys))
    out, at = {}, 0
    for k in keys:
        out[tuple(k)] = values[at:at + k[-1]]
        at += k[-1]
    return out


def _path(key: dict) -> str:
    return json.dumps(key, sort_keys=True)
