"""The step-model cache: what compiling a deployment's step model produced, kept on disk, so a
new process prices steps without capturing, lowering, rolling up or lambdifying again.

An entry lives in ``$XDG_CACHE_HOME/perfcast/steps`` (default ``~/.cache/perfcast``) in the
capture cache's format (:func:`perfcast.capture.cache.write_entry`: gzip-compressed strict JSON,
written atomically, read with size and file-type checks). A ``step`` entry holds, for one
deployment compiled for ``max_tokens``: the dense and LM-head tables (each the base64 of its
little-endian IEEE doubles: exact, and read back at the speed of a copy), per size decision of
the engine the token runs it serves and its parts' NumPy source as :func:`sympy.lambdify`
printed it, the calibrated kernel fits those sources call, and the ops with no cost rule. A
``memory`` entry holds a deployment's memory report (four integers).

The key is everything the result depends on: every field of the deployment and the inputs its
names resolve to (model config, device, engine profile, device mesh — a user's file changes
them), ``max_tokens``, the versions of perfcast, torch, transformers, SymPy and NumPy, and a
digest of the whole installed package, code and data (any edit misses). An entry holds its whole
key and is used only if that key is the one asked for.

A source is used only after its bytecode is checked (compiling runs nothing, and the module's code
is never run: the function is built from its code object): one function whose body returns one
expression built from its arguments, numbers, arithmetic, comparisons and calls of the names the
printer emits (NumPy's ufuncs and a few array functions, ``functools.reduce``) or of the
performance model's own functions. Anything else makes the entry unreadable: a miss, compiled
anew and overwritten (debug note on the ``perfcast.serving.step_cache`` logger). So a damaged or
foreign file costs time, never runs code.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import dis
import functools
import hashlib
import inspect
import json
import logging
import os
import types
from collections import Counter
from pathlib import Path

import numpy as np

from perfcast.capture.cache import Unreadable, read_entry, versions, write_entry

FORMAT = 3  # bump when an entry's fields or their meaning change
MAGIC = "perfcast step cache"
SUFFIX = ".json.gz"

log = logging.getLogger(__name__)

#: Instructions a cached source's module (one ``def``) and function (one expression) may use
#: (:func:`compiled`), by name across CPython versions; a name a version lacks is skipped, an
#: instruction not listed makes the entry unreadable (a miss, compiled anew).
_MODULE_OPS = frozenset(dis.opmap[n] for n in ("CACHE", "RESUME", "NOP", "LOAD_CONST", "MAKE_FUNCTION", "STORE_NAME",
                                               "RETURN_VALUE", "RETURN_CONST") if n in dis.opmap)
_FUNCTION_OPS = frozenset(dis.opmap[n] for n in (
    "CACHE", "RESUME", "NOP", "EXTENDED_ARG", "LOAD_FAST", "LOAD_FAST_CHECK", "LOAD_FAST_LOAD_FAST", "LOAD_CONST",
    "RETURN_CONST", "LOAD_GLOBAL", "PUSH_NULL", "PRECALL", "CALL", "CALL_KW", "KW_NAMES", "BINARY_OP",
    "UNARY_NEGATIVE", "UNARY_NOT", "UNARY_INVERT", "COMPARE_OP", "IS_OP", "CONTAINS_OP", "TO_BOOL", "BUILD_LIST",
    "BUILD_TUPLE", "LIST_EXTEND", "RETURN_VALUE", "COPY", "SWAP", "POP_TOP", "JUMP_FORWARD", "NOT_TAKEN",
    "POP_JUMP_FORWARD_IF_FALSE", "POP_JUMP_FORWARD_IF_TRUE", "POP_JUMP_IF_FALSE", "POP_JUMP_IF_TRUE",
    "JUMP_IF_FALSE_OR_POP", "JUMP_IF_TRUE_OR_POP") if n in dis.opmap)
#: Array functions lambdify's NumPy printer emits besides the ufuncs (sympy/printing/numpy.py).
_ARRAY_FUNCTIONS = ("select", "where", "amax", "amin", "array", "asarray", "broadcast_to", "sum", "prod",
                    "isnan", "inf", "nan", "pi", "e", "euler_gamma")
#: Code flags of anything but a plain function: *args, **kwargs, generators, coroutines.
_FREE_FLAGS = inspect.CO_VARARGS | inspect.CO_VARKEYWORDS | inspect.CO_GENERATOR | inspect.CO_COROUTINE \
    | inspect.CO_ITERABLE_COROUTINE | inspect.CO_ASYNC_GENERATOR | inspect.CO_NESTED


@functools.cache
def _printer_names() -> dict[str, object]:
    # NumPy's own namespace, not getattr: that would import every lazily loaded submodule
    # (numpy.f2py, numpy.testing, numpy.random, ...), none of which holds a ufunc
    names = {n: v for n in dir(np) if isinstance(v := vars(np).get(n), np.ufunc)}
    names.update({n: getattr(np, n) for n in _ARRAY_FUNCTIONS if hasattr(np, n)})
    names["reduce"] = functools.reduce
    return names


def cache_dir() -> Path:
    from perfcast.capture.cache import cache_dir as captures

    return captures().parent / "steps"


@functools.cache
def package_digest() -> str:
    """SHA-256 over every file of the installed perfcast package (path and bytes), caches aside;
    kept in the cache with every file's size and modification time, and hashed again only when
    one of them differs (as Python's bytecode cache decides a source changed): a new process
    stats the package's files instead of reading its ~50 MB."""
    root = Path(__file__).resolve().parent.parent
    files = sorted(p for p in _files(root) if p.is_file())
    stats = [[str(p.relative_to(root)), st.st_size, st.st_mtime_ns] for p in files for st in (p.stat(),)]
    key = {"kind": "digest", "root": str(root), "files": stats, "format": FORMAT}
    path = cache_dir() / f"package-digest{SUFFIX}"
    try:
        kept = read_entry(path, MAGIC, FORMAT, key, "digest")
        if isinstance(kept, str) and len(kept) == 64:
            return kept
    except FileNotFoundError:
        pass
    except (Unreadable, KeyError, TypeError, ValueError) as e:
        log.debug("step cache: %s: not used (%s: %s)", path, type(e).__name__, e)
    h = hashlib.sha256()
    for p, (rel, _, _) in zip(files, stats):
        h.update(rel.encode() + b"\0" + p.read_bytes())
    digest = h.hexdigest()
    try:
        write_entry(path, {"magic": MAGIC, "format": FORMAT, "key": key, "digest": digest})
    except (ValueError, OSError) as e:
        log.debug("step cache: %s: not written (%s)", path, e)
    return digest


def _files(root: Path) -> list[Path]:
    """Every path under ``root`` but the bytecode caches, which are not walked (``rglob`` would
    list their thousand files only to drop them)."""
    out = []
    for folder, dirs, names in os.walk(root):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        out += [Path(folder, n) for n in names]
    return out


def key_of(kind: str, deployment, proto, max_tokens: int) -> dict:
    """Everything a ``kind`` entry of ``deployment`` (its step request ``proto``) depends on."""
    key = {"kind": kind, "deployment": dataclasses.asdict(deployment), "max_tokens": int(max_tokens),
           "config": proto.model.data, "device": repr(proto.device), "profile": repr(proto.profile()),
           "mesh": repr(proto.mesh()), "versions": {**versions(), "numpy": np.__version__},
           "package": package_digest(), "format": FORMAT}
    return json.loads(json.dumps(key, sort_keys=True, default=str))


def entry_path(key: dict) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:32]
    return cache_dir() / f"{key['kind']}-{key['deployment']['model'][:48]}-{digest}{SUFFIX}"


def remembered(key: dict, build, encode, decode):
    """``decode`` of the entry for ``key``, else ``build()`` (kept with ``encode``). A decode
    that fails on the entry's content (:class:`Unreadable`, a missing field, a wrong type) is a
    miss; an unwritable cache only costs speed."""
    value = read(key, key["kind"], decode)
    if value is None:
        value = build()
        write(key, key["kind"], value, encode)
    return value


def read(key: dict, field: str, decode):
    """``decode`` of the ``field`` of the entry for ``key``; None where there is no such entry or
    it cannot be read (debug note)."""
    path = entry_path(key)
    try:
        return decode(read_entry(path, MAGIC, FORMAT, key, field))
    except FileNotFoundError:
        pass
    except (Unreadable, KeyError, TypeError, ValueError, IndexError) as e:
        log.debug("step cache: %s: not used (%s: %s)", path, type(e).__name__, e)
    return None


def write(key: dict, field: str, value, encode) -> None:
    """Keep ``encode(value)`` as the ``field`` of the entry for ``key`` (an unwritable cache, or a
    value strict JSON cannot hold, only costs speed)."""
    path = entry_path(key)
    try:
        write_entry(path, {"magic": MAGIC, "format": FORMAT, "key": key, field: encode(value)})
    except ValueError as e:  # a NaN in a table or key: strict JSON has no token for it
        log.debug("step cache: %s: not written (%s)", path, e)
    except OSError as e:
        log.debug("step cache: %s: not written (%s)", path, e.strerror or e)


def source_of(fn) -> str:
    """The source :func:`sympy.lambdify` generated for ``fn`` (it registers it with linecache)."""
    return inspect.getsource(fn)


def compiled(source: str, names: dict[str, object]):
    """The function ``source`` defines (:func:`_checked`), its names bound to ``names`` (the
    performance model's functions) or to :func:`_printer_names`."""
    fn = _checked(source)
    known = _printer_names()
    used = {}
    for name in fn.co_names:
        if name in names:
            used[name] = names[name]
        elif name in known:
            used[name] = known[name]
        else:
            raise Unreadable(f"a source naming {name!r}")
    return types.FunctionType(fn, {"__builtins__": {}, **used}, fn.co_name)


@functools.lru_cache(maxsize=4096)
def _checked(source: str) -> types.CodeType:
    """The code object of the function ``source`` defines, after the check of the module
    docstring — made on the bytecode ``compile`` gives (compiling runs nothing): the module only
    defines one function; the function takes positional arguments, has no other locals,
    closures, defaults or nested code, uses only the instructions of one expression of calls,
    arithmetic, comparisons and list or tuple displays (no attribute, subscript, store, import or
    loop), numeric constants (and keyword names); :func:`compiled` then binds only the names of
    :func:`_printer_names` or the performance model's functions. The function is built from its
    code object; the module's code is never run. Memoised by the source: a search's stages and
    layouts share most of theirs (a refused source raises again: exceptions are not kept)."""
    try:
        module = compile(source, "<perfcast step cache>", "exec", dont_inherit=True)
    except (SyntaxError, ValueError) as e:
        raise Unreadable(f"a source that does not compile ({e})") from None
    codes = [c for c in module.co_consts if isinstance(c, types.CodeType)]
    fn = codes[0] if len(codes) == 1 else None
    if fn is None or len(module.co_names) != 1 or any(c is not None and c is not fn for c in module.co_consts) \
            or not set(module.co_code[::2]) <= _MODULE_OPS:
        raise Unreadable("a source that is not one function returning one expression")
    if fn.co_flags & _FREE_FLAGS or fn.co_kwonlyargcount or fn.co_posonlyargcount or fn.co_freevars \
            or fn.co_cellvars or fn.co_nlocals != fn.co_argcount:
        raise Unreadable("a function with more than positional arguments and one expression")
    bad = set(fn.co_code[::2]) - _FUNCTION_OPS
    if bad:
        raise Unreadable(f"a source with a {dis.opname[min(bad)]} instruction")
    for c in fn.co_consts:
        if not _numeric(c) and not (type(c) is tuple and c and all(type(k) is str for k in c)):
            raise Unreadable(f"a source with a {type(c).__name__} constant")
    return fn


def _numeric(c) -> bool:
    """None (a function's empty docstring slot), a number, or a tuple of numbers (a display)."""
    return c is None or type(c) in (int, float) or (type(c) is tuple and all(type(k) in (int, float) for k in c))


def encode(compiled: tuple, pm) -> dict:
    """A compiled step model (:meth:`StepModel._compiled`'s tuple) as an entry keeps it."""
    decode, prefill, dense_decode, dense_prefill, head, unpriced = compiled

    def groups(parts: dict) -> list[dict]:
        return [{"key": json.loads(json.dumps(key, default=str)), "runs": _runs(tokens), "host": float(part.host),
                 **{name: source_of(fn) for name, fn in
                    (("dense", part.dense), ("attention", part.attention), ("head", part.head)) if fn is not None}}
                for key, (part, tokens) in parts.items()]

    calibration = getattr(pm, "calibration", None)
    return {"decode": groups(decode), "prefill": groups(prefill), "dense_decode": packed(dense_decode),
            "dense_prefill": packed(dense_prefill), "head": packed(head),
            "fits": calibration.used() if calibration else [],
            "unpriced": [[op, shapes, n] for (op, shapes), n in unpriced.items()]}


def decode(doc: dict, pm, max_tokens: int, part) -> tuple:
    """The inverse of :func:`encode`, the sources compiled by :func:`compiled`; ``part``: the
    step model's part type, built from (dense, attention, head, host)."""
    calibration = getattr(pm, "calibration", None)
    if calibration is not None:
        calibration.restore(doc["fits"])
    elif doc["fits"]:
        raise Unreadable("calibrated fits for a performance model without a calibration")
    names = pm.numpy_functions()

    def parts(groups: list, decoding: bool) -> dict:
        out = {}
        for g in groups:
            fn = {k: compiled(g[k], names) for k in (("dense", "attention") if decoding else
                                                     ("dense", "attention", "head"))}
            tokens: list[int] = []
            for a, b in g["runs"]:
                if not (type(a) is type(b) is int and (tokens[-1] if tokens else 0) < a <= b):
                    raise Unreadable("token runs that are not ascending and apart")
                tokens.extend(range(a, b + 1))
            out[_tupled(g["key"])] = (part(fn["dense"], fn["attention"], fn.get("head"), float(g["host"])), tokens)
        return out

    tables = [unpacked(doc[k], max_tokens + 1) for k in ("dense_decode", "dense_prefill", "head")]
    return (parts(doc["decode"], True), parts(doc["prefill"], False), *tables,
            Counter({(str(op), str(shapes)): int(n) for op, shapes, n in doc["unpriced"]}))


def packed(table) -> str:
    """A table of floats as the base64 of its little-endian IEEE doubles."""
    return base64.b64encode(np.asarray(table, dtype="<f8").tobytes()).decode("ascii")


def unpacked(text: str, n: int) -> list[float]:
    """The inverse of :func:`packed`, refused unless it holds exactly ``n`` floats."""
    if type(text) is not str:
        raise Unreadable("a table that is not base64 text")
    try:
        data = base64.b64decode(text, validate=True)
    except binascii.Error:
        raise Unreadable("a table that is not base64") from None
    if len(data) != 8 * n:
        raise Unreadable(f"a table not of {n} entries")
    return np.frombuffer(data, dtype="<f8").tolist()


def _runs(tokens: list[int]) -> list[list[int]]:
    """Sorted token counts as inclusive runs ``[first, last]``."""
    out: list[list[int]] = []
    for t in tokens:
        if out and out[-1][1] == t - 1:
            out[-1][1] = t
        else:
            out.append([t, t])
    return out


def _tupled(value):
    """A JSON value with its lists as tuples (a size-decision key as it was)."""
    return tuple(_tupled(v) for v in value) if isinstance(value, list) else value
