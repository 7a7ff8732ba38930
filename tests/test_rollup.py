import numpy as np
import pytest
import sympy

from perfcast.hardware import get_device
from perfcast.ir import Graph, Tensor, make_leaf
from perfcast.kernels import get_kernel
from perfcast.perf import AnalyticPerformanceModel
from perfcast.rollup import GuardError, rollup

MODEL = AnalyticPerformanceModel(get_device("h100-sxm"))
FA = get_kernel("flash-attention")


@pytest.fixture(scope="module")
def fa():
    return rollup(FA.graph, MODEL)


def test_time_is_sum_of_leaves_plus_one_launch(fa):
    ev = fa.evaluate(FA.defaults)
    assert fa.launches == 1
    assert ev.time_s == pytest.approx(sum(r["time_s"] for r in ev.leaves.values()) + ev.launch_time_s)
    assert ev.totals["flops.matrix"] == 274_877_906_944
    assert sum(ev.bound_shares().values()) == pytest.approx(1)
    assert ev.provenance_shares() == {"analytic": pytest.approx(1)}


def test_closed_form_matches_evaluate(fa):
    ev = fa.evaluate(FA.defaults)
    exact = MODEL.realize(fa.time_s.xreplace({fa.symbol(k): v for k, v in FA.defaults.items()}))
    assert float(exact) == pytest.approx(ev.time_s, rel=1e-12)


def test_lambdify_matches_evaluate_on_a_grid(fa):
    f = fa.lambdify()
    pts = [dict(FA.defaults, B=b, T_kv=t, kv_blk=k) for b in (1, 8) for t in (1024, 8192) for k in (64, 128)]
    cols = [np.array([p[s] for p in pts]) for s in f.symbols]
    got = f(*cols)
    want = [fa.evaluate(p).time_s for p in pts]
    assert np.allclose(got, want, rtol=1e-9)


def test_guard_rejects_non_integer_trip_counts(fa):
    with pytest.raises(GuardError, match=r"loop q_tiles: trip count T_q/q_blk = 125/4 .* T_q=4000, q_blk=128"):
        fa.evaluate(dict(FA.defaults, T_q=4000))
    f = fa.lambdify()
    cols = [np.array([4000.0 if s == "T_q" else FA.defaults[s]]) for s in f.symbols]
    with pytest.raises(GuardError, match="1 grid points fail"):
        f(*cols)


@pytest.mark.parametrize("bad, message", [
    ({"B": 0}, "B = 0 must be positive"),
    ({"B": 1.5}, "B = 1.5 must be an integer"),
    ({"Z": 1}, "unknown symbol 'Z'"),
])
def test_guard_checks_values(fa, bad, message):
    with pytest.raises(GuardError, match=message):
        fa.evaluate({**FA.defaults, **bad})


def test_missing_value(fa):
    values = dict(FA.defaults)
    values.pop("H")
    with pytest.raises(GuardError, match="no value for H"):
        fa.evaluate(values)


def test_padded_kernel_passes_the_guard():
    from perfcast.dsl import trace

    g = trace(FA.fn, "fa-padded", padded=True)
    r = rollup(g, MODEL)
    ev = r.evaluate(dict(FA.defaults, T_q=4000))
    exact = r.evaluate(dict(FA.defaults, T_q=4096))
    assert ev.totals["flops.matrix"] == exact.totals["flops.matrix"]  # 4000 pads to 32 tiles


def test_standalone_leaves_are_one_launch_each():
    t = Tensor("t", (1024,), "bf16")
    g = Graph("ops", (make_leaf("load", "a", (t,), (t,)), make_leaf("exp", "b", (t,), (t,))))
    r = rollup(g, MODEL)
    assert r.launches == 2
    assert r.launch_time_s == 2 * get_device("h100-sxm").kernel_static_latency_s
    assert isinstance(r.time_s, sympy.Expr)
