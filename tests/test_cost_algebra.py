"""Property tests of the cost algebra and the fold."""

import pytest
import sympy
from hypothesis import given, settings
from hypothesis import strategies as st

from perfcast.ir import (
    BYTES_HBM,
    FLOPS_MATRIX,
    FLOPS_VECTOR,
    Cost,
    Graph,
    Loop,
    Tensor,
    cost,
    dim,
    dims,
    link,
    make_leaf,
)
from perfcast.ir.rules import kinds, register, work

B, M, N, K = dims("B M N K")
small = st.integers(min_value=1, max_value=64)


def _matmul():
    a = Tensor("a", (M, K), "bf16")
    b = Tensor("b", (K, N), "bf16")
    out = Tensor("c", (M, N), "bf16")
    return make_leaf("einsum", "mm", (a, b), (out,), equation="mk,kn->mn")


def test_matmul_flops_are_two_mnk():
    # 2*m*n*k = 2*3*7*5 = 210
    assert _matmul().cost[FLOPS_MATRIX].subs({M: 3, N: 7, K: 5}) == 210


def test_cost_rejects_floats_and_unknown_resources():
    with pytest.raises(TypeError):
        Cost({FLOPS_MATRIX: 1.5})
    with pytest.raises(ValueError, match="unknown resource"):
        Cost({"flops.tensor": 1})
    assert link("x") == "bytes.link:x"


def test_duplicate_rule_registration_raises():
    with pytest.raises(ValueError, match="already registered"):
        register("einsum")(lambda i, o, a: Cost())


def test_unknown_leaf_kind_is_an_error_not_zero():
    with pytest.raises(KeyError, match="no rule for leaf kind"):
        work("frobnicate", (), (), {})


@given(n=small, m=small, k=small, nn=small)
def test_loop_costs_n_times_its_body(n, m, k, nn):
    leaf = _matmul()
    loop = Loop("l", dim("n"), Graph("body", (leaf,)), kind="map")
    rolled = cost(loop).subs({dim("n"): n, M: m, K: k, N: nn})
    assert rolled == cost(leaf).subs({M: m, K: k, N: nn}) * n


@given(a=small, b=small)
def test_addition_is_commutative_and_zero_is_neutral(a, b):
    x = Cost({FLOPS_VECTOR: a * B, BYTES_HBM: b})
    y = Cost({FLOPS_VECTOR: b, FLOPS_MATRIX: a * M})
    assert x + y == y + x
    assert x + Cost() == x


@given(m=small, n=small, k=small)
def test_substitution_commutes_with_pricing(m, n, k):
    from perfcast.hardware import get_device
    from perfcast.perf import AnalyticPerformanceModel

    model = AnalyticPerformanceModel(get_device("h100-sxm"))
    leaf = _matmul()
    point = {M: m, N: n, K: k}
    concrete = make_leaf("einsum", "mm", tuple(Tensor(t.name, [d.subs(point) for d in t.shape], t.dtype)
                                                  for t in leaf.inputs),
                         tuple(Tensor(t.name, [d.subs(point) for d in t.shape], t.dtype) for t in leaf.outputs),
                         equation="mk,kn->mn")
    symbolic_then_subs = model.realize(model.process_op(leaf).time_s.subs(point))
    assert sympy.nsimplify(symbolic_then_subs - model.process_op(concrete).time_s) == 0


@settings(max_examples=50)
@given(dims_=st.lists(small, min_size=1, max_size=4), kind=st.sampled_from(
    ["load", "store", "add", "sub", "mul", "div", "maximum", "exp", "sum", "max", "fill"]))
def test_every_rule_is_non_negative_on_valid_dims(dims_, kind):
    t = Tensor("x", tuple(dims_), "bf16")
    inputs = {"load": (t,), "store": (t,), "fill": ()}.get(kind, (t, t) if kind in
                                                        ("add", "sub", "mul", "div", "maximum") else (t,))
    c = work(kind, inputs, (t,), {})
    assert all(v >= 0 for v in c.values())
    assert kind in kinds()
