"""The screening on two cores (perfcast.search.screening): the same points, the same front, the
same simulations and the same choice as in one process, and an error raised as one process meets it."""

from functools import partial

import pytest

from perfcast.capture.parallel import Layout
from perfcast.ir import UserError
from perfcast.search import screening
from perfcast.search.executor import LocalExecutor
from perfcast.search.optimize import SearchSpec, groups_of, optimize
from perfcast.serving import step as step_mod
from perfcast.serving.types import SLO

SPEC = SearchSpec("llama-3.1-8b", ("h100-sxm",), 4, 1024, 64, SLO(ttft_s=1.0, tpot_s=0.05), batches=(4, 16),
                  modes=("agg", "disagg"))


def _fresh(jobs: int):
    """The search as a new process runs it (every step model loaded again), and the step models
    this process then holds, by deployment, with the size each was compiled for."""
    step_mod._COMPILED.clear()
    result = optimize(SPEC, jobs=jobs)
    return result, {dep: m.max_tokens for dep, m in step_mod._COMPILED.items()}


def test_two_cores_screen_exactly_as_one():
    kinds = {(g[0], g[0] == "agg" and g[3].pp > 1) for g in groups_of(SPEC)}
    assert kinds == {("disagg", False), ("agg", False), ("agg", True)}   # both shares are non-empty
    (one, held_one), (two, held_two) = _fresh(1), _fresh(2)
    assert held_two == held_one   # the worker's step models taken in, each at the size it had
    assert [p.candidate for p in two.points] == [p.candidate for p in one.points]
    assert [(p.status, p.reason) for p in two.points] == [(p.status, p.reason) for p in one.points]
    assert [p.figures() for p in two.points] == [p.figures() for p in one.points]
    assert [p.candidate for p in two.front] == [p.candidate for p in one.front]
    assert [p.figures("simulation") for p in two.points] == [p.figures("simulation") for p in one.points]
    assert two.best.candidate == one.best.candidate and two.rejected == one.rejected


GROUPS = [("agg", "d", None, Layout(tp=1)), ("agg", "d", None, Layout(pp=2)), ("disagg", "d", None, ()),
          ("agg", "d", None, Layout(tp=2)), ("agg", "d", None, Layout(pp=4))]


def _run(bad: tuple, task):
    _, g = task
    if g in bad:
        raise UserError(f"group {GROUPS.index(g)}")
    return [GROUPS.index(g)]


def _failing_at(*bad):
    return partial(_run, bad)   # picklable: the worker receives it


_AT_4 = _failing_at(GROUPS[4])
_AT_3_AND_1 = _failing_at(GROUPS[3], GROUPS[1])
_AT_2_AND_4 = _failing_at(GROUPS[2], GROUPS[4])
_NONE = _failing_at()


@pytest.mark.parametrize("run, first", [(_AT_4, "group 4"), (_AT_3_AND_1, "group 1"), (_AT_2_AND_4, "group 2")])
def test_the_error_raised_is_the_one_one_process_meets_first(run, first):
    # one process runs the disaggregated group first, then the rest in order
    with pytest.raises(UserError, match=first):
        screening.screen(SPEC, GROUPS, run, LocalExecutor(), jobs=2)
    with pytest.raises(UserError, match=first):
        screening.screen(SPEC, GROUPS, run, LocalExecutor(), jobs=1)


def test_every_group_is_screened_once_and_reported_in_order():
    seen = []
    got = screening.screen(SPEC, GROUPS, _NONE, LocalExecutor(), jobs=2, progress=lambda *a: seen.append(a[:2]))
    assert got == {i: [i] for i in range(len(GROUPS))}
    assert seen == [(k, len(GROUPS)) for k in range(1, len(GROUPS) + 1)]
