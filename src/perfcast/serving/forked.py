"""Independent, deterministic tasks on every core: forked worker processes, each inheriting what
this process has compiled (step models, captures), so no task recompiles what the parent holds.
Used by the search's confirming simulations and by the validation's serving replay."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence


def forked_map(fn: Callable, items: Sequence, jobs: int | None = None,
               size: Callable[[int], float] | None = None, fresh: bool = False) -> Iterator[tuple[int, object]]:
    """``(i, fn(items[i]))`` for every item. In ``jobs`` forked processes (default: the CPUs this
    process may use) where there are two or more of them and of the items and the platform can
    fork: submitted largest ``size(i)`` first (for balance), yielded as they finish. Otherwise in
    order, in this process. ``fresh``: every item in a process of its own (at ``jobs`` 1 too, one
    after another, wherever the platform can fork), forked from this one and gone when it is
    done, so what one item compiles does not stay resident while the next runs (a worker that
    served item after item kept every step model it built: the validation's serving replay
    outgrew a 24 GB machine so)."""
    import multiprocessing
    import os

    jobs = jobs or len(os.sched_getaffinity(0))
    if "fork" not in multiprocessing.get_all_start_methods() or (not fresh and (jobs < 2 or len(items) < 2)):
        for i, item in enumerate(items):
            yield i, fn(item)
        return
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, as_completed, wait

    order = sorted(range(len(items)), key=lambda i: -size(i)) if size is not None else range(len(items))
    fork = multiprocessing.get_context("fork")
    if not fresh:
        with ProcessPoolExecutor(min(jobs, len(items)), mp_context=fork) as pool:
            futures = {pool.submit(fn, items[i]): i for i in order}
            for f in as_completed(futures):
                yield futures[f], f.result()
        return
    waiting, running = list(order), {}
    try:
        while waiting or running:
            while waiting and len(running) < jobs:
                i = waiting.pop(0)
                pool = ProcessPoolExecutor(1, mp_context=fork)
                running[pool.submit(fn, items[i])] = (i, pool)
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for f in done:
                i, pool = running.pop(f)
                pool.shutdown()
                yield i, f.result()
    finally:
        for _, pool in running.values():
            pool.shutdown(cancel_futures=True)
