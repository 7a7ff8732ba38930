"""The attention rows kept in the step cache: a later process prices every step exactly as one that
computed its rows itself, takes a kept row only for the very call it stands for (its part, batch,
chunk and length), and reads a damaged rows entry as none."""

import gzip
import json
import random

import pytest

from perfcast.capture.cache import write_entry
from perfcast.serving import step_rows
from perfcast.serving.step import Deployment, StepModel
from perfcast.serving.types import Chunk, Mix

DEP = Deployment("llama-3.1-8b", "h100-sxm", "trtllm")
MAX = 2048


def _mixes(seed: int, n: int = 300) -> list[Mix]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        d = rng.randint(0, 64)
        ch = tuple(Chunk(rng.randint(1, 700), rng.randint(0, 3000)) for _ in range(rng.randint(0, 2)))
        if (d or ch) and d + sum(c.tokens for c in ch) <= MAX:
            out.append(Mix(d, d * rng.randint(1, 6000), ch))
    return out


def _prices(model: StepModel, seed: int) -> list[float]:
    return [model.step_s(m) for m in _mixes(seed)]


@pytest.fixture()
def xdg(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    step_rows.harvest()   # rows other tests' step models computed in this process: not written here
    return tmp_path


def _rows_entries(xdg):
    return sorted((xdg / "perfcast" / "steps").glob("step.rows-*.json.gz"))


def test_kept_rows_price_exactly_as_computed_ones(xdg):
    first = StepModel(DEP, max_tokens=MAX)
    want = _prices(first, 1)
    assert first.rows.new and not _rows_entries(xdg)
    step_rows.flush()
    (entry,) = _rows_entries(xdg)
    again = StepModel(DEP, max_tokens=MAX)
    assert _prices(again, 1) == want
    assert not again.rows.new and again.rows.used == set(first.rows.kept)   # every row read, none computed
    # another process's mixes: the kept rows it can take, the others computed, the same prices
    fresh, other = StepModel(DEP, max_tokens=MAX), _prices(StepModel(DEP, max_tokens=MAX), 2)
    fresh.rows._kept = {}
    assert _prices(fresh, 2) == other
    assert entry.exists()


def test_a_kept_row_is_taken_only_at_its_own_length():
    calls = []
    rows = step_rows.Rows(None)
    rows._kept = {(0, 3, 0, 64): [7.0] * 64}

    def fn(grid):
        calls.append(len(grid))
        return grid * 0 + 1.0

    assert rows.at((0, 3, 0), 10.0, fn) == 7.0 and calls == []          # 64 points: the kept row
    assert rows.at((0, 3, 0), 64 * 16.0, fn) == 1.0 and calls == [128]  # grown to 128: computed
    assert rows.at((0, 4, 0), 10.0, fn) == 1.0 and calls == [128, 64]   # another batch: computed


def _worker_prices(seed: int) -> list[float]:
    from perfcast.serving.step import compile_step

    return _prices(compile_step(DEP, max_tokens=MAX), seed)


def test_rows_computed_in_forked_workers_are_kept_by_the_parent(xdg):
    from perfcast.serving import step as step_mod
    from perfcast.serving.forked import forked_map

    step_mod._COMPILED.pop(DEP, None)
    parent = step_mod.compile_step(DEP, max_tokens=MAX)   # the workers inherit it, no rows grown yet
    got = dict(forked_map(_worker_prices, [4, 5], jobs=2, fresh=True, rows=True))   # a process each
    assert not parent.rows.live                          # grown in the workers only
    assert _rows_entries(xdg)
    for i, seed in enumerate((4, 5)):   # a process pricing as a worker did reads every row, computes none
        again = StepModel(DEP, max_tokens=MAX)
        assert _prices(again, seed) == got[i]
        assert not again.rows.new and again.rows.used
    step_mod._COMPILED.pop(DEP, None)


@pytest.mark.parametrize("edit", [
    lambda r: r.update(data=r["data"][:-4]),
    lambda r: r.update(data=r["data"][8:]),
    lambda r: r["keys"][0].__setitem__(-1, r["keys"][0][-1] + 1),
    lambda r: r["keys"][0].__setitem__(1, 2.5),
    lambda r: r["keys"].append([0, 1, 2]),
    lambda r: r.pop("keys"),
], ids=["cut-data", "short-data", "wrong-length", "float-key", "short-key", "missing-field"])
def test_a_damaged_rows_entry_is_read_as_none(xdg, edit):
    first = StepModel(DEP, max_tokens=MAX)
    want = _prices(first, 3)
    step_rows.flush()
    (entry,) = _rows_entries(xdg)
    doc = json.loads(gzip.decompress(entry.read_bytes()))
    edit(doc["rows"])
    write_entry(entry, doc)
    again = StepModel(DEP, max_tokens=MAX)
    assert again.rows.kept == {}
    assert _prices(again, 3) == want
