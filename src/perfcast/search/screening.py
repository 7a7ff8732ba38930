"""The search's screening: every group of :func:`perfcast.search.optimize.groups_of` priced in
closed form, here, on Ray, or on two cores of this machine.

In order, in one process, the disaggregated groups come first: their prefill pools ask for the
largest steps (the engine's own batch limit), and a step model compiled for those serves the
aggregated groups' smaller ones, so each layout's step model is built or loaded once.

On two cores (the local executor, where the process may use two CPUs and can fork, and holds none
of the search's step models yet: a new process, which loads or compiles them all) the groups
split along the step models they compile, so that every step model is compiled, grown and read
in the same order as in one process: a forked worker screens the disaggregated groups and the
aggregated groups of layouts without pipeline stages (a disaggregated pool is never a pipeline:
:func:`perfcast.search.disagg.screen` counts such pools as ``not_modelled``), while this process
screens the pipeline-parallel layouts — each compiled by its own group only. The worker sends
back its points, each step model it compiled (deployment, size) with the attention rows the
screening grew on it, and the rows it computed; this process loads those step models (from the
step cache the worker filled) and takes the rows, so the confirming simulations start from the
state one process would have reached. An error is raised as one process would have met it: the
first failing group's, in the order above.
"""

from __future__ import annotations

import os

from perfcast.serving import step as step_mod


def screen(spec, groups: list[tuple], run_group, executor, jobs: int | None = None,
           progress=None) -> dict[int, list]:
    """Every group's points by its index in ``groups`` (``run_group((spec, group))`` prices one);
    ``progress(done, total, what)`` after each group."""
    order = sorted(range(len(groups)), key=lambda i: groups[i][0] != "disagg")
    done: dict[int, list] = {}

    def finished(i: int, pts: list) -> None:
        done[i] = pts
        if progress is not None:
            g = groups[i]
            progress(len(done), len(groups), f"{g[1]} {g[3].describe() if g[0] == 'agg' else 'disaggregated'}")

    here = [i for i in order if groups[i][0] == "agg" and groups[i][3].pp > 1]
    there = [i for i in order if i not in here]
    if executor.name != "local" or not here or not there or not _two_cores(jobs) or _warm(spec, groups):
        for j, pts in executor.imap(run_group, [(spec, groups[i]) for i in order]):
            finished(order[j], pts)
        return done
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("fork")) as pool:
        worker = pool.submit(_screened, spec, [(i, groups[i]) for i in there], run_group)
        mine = _outcomes(spec, [(i, groups[i]) for i in here], run_group)
        theirs, compiled, harvested = worker.result()
    outcomes = {**dict(mine), **dict(theirs)}
    for i in order:   # the first error one process would have met
        if isinstance(outcomes[i], BaseException):
            raise outcomes[i]
    _take(compiled, harvested)
    for i in order:
        finished(i, outcomes[i])
    return done


def _two_cores(jobs: int | None) -> bool:
    import multiprocessing

    return "fork" in multiprocessing.get_all_start_methods() and (jobs or len(os.sched_getaffinity(0))) >= 2


def _warm(spec, groups: list[tuple]) -> bool:
    """Whether this process holds a step model of the search's aggregated layouts already (it ran
    the search before): then the screening only prices, and one process does it sooner than two."""
    from perfcast.search.optimize import deployment_for

    have = step_mod.compiled_models()
    return any(deployment_for(spec, g[1], g[2], g[3]) in have for g in groups if g[0] == "agg")


def _outcomes(spec, items: list[tuple], run_group) -> list[tuple[int, object]]:
    """``(i, points)`` per group, or ``(i, the error)`` for the first failing one (the rest unrun)."""
    out = []
    for i, g in items:
        try:
            out.append((i, run_group((spec, g))))
        except Exception as e:   # raised by the caller in the groups' order
            out.append((i, e))
            break
    return out


def _screened(spec, items: list[tuple], run_group):
    """In the worker: the groups' outcomes, every step model it compiled with the rows grown on
    it, and the rows it computed (:func:`perfcast.serving.step_rows.harvest`)."""
    from perfcast.serving import step_rows

    have = step_mod.compiled_models()
    before = {dep: (m, [s.rows.grown for s in m.distinct]) for dep, m in have.items()}
    out = _outcomes(spec, items, run_group)
    compiled = [(dep, m.max_tokens, [s.rows.live for s in m.distinct]) for dep, m in have.items()
                if before.get(dep) != (m, [s.rows.grown for s in m.distinct])]   # compiled or grown here
    return out, compiled, step_rows.harvest()


def _take(compiled: list, harvested: dict) -> None:
    """This process's copies of the worker's step models, with the rows it grew, and the rows it
    computed, to be kept (:func:`perfcast.serving.step_rows.adopt`)."""
    from perfcast.serving import step_rows

    for dep, max_tokens, lives in compiled:
        model = step_mod.compile_step(dep, max_tokens=max_tokens)
        for stage, live in zip(model.distinct, lives, strict=True):
            stage.rows.live = live
    step_rows.adopt(harvested)
