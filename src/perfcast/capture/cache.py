"""The capture cache: one symbolic capture per (model config, dtype, phase), reused for every
design point it is valid at.

A symbolic capture (batch ``B``, new tokens ``S``, context ``C`` as ShapeEnv symbols) is exact
wherever its guards hold and every dim is at least 2 (the ShapeEnv specialises sizes 0 and 1,
so code that branches on a size of 1 was traced for sizes ≥ 2 only). At such a point, lowering
the cached capture with the point substituted gives the same graph as a fresh concrete capture
(a test checks this); elsewhere the caller captures concretely. The cache lives in
``$XDG_CACHE_HOME/perfcast`` (default ``~/.cache/perfcast``), keyed by a hash of the config,
the options and the versions of perfcast, torch and transformers; entries are pickles of
:class:`perfcast.capture.types.Capture`, which needs no torch to load.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
from importlib import metadata
from pathlib import Path

import sympy

from perfcast.capture.types import Capture
from perfcast.models import ModelConfig

FORMAT = 1  # bump when Capture's layout or the capture's semantics change


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "perfcast" / "captures"


def _source_digest() -> str:
    """The capture code itself is part of the key, and the architecture table it applies: a
    changed capture or row never reuses old entries."""
    h = hashlib.sha256()
    models = Path(__file__).parent.parent / "models"
    for p in [*sorted(Path(__file__).parent.glob("*.py")), models / "architecture.py", models / "architectures.yaml"]:
        h.update(p.read_bytes())
    return h.hexdigest()


def _key(model: ModelConfig, dtype: str, decode: bool, context: bool, reroll: bool) -> str:
    versions = {p: metadata.version(p) for p in ("torch", "transformers")}
    blob = json.dumps({"config": model.data, "dtype": dtype, "decode": decode, "context": context,
                       "reroll": reroll, "versions": versions, "code": _source_digest(),
                       "format": FORMAT}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


def symbolic_capture(model: ModelConfig, *, dtype: str, decode: bool, context: bool,
                     reroll: bool = True, use_cache: bool = True) -> tuple[Capture, bool]:
    """(the symbolic capture, whether it came from the cache)."""
    path = cache_dir() / f"{model.name}-{_key(model, dtype, decode, context, reroll)}.pkl"
    if use_cache and path.exists():
        try:
            with path.open("rb") as f:
                return pickle.load(f), True
        except (OSError, pickle.UnpicklingError, EOFError, AttributeError):
            pass  # a damaged entry is recaptured below and overwritten
    from perfcast.capture.build import capture, hf_config

    # Distinct hints above 1: no two sizes share a symbol, none is specialised to 0 or 1.
    hints = {"batch": 3, "new_tokens": 5, "past": 7}
    cap = capture(hf_config(model), dtype=dtype, batch=hints["batch"],
                  new_tokens=1 if decode else hints["new_tokens"],
                  past=hints["past"] if (decode or context) else 0,
                  decode=decode, symbolic=True, reroll=reroll)
    if use_cache:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            with tmp.open("wb") as f:
                pickle.dump(cap, f, protocol=pickle.HIGHEST_PROTOCOL)
            tmp.replace(path)
        except OSError:
            pass  # an unwritable cache only costs speed
    return cap, False


def valid_at(cap: Capture, point: dict) -> bool:
    """Whether the symbolic capture is exact at ``point`` (dim → value)."""
    dims = set(cap.symbols.values())
    if any(point.get(d, 2) < 2 for d in dims):
        return False
    return all(bool(sympy.sympify(g).xreplace(point)) for g in cap.guards)
