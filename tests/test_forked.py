"""forked_map: tasks in forked worker processes — shared workers by default, a process of its own
per task when ``fresh`` (what the validation's serving replay uses, so one group's compiled step
models are freed before the next group runs)."""

import os
from concurrent.futures.process import BrokenProcessPool

import pytest

from perfcast.serving.forked import forked_map


def _pid(item):
    return item * item, os.getpid()


def _dies(item):
    os._exit(3)


def test_fresh_runs_every_task_in_a_process_of_its_own():
    shared = dict(forked_map(_pid, list(range(6)), jobs=2))
    fresh = dict(forked_map(_pid, list(range(6)), jobs=2, fresh=True))
    assert sorted(shared) == sorted(fresh) == list(range(6))
    assert [fresh[i][0] for i in range(6)] == [shared[i][0] for i in range(6)] == [i * i for i in range(6)]
    assert len({pid for _, pid in fresh.values()}) == 6 and os.getpid() not in {pid for _, pid in fresh.values()}
    assert len({pid for _, pid in shared.values()}) <= 2
    one = dict(forked_map(_pid, list(range(3)), jobs=1, fresh=True))  # one at a time, each its own process
    assert len({pid for _, pid in one.values()}) == 3 and os.getpid() not in {pid for _, pid in one.values()}
    assert {pid for _, pid in dict(forked_map(_pid, [0, 1], jobs=1)).values()} == {os.getpid()}


def test_a_task_whose_process_dies_is_an_error_not_a_hang():
    with pytest.raises(BrokenProcessPool):
        dict(forked_map(_dies, [1, 2, 3], jobs=2, fresh=True))
