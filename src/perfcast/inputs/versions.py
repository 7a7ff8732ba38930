"""One order of version strings for the whole project (profiling databases, kernel calibrations,
engine releases): :func:`version_key`."""

from __future__ import annotations

import re

_VERSION = re.compile(r"^v?(\d+(?:\.\d+)*)(?:[.-]?(dev|a|alpha|b|beta|rc|c|post)[.-]?(\d*))?(.*)$", re.I)
_PHASE = {"dev": 0, "a": 1, "alpha": 1, "b": 2, "beta": 2, "rc": 3, "c": 3, "post": 5}
_FINAL = 4


def version_key(version: str) -> tuple:
    """A sort key for version strings in the PEP 440 spirit: numeric release parts compared as
    numbers, then ``dev < a < b < rc <`` the release ``< post``; anything unparseable sorts
    after every parseable version, by its text."""
    m = _VERSION.match(version.strip())
    if not m:
        return (1, (), 0, 0, version)
    release = tuple(int(x) for x in m.group(1).split("."))
    while len(release) > 1 and release[-1] == 0:
        release = release[:-1]  # 1.3 == 1.3.0
    phase = _PHASE[m.group(2).lower()] if m.group(2) else _FINAL
    return (0, release, phase, int(m.group(3) or 0), m.group(4))
