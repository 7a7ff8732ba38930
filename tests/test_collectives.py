"""WE-2 (torus links and all-gather) and the collective cost algebra."""

import json

import pytest
import sympy

from perfcast.hardware.topology import Tier, parse_tier
from perfcast.perf.collectives import cost, costs

V, BW = 1_200_000_000, 50e9


@pytest.mark.parametrize("spec, nodes, links, ms", [
    ("torus:2x2x2", 8, 3, 7),  # counting 6 links would wrongly give 3.5 ms
    ("torus:4x4x4", 64, 6, sympy.Rational(63, 16)),  # 3.9375 ms
    ("torus:4x2", 8, 3, 7),
    ("ring:8", 8, 2, sympy.Rational(21, 2)),  # 10.5 ms
])
def test_we2_bandwidth_optimal_all_gather(spec, nodes, links, ms):
    tier = parse_tier(spec, BW)
    assert (tier.size, tier.links_per_device) == (nodes, links)
    c = cost("all_gather", V, tier, algorithm="multiport")
    # t = (N−1)/N · V / (L · link_bw)
    assert c.time_s == sympy.Rational(nodes - 1, nodes) * V / (links * 50_000_000_000)
    assert c.time_s * 1000 == ms


def test_cheapest_algorithm_and_latency_terms():
    tier = parse_tier("torus:4x4", 100e9, 1e-6)
    small = cost("all_reduce", 1024, tier)
    big = cost("all_reduce", 1 << 30, tier)
    assert big.algorithm == "multiport"
    ring = [c for c in costs("all_reduce", 1024, tier) if c.algorithm == "ring"][0]
    assert ring.time_s == 2 * (15 * sympy.Rational(1, 10**6) + sympy.Rational(15, 16) * 1024 / 10**11)
    assert small.time_s <= ring.time_s


def test_symbolic_bytes():
    v = sympy.Symbol("V", positive=True)
    c = costs("reduce_scatter", v, parse_tier("ring:4", 25e9))[0]
    assert c.time_s == sympy.Rational(3, 4) * v / 25_000_000_000


def test_bad_topologies():
    with pytest.raises(ValueError, match="KIND:SHAPE"):
        parse_tier("torus", BW)
    with pytest.raises(ValueError, match="kind 'donut'"):
        parse_tier("donut:4", BW)
    with pytest.raises(ValueError, match="group-size 9"):
        cost("all_gather", V, parse_tier("ring:8", BW), group_size=9)
    assert Tier("t", "torus", (1, 2), sympy.Integer(1)).links_per_device == 1


def test_cli(cli):
    doc = json.loads(cli("collective", "all_gather", "--topology", "torus:2x2x2", "--link-bandwidth",
                         "50e9", "--bytes", "1.2e9", "--json", check=True).stdout)
    assert doc["time_s"] == pytest.approx(7e-3) and doc["links_per_node"] == 3
    assert doc["algorithm"] == "multiport"
    proc = cli("collective", "all_gather", "--topology", "torus:2x2x2", "--link-bandwidth", "fast",
               "--bytes", "1")
    assert proc.returncode == 2 and "--link-bandwidth: expected a number, got 'fast'" in proc.stderr
    proc = cli("collective", "gossip", "--topology", "ring:4", "--link-bandwidth", "1e9", "--bytes", "1")
    assert proc.returncode == 2 and "unknown collective 'gossip'" in proc.stderr


@pytest.mark.parametrize("args, message", [
    (["--topology", "ring:8", "--link-bandwidth", "nan", "--bytes", "1e6"],
     "--link-bandwidth: expected a finite number, got 'nan'"),
    (["--topology", "ring:8", "--link-bandwidth=-1e9", "--bytes", "1e6"],
     "--link-bandwidth: expected a positive number, got '-1e9'"),
    (["--topology", "ring:8", "--link-bandwidth", "1e9", "--link-latency", "-1", "--bytes", "1e6"],
     "--link-latency: expected at least 0, got '-1'"),
    (["--topology", "hgx-h200", "--bytes", "-1"], "--bytes: expected a positive number, got '-1'"),
    (["--topology", "hgx-h200", "--bytes", "1e400"], "--bytes: expected a finite number, got '1e400'"),
    (["--topology", "hgx-h200", "--bytes", "64e6", "--group-size", "0"],
     "--group-size: expected at least 1, got '0'"),
    (["--topology", "hgx-h200", "--bytes", "64e6", "--stride", "0"], "--stride: expected at least 1, got '0'"),
])
def test_cli_refuses_values_that_price_nothing(cli, args, message):
    proc = cli("collective", "all_reduce", *args)
    assert proc.returncode == 2 and proc.stdout == "" and proc.stderr.count("\n") == 1 and message in proc.stderr


def test_cli_takes_the_hyphenated_names_the_docs_use(cli):
    hyphen, underscore = (json.loads(cli("collective", op, "--topology", "hgx-h200", "--bytes", "64e6", "--json",
                                         check=True).stdout) for op in ("all-gather", "all_gather"))
    assert hyphen == underscore and hyphen["op"] == "all_gather"


def test_multiport_without_wraparound_runs_at_the_edge_devices_pace():
    # a 4×4 mesh: interior devices have 4 links, edge devices one neighbour per dim (2 at a
    # corner, 3 on a side), and a bandwidth-optimal collective waits for the worst placed
    wrap, mesh = parse_tier("torus:4x4", BW), parse_tier("mesh:4x4", BW)
    assert (wrap.bottleneck_links, mesh.links_per_device, mesh.bottleneck_links) == (4, 4, 2)
    a = cost("all_gather", V, wrap, algorithm="multiport")
    b = cost("all_gather", V, mesh, algorithm="multiport")
    # (N−1)/N·V/(L·B) = 15/16·1.2e9/(4·50e9) = 5.625 ms with wraparound; L = 2 without: 11.25 ms
    assert a.time_s == sympy.Rational(15, 16) * V / (4 * 50_000_000_000) == sympy.Rational(5625, 10**6)
    assert b.time_s == 2 * a.time_s and b.links_used == 2
    # a line (one dim, no wraparound): one link at the ends, so only the ring applies
    assert [c.algorithm for c in costs("all_gather", V, parse_tier("mesh:8", BW))] == ["ring"]
