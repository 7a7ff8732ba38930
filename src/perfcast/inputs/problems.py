"""Everything wrong in one file, reported at once: a user fixing a file they wrote sees every
problem in one run instead of one more per try."""

from __future__ import annotations

from pathlib import Path

from perfcast.ir.errors import UserError

#: Problems listed in one report; the rest are counted. Past a screenful the first ones are
#: what a user fixes first anyway.
MAX_PROBLEMS_SHOWN = 30
#: A problem line longer than this is cut: each line quotes at most a short excerpt of the bad
#: content, so only a very long key path reaches it.
MAX_PROBLEM_CHARS = 300


def problems_error(where: str | Path, problems: list[str], error: type[UserError] = UserError) -> UserError:
    """An ``error`` for ``problems`` (at least one) found in ``where``: one line
    ``WHERE: PROBLEM`` for a single problem, else ``WHERE: N problems`` followed by a line per
    problem (the CLI indents them)."""
    lines = [p if len(p) <= MAX_PROBLEM_CHARS else p[:MAX_PROBLEM_CHARS] + "…" for p in problems]
    if len(lines) == 1:
        return error(f"{where}: {lines[0]}")
    shown = lines[:MAX_PROBLEMS_SHOWN]
    more = len(lines) - len(shown)
    return error("\n".join([f"{where}: {len(lines)} problems", *shown, *([f"… and {more} more"] if more else [])]))
