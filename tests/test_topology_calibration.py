"""The NVLink calibration of the HGX topologies: applied by topology_cost, strict in the YAML."""

from pathlib import Path

import pytest
import sympy
import yaml

from perfcast.hardware.spec import SpecError
from perfcast.hardware.topology import get_topology, load_topology_file
from perfcast.perf.collectives import topology_cost

FITTED = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")


def nvlink(name):
    return next(t for t in get_topology(name).tiers if t.name == "nvlink")


def test_large_all_reduce_uses_the_calibrated_bandwidth():
    topo = get_topology("hgx-h200")
    cal = nvlink("hgx-h200").calibrated("all_reduce")
    assert 0 < cal.bandwidth_efficiency <= 1 and cal.latency_s is not None
    v = 256 << 20
    c = topology_cost("all_reduce", v, topo, group_size=8)
    assert c.algorithm == "ring"
    # 2·((N−1)·α + (N−1)/N·V/(L·B·eff)), L = 18 links, B = 25e9 B/s per link and direction
    bw = 18 * 25_000_000_000 * cal.bandwidth_efficiency
    assert c.time_s == 2 * (7 * cal.latency_s + sympy.Rational(7, 8) * v / bw)
    uncalibrated = 2 * (7 * sympy.Rational(2, 10**6) + sympy.Rational(7, 8) * v / (18 * 25_000_000_000))
    assert c.time_s > uncalibrated  # achieved bandwidth below the datasheet's


def test_every_fitted_op_is_calibrated_and_h200_uses_the_h100_fit():
    h100, h200 = nvlink("hgx-h100"), nvlink("hgx-h200")
    for op in FITTED:
        assert h200.calibrated(op) == h100.calibrated(op) != h200.calibrated("broadcast")
    assert h200.calibrated("broadcast").latency_s is None  # not fitted: datasheet figures
    ib = next(t for t in get_topology("hgx-h200").tiers if t.name == "infiniband")
    assert ib.calibration == ()


def _broken(tmp_path: Path, edit) -> Path:
    doc = yaml.safe_load(Path(get_topology("hgx-h200").path).read_text())
    edit(doc)
    path = tmp_path / "hgx-h200.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


@pytest.mark.parametrize("edit, key", [
    (lambda d: d["tiers"][0]["calibration"]["all_reduce"].update(bandwidth_efficiency=1.2),
     "key 'tiers.0.calibration.all_reduce.bandwidth_efficiency'"),
    (lambda d: d["tiers"][0]["calibration"]["all_gather"].update(latency_s=-1e-6),
     "key 'tiers.0.calibration.all_gather.latency_s'"),
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
