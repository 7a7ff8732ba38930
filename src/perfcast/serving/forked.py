"""Independent, deterministic tasks on every core: forked worker processes, each inheriting what
this process has compiled (step models, captures), so no task recompiles what the parent holds.
Used by the search's confirming simulations and by the validation's serving replay."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from functools import partial


def forked_map(fn: Callable, items: Sequence, jobs: int | None = None, size: Callable[[int], float] | None = None,
               fresh: bool = False, rows: bool = False) -> Iterator[tuple[int, object]]:
    """``(i, fn(items[i]))`` for every item. In ``jobs`` forked processes (default: the CPUs this
    process may use) where there are two or more of them and of the items and the platform can
    fork: submitted largest ``size(i)`` first (for balance), yielded as they finish. Otherwise in
    order, in this process. ``fresh``: every item in a process of its own (at ``jobs`` 1 too, one
    after another, wherever the platform can fork), forked from this one and gone when it is
    done, so what one item compiles does not stay resident while the next runs (a worker that
    served item after item kept every step model it built: the validation's serving replay
    outgrew a 24 GB machine so). ``rows``: the step models' attention rows a worker computes are
    sent back with its results, and kept in the step cache with this process's at the end
    (:func:`perfcast.serving.step_rows.flush`)."""
    yield from _mapped(fn, items, jobs, size, fresh, rows)
    if rows:
        from perfcast.serving import step_rows

        step_rows.flush()


def _mapped(fn: Callable, items: Sequence, jobs: int | None, size, fresh: bool, rows: bool):
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
    start = None
    if rows:   # a worker sends back the rows it computes, not the ones this process had not kept yet
        fn, start = partial(_with_rows, fn), _forget_rows
    if not fresh:
        with ProcessPoolExecutor(min(jobs, len(items)), mp_context=fork, initializer=start) as pool:
            futures = {pool.submit(fn, items[i]): i for i in order}
            for f in as_completed(futures):
                yield futures[f], _result(f, rows)
        return
    waiting, running = list(order), {}
    try:
        while waiting or running:
            while waiting and len(running) < jobs:
                i = waiting.pop(0)
                pool = ProcessPoolExecutor(1, mp_context=fork, initializer=start)
                running[pool.submit(fn, items[i])] = (i, pool)
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for f in done:
                i, pool = running.pop(f)
                pool.shutdown()
                yield i, _result(f, rows)
    finally:
        for _, pool in running.values():
            pool.shutdown(cancel_futures=True)


def _with_rows(fn: Callable, item):
    """In a worker: ``fn(item)`` and the attention rows it computed."""
    from perfcast.serving import step_rows

    return fn(item), step_rows.harvest()


def _forget_rows() -> None:
    from perfcast.serving import step_rows

    step_rows.harvest()


def _result(future, rows: bool):
    """A worker's result; with ``rows``, its attention rows taken in by this process."""
    if not rows:
        return future.result()
    from perfcast.serving import step_rows

    out, harvested = future.result()
    step_rows.adopt(harvested)
    return out
