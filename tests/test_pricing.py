import pytest
import sympy

from perfcast.hardware import get_device
from perfcast.ir import Cost, Tensor, dim, hw, make_leaf
from perfcast.perf import AnalyticPerformanceModel, Provenance
from perfcast.perf.efficiency import Efficiency

H100 = get_device("h100-sxm")


def load(nbytes):
    t = Tensor("t", (nbytes // 2,), "bf16")
    return make_leaf("load", "ld", (t,), (t,))


def test_memory_bound_leaf_uses_bandwidth_and_efficiency():
    model = AnalyticPerformanceModel(H100)
    r = model.process_op(load(2**30))
    eff = model.efficiencies["memory"].at(sympy.Integer(2**30))
    assert r.time_s == sympy.Integer(2**30) / (H100.hbm_bandwidth_bytes_per_s * eff)
    assert r.source is Provenance.ANALYTIC
    assert set(r.breakdown) == {"memory.hbm"}


def test_efficiency_is_piecewise_linear_and_flat_at_the_ends():
    e = Efficiency("memory", H100.efficiency("memory"))
    (x0, e0), (x1, e1) = H100.efficiency("memory").points[:2]
    mid = (sympy.Rational(repr(x0)) + sympy.Rational(repr(x1))) / 2
    assert e.at(mid) == (sympy.Rational(repr(e0)) + sympy.Rational(repr(e1))) / 2
    assert e.at(sympy.Integer(1)) == sympy.Rational(repr(e0))
    assert e.at(sympy.Integer(10**15)) == sympy.Rational(repr(H100.efficiency("memory").points[-1][1]))
    n = dim("n")
    assert e(n).func.__name__ == "eff_memory"  # opaque in closed forms
    assert e.realize(e(n).subs(n, mid)) == e.at(mid)


def test_uncalibrated_units_are_priced_at_peak_and_reported():
    model = AnalyticPerformanceModel(get_device("tpu-v5e"))
    assert model.uncalibrated() == ["matrix", "vector", "memory"]
    assert model.efficiencies["matrix"](dim("n")) == 1


def test_kernel_size_drives_efficiency_not_tile_size():
    model = AnalyticPerformanceModel(H100)
    tile = load(2**20)
    alone = model.process_op(tile).time_s
    inside = model.process_op(tile, kernel=Cost({"bytes.hbm": 2**31})).time_s
    assert inside < alone


def test_symbolic_hardware_parameter():
    model = AnalyticPerformanceModel(H100, symbolic=["hbm_bandwidth_bytes_per_s"])
    t = model.process_op(load(2**30)).time_s
    bw = hw("hbm_bandwidth_bytes_per_s")
    assert t.free_symbols == {bw}
    assert sympy.diff(t, bw) == -t / bw
    with pytest.raises(ValueError, match="unknown hardware parameter"):
        AnalyticPerformanceModel(H100, symbolic=["warp_speed"])


def test_compute_bound_matmul_and_launch_overhead():
    model = AnalyticPerformanceModel(H100)
    a = Tensor("a", (8192, 8192), "bf16")
    mm = make_leaf("einsum", "mm", (a, a), (a,), equation="mk,kn->mn")
    r = model.process_op(mm)
    flops = 2 * 8192**3
    eff = model.efficiencies["matrix"].at(sympy.Integer(flops))
    assert r.breakdown["compute"] == flops / (H100.matrix_flops_per_s("bf16") * eff)
    assert r.time_s == r.breakdown["compute"]
    assert model.launch_overhead().time_s == H100.kernel_static_latency_s


def test_link_traffic_needs_a_topology():
    leaf = load(2)
    object.__setattr__(leaf, "cost", Cost({"bytes.link:x": 10}))
    with pytest.raises(ValueError, match="needs a topology"):
        AnalyticPerformanceModel(H100).process_op(leaf)
