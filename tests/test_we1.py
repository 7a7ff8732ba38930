"""ARCHITECTURE.md §7 WE-1: flash attention, fast roll-up — exact anchors."""

from perfcast.ir import BYTES_HBM, FLOPS_MATRIX, FLOPS_VECTOR, cost, dim, dims, rolled_leaves
from perfcast.kernels import get_kernel

B, H, T_q, T_kv, hd_qk, hd_v, q_blk, kv_blk = dims("B H T_q T_kv hd_qk hd_v q_blk kv_blk")
PREFILL = {B: 1, H: 32, T_q: 4096, T_kv: 4096, hd_qk: 128, hd_v: 128, q_blk: 128, kv_blk: 128}
DECODE = {**PREFILL, T_q: 1, q_blk: 1}


def graph(name="flash-attention"):
    return get_kernel(name).graph


def test_leaf_names():
    assert list(rolled_leaves(graph())) == ["q_i", "acc0", "k_t", "v_t", "scores", "attn_v",
                                            "accumulate", "out"]


def test_symbolic_tile_sizes_cancel():
    leaves = rolled_leaves(graph())
    assert leaves["scores"][FLOPS_MATRIX] == 2 * B * H * T_q * T_kv * hd_qk
    assert leaves["attn_v"][FLOPS_MATRIX] == 2 * B * H * T_q * T_kv * hd_v
    # K is read T_q/q_blk times: elements B·H·T_kv·hd_qk·T_q/q_blk, 2 bytes each (bf16).
    assert leaves["k_t"][BYTES_HBM] == 2 * B * H * T_kv * hd_qk * T_q / q_blk


def test_prefill_numbers():
    leaves = {k: v.subs(PREFILL) for k, v in rolled_leaves(graph()).items()}
    total = cost(graph()).subs(PREFILL)
    assert leaves["scores"][FLOPS_MATRIX] == 137_438_953_472 == 2**37
    assert total[FLOPS_MATRIX] == 274_877_906_944
    assert leaves["k_t"][BYTES_HBM] == 1_073_741_824 == 2**30
    assert leaves["q_i"][BYTES_HBM] == 33_554_432
    assert leaves["accumulate"][FLOPS_VECTOR] == 536_870_912
    assert total[BYTES_HBM] == 2_248_146_944


def test_decode_from_the_same_trace():
    leaves = {k: v.subs(DECODE) for k, v in rolled_leaves(graph()).items()}
    assert leaves["k_t"][BYTES_HBM] == 33_554_432  # each K element read once
    assert leaves["scores"][FLOPS_MATRIX] == 33_554_432


def test_softmax_variant_has_we1_matrix_flops_and_counts_vector_work():
    plain, softmax = cost(graph()), cost(graph("flash-attention-softmax"))
    assert softmax[FLOPS_MATRIX] == plain[FLOPS_MATRIX]
    assert softmax[BYTES_HBM] == plain[BYTES_HBM]
    # Per KV tile: scale, s_centered, p (exp), row_max, row_sum touch each score (5·q·kv),
    # o_rescaled and accumulate each output element (2·q·hd_v), and five row-vector ops
    # (m_new, m_delta, alpha, l_rescaled, l_new: 5·q). Per query tile: normalize (q·hd_v).
    per_kv_tile = 5 * q_blk * kv_blk + 2 * q_blk * hd_v + 5 * q_blk
    expected = B * H * (T_q / q_blk) * ((T_kv / kv_blk) * per_kv_tile + q_blk * hd_v)
    assert (softmax[FLOPS_VECTOR] - expected).expand() == 0
    assert softmax[FLOPS_VECTOR].subs(PREFILL) == 3_795_845_120


def test_trip_counts_stay_symbolic():
    (q_tiles,) = graph().ops
    assert q_tiles.n_iter == T_q / q_blk and q_tiles.kind == "map" and q_tiles.gather_axis == 2
    kv = [op for op in q_tiles.body.ops if op.name == "kv_tiles"][0]
    assert kv.n_iter == T_kv / kv_blk and kv.kind == "reduce"
    assert kv.carried == (("accumulate", "o_acc"),)
    assert dim("T_q") is T_q
