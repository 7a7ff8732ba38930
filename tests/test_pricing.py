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
    model = AnalyticPerformanceModel(get_device("cpu-local"))  # measured here, lends from no one
    assert model.uncalibrated() == ["matrix", "vector", "memory"]
    assert model.efficiencies["matrix"](dim("n")) == 1


def test_a_device_without_measurements_borrows_the_nearest_calibrated_curves():
    tpu = get_device("tpu-v5e")
    # 197 TFLOP/s bf16 and 0.82 TB/s: the A100's (312, 2.04) are the nearest in log space
    assert tpu.lender == "a100-sxm-80gb" and tpu.spec.calibration.efficiency.matrix is None
    assert tpu.efficiency("matrix") == get_device("a100-sxm-80gb").efficiency("matrix")
    assert AnalyticPerformanceModel(tpu).uncalibrated() == ["vector"]  # the lender has no vector curve


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
    x = Tensor("x", (1 << 20,), "bf16")
    leaf = make_leaf("all_reduce", "ar", (x,), (x,), axis="tp", group_size=8)
    with pytest.raises(ValueError, match="over mesh axis 'tp' needs a topology"):
        AnalyticPerformanceModel(H100).process_op(leaf)


def test_collective_leaf_on_a_mesh():
    """A tp all-reduce inside a node and a dp all-reduce across nodes, priced on hgx-h100."""
    from perfcast.hardware.topology import Mesh, get_topology
    from perfcast.perf.collectives import span_costs

    topo = get_topology("hgx-h100").with_devices(32)
    mesh = Mesh.ordered(topo, (("tp", 8), ("dp", 4)))
    model = AnalyticPerformanceModel(H100, mesh=mesh)
    x = Tensor("x", (1 << 24,), "bf16")  # 32 MiB
    tp = model.process_op(make_leaf("all_reduce", "ar", (x,), (x,), axis="tp", group_size=8))
    dp = model.process_op(make_leaf("all_reduce", "ar", (x,), (x,), axis="dp", group_size=4))
    assert tp.time_s == min(c.time_s for c in span_costs("all_reduce", 1 << 25, [(topo.tiers[0], 8)]))
    assert dp.time_s == min(c.time_s for c in span_costs("all_reduce", 1 << 25, [(topo.tiers[1], 4)]))
    assert set(tp.breakdown) == {"comm.tp"} and dp.time_s > 3 * tp.time_s  # one IB NIC vs 18 NVLinks
    assert "over dp(4)" in dp.notes[0]
    sym = sympy.Symbol("n", positive=True, integer=True)
    r = model.process_op(make_leaf("all_gather", "ag", (Tensor("y", (sym,), "bf16"),),
                                   (Tensor("z", (sym,), "bf16"),), axis="tp", group_size=8))
    # on a switch only the ring applies, once per protocol the tier calibrates for all-gather:
    # α₀ + 7 steps of α + 7/8 of 2n bytes over 18 links of 25 GB/s times the efficiency; at a
    # symbolic size the model keeps the Min of the protocols
    tier = topo.tiers[0]
    rings = [(c.base_latency_s + 7 * (tier.link_latency_s if c.latency_s is None else c.latency_s)
              + sympy.Rational(7, 8) * 2 * sym / (18 * 25 * 10**9 * c.bandwidth_efficiency))
             for c in tier.calibrated("all_gather")]
    assert len(rings) == 2 and r.time_s == sympy.Min(*rings)
    assert "cheapest of ring/ll, ring/simple" in r.notes[0]
    wide = AnalyticPerformanceModel(H100, mesh=Mesh.ordered(topo, (("dp", 32),)))
    r = wide.process_op(make_leaf("all_reduce", "ar", (Tensor("y", (sym,), "bf16"),),
                                  (Tensor("z", (sym,), "bf16"),), axis="dp", group_size=32))
    # Min(hierarchical, flat ring per protocol); at 32 MiB the hierarchical form is the cheapest
    hier, *flat = span_costs("all_reduce", 2 * sym, topo.span(32))
    assert hier.algorithm == "hierarchical" and [c.algorithm for c in flat] == ["ring/ll", "ring/simple"]
    assert r.time_s == sympy.Min(hier.time_s, *(c.time_s for c in flat))
    assert r.time_s.subs(sym, 1 << 24) == hier.time_s.subs(sym, 1 << 24)
    assert "cheapest of hierarchical, ring/ll, ring/simple" in r.notes[0]
