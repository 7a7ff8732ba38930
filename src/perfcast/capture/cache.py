"""The capture cache: one symbolic capture per (model config, dtype, phase), reused for every
design point it is valid at.

A symbolic capture (batch ``B``, new tokens ``S``, context ``C`` as ShapeEnv symbols) is exact
wherever its guards hold and every dim is at least 2 (the ShapeEnv specialises sizes 0 and 1,
so code that branches on a size of 1 was traced for sizes ≥ 2 only). At such a point, lowering
the cached capture with the point substituted gives the same graph as a fresh concrete capture
(a test checks this); elsewhere the caller captures concretely.

The cache lives in ``$XDG_CACHE_HOME/perfcast/captures`` (default ``~/.cache/perfcast``). An
entry is gzip-compressed JSON (:mod:`perfcast.capture.codec`: data only, so reading one never
runs code, and no torch is needed to read it), named by a hash of its key: the config, the dtype
and phase flags, the versions of perfcast, torch, transformers and SymPy, and a digest of the
capture code and the architecture table. The entry holds its whole key and is used only if that
key is the one asked for. Entries are written to a temporary file in the same folder, synced and
renamed into place, so a reader sees a whole entry or none; one that cannot be read back (cut
short, damaged, another key or format, too large, not a regular file) is a miss: captured anew
and overwritten, with a debug note on the ``perfcast.capture.cache`` logger.
"""

from __future__ import annotations

import contextlib
import functools
import gzip
import hashlib
import json
import logging
import os
import stat
import tempfile
import zlib
from importlib import metadata
from pathlib import Path

import sympy

from perfcast.capture import codec, heap
from perfcast.capture.types import Capture
from perfcast.models import ModelConfig

FORMAT = 2  # bump when Capture's layout, the codec or the capture's semantics change
MAGIC = "perfcast capture cache"
SUFFIX = ".json.gz"
#: the largest entry read (compressed) and the most its JSON may inflate to; the catalog's
#: largest (GLM-5's) is 18 KB compressed, 190 KB of JSON
MAX_ENTRY_BYTES = 4 * 1024 * 1024
MAX_JSON_BYTES = 32 * 1024 * 1024

log = logging.getLogger(__name__)


class Unreadable(Exception):
    """Why a cache entry is not used (the reason goes to the debug log)."""


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "perfcast" / "captures"


@functools.cache
def _source_digest() -> str:
    """The capture code itself is part of the key, and the architecture table it applies: a
    changed capture or row never reuses old entries."""
    h = hashlib.sha256()
    models = Path(__file__).parent.parent / "models"
    for p in [*sorted(Path(__file__).parent.glob("*.py")), models / "architecture.py", models / "architectures.yaml"]:
        h.update(p.read_bytes())
    return h.hexdigest()


@functools.cache
def versions() -> dict[str, str]:
    """The versions of the packages a capture depends on (a cache key's ``versions``)."""

    def version(package: str) -> str:
        try:
            return metadata.version(package)
        except metadata.PackageNotFoundError:  # perfcast run from a source tree: the digest decides
            return "not installed"

    return {p: version(p) for p in ("perfcast", "torch", "transformers", "sympy")}


def entry_key(model: ModelConfig, dtype: str, decode: bool, context: bool, reroll: bool) -> dict:
    """Everything the capture depends on, as plain JSON values."""
    key = {"config": model.data, "dtype": dtype, "decode": decode, "context": context, "reroll": reroll,
           "versions": versions(), "code": _source_digest(), "format": FORMAT}
    # as read back (tuples become lists); a value JSON lacks (a YAML date) by its text
    return json.loads(json.dumps(key, sort_keys=True, default=str))


def entry_path(model: ModelConfig, key: dict) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:32]
    return cache_dir() / f"{model.name[:64]}-{digest}{SUFFIX}"  # (a file name has at most 255 bytes)


def symbolic_capture(model: ModelConfig, *, dtype: str, decode: bool, context: bool,
                     reroll: bool = True, use_cache: bool = True) -> tuple[Capture, bool]:
    """(the symbolic capture, whether it came from the cache)."""
    key = entry_key(model, dtype, decode, context, reroll)
    path = entry_path(model, key)
    if use_cache:
        try:
            return load(path, key), True
        except FileNotFoundError:
            pass
        except Unreadable as e:
            log.debug("capture cache: %s: not used (%s); capturing anew", path, e)
    with heap.first_capture():
        from perfcast.capture.build import capture, hf_config

        # Distinct hints above 1: no two sizes share a symbol, none is specialised to 0 or 1.
        hints = {"batch": 3, "new_tokens": 5, "past": 7}
        cap = capture(hf_config(model), dtype=dtype, batch=hints["batch"],
                      new_tokens=1 if decode else hints["new_tokens"],
                      past=hints["past"] if (decode or context) else 0,
                      decode=decode, symbolic=True, reroll=reroll)
    if use_cache:
        try:
            store(path, key, cap)
        # codec.Invalid: a value the format has no node for; or a NaN in the config, which
        # strict JSON has no token for. The capture is used, only not kept.
        except ValueError as e:
            log.debug("capture cache: %s: not written (%s)", path, e)
        except OSError as e:  # an unwritable cache only costs speed
            log.debug("capture cache: %s: not written (%s)", path, e.strerror or e)
    return cap, False


def store(path: Path, key: dict, cap: Capture) -> None:
    """Write the capture entry for ``key`` (:func:`write_entry`)."""
    write_entry(path, {"magic": MAGIC, "format": FORMAT, "key": key, "capture": codec.encode(cap)})


def write_entry(path: Path, doc: dict) -> None:
    """Write ``doc`` as gzip-compressed strict JSON atomically: a unique temporary file in the
    same folder, synced, then renamed over ``path``. Shared with the step-model cache
    (:mod:`perfcast.serving.step_cache`)."""
    text = json.dumps(doc, separators=(",", ":"), allow_nan=False)
    data = gzip.compress(text.encode(), compresslevel=6, mtime=0)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def load(path: Path, key: dict) -> Capture:
    """The capture stored at ``path`` for ``key``; :class:`FileNotFoundError` if there is none,
    :class:`Unreadable` (with the reason) if the file is not such an entry."""
    body = read_entry(path, MAGIC, FORMAT, key, "capture")
    try:
        return codec.decode(body)
    except codec.Invalid as e:
        raise Unreadable(str(e)) from None


def read_entry(path: Path, magic: str, fmt: int, key: dict, field: str):
    """The ``field`` of the entry at ``path`` written by :func:`write_entry` with this
    ``magic``, ``fmt`` and ``key`` (and no other field); :class:`FileNotFoundError` if there is
    none, :class:`Unreadable` (with the reason) if the file is not such an entry."""
    text = _inflate(_read(path))
    try:
        doc = json.loads(text, parse_constant=_no_constant)
    except (ValueError, RecursionError) as e:  # not JSON, not UTF-8, nested too deep, NaN
        raise Unreadable(f"not JSON ({type(e).__name__})") from None
    if type(doc) is not dict or doc.get("magic") != magic or doc.get("format") != fmt:
        raise Unreadable("not a cache entry of this kind and format")
    if set(doc) != {"magic", "format", "key", field}:
        raise Unreadable("unexpected fields")
    if doc["key"] != key:
        raise Unreadable("an entry for another key")
    return doc[field]


def _read(path: Path) -> bytes:
    """The bytes of a regular file at ``path`` itself (not through a symlink, never blocking
    on a FIFO or device), at most :data:`MAX_ENTRY_BYTES`."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise
    except OSError as e:  # a symlink (ELOOP), no permission
        raise Unreadable(f"cannot open ({e.strerror or e})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise Unreadable("not a regular file")
        if st.st_size > MAX_ENTRY_BYTES:
            raise Unreadable(f"{st.st_size:,} bytes, more than {MAX_ENTRY_BYTES:,}")
        with open(fd, "rb", closefd=False) as f:
            data = f.read(MAX_ENTRY_BYTES + 1)
    except OSError as e:
        raise Unreadable(f"cannot read ({e.strerror or e})") from None
    finally:
        os.close(fd)
    if len(data) > MAX_ENTRY_BYTES:
        raise Unreadable(f"more than {MAX_ENTRY_BYTES:,} bytes")
    return data


def _inflate(data: bytes) -> str:
    """The text of a whole gzip stream (its length and CRC checked), at most
    :data:`MAX_JSON_BYTES` of it."""
    inflater = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)  # gzip framing only
    try:
        text = inflater.decompress(data, MAX_JSON_BYTES + 1)
    except zlib.error as e:
        raise Unreadable(f"not gzip, or damaged ({e})") from None
    if len(text) > MAX_JSON_BYTES:
        raise Unreadable(f"inflates to more than {MAX_JSON_BYTES:,} bytes")
    if not inflater.eof or inflater.unused_data:
        raise Unreadable("cut short" if not inflater.eof else "data after the gzip stream")
    try:
        return text.decode("utf-8")
    except UnicodeDecodeError:
        raise Unreadable("not UTF-8") from None


def _no_constant(name: str):
    raise ValueError(f"{name} is not JSON")


def valid_at(cap: Capture, point: dict) -> bool:
    """Whether the symbolic capture is exact at ``point`` (dim → value)."""
    dims = set(cap.symbols.values())
    if any(point.get(d, 2) < 2 for d in dims):
        return False
    return all(bool(sympy.sympify(g).xreplace(point)) for g in cap.guards)
