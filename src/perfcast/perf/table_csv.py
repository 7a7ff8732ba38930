"""Reading one kernel table (``.csv`` or ``.csv.gz``) and every problem in it.

A table is UTF-8 text: a header naming its columns, then one measurement per line with as many
cells as the header — the key columns and ``latency_us``. Key columns hold names
(:data:`~perfcast.perf.database_files.TEXT_COLUMNS`: ``shape`` like ``1024x4096``, ``dtype``,
``kv_dtype``, ``routing``) or non-negative finite numbers (positive on an axis interpolated in
``log``); ``latency_us`` is a positive finite number of microseconds, at most
:data:`MAX_LATENCY_US`. No key appears twice. Each problem is one line naming the file, the
first line (of the decompressed text) that has it, the column, the value (an excerpt) and how
many rows share it — a binary or non-UTF-8 file, a row with more or fewer cells than the header,
a blank or repeated column name, a header-only table, a missing column, a non-numeric,
infinite, NaN or negative number, a repeated key.

The shipped tables hold up to ~450,000 rows a database, so the checks are vectorized: line
structure from the byte offsets of newlines and commas (NumPy; Python's ``csv`` module only
for a file that quotes cells), one pandas parse of the needed columns, column checks as array
masks.
"""

from __future__ import annotations

import gzip
import io
import zlib
from pathlib import Path

import numpy as np

from perfcast.inputs import excerpt
from perfcast.perf.database_files import STATISTICS, TEXT_COLUMNS
from perfcast.perf.tables import KernelTable

#: The most bytes a table may hold once decompressed (the largest shipped table is ~10 MB): a
#: bigger one, such as a small ``.csv.gz`` that inflates to gigabytes, is refused before it fills
#: memory.
MAX_TABLE_BYTES = 256 * 1024 * 1024
#: No kernel takes more than this many microseconds (1,000 s); a larger latency is a unit mistake.
MAX_LATENCY_US = 1e9


def read_table(path: Path, name: str, keys: list[str] | None, axes=(), transform=None) \
        -> tuple[KernelTable | None, list[str]]:
    """The table at ``path`` keyed on ``keys`` (None: every column but the statistics, with
    ``bytes`` the axis — a collective table), and its problems; the table is None when there
    is any."""
    import pandas as pd

    data, problems = _read(path)
    if problems:
        return None, problems
    header, lines, problems = _structure(path, data)
    if problems:
        return None, problems
    if keys is None:
        keys = [c for c in header if c not in STATISTICS]
        if not keys:
            return None, [f"{path}: no key columns, only {', '.join(header)} (expected e.g. devices, dtype, "
                          f"bytes, latency_us)"]
        axes = ["bytes"] if "bytes" in keys else []
    wanted = [*keys, "latency_us"]
    problems = [f"{path}: missing column {c!r} (expected {', '.join(keys)}, latency_us)" for c in wanted if c not in header]
    if not len(lines):
        return None, [*problems, f"{path}: no rows, only the header (expected one measurement per line)"]
    present = [c for c in wanted if c in header]
    try:
        # only an empty cell is missing: a cell reading "nan" or "NA" is kept as written, so an
        # error quotes it (and a numeric check refuses it)
        df = pd.read_csv(io.BytesIO(data), usecols=present, dtype={c: str for c in present if c in TEXT_COLUMNS},
                         keep_default_na=False, na_values=[""], low_memory=False)
    except (ValueError, pd.errors.ParserError) as e:  # the structure checks should leave none
        return None, [f"{path}: cannot read as CSV ({excerpt(str(e), 120)})"]
    transform = transform or {}
    if "latency_us" in df.columns:
        latency = _numbers(df["latency_us"])
        bad = ~(np.isfinite(latency) & (latency > 0) & (latency <= MAX_LATENCY_US))
        problems += _bad(path, lines, df, "latency_us", bad,
                         f"a positive number of microseconds up to {MAX_LATENCY_US:g}")
    columns = []
    for c in (k for k in keys if k in df.columns):
        if c in TEXT_COLUMNS:
            text = df[c]
            bad = text.isna().to_numpy() | (text.str.strip() == "").to_numpy()
            if c == "shape":
                bad |= ~text.str.fullmatch(r"\d+(?:x\d+)*").fillna(False).to_numpy(dtype=bool)
            problems += _bad(path, lines, df, c, bad, "a shape like 1024x4096" if c == "shape" else "a name")
            columns.append(text.tolist())
        else:
            v = _numbers(df[c])
            log = transform.get(c) == "log"
            problems += _bad(path, lines, df, c, ~(np.isfinite(v) & (v > 0 if log else v >= 0)),
                             "a positive number (the axis is interpolated in log)" if log else "a non-negative number")
            columns.append(df[c].tolist() if df[c].dtype.kind in "iu" else _keys(v))
    if problems:
        return None, problems
    key_rows = list(zip(*columns))
    rows = dict(zip(key_rows, latency.tolist()))
    if len(rows) != len(key_rows):
        return None, [_repeated(path, lines, keys, key_rows)]
    try:
        return KernelTable(name, tuple(keys), tuple(axes), rows, dict(transform), str(path)), []
    except ValueError as e:
        return None, [f"{path}: {e}"]


def _read(path: Path) -> tuple[bytes, list[str]]:
    """The decompressed bytes, checked to be UTF-8 text."""
    gz = path.name.endswith(".gz")
    if not path.is_file():
        return b"", [f"{path}: not a regular file" if path.exists() else f"{path}: missing"]
    try:
        with (gzip.open if gz else open)(path, "rb") as f:
            data = f.read(MAX_TABLE_BYTES + 1)
    except (OSError, EOFError, zlib.error) as e:  # gzip.BadGzipFile is an OSError
        return b"", [f"{path}: cannot read{' as gzip' if gz else ''} ({excerpt(str(e), 80)})"]
    if len(data) > MAX_TABLE_BYTES:
        return b"", [f"{path}: more than {MAX_TABLE_BYTES:,} bytes{' once decompressed' if gz else ''}; "
                     f"a kernel table is far smaller"]
    nul = data.find(b"\0")
    if nul >= 0:
        return b"", [f"{path}: line {_line_of(data, nul)}: a binary file (NUL byte at offset {nul:,}); "
                     f"expected CSV text"]
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as e:
        return b"", [f"{path}: line {_line_of(data, e.start)}: not UTF-8 text "
                     f"(byte 0x{data[e.start]:02x} at offset {e.start:,})"]
    return data.removeprefix(b"\xef\xbb\xbf"), []


def _structure(path: Path, data: bytes) -> tuple[list[str], np.ndarray, list[str]]:
    """The header, the line number of each data row (blank lines skipped, as pandas does), and
    the problems of the layout: no header, a blank or repeated column name, a row with more or
    fewer cells than the header, a carriage return inside a line."""
    try:
        lines, header, cells = _quoted(data) if b'"' in data else _plain(data)
    except ValueError as e:
        return [], np.empty(0, int), [f"{path}: {e}"]
    if not len(lines):
        return [], lines, [f"{path}: empty; expected a header line (the key columns and latency_us) and rows"]
    problems = []
    if any(not c.strip() for c in header):
        problems.append(f"{path}: line {lines[0]}: a column without a name (header {excerpt(','.join(header), 80)})")
    repeated = sorted({c for c in header if header.count(c) > 1})
    if repeated:
        problems.append(f"{path}: line {lines[0]}: column {excerpt(repeated[0])} is named twice")
    rows, cells = lines[1:], cells[1:]
    for wrong, word in ((cells > len(header), "more"), (cells < len(header), "fewer")):
        if wrong.any():
            first, n = int(np.argmax(wrong)), int(wrong.sum())
            problems.append(f"{path}: line {rows[first]}: {int(cells[first])} cells, {word} than the header's "
                            f"{len(header)}" + (f" ({n:,} rows)" if n > 1 else ""))
    return header, rows, problems


def _line_of(data: bytes, offset: int) -> int:
    return data.count(NEWLINE, 0, offset) + 1


NEWLINE = b"\n"


def _plain(data: bytes) -> tuple[np.ndarray, list[str], np.ndarray]:
    """The numbers of the non-blank lines (the header's first), the header, and each line's
    cell count, from the byte offsets of newlines and commas (a file without quotes)."""
    arr = np.frombuffer(data, dtype=np.uint8)
    if not len(arr):
        return np.empty(0, int), [], np.empty(0, int)
    nl = np.flatnonzero(arr == 10)
    starts = np.concatenate(([0], nl + 1))
    ends = np.concatenate((nl, [len(arr)]))
    cr = (ends > starts) & (arr[np.maximum(ends - 1, 0)] == 13)
    ends = ends - cr
    returns = np.flatnonzero(arr == 13)
    if len(returns) != int(cr.sum()):
        at = int(np.setdiff1d(returns, ends)[0])
        raise ValueError(f"line {_line_of(data, at)}: a carriage return inside the line (expected \\n or \\r\\n "
                         f"line endings)")
    # commas per line: each segment [start, next start) holds one line and its newline
    last = len(starts) - (starts[-1] == len(arr))
    cells = np.zeros(len(starts), dtype=np.int64)
    if last:
        cells[:last] = np.add.reduceat((arr == 44).view(np.uint8), starts[:last], dtype=np.int32)
    cells += 1
    keep = ends > starts
    lines = np.flatnonzero(keep) + 1
    if not len(lines):
        return lines, [], cells[:0]
    h = lines[0] - 1
    return lines, data[starts[h]:ends[h]].decode("utf-8").split(","), cells[keep]


def _quoted(data: bytes) -> tuple[np.ndarray, list[str], np.ndarray]:
    """As :func:`_plain` for a file that quotes cells (a quoted cell may hold commas and
    newlines), with Python's csv reader."""
    import csv

    lines, cells, header = [], [], []
    reader = csv.reader(io.StringIO(data.decode("utf-8"), newline=""))
    last = 0
    try:
        for record in reader:
            start, last = last + 1, reader.line_num
            if not record:
                continue
            if not lines:
                header = record
            lines.append(start)
            cells.append(len(record))
    except csv.Error as e:  # an unterminated quote, a cell past the csv module's limit
        raise ValueError(f"line {reader.line_num}: {excerpt(str(e), 80)}") from None
    return np.array(lines, dtype=int), header, np.array(cells, dtype=int)


def _numbers(series) -> np.ndarray:
    """A column as floats; NaN where a cell is empty or not a number."""
    import pandas as pd

    if series.dtype.kind in "iuf":
        return series.to_numpy(dtype=float)
    if series.dtype.kind == "b":  # True / False: not a size
        return np.full(len(series), np.nan)
    return pd.to_numeric(series, errors="coerce").to_numpy(dtype=float)


def _keys(v: np.ndarray) -> list:
    """A numeric key column as Python values: whole numbers as ints, so a key built from a
    leaf's integer features matches and prints as one."""
    if len(v) and np.all(v == np.floor(v)) and np.abs(v).max() < 2**53:
        return v.astype(np.int64).tolist()
    return v.tolist()


def _bad(path: Path, lines: np.ndarray, df, column: str, bad: np.ndarray, expected: str) -> list[str]:
    if not bad.any():
        return []
    first, n = int(np.argmax(bad)), int(bad.sum())
    raw = df[column].iloc[first]
    shown = "an empty cell" if raw is None or raw != raw else excerpt(str(raw))
    return [f"{path}: line {lines[first]}: column {column!r}: expected {expected}, got {shown}"
            + (f" ({n:,} rows)" if n > 1 else "")]


def _repeated(path: Path, lines: np.ndarray, keys: list[str], key_rows: list[tuple]) -> str:
    seen: dict[tuple, int] = {}
    repeats, first = 0, None
    for i, key in enumerate(key_rows):
        if key in seen:
            repeats += 1
            first = first or (i, seen[key])
        else:
            seen[key] = i
    i, j = first
    described = ", ".join(f"{k}={v}" for k, v in zip(keys, key_rows[i]))
    described = described if len(described) <= 160 else described[:160] + "…"
    return (f"{path}: line {lines[i]}: repeats the key of line {lines[j]} ({described})"
            + (f" ({repeats:,} rows repeat a key)" if repeats > 1 else ""))
