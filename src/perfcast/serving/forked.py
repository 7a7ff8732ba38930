"""Independent, deterministic tasks on every core: forked worker processes, each inheriting what
this process has compiled (step models, captures), so no task recompiles what the parent holds.
Used by the search's confirming simulations and by the validation's serving replay."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence


def forked_map(fn: Callable, items: Sequence, jobs: int | None = None,
               size: Callable[[int], float] | None = None) -> Iterator[tuple[int, object]]:
    """``(i, fn(items[i]))`` for every item. In ``jobs`` forked processes (default: the CPUs this
    process may use) where there are two or more of them and of the items and the platform can
    fork: submitted largest ``size(i)`` first (for balance), yielded as they finish. Otherwise in
    order, in this process."""
    import multiprocessing
    import os

    jobs = jobs or len(os.sched_getaffinity(0))
    if jobs < 2 or len(items) < 2 or "fork" not in multiprocessing.get_all_start_methods():
        for i, item in enumerate(items):
            yield i, fn(item)
        return
    from concurrent.futures import ProcessPoolExecutor, as_completed

    order = sorted(range(len(items)), key=lambda i: -size(i)) if size is not None else range(len(items))
    with ProcessPoolExecutor(min(jobs, len(items)), mp_context=multiprocessing.get_context("fork")) as pool:
        futures = {pool.submit(fn, items[i]): i for i in order}
        for f in as_completed(futures):
            yield futures[f], f.result()
