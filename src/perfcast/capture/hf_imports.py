"""Importing transformers for a capture without the work a capture does not need.

A new process that captures a model spends most of its time importing (issue 13's cold start:
within 2× a bare ``python -c "import torch"``, timed by ``benchmarks/textgen_cold.py``). Two of
transformers' import-time costs buy a capture nothing; each workaround below is scoped to the one
import it speeds up and changes no object a capture uses.

- :func:`models`: ``transformers/__init__.py`` and ``transformers/models/__init__.py`` each build
  the lazy import structure of every model folder by reading its files for ``__all__``
  (``utils.import_utils.create_import_structure_from_path``, about 560 folders). The function is
  memoised with ``lru_cache(maxsize=128)``, so the second scan finds none of the first's folders
  left and reads the 1,100 files again (a fifth of a second). While ``transformers.models`` is
  first imported, the module defining the function is given the same function memoised without a
  bound: the second scan is served from the first. The function is pure in the files it reads,
  which do not change under a running process.
  The scan also reads each file's ``__all__`` by splitting the whole file into lines and testing
  every line (``fetch__all__``, a third of the scan); while that import runs it is given a reader
  that finds the last line starting ``__all__`` with one ``rfind`` and hands the original the rest
  (the same list for every file: the original keeps the last such line and reads on from it; a
  file with any other line break than ``\n`` goes to the original whole).
- :func:`modeling_utils`: ``transformers.modeling_utils`` imports every loss of
  ``transformers.loss``; six import ``scipy.optimize.linear_sum_assignment`` at module level when
  ``is_scipy_available()`` (scipy.optimize with .sparse, .linalg and .special: a fifth of a
  second). A capture computes no loss, so the check reads false for the length of that one import
  and is restored after it: those object-detection losses are left unable to match boxes.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.abc
import importlib.machinery
import logging
import sys

log = logging.getLogger(__name__)

_IMPORT_UTILS = "transformers.utils.import_utils"


class _UnboundedScanCache(importlib.abc.MetaPathFinder):
    """Finds ``transformers.utils.import_utils`` as usual and, once it has run, memoises its
    folder scan without a bound."""

    def find_spec(self, name, path, target=None):
        if name != _IMPORT_UTILS:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            scan = getattr(module, "create_import_structure_from_path", None)
            if scan is not None and hasattr(scan, "__wrapped__"):  # the lru_cache of transformers 5
                module.create_import_structure_from_path = functools.lru_cache(maxsize=None)(scan.__wrapped__)
            if callable(getattr(module, "fetch__all__", None)):
                module.fetch__all__ = last_all(module.fetch__all__)

        spec.loader.exec_module = exec_module
        return spec


#: line boundaries ``str.splitlines`` knows besides ``\n`` (a file with one is read by the original)
_OTHER_BREAKS = "\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"


def last_all(fetch):
    """``fetch`` (transformers' ``fetch__all__``) given only the file from its last line starting
    ``__all__``: the list it returns for the whole file."""

    def fetch_last(file_content: str):
        if "__all__" not in file_content or any(c in file_content for c in _OTHER_BREAKS):
            return fetch(file_content)
        at = file_content.rfind("\n__all__")
        if at < 0:
            return fetch(file_content) if file_content.startswith("__all__") else []
        return fetch(file_content[at + 1:])

    return fetch_last


def models() -> None:
    """Import ``transformers.models`` (and transformers) scanning the model folders once."""
    if "transformers.models" in sys.modules:
        return
    finder = _UnboundedScanCache() if _IMPORT_UTILS not in sys.modules else None
    if finder is not None:
        sys.meta_path.insert(0, finder)
    try:
        import transformers.models  # noqa: F401
    finally:
        if finder is not None:
            sys.meta_path.remove(finder)


def modeling_utils() -> None:
    """Import ``transformers.modeling_utils`` without the object-detection losses' scipy.optimize."""
    if "transformers.modeling_utils" in sys.modules:
        return
    models()
    import transformers.utils
    import transformers.utils.import_utils as import_utils

    real = transformers.utils.is_scipy_available
    transformers.utils.is_scipy_available = import_utils.is_scipy_available = lambda: False
    try:
        import transformers.modeling_utils  # noqa: F401
    finally:
        transformers.utils.is_scipy_available = import_utils.is_scipy_available = real


class _Kept(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage())


@contextlib.contextmanager
def config_warnings(source: str):
    """transformers' warnings while a config object is built (its own checks of a published
    config, e.g. Llama 4 Scout's ``rope_scaling`` with ``high_freq_factor`` equal to
    ``low_freq_factor``, 1.0, as meta-llama ships it) kept off stderr: perfcast's own checks
    (:mod:`perfcast.models.validate`) say what a capture needs of a config, and a fault that
    stops the build is still an error. Each kept warning goes to this module's logger at debug
    level, naming ``source``."""
    logger = logging.getLogger("transformers")
    kept = _Kept()
    logger.addHandler(kept)
    propagate, logger.propagate = logger.propagate, False
    shown = [h for h in logger.handlers if h is not kept]
    for h in shown:
        logger.removeHandler(h)
    try:
        yield
    finally:
        logger.removeHandler(kept)
        for h in shown:
            logger.addHandler(h)
        logger.propagate = propagate
        for message in kept.messages:
            log.debug("%s: transformers: %s", source, message)
