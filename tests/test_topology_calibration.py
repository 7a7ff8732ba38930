"""The NVLink calibration of the HGX topologies: per-call and per-step latency, one option per
protocol, applied by topology_cost; strict in the YAML."""

import json
from pathlib import Path

import pytest
import sympy
import yaml

from perfcast.hardware.spec import SpecError
from perfcast.hardware.topology import Calibration, Tier, get_topology, load_topology_file
from perfcast.ir.errors import UserError
from perfcast.perf.collectives import costs, topology_cost

FITTED = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")
LB = 18 * 25_000_000_000  # 18 NVLinks of 25e9 B/s per direction


def nvlink(name):
    return next(t for t in get_topology(name).tiers if t.name == "nvlink")


def protocols(op, name="hgx-h200"):
    return {c.protocol: c for c in nvlink(name).calibrated(op)}


def test_every_fitted_op_has_a_low_latency_and_a_full_bandwidth_protocol():
    for op in FITTED:
        p = protocols(op)
        assert list(p) == ["ll", "simple"]
        # ll: lower bandwidth, shorter start; simple: more bandwidth, longer start
        assert 0 < p["ll"].bandwidth_efficiency < p["simple"].bandwidth_efficiency <= 1
        assert p["ll"].base_latency_s < p["simple"].base_latency_s
        assert all(c.latency_s is not None and c.latency_s >= 0 for c in p.values())


def test_small_all_reduce_runs_ll_large_runs_simple_with_their_exact_forms():
    topo = get_topology("hgx-h200")
    p = protocols("all_reduce")
    # α₀ + 2·((N−1)·α + (N−1)/N·V/(L·B·eff)), N = 8
    def ring(c, v):
        return c.base_latency_s + 2 * (7 * c.latency_s + sympy.Rational(7, 8) * v / (LB * c.bandwidth_efficiency))

    small, large = 1024, 256 << 20
    c = topology_cost("all_reduce", small, topo, group_size=8)
    assert c.algorithm == "ring/ll" and c.time_s == ring(p["ll"], small)
    assert c.formula == "α₀ + 2·((N−1)·α + (N−1)/N·V/(L·B))"
    assert ring(p["ll"], small) < ring(p["simple"], small)
    c = topology_cost("all_reduce", large, topo, group_size=8)
    assert c.algorithm == "ring/simple" and c.time_s == ring(p["simple"], large)
    assert ring(p["simple"], large) < ring(p["ll"], large)
    # the datasheet ring (α = 2 µs per step, no per-call latency, full link bandwidth) is faster
    datasheet = 2 * (7 * sympy.Rational(2, 10**6) + sympy.Rational(7, 8) * large / LB)
    assert c.time_s > datasheet


def test_options_are_per_algorithm_and_protocol_and_can_be_forced():
    topo = get_topology("hgx-h200")
    tier = topo.tiers[0]
    assert [c.algorithm for c in costs("all_to_all", 1 << 20, tier)] == [
        "direct/ll", "direct/simple", "ring/ll", "ring/simple"]
    v = 1 << 30
    best = topology_cost("all_gather", v, topo, algorithm="ring")  # the ring's cheapest protocol
    assert best.algorithm == "ring/simple"
    forced = topology_cost("all_gather", v, topo, algorithm="ring/ll")
    assert forced.algorithm == "ring/ll" and forced.time_s > best.time_s
    with pytest.raises(UserError, match="available: ring/ll, ring/simple"):
        topology_cost("all_gather", v, topo, algorithm="multiport")


def test_symbolic_sizes_keep_every_protocol():
    v = sympy.Symbol("V", positive=True)
    options = costs("reduce_scatter", v, get_topology("hgx-h200").tiers[0])
    p = protocols("reduce_scatter")
    assert [o.time_s for o in options] == [
        p[k].base_latency_s + 7 * p[k].latency_s + sympy.Rational(7, 8) * v / (LB * p[k].bandwidth_efficiency)
        for k in ("ll", "simple")]


def test_h200_uses_the_h100_fit_and_unfitted_ops_keep_the_datasheet():
    h100, h200 = nvlink("hgx-h100"), nvlink("hgx-h200")
    for op in FITTED:
        assert h200.calibrated(op) == h100.calibrated(op)
    assert h200.calibrated("broadcast") == (Calibration(),)  # not fitted: datasheet figures
    c = topology_cost("broadcast", 1 << 20, get_topology("hgx-h200"))
    assert c.algorithm in ("tree", "ring") and "α₀" not in c.formula
    ib = next(t for t in get_topology("hgx-h200").tiers if t.name == "infiniband")
    assert ib.calibration == ()
    sources = yaml.safe_load(Path(get_topology("hgx-h200").path).read_text())["calibration_sources"]
    assert all(s.startswith("H100 fit applied unchanged") and "H100 |error| median" in s
               for s in sources.values())


def test_a_single_calibration_with_a_per_call_latency():
    # α₀ + (N−1)·α + (N−1)/N·V/(L·B·eff) = 3e-6 + 3·1e-6 + 3/4·4e9/(1e9·1/2) = 6.000006 s
    half = sympy.Rational(1, 2)
    cal = Calibration(half, sympy.Rational(1, 10**6), sympy.Rational(3, 10**6))
    tier = Tier("t", "ring", (4,), sympy.Integer(10**9), sympy.Rational(2, 10**6), calibration=(("all_gather", (cal,)),))
    c = costs("all_gather", 4 * 10**9, tier)[0]
    assert c.algorithm == "ring" and c.formula == "α₀ + (N−1)·α + (N−1)/N·V/B"
    assert c.time_s == sympy.Rational(3, 10**6) + 3 * sympy.Rational(1, 10**6) + sympy.Rational(3, 4) * 4 * 10**9 / (10**9 * half)
    assert c.time_s == sympy.Rational(6000006, 10**6)
    with pytest.raises(UserError, match="one per distinctly named protocol"):
        Tier("t", "ring", (4,), sympy.Integer(1), calibration=(("all_gather", (cal, cal)),))


def test_cli_and_analytic_notes_name_the_protocol(cli):
    doc = json.loads(cli("collective", "all_reduce", "--topology", "hgx-h200", "--bytes", "1024", "--json",
                         check=True).stdout)
    assert doc["algorithm"] == "ring/ll" and doc["formula"].startswith("α₀ + ")
    doc = json.loads(cli("collective", "all_reduce", "--topology", "hgx-h200", "--bytes", "1e9", "--json",
                         check=True).stdout)
    assert doc["algorithm"] == "ring/simple"
    from perfcast.hardware import get_device
    from perfcast.hardware.topology import Mesh
    from perfcast.ir import Tensor, make_leaf
    from perfcast.perf import AnalyticPerformanceModel

    model = AnalyticPerformanceModel(get_device("h200-sxm"), mesh=Mesh.ordered(get_topology("hgx-h200"), (("tp", 8),)))
    x = Tensor("x", (512,), "bf16")
    r = model.process_op(make_leaf("all_reduce", "ar", (x,), (x,), axis="tp", group_size=8))
    assert r.notes[0].startswith("all_reduce over tp(8): ring/ll — α₀ + ")


def _broken(tmp_path: Path, edit) -> Path:
    doc = yaml.safe_load(Path(get_topology("hgx-h200").path).read_text())
    edit(doc)
    path = tmp_path / "hgx-h200.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def _ar(d):
    return d["tiers"][0]["calibration"]["all_reduce"]


@pytest.mark.parametrize("edit, key", [
    (lambda d: _ar(d)["protocols"]["ll"].update(bandwidth_efficiency=1.2),
     "key 'tiers.0.calibration.all_reduce.protocols.ll.bandwidth_efficiency'"),
    (lambda d: d["tiers"][0]["calibration"]["all_gather"]["protocols"]["simple"].update(latency_s=-1e-6),
     "key 'tiers.0.calibration.all_gather.protocols.simple.latency_s'"),
    (lambda d: _ar(d)["protocols"]["simple"].update(base_latency_s=-1e-6),
     "key 'tiers.0.calibration.all_reduce.protocols.simple.base_latency_s'"),
    (lambda d: _ar(d)["protocols"]["ll"].update(base_latency_s="5 us"),
     "key 'tiers.0.calibration.all_reduce.protocols.ll.base_latency_s'"),
    (lambda d: _ar(d)["protocols"]["ll"].update(gossip=1.0),
     "key 'tiers.0.calibration.all_reduce.protocols.ll.gossip': unknown key"),
    (lambda d: _ar(d)["protocols"].update({"LL-128": {"bandwidth_efficiency": 0.5}}),
     "key 'tiers.0.calibration.all_reduce.protocols.LL-128"),
    (lambda d: _ar(d).update(base_latency_s=1e-6),
     "key 'tiers.0.calibration.all_reduce.base_latency_s': give the figures once or per protocol"),
    (lambda d: _ar(d).update(protocols={}),
     "key 'tiers.0.calibration.all_reduce.protocols'"),
    (lambda d: d["tiers"][0]["calibration"].update(broadcast={"base_latency_s": -1.0}),
     "key 'tiers.0.calibration.broadcast.base_latency_s'"),
    (lambda d: d["calibration_sources"].pop("nvlink.reduce_scatter"),
     "key 'calibration_sources.nvlink.reduce_scatter': missing source"),
    (lambda d: d["calibration_sources"].update({"nvlink.broadcast": "made up"}),
     "key 'calibration_sources.nvlink.broadcast': source given for unknown value"),
    (lambda d: d["tiers"][0]["calibration"].update(gossip={"bandwidth_efficiency": 0.5}),
     "key 'tiers.0.calibration.gossip"),
])
def test_malformed_calibration_is_a_one_line_error(tmp_path, edit, key):
    path = _broken(tmp_path, edit)
    with pytest.raises(SpecError) as err:
        load_topology_file(path)
    assert key in str(err.value) and str(path) in str(err.value)
    assert "\n" not in str(err.value)


def test_a_calibrated_op_without_protocols_loads(tmp_path):
    def flat(d):
        d["tiers"][0]["calibration"]["all_reduce"] = {"bandwidth_efficiency": 0.5, "latency_s": 0.0,
                                                      "base_latency_s": 5e-6}
    (cal,) = next(t for t in load_topology_file(_broken(tmp_path, flat)).tiers
                  if t.name == "nvlink").calibrated("all_reduce")
    assert cal == Calibration(sympy.Rational(1, 2), sympy.Integer(0), sympy.Rational(5, 10**6))


def test_b200_fit_prices_its_nccl_rows_and_the_datasheet_alone_does_not():
    """HGX B200's NVLink tier fitted on the B200 NCCL table (``tools/calibrate_collectives.py
    --system b200_sxm``), in sample: ``benchmarks/nccl_accuracy.py --device b200-sxm``."""
    import importlib.util

    import numpy as np

    path = Path(__file__).resolve().parent.parent / "benchmarks" / "nccl_accuracy.py"
    spec = importlib.util.spec_from_file_location("nccl_accuracy", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    errs = bench.errors(device="b200-sxm")
    overall = {k: np.abs(np.concatenate([errs[op][k] for op in bench.OPS])) for k in ("calibrated", "datasheet")}
    assert len(overall["calibrated"]) == 378
    assert round(float(np.median(overall["calibrated"])) * 100, 1) == 5.7
    assert round(float(np.median(overall["datasheet"])) * 100, 1) == 48.9
    assert {p.protocol for p in nvlink("hgx-b200").calibrated("all_gather")} == {"ll", "simple"}
