"""Expert-parallel grouped GEMMs priced from measured rows keyed on ``moe_tp`` and ``moe_ep``.

A measured row (tokens N, experts E, top_k k, moe_ep ep) times a device that holds E/ep experts
and computes the N·k/ep token-expert pairs balanced routing sends them; a leaf with T rows and
token share s computes T·k·s pairs, so it is keyed at N = T·s·ep (``perf/features.py``)."""

from pathlib import Path

import pytest
import sympy

import perfcast
from perfcast.ir import Tensor, make_leaf
from perfcast.perf import Provenance
from perfcast.perf.empirical import Miss
from perfcast.perf.features import features
from perfcast.perf.profiling import ProfilingDataSource

MAPPING = """\
schema: 1
device: h200-sxm
framework: test
version: "0"
kernels:
  Experts: {{file: Experts.csv, keys: [{keys}], axes: [tokens]}}
ops:
  perfcast.moe_experts.default: {{category: moe_fused, kernel_type: Experts}}
"""
KEYS = "tokens, hidden, inter, experts, top_k, moe_tp, moe_ep, dtype"
ROWS = """\
tokens,hidden,inter,experts,top_k,moe_tp,moe_ep,dtype,latency_us
64,1024,512,8,2,1,1,bf16,30
128,1024,512,8,2,1,1,bf16,50
64,1024,512,8,2,1,4,bf16,12
128,1024,512,8,2,1,4,bf16,20
128,1024,256,8,2,2,2,bf16,25
"""


def _db(root: Path, keys: str, rows: str) -> ProfilingDataSource:
    root.mkdir(parents=True, exist_ok=True)
    (root / "op_mapping.yaml").write_text(MAPPING.format(keys=keys))
    (root / "Experts.csv").write_text(rows)
    return ProfilingDataSource(root)


@pytest.fixture
def ep_db(tmp_path):
    return _db(tmp_path / "ep", KEYS, ROWS)


@pytest.fixture
def old_db(tmp_path):
    """A table measured on one device only: no moe_tp, moe_ep columns."""
    rows = "tokens,hidden,inter,experts,top_k,dtype,latency_us\n128,1024,512,8,2,bf16,50\n128,1024,256,8,2,bf16,28\n"
    return _db(tmp_path / "old", "tokens, hidden, inter, experts, top_k, dtype", rows)


def experts(tokens, *, ep=1, share=1, moe_tp=1, dispatched=False, hidden=1024, inter=512, num_experts=8,
            top_k=2, dtype="bf16"):
    """A parallel plan's grouped GEMM leaf: all E experts' weights at the per-device width."""
    width = inter // moe_tp
    h = Tensor("h", (tokens, hidden), dtype)
    gu, d = Tensor("gu", (num_experts, 2 * width, hidden), dtype), Tensor("d", (num_experts, hidden, width), dtype)
    return make_leaf("grouped_matmul", "moe", (h, gu, d, Tensor("i", (tokens, top_k), "int64")), (h,),
                     op="perfcast.moe_experts.default", num_experts=num_experts, top_k=top_k, routing="balanced",
                     expert_shards=ep, token_share=sympy.sympify(share), dispatched=dispatched, expert_tp=moe_tp)


def test_ep_leaf_hits_its_split(ep_db):
    # tp = ep = 4, no attention-DP: every device holds the same 128 tokens, computes 1/4 of the pairs
    leaf = experts(128, ep=4, share=sympy.Rational(1, 4))
    assert features(leaf)["tokens"] == 128 and features(leaf)["moe_ep"] == 4
    r = ep_db.lookup(leaf)
    assert (r.latency_us, r.source, r.note) == (20, Provenance.MEASURED, "Experts: exact")
    # 96 tokens: halfway between the moe_ep 4 rows at 64 (12 µs) and 128 (20 µs), not the moe_ep 1 rows
    r = ep_db.lookup(experts(96, ep=4, share=sympy.Rational(1, 4)))
    assert r.source is Provenance.INTERPOLATED and r.latency_us == pytest.approx(16)


def test_expert_tensor_parallel_leaf_is_keyed_per_device(ep_db):
    # tp = 4, ep = 2 → moe_tp 2: each expert's 512-wide intermediate is 256 wide per device
    leaf = experts(128, ep=2, share=sympy.Rational(1, 2), moe_tp=2)
    assert (features(leaf)["inter"], features(leaf)["moe_tp"]) == (256, 2)
    assert ep_db.lookup(leaf).latency_us == 25


@pytest.mark.parametrize("tokens, tp", [(32, 1), (64, 2)])
def test_attention_dp_dispatched_leaf_matches_the_group_token_row(ep_db, tokens, tp):
    """ep = tp·dp = 4 with attention-DP: each rank's T tokens, share 1/tp. The group's tokens are
    T·dp = 128 and the device computes 128·2/4 = 64 pairs — the row at tokens 128, moe_ep 4, the
    same work as the non-dispatched leaf over 128 tokens (TensorRT-LLM gathers the data-parallel
    ranks' tokens before this kernel; aiconfigurator prices it at x · attention_dp_size)."""
    share = sympy.Rational(1, tp)
    leaf = experts(tokens, ep=4, share=share, dispatched=True)
    same_work = experts(128, ep=4, share=sympy.Rational(1, 4))
    assert leaf.cost["flops.matrix"] == same_work.cost["flops.matrix"]  # 2 · 64 pairs · 3·1024·512
    assert features(leaf)["tokens"] == 128
    r = ep_db.lookup(leaf)
    assert (r.latency_us, r.source) == (20, Provenance.MEASURED)


def test_unmeasured_split_and_fractional_tokens_miss_with_the_reason(ep_db):
    miss = ep_db.lookup(experts(128, ep=8, share=sympy.Rational(1, 8)))
    assert isinstance(miss, Miss)
    assert "Experts[tokens=128, hidden=1024, inter=512, experts=8, top_k=2, moe_tp=1, moe_ep=8" in miss.reason
    miss = ep_db.lookup(experts(3, share=sympy.Rational(1, 2)))  # 3 tokens × 1/2 × 1 shard
    assert isinstance(miss, Miss) and "3/2 is not a whole number of routed tokens" in miss.reason


def test_single_device_table_still_misses_ep_leaves(old_db):
    miss = old_db.lookup(experts(128, ep=4, share=sympy.Rational(1, 4)))
    assert isinstance(miss, Miss)
    assert miss.reason == "Experts: the leaf has moe_ep 4; the table's rows are all at moe_ep 1"
    assert old_db.lookup(experts(128)).latency_us == 50
    # moe_tp alone (tp = 2, ep = 1) runs a single device's GEMMs at the per-device width 256
    assert old_db.lookup(experts(128, moe_tp=2)).latency_us == 28


# ---- the shipped H200 database (aiconfigurator-core 0.12.0, TensorRT-LLM 1.3.0rc20) -----------

SHIPPED = Path(perfcast.__file__).parent / "data" / "profiling" / "h200-sxm" / "trtllm" / "1.3.0rc20"


@pytest.fixture(scope="module")
def shipped():
    return ProfilingDataSource(SHIPPED)


def _row(**key) -> float:
    import pandas as pd

    df = pd.read_csv(SHIPPED / "GroupedMatMul.csv.gz", dtype=str)
    match = (df[list(key)] == pd.Series({k: str(v) for k, v in key.items()})).all(axis=1)
    (hit,) = df[match].to_dict("records")
    return float(hit["latency_us"])


QWEN3_30B = dict(hidden=2048, inter=768, num_experts=128, top_k=8)  # Qwen3-30B-A3B's routed experts


def test_shipped_qwen3_30b_a3b_tp4_ep4_grouped_gemm_is_measured(shipped):
    r = shipped.lookup(experts(256, ep=4, share=sympy.Rational(1, 4), **QWEN3_30B))
    assert r.source is Provenance.MEASURED and r.note == "GroupedMatMul: exact"
    assert r.latency_us == _row(tokens=256, hidden=2048, inter=768, experts=128, top_k=8, moe_tp=1, moe_ep=4,
                                routing="balanced", dtype="bf16")
    # attention-DP over 4 ranks of 64 tokens each: the same row
    assert shipped.lookup(experts(64, ep=4, share=1, dispatched=True, **QWEN3_30B)).latency_us == r.latency_us
    # tp 4, ep 2: moe_tp 2, experts 384 wide per device
    r2 = shipped.lookup(experts(256, ep=2, share=sympy.Rational(1, 2), moe_tp=2, **QWEN3_30B))
    assert r2.source is Provenance.MEASURED
    assert r2.latency_us == _row(tokens=256, hidden=2048, inter=384, experts=128, top_k=8, moe_tp=2, moe_ep=2,
                                 routing="balanced", dtype="bf16")


def test_shipped_deepseek_v3_experts_are_measured_in_fp8_block_only(shipped):
    """DeepSeek-V3's routed experts (7168 / 2048 / 256 / top 8) are measured only in block-scaled
    FP8 (``fp8_block``, kept apart from per-tensor ``fp8``): a bf16 or fp8 leaf misses with the key
    it asked for; a leaf computing in fp8_block hits the measured row."""
    deepseek = dict(ep=8, share=sympy.Rational(1, 8), hidden=7168, inter=2048, num_experts=256, top_k=8)
    miss = shipped.lookup(experts(256, **deepseek))
    assert isinstance(miss, Miss)
    assert "hidden=7168, inter=2048, experts=256, top_k=8, moe_tp=1, moe_ep=8, routing=balanced, dtype=bf16" in miss.reason
    assert isinstance(shipped.lookup(experts(256, dtype="fp8", **deepseek)), Miss)
    leaf = experts(256, dtype="fp8", **deepseek)
    block = make_leaf(leaf.kind, leaf.name, leaf.inputs, leaf.outputs, **{**dict(leaf.attrs), "compute_dtype": "fp8_block"})
    r = shipped.lookup(block)
    assert r.source is Provenance.MEASURED and r.latency_us == _row(
        tokens=256, hidden=7168, inter=2048, experts=256, top_k=8, moe_tp=1, moe_ep=8, routing="balanced",
        dtype="fp8_block")


def test_qwen3_30b_a3b_at_tp4_ep4_prices_its_grouped_gemm_from_the_table():
    from perfcast.capture.parallel import Layout
    from perfcast.hardware import get_device
    from perfcast.inference.textgen import Request, simulate
    from perfcast.models import load_model_config
    from perfcast.report.textgen import missed_ops

    r = simulate(Request(load_model_config("qwen3-30b-a3b"), get_device("h200-sxm"), num_queries=8,
                         decode=True, context_length=1024, layout=Layout(tp=4, ep=4),
                         performance_models=("profiling",), moe_routing="balanced"))  # the tables' routing
    assert "perfcast.moe_experts.default" not in {m["op"] for m in missed_ops(r, "profiling")}
