"""The step-model cache: a new process prices steps exactly as the compiling one did, without
capturing; a damaged or foreign entry is a miss and never runs code."""

import json
import random
from unittest import mock

import numpy as np
import pytest
import sympy

from perfcast.capture.cache import write_entry
from perfcast.ir.errors import UserError
from perfcast.serving import memory as memory_mod
from perfcast.serving import step_cache
from perfcast.serving.memory import memory_of
from perfcast.serving.step import Deployment, StepModel
from perfcast.serving.step_cache import Unreadable, compiled
from perfcast.serving.types import Chunk, Mix

DEP = Deployment("llama-3.1-8b", "h100-sxm", "trtllm")
MAX = 2048


def _mixes(n=400):
    rng = random.Random(7)
    out = []
    for _ in range(n):
        d = rng.randint(0, 64)
        ch = tuple(Chunk(rng.randint(1, 700), rng.randint(0, 3000)) for _ in range(rng.randint(0, 2)))
        if d or ch:
            out.append(Mix(d, d * rng.randint(1, 6000), ch))
    return [m for m in out if m.tokens <= MAX]


def _prices(model: StepModel) -> list[float]:
    many = model.step_many([1, 8, 0, 30], [100, 8 * 999, 0, 30 * 70], [0, 0, 256, 31], [0, 0, 0, 500])
    return [model.step_s(m) for m in _mixes()] + many.tolist()


@pytest.fixture(scope="module")
def cached(tmp_path_factory):
    """(the freshly compiled model, the cache dir it wrote)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("xdg")))
        fresh = StepModel(DEP, max_tokens=MAX)
        yield fresh, step_cache.cache_dir()


def _no_capture():
    boom = AssertionError("captured although the step cache holds the model")
    return mock.patch("perfcast.capture.cache.symbolic_capture", side_effect=boom)


def _entry(d):
    (path,) = d.glob("step-*.json.gz")
    return path


def test_a_cached_step_model_prices_every_mix_exactly_as_the_compiled_one(cached, monkeypatch):
    fresh, d = cached
    monkeypatch.setenv("XDG_CACHE_HOME", str(d.parent.parent))
    with _no_capture():
        back = StepModel(DEP, max_tokens=MAX)
    assert _prices(back) == _prices(fresh)
    assert (back._dense_decode, back._dense_prefill, back._head) == \
        (fresh._dense_decode, fresh._dense_prefill, fresh._head)
    assert back.unpriced == fresh.unpriced
    assert [t for _, t in back._decode.values()] == [t for _, t in fresh._decode.values()]


def test_another_deployment_or_size_is_another_entry(cached):
    fresh, _ = cached
    proto = fresh.proto
    keys = [step_cache.key_of("step", DEP, proto, MAX), step_cache.key_of("step", DEP, proto, MAX + 1),
            step_cache.key_of("step", Deployment(DEP.model, DEP.device, DEP.engine, what_if=(("hbm_bandwidth", 2.0),)),
                              proto, MAX),
            step_cache.key_of("memory", DEP, proto, MAX)]
    assert len({json.dumps(k, sort_keys=True) for k in keys}) == 4
    assert len({step_cache.entry_path(k) for k in keys}) == 4


def _short(table: str) -> str:
    """A packed table one float short, still valid base64."""
    import base64

    return base64.b64encode(base64.b64decode(table)[:-8]).decode()


def test_an_entry_of_the_previous_format_is_refused_before_its_fields_are_read(cached, monkeypatch, tmp_path):
    # format 2 kept the tables as JSON lists of floats; its entries are refused by their header
    import gzip

    fresh, d = cached
    target = tmp_path / "xdg" / "perfcast" / "steps"
    target.mkdir(parents=True)
    doc = json.loads(gzip.decompress(_entry(d).read_bytes()))
    doc["format"] = 2
    for k in ("dense_decode", "dense_prefill", "head"):
        doc["step"][k] = [0.0] * (MAX + 1)
    write_entry(target / _entry(d).name, doc)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    with pytest.raises(Unreadable, match="kind and format"):
        step_cache.read_entry(target / _entry(d).name, step_cache.MAGIC, step_cache.FORMAT, doc["key"], "step")
    assert _prices(StepModel(DEP, max_tokens=MAX)) == _prices(fresh)


def _rewritten(path, edit):
    """The entry at ``path`` with ``edit(body)`` applied, written back in the cache format."""
    import gzip

    doc = json.loads(gzip.decompress(path.read_bytes()))
    edit(doc["step"])
    write_entry(path, doc)


@pytest.mark.parametrize("edit", [
    lambda b: b["decode"][0].update(attention="def f(B, C):\n    return __import__('os').system('touch PWNED')\n"),
    lambda b: b["decode"][0].update(attention="def f(B, C):\n    return B.__class__\n"),
    lambda b: b["prefill"][0].update(dense="import os\n"),
    lambda b: b["decode"][0].update(dense="def f(B):\n    return open('x')\n"),
    lambda b: b.update(dense_decode=_short(b["dense_decode"])),
    lambda b: b.update(head=b["head"][:-4]),
    lambda b: b.update(dense_prefill="not base64!" + b["dense_prefill"]),
    lambda b: b.update(dense_decode=[0.0] * (MAX + 1)),
    lambda b: b["decode"][0].update(runs=[[1, 1], [1, 1], [3, 3]]),
    lambda b: b.update(fits=["no/such_fit"]),
    lambda b: b.pop("head"),
], ids=["import", "attribute", "statement", "builtin", "short-table", "cut-table", "not-base64", "float-list-table",
        "repeated-runs", "unknown-fit", "missing-field"])
def test_a_tampered_entry_is_a_miss_compiled_anew_and_runs_no_code(cached, monkeypatch, tmp_path, edit):
    fresh, d = cached
    xdg = tmp_path / "xdg"
    (xdg / "perfcast").mkdir(parents=True)
    target = xdg / "perfcast" / "steps"
    target.mkdir()
    entry = _entry(d)
    (target / entry.name).write_bytes(entry.read_bytes())
    _rewritten(target / entry.name, edit)
    monkeypatch.setenv("XDG_CACHE_HOME", str(xdg))
    monkeypatch.chdir(tmp_path)
    again = StepModel(DEP, max_tokens=MAX)
    assert not (tmp_path / "PWNED").exists()
    assert _prices(again) == _prices(fresh)
    with _no_capture():   # the miss overwrote the entry with a good one
        assert _prices(StepModel(DEP, max_tokens=MAX)) == _prices(fresh)


def test_a_cut_short_entry_is_a_miss(cached, monkeypatch, tmp_path):
    fresh, d = cached
    target = tmp_path / "xdg" / "perfcast" / "steps"
    target.mkdir(parents=True)
    data = _entry(d).read_bytes()
    (target / _entry(d).name).write_bytes(data[: len(data) // 2])
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert _prices(StepModel(DEP, max_tokens=MAX)) == _prices(fresh)


def test_the_memory_report_is_kept_too(cached, monkeypatch):
    _, d = cached
    monkeypatch.setenv("XDG_CACHE_HOME", str(d.parent.parent))
    memory_of.cache_clear()
    first = memory_of(DEP, 1024)
    memory_of.cache_clear()
    with mock.patch.object(memory_mod, "simulate", side_effect=AssertionError("simulated again")):
        assert memory_of(DEP, 1024) == first


def test_the_source_check_takes_what_lambdify_prints_and_nothing_else():
    B, C = sympy.symbols("B C", positive=True)
    expr = sympy.Max(1, sympy.floor(33 / B)) * C + sympy.Min(B, 64) + sympy.log(C + 1) + sympy.Rational(1, 3)
    fn = sympy.lambdify((B, C), expr, modules="numpy")
    back = compiled(step_cache.source_of(fn), {})
    x = np.array([1.0, 7.0, 100.0])
    assert np.array_equal(back(x, 5 * x), fn(x, 5 * x))
    for bad in ("def f(B):\n    return B.real\n", "def f(B):\n    return 'a'\n", "def f(B):\n    return eval('1')\n",
                "def f(B):\n    x = 1\n    return x\n", "def f(B=1):\n    return B\n", "f = 1\n",
                "def f(B):\n    return (lambda: 1)()\n", "def f(B):\n    return [i for i in B]\n",
                "def f(B):\n    return B[0]\n", "def f(*B):\n    return B\n", "def f(B, *, C):\n    return B\n",
                "def f(B):\n    return (yield B)\n", "async def f(B):\n    return B\n", "def f(B):\n    return True\n",
                "def f(B):\n    return (x := B)\n", "def f(B):\n    'doc'\n    return B\n",
                "def f(B):\n    return B\ndef g(B):\n    return B\n", "@max\ndef f(B):\n    return B\n",
                "def f(B: 'int'):\n    return B\n", "import os\ndef f(B):\n    return B\n",
                "def f(B):\n    return {B: 1}\n", "def f(B):\n    return B if B else b'x'\n",
                "def f(B):\n    return max(B, key=abs)\n"):
        with pytest.raises(Unreadable):
            compiled(bad, {})


def test_ops_without_a_cost_rule_are_named_in_the_serving_notes(cached, monkeypatch):
    import copy
    from collections import Counter

    from perfcast.serving import serve as serve_mod
    from perfcast.serving.serve import ServeSpec, serve
    from perfcast.serving.workload import Lengths, Workload

    fresh, _ = cached
    assert serve_mod.unpriced_note(fresh) is None   # the catalog's models have a rule for every op
    model = copy.copy(fresh)
    model.unpriced = Counter({("aten.mystery", "4x8"): 2})
    monkeypatch.setattr(serve_mod, "compile_step", lambda dep, max_tokens: model)
    rep = serve(ServeSpec(DEP, Workload(Lengths("fixed", 128), Lengths("fixed", 16), num_requests=8, concurrency=4),
                          tier="closed-form"))
    assert "step: 2 op call(s) with no cost rule, priced at ZERO: aten.mystery (4x8) ×2" in rep.notes


def test_a_decode_only_price_without_a_mix_is_the_mix_price(cached):
    # StepModel.decode_s is what the simulation's fast-forward calls per step
    fresh, _ = cached
    rng = random.Random(3)
    pts = [(d, d * rng.randint(1, 9000)) for d in (rng.randint(1, MAX) for _ in range(300))] + [(0, 0), (1, 1)]
    assert [fresh.decode_s(d, c) for d, c in pts] == [fresh.step_s(Mix(d, c)) for d, c in pts]
    with pytest.raises(UserError, match="exceeds"):
        fresh.decode_s(MAX + 1, 10)


def test_the_package_digest_is_kept_and_hashed_again_when_a_file_changes(monkeypatch, tmp_path):
    import gzip

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    step_cache.package_digest.cache_clear()
    first = step_cache.package_digest()
    (kept,) = step_cache.cache_dir().glob("package-digest*")
    step_cache.package_digest.cache_clear()
    with mock.patch("hashlib.sha256", side_effect=AssertionError("hashed although the digest was kept")):
        assert step_cache.package_digest() == first   # every file's size and time as they were
    doc = json.loads(gzip.decompress(kept.read_bytes()))
    doc["key"]["files"][0][2] += 1                       # one file's modification time differs
    doc["digest"] = "0" * 64
    write_entry(kept, doc)
    step_cache.package_digest.cache_clear()
    assert step_cache.package_digest() == first          # hashed again, not the kept one
    step_cache.package_digest.cache_clear()
