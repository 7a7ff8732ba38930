"""Flash attention as tiled loop nests (Dao et al., "FlashAttention", NeurIPS 2022, Alg. 1;
Dao, "FlashAttention-2", 2023, Alg. 1: query tiles outer and parallel, KV tiles inner).

``flash-attention`` is the bare loop nest of ARCHITECTURE.md WE-1: it counts the matrix work and
the tile traffic. ``flash-attention-softmax`` adds the online softmax (running max and sum,
rescaling of the accumulator), so its vector work is the real kernel's.

Both read an initial output accumulator tile per query tile (``acc0``, loaded from HBM as in
the reference loop nest of WE-1, whose HBM total counts Q, O-in and O-out once each plus K and V
once per query tile).
"""

from __future__ import annotations

from perfcast.kernels.registry import kernel

_DEFAULTS = dict(B=1, H=32, T_q=4096, T_kv=4096, hd_qk=128, hd_v=128, q_blk=128, kv_blk=128)


def _operands(b):
    B, H, T_q, T_kv, hd_qk, hd_v, q_blk, kv_blk = b.dims("B H T_q T_kv hd_qk hd_v q_blk kv_blk")
    Q = b.hbm("Q", (B, H, T_q, hd_qk))
    K = b.hbm("K", (B, H, T_kv, hd_qk))
    V = b.hbm("V", (B, H, T_kv, hd_v))
    O = b.hbm("O", (B, H, T_q, hd_v))
    return (B, H, T_q, T_kv, hd_qk, hd_v, q_blk, kv_blk), (Q, K, V, O)


@kernel("flash-attention", defaults=_DEFAULTS,
        description="flash attention loop nest (WE-1): map over query tiles, reduce over KV tiles")
def flash_attention(b):
    (B, H, T_q, T_kv, hd_qk, hd_v, q_blk, kv_blk), (Q, K, V, O) = _operands(b)

    @b.parallel_map(b.tiles(T_q, q_blk), gather_axis=2)
    def q_tiles():
        q_i = b.load_tile("q_i", Q, (B, H, q_blk, hd_qk))
        acc0 = b.load_tile("acc0", O, (B, H, q_blk, hd_v))

        @b.reduce_loop(b.tiles(T_kv, kv_blk), init=[acc0])
        def kv_tiles(o_acc):
            k_t = b.load_tile("k_t", K, (B, H, kv_blk, hd_qk))
            v_t = b.load_tile("v_t", V, (B, H, kv_blk, hd_v))
            s = b.einsum("scores", "bhte,bhse->bhts", q_i, k_t)
            attn_v = b.einsum("attn_v", "bhts,bhse->bhte", s, v_t)
            return b.tensor_add("accumulate", o_acc, attn_v)

        (o,) = kv_tiles
        return b.store_tile("out", o, O)


@kernel("flash-attention-softmax", defaults=_DEFAULTS,
        description="flash attention with online softmax (running max/sum, accumulator rescaling)")
def flash_attention_softmax(b):
    (B, H, T_q, T_kv, hd_qk, hd_v, q_blk, kv_blk), (Q, K, V, O) = _operands(b)
    @b.parallel_map(b.tiles(T_q, q_blk), gather_axis=2)
    def q_tiles():
        # Softmax scale 1/sqrt(hd_qk): a constant in registers, one broadcast multiply per tile.
        scale = b.fill("softmax_scale", (1, 1, 1, 1), "fp32", value="1/sqrt(hd_qk)")
        q_i = b.load_tile("q_i", Q, (B, H, q_blk, hd_qk))
        acc0 = b.load_tile("acc0", O, (B, H, q_blk, hd_v))
        m0 = b.fill("m0", (B, H, q_blk, 1), "fp32", value="-inf")
        l0 = b.fill("l0", (B, H, q_blk, 1), "fp32", value=0)

        @b.reduce_loop(b.tiles(T_kv, kv_blk), init=[acc0, m0, l0])
        def kv_tiles(o_acc, m_prev, l_prev):
            k_t = b.load_tile("k_t", K, (B, H, kv_blk, hd_qk))
            v_t = b.load_tile("v_t", V, (B, H, kv_blk, hd_v))
            s = b.einsum("scores", "bhte,bhse->bhts", q_i, k_t)
            s = b.tensor_mul("scale", s, scale)
            m_tile = b.reduce_max("row_max", s)
            m_new = b.tensor_max("m_new", m_prev, m_tile)
            p = b.exp("p", b.tensor_sub("s_centered", s, m_new))
            alpha = b.exp("alpha", b.tensor_sub("m_delta", m_prev, m_new))
            l_new = b.tensor_add("l_new", b.tensor_mul("l_rescaled", l_prev, alpha),
                                 b.reduce_sum("row_sum", p))
            attn_v = b.einsum("attn_v", "bhts,bhse->bhte", p, v_t)
            o_new = b.tensor_add("accumulate", b.tensor_mul("o_rescaled", o_acc, alpha), attn_v)
            return o_new, m_new, l_new

        o, _, l = kv_tiles
        return b.store_tile("out", b.tensor_div("normalize", o, l), O)
