"""Topologies as data: every shipped file loads, names a shipped device and agrees with its
links; links are counted by distinct neighbours; hierarchical spans; the loader is strict."""

import json
from pathlib import Path

import pytest
import sympy
import yaml

from perfcast.hardware import SpecError, device_names, get_device
from perfcast.hardware.spec import read_yaml
from perfcast.hardware.topology import Tier, get_topology, load_topology_file, parse_tier, topology_names
from perfcast.perf.collectives import topology_cost

# name: (device, devices in the file, [(tier, kind, shape, links per device)] innermost first)
SHIPPED = {
    "hgx-b200": ("b200-sxm", 128, [("nvlink", "switch", (8,), 18), ("infiniband", "switch", (16,), 1)]),
    "hgx-b300": ("b300-sxm", 128, [("nvlink", "switch", (8,), 18), ("infiniband", "switch", (16,), 1)]),
    "gb200-nvl72": ("gb200", 576, [("nvlink", "switch", (72,), 18), ("infiniband", "switch", (8,), 1)]),
    "gb300-nvl72": ("gb300", 576, [("nvlink", "switch", (72,), 18), ("infiniband", "switch", (8,), 1)]),
    "mi325x-platform": ("mi325x", 128, [("infinity_fabric", "full_mesh", (8,), 7), ("roce", "switch", (16,), 1)]),
    "mi355x-platform": ("mi355x", 128, [("infinity_fabric", "full_mesh", (8,), 7), ("roce", "switch", (16,), 1)]),
    "tpu-v5e-16x16": ("tpu-v5e", 256, [("ici", "torus", (16, 16), 4), ("dcn", "switch", (1,), 1)]),
    "tpu-v5e-4x4": ("tpu-v5e", 16, [("ici", "torus", (4, 4), 4), ("dcn", "switch", (1,), 1)]),
    "tpu-v5p-4x4x4": ("tpu-v5p", 64, [("ici", "torus", (4, 4, 4), 6), ("dcn", "switch", (1,), 1)]),
    "tpu-v5p-8x8x8": ("tpu-v5p", 512, [("ici", "torus", (8, 8, 8), 6), ("dcn", "switch", (1,), 1)]),
    "ascend-910b-8": ("ascend-910b", 128, [("hccs", "full_mesh", (8,), 7), ("roce", "switch", (16,), 1)]),
    "ascend-910c-supernode": ("ascend-910c-die", 768, [("sio", "full_mesh", (2,), 1), ("ub", "switch", (384,), 7),
                                                       ("roce", "switch", (1,), 1)]),
}


def test_catalog_has_the_new_topologies():
    assert set(SHIPPED) <= set(topology_names())


@pytest.mark.parametrize("name", topology_names())
def test_every_shipped_topology_loads_and_names_a_shipped_device(name):
    topo = get_topology(name)
    assert topo.name == name and topo.description
    assert topo.device in device_names(), f"{name}: device {topo.device!r} is not a shipped device"
    assert all(t.link_bandwidth_bytes_per_s > 0 and t.link_latency_s > 0 for t in topo.tiers)


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_shape_and_links_by_distinct_neighbours(name):
    device, size, tiers = SHIPPED[name]
    topo = get_topology(name)
    assert (topo.device, topo.size) == (device, size)
    assert [(t.name, t.kind, t.dims, t.links_per_device) for t in topo.tiers] == tiers


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_scale_up_tier_agrees_with_the_device_file(name):
    """Each link of the device file is one tier with the same per-link bandwidth, count and
    latency (the supernode's UB tier carries the die's 'hccs' links)."""
    topo = get_topology(name)
    for link in get_device(topo.device).spec.datasheet.links.values():
        matching = [t for t in topo.tiers
                    if (t.link_bandwidth_bytes_per_s, t.links_per_device, t.link_latency_s)
                    == (sympy.Rational(repr(link.bandwidth_bytes_per_s)), link.count,
                        sympy.Rational(repr(link.latency_s)))]
        assert matching, f"{name}: no tier matches {topo.device}'s link {link}"


def test_wraparound_follows_the_slice_shape():
    # v5e wraps only along axes of 16; v5p wraps on every axis of a whole number of 4x4x4 cubes
    assert get_topology("tpu-v5e-16x16").tiers[0].wraparound
    assert not get_topology("tpu-v5e-4x4").tiers[0].wraparound
    assert get_topology("tpu-v5p-4x4x4").tiers[0].wraparound
    # diameter: 8+8 hops on the 16x16 torus; 3+3 on the 4x4 mesh (no wrap); 2+2+2 on the cube
    assert [get_topology(n).tiers[0].diameter for n in ("tpu-v5e-16x16", "tpu-v5e-4x4", "tpu-v5p-4x4x4")] == [16, 6, 6]


@pytest.mark.parametrize("spec, links", [
    ("torus:4x4x4", 6),  # ± neighbour on each of 3 dims
    ("torus:2x2x2", 3),  # the + and − neighbours of a size-2 dim are one device
    ("torus:8x8x8", 6),
    ("torus:4x1", 2),  # a size-1 dim adds none
    ("full_mesh:8", 7),
    ("full_mesh:2", 1),
    ("ring:2", 1),
    ("switch:8", 1),  # an ad-hoc switch has one port per device
])
def test_links_per_device_counts_distinct_neighbours(spec, links):
    assert parse_tier(spec, 1e9).links_per_device == links


def test_switch_links_are_its_ports():
    assert Tier("nvl", "switch", (8,), sympy.Integer(1), ports=18).links_per_device == 18


@pytest.mark.parametrize("name, group, stride, span", [
    ("hgx-b200", 8, 1, [("nvlink", 8)]),
    ("hgx-b200", 16, 1, [("nvlink", 8), ("infiniband", 2)]),  # 16 = 8 on nvlink × 2 on infiniband
    ("hgx-b200", 4, 8, [("infiniband", 4)]),  # one GPU per node: stride 8 skips the nvlink tier
    ("hgx-b200", 32, 4, [("nvlink", 2), ("infiniband", 16)]),
    ("gb200-nvl72", 72, 1, [("nvlink", 72)]),  # a whole rack is one NVLink domain
    ("gb200-nvl72", 2, 16, [("nvlink", 2)]),  # the dp pair of a tp16 x dp2 layout: 0 and 16, one rack
    ("gb200-nvl72", 144, 1, [("nvlink", 72), ("infiniband", 2)]),  # two racks
    ("hgx-b300", 16, 1, [("nvlink", 8), ("infiniband", 2)]),
    ("ascend-910b-8", 16, 1, [("hccs", 8), ("roce", 2)]),
    ("ascend-910c-supernode", 2, 1, [("sio", 2)]),
    ("ascend-910c-supernode", 16, 1, [("sio", 2), ("ub", 8)]),  # one node: 8 NPUs = 16 dies
    ("ascend-910c-supernode", 384, 2, [("ub", 384)]),  # one die of every 910C
    ("ascend-910c-supernode", 768, 1, [("sio", 2), ("ub", 384)]),
    ("tpu-v5p-8x8x8", 512, 1, [("ici", 512)]),
])
def test_span_of_hierarchical_groups(name, group, stride, span):
    got = get_topology(name).span(group, stride)
    assert [(t.name, k) for t, k in got if k > 1] == span
    assert sympy.prod([k for _, k in got]) == group


def test_outermost_tier_grows_on_demand():
    topo = get_topology("tpu-v5p-4x4x4").with_devices(128)  # two cubes over DCN
    assert [(t.name, t.size) for t in topo.tiers] == [("ici", 64), ("dcn", 2)]
    assert [(t.name, k) for t, k in topo.span(128)] == [("ici", 64), ("dcn", 2)]
    big = get_topology("ascend-910c-supernode").with_devices(2 * 768)
    assert [(t.name, k) for t, k in big.span(1536)] == [("sio", 2), ("ub", 384), ("roce", 2)]


@pytest.mark.parametrize("name, group, stride, match", [
    ("hgx-b200", 129, 1, "does not fit"),
    ("hgx-b200", 2, 12, "stride of 12 devices does not line up"),  # 0 and 12: node 0 and half of node 1
    ("gb200-nvl72", 2, 48, "stride of 48 devices does not line up"),  # 0..47 and 48..95 straddle two racks
    ("hgx-b200", 12, 1, "group of 12 devices does not line up"),
])
def test_misaligned_groups_are_errors(name, group, stride, match):
    with pytest.raises(ValueError, match=match):
        get_topology(name).span(group, stride)


def test_hierarchical_all_reduce_on_the_910b_cluster():
    # 16 NPUs = 8 on hccs × 2 on roce, V = 1e9 B:
    #   RS hccs (multiport, 7 links of 28e9): 2e-6 + 7/8·1e9/(7·28e9)  = 0.0044662857 s
    #   AR roce on V/8 (ring, 25e9):          2·(5e-6 + 1/2·1.25e8/25e9) = 0.00501 s
    #   AG hccs: as RS                                                  = 0.0044662857 s
    c = topology_cost("all_reduce", 10**9, get_topology("ascend-910b-8"), 16)
    rs = sympy.Rational(2, 10**6) + sympy.Rational(7, 8) * 10**9 / (7 * 28 * 10**9)
    ar = 2 * (sympy.Rational(5, 10**6) + sympy.Rational(1, 2) * 125_000_000 / (25 * 10**9))
    assert c.algorithm == "hierarchical" and c.time_s == 2 * rs + ar == sympy.Rational(48799, 3500000)
    assert c.formula == "RS hccs(8) [multiport] + AR roce(2) [ring] + AG hccs(8) [multiport]"


def test_all_reduce_on_a_v5p_cube_uses_all_six_links():
    # 2·(D·α + (N−1)/N·V/(L·B)) = 2·(6·1e-6 + 63/64·1e9/(6·1e11)) = 3.29325 ms
    c = topology_cost("all_reduce", 10**9, get_topology("tpu-v5p-4x4x4"))
    assert (c.algorithm, c.links_used) == ("multiport", 6)
    assert c.time_s == 2 * (6 * sympy.Rational(1, 10**6) + sympy.Rational(63, 64) * 10**9 / (6 * 10**11))
    assert c.time_s == sympy.Rational(13173, 4000000)


# --- the strict loader -------------------------------------------------------------------------


def _variant(tmp_path: Path, name: str, edit) -> Path:
    data = read_yaml(get_topology(name).path)
    edit(data)
    out = tmp_path / f"{name}.yaml"
    out.write_text(yaml.safe_dump(data, sort_keys=False))
    load_topology_file.cache_clear()
    return out


@pytest.mark.parametrize("name, edit, message", [
    ("ascend-910b-8", lambda d: d["tiers"][0].update(link_bandwidth_gbps=224),
     "key 'tiers.0.link_bandwidth_gbps': unknown key"),
    ("ascend-910b-8", lambda d: d.update(pod_size=16), "key 'pod_size': unknown key"),
    ("ascend-910b-8", lambda d: d["sources"].pop("roce.link_latency_s"),
     "key 'sources.roce.link_latency_s': missing source for roce.link_latency_s"),
    ("ascend-910b-8", lambda d: d["sources"].update({"hccs.links_per_device": "stale"}),
     "key 'sources.hccs.links_per_device': source given for unknown value hccs.links_per_device"),
    ("tpu-v5p-4x4x4", lambda d: d["tiers"][0].update(links_per_device=6),
     "key 'tiers.0.links_per_device': a torus counts its distinct neighbours; give links_per_device only for a switch"),
    ("ascend-910b-8", lambda d: d["tiers"][0].update(links_per_device=7),
     "key 'tiers.0.links_per_device': a full_mesh counts its distinct neighbours"),
    ("hgx-b200", lambda d: d["tiers"][1].pop("links_per_device"),
     "key 'tiers.1.links_per_device': a switch tier needs its ports per device"),
    ("hgx-b200", lambda d: d["tiers"][0].update(kind="dragonfly"),
     "key 'tiers.0.kind': input should be 'torus', 'ring', 'switch' or 'full_mesh' (got 'dragonfly')"),
    ("hgx-b200", lambda d: d["tiers"][0].update(shape=[8, 2]), "key 'tiers.0.shape': a switch has one size"),
    ("hgx-b200", lambda d: d["tiers"][0].update(link_bandwidth_bytes_per_s="50 GB/s"),
     "key 'tiers.0.link_bandwidth_bytes_per_s': input should be a valid number"),
    ("hgx-b200", lambda d: d["tiers"][0].update(link_latency_s=-2e-6),
     "key 'tiers.0.link_latency_s': input should be greater than 0"),
    ("hgx-b200", lambda d: (d["tiers"][1].update(name="nvlink"),  # and its sources, else they go stale first
                            [d["sources"].pop(k) for k in list(d["sources"]) if k.startswith("infiniband.")]),
     "key 'tiers': tier names must be distinct"),
    ("hgx-b200", lambda d: d.pop("device"), "key 'device': missing key"),
])
def test_strict_loader_one_line_naming_file_and_key(tmp_path, name, edit, message):
    path = _variant(tmp_path, name, edit)
    with pytest.raises(SpecError) as err:
        load_topology_file(path)
    text = str(err.value)
    assert text.startswith(f"{path}: key '") and message in text
    assert "\n" not in text


def test_unedited_copy_loads(tmp_path):
    topo = load_topology_file(_variant(tmp_path, "tpu-v5e-4x4", lambda d: None))
    assert topo.tiers == get_topology("tpu-v5e-4x4").tiers


def test_unknown_name_suggests_the_closest():
    with pytest.raises(SpecError, match="did you mean tpu-v5p-4x4x4"):
        get_topology("tpu-v5p-4x4x8")


# --- the CLI -----------------------------------------------------------------------------------


def test_cli_topologies_json(cli):
    rows = {r["name"]: r for r in json.loads(cli("topologies", "--json", check=True).stdout)["topologies"]}
    assert set(SHIPPED) <= set(rows)
    for name, (device, size, tiers) in SHIPPED.items():
        row = rows[name]
        assert (row["device"], row["devices"]) == (device, size)
        assert [(t["name"], t["kind"], tuple(t["shape"]), t["links_per_device"]) for t in row["tiers"]] == tiers
    assert rows["tpu-v5e-4x4"]["tiers"][0]["wraparound"] is False
    assert rows["ascend-910c-supernode"]["tiers"][1]["link_bandwidth_bytes_per_s"] == 28e9


def test_cli_collective_on_a_shipped_torus(cli):
    doc = json.loads(cli("collective", "all_reduce", "--topology", "tpu-v5p-4x4x4", "--bytes", "1e9", "--json",
                         check=True).stdout)
    assert (doc["algorithm"], doc["group_size"], doc["links_per_node"]) == ("multiport", 64, 6)
    assert doc["tiers"] == [{"tier": "ici", "devices": 64}]
    assert doc["time_s"] == pytest.approx(3.29325e-3, rel=1e-12)
    # two cubes: the DCN tier grows to 2 and the all-reduce runs hierarchically
    # 3.29325 ms on ICI + 2·(1e-5 + 1/2·(1e9/64)/6.25e9) = 2.52 ms on DCN
    doc = json.loads(cli("collective", "all_reduce", "--topology", "tpu-v5p-4x4x4", "--bytes", "1e9",
                         "--group-size", "128", "--json", check=True).stdout)
    assert doc["algorithm"] == "hierarchical"
    assert doc["tiers"] == [{"tier": "ici", "devices": 64}, {"tier": "dcn", "devices": 2}]
    assert doc["time_s"] == pytest.approx(5.81325e-3, rel=1e-12)


@pytest.mark.parametrize("args, message", [
    (("collective", "all_reduce", "--topology", "tpu-v5p-4x4x8", "--bytes", "1e9"),
     "unknown topology 'tpu-v5p-4x4x8'; did you mean tpu-v5p-4x4x4"),
    (("collective", "all_reduce", "--topology", "no/such/topology.yaml", "--bytes", "1e9"),
     "no/such/topology.yaml: cannot read"),
    (("topologies", "--topology-file", "no/such/topology.yaml"), "no/such/topology.yaml: cannot read"),
])
def test_cli_bad_topology_is_exit_2_with_one_line(cli, args, message):
    proc = cli(*args)
    assert proc.returncode == 2
    assert message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_cli_bad_topology_file_names_file_and_key(cli, tmp_path):
    path = _variant(tmp_path, "hgx-b200", lambda d: d["tiers"][1].pop("links_per_device"))
    proc = cli("collective", "all_reduce", "--topology", str(path), "--bytes", "1e9")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"perfcast collective: error: {path}: key 'tiers.1.links_per_device': a switch tier needs its ports per device"]


def test_an_ad_hoc_tier_beyond_the_device_limit_is_refused_not_priced():
    # 10**16 devices priced a 10-byte all-reduce at 5 ns: a tier holds at most 2**20 devices
    from fuzzing import run_cli

    rc, out, err = run_cli("collective", "all_reduce", "--topology", "torus:99999999x99999999",
                           "--link-bandwidth", "1e9", "--bytes", "10")
    assert (rc, out) == (2, "") and err == (
        "perfcast collective: error: topology tier torus:99999999x99999999: 9,999,999,800,000,001 devices; "
        "expected at most 1,048,576 (2**20, about a thousand times the largest deployments)\n")
