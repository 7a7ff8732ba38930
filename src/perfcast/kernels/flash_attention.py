"""Flash attention as tiled loop nests (Dao et al., "FlashAttention", NeurIPS 2022, Alg. 1;
Dao, "FlashAttention-2", 2023, Alg. 1: query tiles outer and parallel, KV tiles inner).

``flash-attention`` is the bare loop nest of ARCHITECTURE.md WE-1: it counts the matrix work and
the tile traffic. ``flash-attention-softmax`` adds the online softmax (running max and sum,
rescaling of the accumulator), so its vector work is the real kernel's.

Both read an initial output accumulator tile per query tile (``acc0``, loaded from HBM as in
the reference loop nest of WE-1, whose HBM total counts Q, O-in and O-out once each plus K and V
once per query tile).

:func:`attention` is the online-softmax nest as a block for models written in the DSL: any
leading dims, grouped-query heads, a key count of its own, prefixed names, and an accumulator
started on chip.
"""

from __future__ import annotations

import inspect

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
    return attention(b, Q, K, V, O, q_blk=q_blk, kv_blk=kv_blk)


def attention(b, Q, K, V, O, *, q_blk, kv_blk, kv_len=None, prefix: str = "", fill_acc: bool = False):
    """The online-softmax nest over tensors laid out ``(lead..., T, head_dim)``, as a reusable
    block: ``Q``, ``O`` are ``(B, H, T_q, hd)`` or, for grouped-query attention,
    ``(B, H_kv, G, T_q, hd)`` with ``K``, ``V`` ``(B, H_kv, T_kv, hd)`` — the ``G`` query heads of
    one KV head share each K/V tile (one tile load serves the group). ``kv_len`` (default: all of
    ``K``'s rows) is how many keys are attended; the names of the leaves and loops get
    ``prefix``. ``fill_acc`` starts the output accumulator on chip (a production kernel) instead
    of loading it from ``O`` (the WE-1 reference nest)."""
    lead, kv_lead = "bhg"[:Q.rank - 2], "bhg"[:K.rank - 2]
    q_shape, kv_shape = Q.shape[:-2], K.shape[:-2]
    hd_qk, hd_v = Q.shape[-1], V.shape[-1]
    kv_len = K.shape[-2] if kv_len is None else kv_len
    rows, one = q_shape + (q_blk, 1), (1,) * Q.rank

    def n(name):
        return prefix + name

    @b.parallel_map(b.tiles(Q.shape[-2], q_blk), gather_axis=Q.rank - 2, name=n("q_tiles"))
    def q_tiles():
        # Softmax scale 1/sqrt(hd_qk): a constant in registers, one broadcast multiply per tile.
        scale = b.fill(n("softmax_scale"), one, "fp32", value="1/sqrt(hd_qk)")
        q_i = b.load_tile(n("q_i"), Q, q_shape + (q_blk, hd_qk))
        acc0 = (b.fill(n("acc0"), q_shape + (q_blk, hd_v), "fp32") if fill_acc
                else b.load_tile(n("acc0"), O, q_shape + (q_blk, hd_v)))
        m0 = b.fill(n("m0"), rows, "fp32", value="-inf")
        l0 = b.fill(n("l0"), rows, "fp32", value=0)

        @b.reduce_loop(b.tiles(kv_len, kv_blk), init=[acc0, m0, l0], name=n("kv_tiles"))
        @carrying(*(prefix.replace(".", "_") + a for a in ("o_acc", "m_prev", "l_prev")))
        def kv_tiles(o_acc, m_prev, l_prev):
            k_t = b.load_tile(n("k_t"), K, kv_shape + (kv_blk, hd_qk))
            v_t = b.load_tile(n("v_t"), V, kv_shape + (kv_blk, hd_v))
            s = b.einsum(n("scores"), f"{lead}te,{kv_lead}se->{lead}ts", q_i, k_t)
            s = b.tensor_mul(n("scale"), s, scale)
            m_tile = b.reduce_max(n("row_max"), s)
            m_new = b.tensor_max(n("m_new"), m_prev, m_tile)
            p = b.exp(n("p"), b.tensor_sub(n("s_centered"), s, m_new))
            alpha = b.exp(n("alpha"), b.tensor_sub(n("m_delta"), m_prev, m_new))
            l_new = b.tensor_add(n("l_new"), b.tensor_mul(n("l_rescaled"), l_prev, alpha),
                                 b.reduce_sum(n("row_sum"), p))
            attn_v = b.einsum(n("attn_v"), f"{lead}ts,{kv_lead}se->{lead}te", p, v_t)
            o_new = b.tensor_add(n("accumulate"), b.tensor_mul(n("o_rescaled"), o_acc, alpha), attn_v)
            return o_new, m_new, l_new

        o, _, l = kv_tiles
        return b.store_tile(n("out"), b.tensor_div(n("normalize"), o, l), O)

    return q_tiles


def carrying(*names: str):
    """Decorator: a loop body whose carried accumulators get ``names`` (identifiers) — a
    reduce loop names them after its body's parameters, and names are unique in a trace."""

    def deco(f):
        f.__signature__ = inspect.Signature(
            [inspect.Parameter(n, inspect.Parameter.POSITIONAL_ONLY) for n in names])
        return f

    return deco
