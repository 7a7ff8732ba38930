"""The slow roll-up: iterative modulo scheduling over RRTs (WE-3) and its properties."""

import random

import pytest

from perfcast.hardware import get_device
from perfcast.ir import RRT
from perfcast.kernels import get_kernel
from perfcast.perf import AnalyticPerformanceModel
from perfcast.rollup import rollup
from perfcast.rollup.modulo import Edge, list_schedule, modulo_schedule, rec_mii, res_mii
from perfcast.rollup.slow import SlowRollup

H100 = get_device("h100-sxm")


def we3(acc_latency=1):
    ops = {"ld": RRT.single("dma", 2), "mm": RRT.single("mxu", 4), "acc": RRT.single("vpu", 1, latency=acc_latency)}
    edges = [Edge("ld", "mm", 2), Edge("mm", "acc", 4), Edge("acc", "acc", acc_latency, 1)]
    return ops, edges


def test_we3_modulo_schedule():
    ops, edges = we3()
    s = modulo_schedule(ops, edges, {})
    assert (s.res_mii, s.rec_mii, s.ii, s.length) == (4, 1, 4, 7)
    assert s.start == {"ld": 0, "mm": 2, "acc": 6} and s.limiter == "resource mxu"
    assert s.total(8) == 35  # the plain sum is 8 × 7 = 56, the pure resource bound 8 × 4 = 32
    ops, edges = we3(acc_latency=6)
    s = modulo_schedule(ops, edges, {})
    assert (s.res_mii, s.rec_mii, s.ii) == (4, 6, 6) and s.limiter.startswith("recurrence acc→acc")


def test_we3_through_the_catalog_kernel():
    spec = get_kernel("modulo-reference")
    slow = SlowRollup(AnalyticPerformanceModel(H100), H100)
    r = slow.run(spec.graph, spec.defaults)
    assert (r.loops[0].ii, r.cycles, r.serial_cycles, r.resource_bound_cycles) == (4, 35, 56, 32)
    assert slow.run(spec.graph, {**spec.defaults, "acc_latency": 6}).loops[0].ii == 6


def test_capacity_and_res_mii():
    ops = {"a": RRT.single("x", 3), "b": RRT.single("x", 3), "c": RRT.single("y", 1)}
    assert res_mii(ops, {}) == (6, "x")
    assert res_mii(ops, {"x": 2}) == (3, "x")
    assert modulo_schedule(ops, [], {"x": 2}).ii == 3
    assert rec_mii(list(ops), [Edge("a", "b", 3), Edge("b", "a", 5, 2)]) == (4, "b→a (distance 2)")
    start, length = list_schedule(ops, [Edge("a", "c", 3)], {})
    assert start == {"a": 0, "b": 3, "c": 3} and length == 6
    with pytest.raises(ValueError, match="needs 2 units of x at once"):
        modulo_schedule({"a": RRT.single("x", 1, units=2)}, [], {})


@pytest.mark.parametrize("seed", range(25))
def test_random_loops_respect_the_bounds(seed):
    """II ≥ max(ResMII, RecMII); resource bound ≤ slow ≤ serial; deterministic."""
    rng = random.Random(seed)
    names = [f"op{i}" for i in range(rng.randint(1, 7))]
    ops = {n: RRT(spans=tuple((rng.choice("abc"), rng.randint(0, 2), rng.randint(1, 9), 1)
                              for _ in range(rng.randint(1, 2)))) for n in names}
    ops = {n: RRT(spans=tuple({s[0]: s for s in r.spans}.values())) for n, r in ops.items()}
    edges = [Edge(a, b, ops[a].length) for i, a in enumerate(names) for b in names[i + 1:] if rng.random() < 0.4]
    edges += [Edge(b, a, rng.randint(1, 12), rng.randint(1, 3)) for i, a in enumerate(names)
              for b in names[i:] if rng.random() < 0.2]
    s = modulo_schedule(ops, edges, {})
    assert s.ii >= max(s.res_mii, s.rec_mii)
    for e in edges:  # every dependence holds across iterations
        assert s.start[e.dst] + s.ii * e.distance >= s.start[e.src] + e.latency
    n = rng.randint(1, 20)
    bound = max(n * sum(r.usage(x) for r in ops.values()) for x in "abc")
    serial = n * sum(r.length for r in ops.values())
    assert bound <= s.total(n) and bound <= serial
    assert modulo_schedule(ops, edges, {}) == s


@pytest.mark.parametrize("name", ["flash-attention", "flash-attention-softmax"])
@pytest.mark.parametrize("decode", [False, True])
def test_flash_attention_slow_between_bound_and_serial(name, decode):
    spec = get_kernel(name)
    model = AnalyticPerformanceModel(H100)
    point = {**spec.defaults, **({"T_q": 1, "q_blk": 1} if decode else {})}
    r = SlowRollup(model, H100).run(spec.graph, point)
    assert r.resource_bound_cycles <= r.cycles <= r.serial_cycles
    fast = rollup(spec.graph, model).evaluate(point)
    serial_s = r.serial_cycles / float(H100.clock_hz)
    # the serial sum is the fast roll-up without launch latency, up to rounding each leaf to whole cycles
    assert serial_s == pytest.approx(fast.time_s - fast.launch_time_s, rel=1e-2)  # each leaf rounded up
    assert r.loops and all(x.ii >= max(x.res_mii, x.rec_mii) for x in r.loops)


def test_one_leaf_agrees_with_the_analytic_time():
    from perfcast.ir import Tensor, make_leaf

    a = Tensor("a", (4096, 4096), "bf16")
    leaf = make_leaf("einsum", "mm", (a, a), (a,), equation="mk,kn->mn")
    model = AnalyticPerformanceModel(H100)
    r = SlowRollup(model, H100).run(leaf, {})
    t = float(model.realize(model.process_op(leaf).time_s))
    assert r.cycles == pytest.approx(t * float(H100.clock_hz), abs=2)


def test_we3_cli(cli):
    import json

    doc = json.loads(cli("kernel", "modulo-reference", "--rollup", "slow", "--set", "n=8", "--json",
                         check=True).stdout)
    assert doc["slow"]["ii"] == 4 and doc["slow"]["cycles"] == 35 and doc["rollup"] == "slow"
    assert doc["slow"]["serial_cycles"] == 56 and doc["slow"]["resource_bound_cycles"] == 32
    doc = json.loads(cli("kernel", "modulo-reference", "--rollup", "slow", "--set", "acc_latency=6", "--json",
                         check=True).stdout)
    assert doc["slow"]["ii"] == 6 and doc["slow"]["limiter"] == "recurrence acc→acc (distance 1)"


def test_kernel_both_and_trace(cli, tmp_path):
    import json

    out = cli("kernel", "flash-attention", "--rollup", "both", check=True).stdout
    assert "slow (modulo schedule)" in out and "set by resource hbm" in out
    path = tmp_path / "fa.json"
    cli("kernel", "flash-attention", "--rollup", "slow", "--chrome-trace", str(path), check=True)
    events = json.loads(path.read_text())["traceEvents"]
    tracks = {e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    assert tracks == {"matrix", "vector", "hbm", "onchip"}
    proc = cli("kernel", "flash-attention", "--chrome-trace", str(path))
    assert proc.returncode == 2 and "add --rollup slow or both" in proc.stderr


def test_text_generate_rollup_both(cli):
    import json

    doc = json.loads(cli("text-generate", "qwen3-8b", "--decode", "--context-length", "64", "--num-queries", "2",
                         "--rollup", "both", "--json", check=True).stdout)
    slow = doc["slow"]["analytic"]
    assert slow["resource_bound_time_s"] <= slow["time_s"] <= slow["fast_time_s"] * (1 + 1e-3)
    layers = slow["loops"][0]
    # kernels on one stream: layer i + 1 follows layer i, so the layer loop stays serial
    assert layers["ii"] >= max(layers["res_mii"], layers["rec_mii"]) and layers["cycles"] == layers["serial_cycles"]
