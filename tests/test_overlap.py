"""Overlap transforms of the fast roll-up: exact closed forms on hand-built graphs, the fixed
composition order, never slower and never below the max-over-resources bound, the WE-1 figures,
the guard, and the CLI."""

import contextlib
import io
import itertools
import json

import numpy as np
import pytest
import sympy
from hypothesis import given, settings
from hypothesis import strategies as st

from perfcast.hardware import get_device
from perfcast.ir import Graph, Loop, Tensor, dim, make_leaf
from perfcast.ir.rules import COLLECTIVE_KINDS
from perfcast.kernels import get_kernel
from perfcast.perf import AnalyticPerformanceModel
from perfcast.perf.model import PerformanceModel, Provenance, Result
from perfcast.rollup import GuardError, OVERLAPS, overlap, rollup
from perfcast.rollup.overlap import parse, weight_bytes
from perfcast.ir.errors import UserError

a, c, d, e, k, m, r, s, x, y, lam = sympy.symbols("a c d e k m r s x y lam", positive=True)
n = dim("n")


class Table(PerformanceModel):
    """Prices a leaf from its ``terms`` attribute: the time is the largest term (a roofline)."""

    name = "table"

    def __init__(self, launch=lam):
        self.launch = sympy.sympify(launch)

    def process_op(self, op, kernel=None):
        terms = dict(op.attr("terms"))
        return Result(sympy.Max(*terms.values()), Provenance.ANALYTIC, terms)

    def launch_overhead(self):
        return Result(self.launch, Provenance.ANALYTIC, {"latency.launch": self.launch})


def _terms(terms: dict) -> tuple:
    """Keyword names → the pricing models' term names: ``memory_hbm`` → ``memory.hbm``."""
    return tuple((key.replace("_", ".", 1), v) for key, v in terms.items())


def leaf(kind, name, **terms):
    t = Tensor(f"{name}:x", (8, 8), "bf16")
    attrs = {"axis": "tp", "group_size": 2} if kind in COLLECTIVE_KINDS else {}
    return make_leaf(kind, name, (t,), (t.renamed(f"{name}:y"),), terms=_terms(terms), **attrs)


def linear(name, **terms):
    """A captured ``F.linear``: x (4, 64) @ W (64, 32), bf16 — W is 4,096 of the 4,864 HBM bytes."""
    x_, w = Tensor(f"{name}:in0", (4, 64), "bf16"), Tensor(f"{name}:in1", (64, 32), "bf16")
    return make_leaf("matmul", name, (x_, w), (Tensor(f"{name}:out0", (4, 32), "bf16"),),
                     op="aten.mm.default", terms=_terms(terms))


WT = sympy.Rational(4096, 4864) * m  # the weight read's share of the linear's HBM term: 16m/19


def same(u, v) -> bool:
    return sympy.expand(u - v) == 0


# Exact closed forms ---------------------------------------------------------------------------

def test_double_buffer_is_fill_then_the_longer_stage():
    body = Graph("body", (leaf("load", "ld", memory_hbm=a), leaf("exp", "mm", compute=c)))
    r = rollup(Graph("kernel", (Loop("tiles", n, body),), launch=True), Table())
    ov = overlap(r, ["double-buffer"])
    assert same(r.time_s, n * (a + c) + lam)
    # T = (t_load + t_rest) + (n − 1)·max(t_load, t_rest) + one launch
    assert same(ov.time_s, (a + c) + (n - 1) * sympy.Max(a, c) + lam)


def test_double_buffer_charges_a_resource_both_stages_use():
    body = Graph("body", (leaf("load", "ld", memory_hbm=a), leaf("store", "st", memory_hbm=s),
                          leaf("exp", "mm", compute=c)))
    r = rollup(Graph("kernel", (Loop("tiles", n, body),), launch=True), Table())
    # the store and the next tile's load share HBM: the steady iteration is at least a + s
    assert same(overlap(r, ["double-buffer"]).time_s,
                (a + s + c) + (n - 1) * sympy.Max(a, c + s, a + s) + lam)


def test_a2a_experts_is_max_of_all_to_alls_and_experts_when_the_split_pays():
    block = Graph("layer", (leaf("exp", "attn", compute=x), leaf("all_to_all", "dispatch", comm_ep=d),
                            leaf("exp", "experts", compute=e), leaf("all_to_all", "combine", comm_ep=k),
                            leaf("exp", "out", compute=y)))
    r = rollup(Graph("model", (block,)), Table())
    serial = x + d + e + k + y + 5 * lam
    # two micro-batches: every kernel launched twice (5 more launches), the two all-to-alls
    # under the expert work between them
    split = x + y + sympy.Max(d + k, e) + 10 * lam
    assert same(r.time_s, serial)
    assert overlap(r, ["a2a-experts"]).time_s == sympy.Min(serial, split)


def test_comm_overlap_charges_the_weights_a_split_reads_twice():
    block = Graph("layer", (linear("proj", compute=c, memory_hbm=m), leaf("all_reduce", "ar", comm_tp=r)))
    rr = rollup(Graph("kernel", (block,), launch=True), Table())
    # split: the all-reduce under the projection, whose 4,096 weight bytes are read twice
    assert same(weight_bytes(block.ops[0]), 4096)
    assert overlap(rr, ["comm-overlap"]).time_s == sympy.Min(
        sympy.Max(c, m) + r + lam, sympy.Max(c, m + WT, r) + lam)


def test_weight_prefetch_streams_next_layers_weights_into_the_slack():
    body = Graph("layer", (linear("proj", compute=c, memory_hbm=m), leaf("all_reduce", "ar", comm_tp=r)))
    rr = rollup(Graph("kernel", (Loop("layers", n, body),), launch=True), Table())
    ov = overlap(rr, ["weight-prefetch"], staging_bytes=None)
    first = sympy.Max(c, m) + r  # the first layer reads its own weights (the fill)
    staged = sympy.Max(c, m - WT) + r  # later layers find them on chip…
    # …and stream the next layer's (WT of HBM time) alongside: HBM stays busy m per layer
    assert same(ov.time_s, first + (n - 1) * sympy.Max(staged, m) + lam)
    half = overlap(rr, ["weight-prefetch"], staging_bytes=2048)  # half of the 4,096 weight bytes
    assert same(half.time_s, first + (n - 1) * sympy.Max(sympy.Max(c, m - WT / 2) + r, m) + lam)


def test_weight_prefetch_cannot_help_a_memory_bound_layer():
    body = Graph("layer", (linear("proj", compute=sympy.Integer(1), memory_hbm=sympy.Integer(10)),))
    rr = rollup(Graph("kernel", (Loop("layers", 4, body),), launch=True), Table(0))
    ev = overlap(rr, ["weight-prefetch"], staging_bytes=None).evaluate({})
    assert ev.before_s == ev.after_s == ev.bound_s == 40


# Composition ---------------------------------------------------------------------------------

def _model_graph(vals):
    """A kernel with a pipelined tile loop, then 3 layers of an MoE block with a linear, a
    dispatch/experts/combine group and an all-reduce; numeric terms from ``vals``."""
    v = iter(vals)
    tiles = Graph("tile", (leaf("load", "ld", memory_hbm=next(v)), leaf("store", "st", memory_hbm=next(v)),
                           leaf("exp", "mma", compute=next(v), memory_onchip=next(v))))
    kernel = Graph("kernel", (Loop("tiles", 4, tiles),), launch=True)
    layer = Graph("layer", (
        linear("qkv", compute=next(v), memory_hbm=next(v)),
        leaf("all_reduce", "ar", comm_tp=next(v)),
        leaf("all_to_all", "dispatch", comm_ep=next(v)),
        linear("experts", compute=next(v), memory_hbm=next(v)),
        leaf("all_to_all", "combine", comm_ep=next(v)),
        leaf("exp", "norm", memory_hbm=next(v), compute=next(v))))
    return Graph("model", (kernel, Loop("layers", 3, layer)))


NVALS = 13


def test_fixed_order_whatever_the_order_given():
    assert parse(["weight-prefetch", "double-buffer", "weight-prefetch"]) == ("double-buffer", "weight-prefetch")
    assert parse(["all"]) == OVERLAPS == ("double-buffer", "a2a-experts", "comm-overlap", "weight-prefetch")
    with pytest.raises(UserError, match="--overlap 'prefetch': expected one of double-buffer, a2a-experts"):
        parse(["prefetch"])
    rr = rollup(_model_graph(range(1, NVALS + 1)), Table(1))
    ov = overlap(rr, ["comm-overlap", "double-buffer"], staging_bytes=None)
    assert [s.name for s in ov.steps] == ["double-buffer", "comm-overlap"]
    assert ov.time_s == overlap(rr, ["double-buffer", "comm-overlap"], staging_bytes=None).time_s


@settings(max_examples=25)
@given(st.lists(st.integers(1, 50), min_size=NVALS, max_size=NVALS), st.integers(0, 3))
def test_no_transform_slows_and_none_beats_the_bound(vals, launch):
    rr = rollup(_model_graph(vals), Table(launch))
    for subset in itertools.chain.from_iterable(itertools.combinations(OVERLAPS, i) for i in range(1, 5)):
        ev = overlap(rr, subset, staging_bytes=2048).evaluate({})
        times = [ev.before_s] + [st_.time_s for st_ in ev.steps]
        assert all(later <= earlier + 1e-12 for earlier, later in zip(times, times[1:])), subset
        assert ev.after_s >= ev.bound_s - 1e-12, subset
        assert sum(st_.hidden_s for st_ in ev.steps) == pytest.approx(ev.hidden_s)


def test_sites_account_for_the_time_each_step_hides():
    rr = rollup(_model_graph([5, 1, 3, 2, 9, 2, 3, 20, 30, 2, 20, 1, 1]), Table(1))
    ev = overlap(rr, OVERLAPS, staging_bytes=None).evaluate({})
    for step in ev.steps:
        assert sum(x.hidden_s for x in step.sites) == pytest.approx(step.hidden_s), step.name
    assert [(s.name, s.applied) for s in ev.steps] == [
        ("double-buffer", True), ("a2a-experts", True), ("comm-overlap", True), ("weight-prefetch", True)]


def test_grouped_matmul_weight_bytes_follow_the_rule_book():
    h = Tensor("h", (16, 256), "bf16")
    gate_up, down = Tensor("gu", (16, 256, 256), "bf16"), Tensor("dn", (16, 128, 256), "bf16")
    index = Tensor("idx", (16, 4), "int64")
    g = make_leaf("grouped_matmul", "moe", (h, gate_up, down, index), (h.renamed("o"),),
                  num_experts=16, top_k=4, expert_shards=2, token_share=sympy.Rational(1, 2))
    # 16 tokens · top-4 · ½ = 32 token-expert pairs on 8 local experts: all 8 read
    assert weight_bytes(g) == 8 * (gate_up.nbytes + down.nbytes) / 16
    assert g.cost["bytes.hbm"] == weight_bytes(g) + h.nbytes + h.nbytes + index.nbytes


# WE-1 and the guard ----------------------------------------------------------------------------

MODEL = AnalyticPerformanceModel(get_device("h100-sxm"))
FA = get_kernel("flash-attention")


@pytest.fixture(scope="module")
def fa():
    return overlap(rollup(FA.graph, MODEL), ["double-buffer"])


def test_we1_double_buffering(fa):
    ev = fa.evaluate(FA.defaults)
    assert ev.before_s == pytest.approx(1.222650e-3, rel=1e-6)
    assert ev.after_s == pytest.approx(7.607671e-4, rel=1e-6)
    assert ev.bound_s <= ev.after_s <= ev.before_s
    kv, q = ev.steps[0].sites
    assert (kv.path.rsplit("/", 1)[-1], kv.executions, kv.moved) == ("kv_tiles", 32, ("k_t", "v_t"))
    assert (q.path.rsplit("/", 1)[-1], q.executions, q.moved) == ("q_tiles", 1, ("q_i", "acc0"))


def test_overlap_lambdify_matches_evaluate_and_keeps_the_guard(fa):
    f = fa.lambdify(["B", "H", "T_q", "T_kv", "hd_qk", "hd_v", "q_blk", "kv_blk"])
    T = np.array([1024, 4096, 8192])
    got = f(1, 32, T, T, 128, 128, 128, 128)
    want = [fa.evaluate({**FA.defaults, "T_q": int(t), "T_kv": int(t)}).after_s for t in T]
    assert np.allclose(got, want, rtol=1e-12, atol=0)
    with pytest.raises(GuardError, match="loop q_tiles: trip count T_q/q_blk = 125/4"):
        fa.evaluate({**FA.defaults, "T_q": 4000})
    with pytest.raises(GuardError, match="1 grid points fail"):
        f(1, 32, np.array([4000, 4096]), 4096, 128, 128, 128, 128)


# CLI ----------------------------------------------------------------------------------------------

def _main(*argv):
    from perfcast.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(list(argv))
    return rc, out.getvalue(), err.getvalue()


def test_cli_kernel_overlap_json_text_and_errors():
    rc, out, _ = _main("kernel", "flash-attention", "--json", "--overlap", "double-buffer", "--sweep", "T_kv=2048,8192")
    doc = json.loads(out)
    assert rc == 0 and doc["totals"]["time_s"] == pytest.approx(doc["overlap"]["after_s"])
    assert doc["overlap"]["transforms"] == ["double-buffer"]
    ov = doc["overlap"]
    assert ov["steps"][0]["hidden_s"] == pytest.approx(ov["before_s"] - ov["after_s"])
    assert all(e["totals"]["time_s"] == e["overlap"]["after_s"] < e["overlap"]["before_s"] for e in doc["sweep"])
    assert "no overlap" not in " ".join(doc["notes"])
    rc, out, _ = _main("kernel", "flash-attention", "--overlap", "all")
    assert rc == 0 and "Overlap: 1.223 ms → 760.8 µs" in out and "a2a-experts: nothing to rewrite" in out
    rc, out, err = _main("kernel", "flash-attention", "--overlap", "pipelining")
    assert rc == 2 and out == "" and err.count("\n") == 1 and "--overlap 'pipelining': expected one of" in err
    rc, out, _ = _main("kernel", "flash-attention", "--json")
    assert "overlap" not in json.loads(out)


@pytest.fixture(scope="module")
def moe_config(tmp_path_factory):
    path = tmp_path_factory.mktemp("moe") / "config.json"
    path.write_text(json.dumps({
        "model_type": "qwen3_moe", "hidden_size": 256, "num_attention_heads": 8, "num_key_value_heads": 4,
        "head_dim": 32, "intermediate_size": 512, "moe_intermediate_size": 128, "num_experts": 16,
        "num_experts_per_tok": 4, "num_hidden_layers": 4, "vocab_size": 512, "max_position_embeddings": 4096,
        "norm_topk_prob": True, "decoder_sparse_step": 1, "mlp_only_layers": [], "tie_word_embeddings": False}))
    return str(path)


def test_cli_text_generate_overlap(moe_config):
    args = ["text-generate", moe_config, "--device", "h200-sxm", "--num-queries", "4", "--query-length", "512",
            "--dp-size", "4", "--ep-size", "4", "--attention-dp", "--json"]
    _, base, _ = _main(*args)
    rc, out, _ = _main(*args, "--overlap", "a2a-experts", "--overlap", "weight-prefetch")
    plain, doc = json.loads(base), json.loads(out)
    assert rc == 0 and "overlap" not in plain
    ov = doc["overlap"]["performance_models"]["analytic"]
    assert doc["overlap"]["transforms"] == ["a2a-experts", "weight-prefetch"]
    assert ov["before_s"] == pytest.approx(plain["performance_models"]["analytic"]["total_time_s"])
    assert ov["after_s"] <= ov["before_s"] and ov["after_s"] >= ov["bound_s"]
    assert "kernels run one after another: no overlap between them is assumed" in plain["notes"]
    assert any(n.startswith("kernels run one after another except where --overlap") for n in doc["notes"])
    rc, out, _ = _main(*args[:-1], "--overlap", "all")
    assert rc == 0 and "Overlap (analytic, one pass)" in out


def test_cli_text_generate_pipeline_stages_with_overlap(moe_config):
    rc, out, _ = _main("text-generate", moe_config, "--device", "h200-sxm", "--num-queries", "4",
                       "--query-length", "256", "--tp-size", "2", "--ep-size", "2", "--pp-size", "2",
                       "--overlap", "comm-overlap", "--json")
    doc = json.loads(out)
    m = doc["performance_models"]["analytic"]
    stages = m["stage_times_s"]
    assert rc == 0 and len(stages) == 2
    assert m["total_time_s"] == pytest.approx(sum(stages) + (doc["parallel"]["micro_batches"] - 1) * max(stages))


def test_cli_text_generate_overlap_per_performance_model(moe_config):
    rc, out, _ = _main("text-generate", moe_config, "--device", "h200-sxm", "--num-queries", "4",
                       "--query-length", "256", "--tp-size", "2", "--ep-size", "2", "--performance-model", "analytic",
                       "--performance-model", "profiling", "--overlap", "all", "--json")
    doc = json.loads(out)
    accounts = doc["overlap"]["performance_models"]
    assert rc == 0 and list(accounts) == ["analytic", "profiling"]
    for name, acc in accounts.items():
        assert acc["bound_s"] <= acc["after_s"] <= acc["before_s"]
        assert doc["performance_models"][name]["total_time_s"] == pytest.approx(acc["after_s"])
