"""Transformer layers in the DSL for models written in it (the π0 policy, :mod:`.pi0`).

A pre-norm layer is five kernel launches — the fusion groups of a compiled (XLA, TensorRT)
transformer block, each a GEMM with its prologue and epilogue fused:

1. ``qkv``: the pre-attention norm, the Q, K and V projections (+ biases), rotary embeddings; Q is
   written for the attention kernel, K and V into the layer's KV cache;
2. ``attention``: the online-softmax flash-attention nest (:func:`.flash_attention.attention`)
   over the layer's queries and the first ``kv_len`` keys of the cache;
3. ``o_proj``: the output projection (+ bias) and the residual add;
4. ``mlp_up``: the pre-MLP norm and the up projection(s) with the activation — GeGLU
   ``gelu(x·W_gate) ⊙ x·W_up`` (Gemma) or ``gelu(x·W_1 + b_1)`` (ViT);
5. ``mlp_down``: the down projection (+ bias) and the residual add.

Tensors between kernels cross HBM (each kernel loads its inputs and stores its outputs);
inside a kernel its intermediates stay on chip. Layouts: activations ``(N, T, D)``; queries
``(N, H_kv, G, T, hd)`` with ``G = heads / kv_heads`` query heads per KV head (multi-head
attention is ``G = 1``); keys and values ``(N, H_kv, T_kv, hd)``. The layers are a loop of
``depth`` iterations carrying the residual stream; each iteration reads its own layer's slice of
the stacked weights (declared with one layer's shape, so the loop reads every layer's weights
once), as in openpi's ``nn.scan`` over layers (openpi ``src/openpi/models/gemma.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

from perfcast.kernels.flash_attention import attention, carrying


@dataclass(frozen=True)
class Stack:
    """One transformer stack's sizes. ``gemma=True``: RMSNorm, rotary embeddings, GeGLU MLP,
    no biases (Gemma: Gemma Team, arXiv:2403.08295, §2); ``False``: LayerNorm, biases, GELU MLP,
    no rotary embeddings (ViT: Dosovitskiy et al., arXiv:2010.11929, §3.1, as in SigLIP)."""

    name: str  # prefix of the stack's leaves and tensors
    width: int
    depth: int
    mlp_dim: int
    heads: int
    kv_heads: int
    head_dim: int
    gemma: bool
    eps: float = 1e-6

    @property
    def group(self) -> int:
        return self.heads // self.kv_heads


def const(b, name: str, value):
    """A scalar constant in registers, broadcast by the vector op that uses it."""
    return b.fill(name, (1,), "fp32", value=value)


def load(b, name: str, t):
    """The whole of ``t`` as one tile."""
    return b.load_tile(name, t, t.shape)


def rms_norm(b, p: str, x, scale, eps: float):
    """``x · rsqrt(mean(x²) + eps) · scale`` over the last dim (Zhang & Sennrich, "Root Mean
    Square Layer Normalization", NeurIPS 2019, §3; Gemma's scale is ``1 + w``, folded into the
    weight: openpi ``gemma.py`` ``RMSNorm``)."""
    ss = b.reduce_sum(p + "sumsq", b.tensor_mul(p + "square", x, x))
    ms = b.tensor_mul(p + "mean_square", ss, const(b, p + "inv_width", f"1/{x.shape[-1]}"))
    r = b.rsqrt(p + "rsqrt", b.tensor_add(p + "plus_eps", ms, const(b, p + "eps", eps)))
    return b.tensor_mul(p + "gain", b.tensor_mul(p + "normalize", x, r), scale)


def ada_rms_norm(b, p: str, x, cond, weights, eps: float):
    """Adaptive RMSNorm (π0.5's flow-time conditioning: openpi ``gemma.py`` ``RMSNorm`` with
    ``cond``): ``Dense(cond) → (scale, shift, gate)``, ``x̂·(1 + scale) + shift``; the gate scales
    the sub-block's output on the residual (``_gated_residual``: ``x + y·gate``). ``weights``: the
    Dense's ``(D, D)`` kernels and ``(D,)`` biases per part (one ``D → 3D`` Dense, split); the
    ``1 + scale`` is one vector op on the ``(N, 1, D)`` conditioning rows. Returns ``(y, gate)``."""
    ss = b.reduce_sum(p + "sumsq", b.tensor_mul(p + "square", x, x))
    ms = b.tensor_mul(p + "mean_square", ss, const(b, p + "inv_width", f"1/{x.shape[-1]}"))
    r = b.rsqrt(p + "rsqrt", b.tensor_add(p + "plus_eps", ms, const(b, p + "eps", eps)))
    mod = {}
    for part, (w, bias) in weights.items():
        m = b.einsum(f"{p}{part}_proj", "nsd,de->nse", cond, load(b, f"{p}load_w_{part}", w))
        mod[part] = b.tensor_add(f"{p}{part}_bias", m, load(b, f"{p}load_b_{part}", bias))
    gain = b.tensor_add(p + "one_plus_scale", mod["scale"], const(b, p + "one", 1))
    y = b.tensor_mul(p + "gain", b.tensor_mul(p + "normalize", x, r), gain)
    return b.tensor_add(p + "shift", y, mod["shift"]), mod["gate"]


def layer_norm(b, p: str, x, gamma, beta, eps: float):
    """``(x − mean) · rsqrt(var + eps) · γ + β`` over the last dim (Ba et al., "Layer
    Normalization", arXiv:1607.06450, §3; the two-pass mean/variance of flax
    ``nn.LayerNorm``)."""
    inv = const(b, p + "inv_width", f"1/{x.shape[-1]}")
    mean = b.tensor_mul(p + "mean", b.reduce_sum(p + "sum", x), inv)
    xc = b.tensor_sub(p + "center", x, mean)
    var = b.tensor_mul(p + "var", b.reduce_sum(p + "sumsq", b.tensor_mul(p + "square", xc, xc)), inv)
    r = b.rsqrt(p + "rsqrt", b.tensor_add(p + "plus_eps", var, const(b, p + "eps", eps)))
    return b.tensor_add(p + "shift", b.tensor_mul(p + "gain", b.tensor_mul(p + "normalize", xc, r), gamma), beta)


def gelu_tanh(b, p: str, x):
    """``0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))``, the tanh approximation of GELU (Hendrycks
    & Gimpel, arXiv:1606.08415, §2) that ``jax.nn.gelu`` computes by default: 8 vector ops and
    one tanh per element."""
    x3 = b.tensor_mul(p + "cube", b.tensor_mul(p + "square", x, x), x)
    inner = b.tensor_add(p + "inner", x, b.tensor_mul(p + "cubic", x3, const(b, p + "c_cubic", 0.044715)))
    t = b.tanh(p + "tanh", b.tensor_mul(p + "scaled", inner, const(b, p + "c_sqrt_2_over_pi", "sqrt(2/pi)")))
    half = b.tensor_mul(p + "half_x", x, const(b, p + "c_half", 0.5))
    return b.tensor_mul(p + "gelu", half, b.tensor_add(p + "one_plus", t, const(b, p + "c_one", 1)))


def rope(b, p: str, x, cos, sin):
    """Rotary embedding ``x·cos + rotate_half(x)·sin`` (Su et al., arXiv:2104.09864, §3.4.2):
    two multiplies and an add per element; ``rotate_half`` is a permutation with sign flips,
    folded into the ``sin`` table."""
    return b.tensor_add(p + "rope", b.tensor_mul(p + "rope_cos", x, cos), b.tensor_mul(p + "rope_sin", x, sin))


def layers(b, s: Stack, h0, kv, *, kv_len, q_blk, kv_blk, cond=None):
    """``s.depth`` layers over the residual stream ``h0`` ``(N, T, D)``; the loop's value is the
    last layer's output. ``kv`` is the ``(K, V)`` cache ``(N, H_kv, T_kv, hd)``: each layer writes
    its ``T`` tokens' keys and values there and attends the first ``kv_len`` keys (the tokens of
    an earlier stack first, then these). With ``cond`` (``(N, 1, D)`` in HBM) the two norms are
    adaptive RMSNorms (:func:`ada_rms_norm`) and their gates scale the residual branches."""
    N, T, D = h0.shape
    Hk, G, hd, F = s.kv_heads, s.group, s.head_dim, s.mlp_dim
    p = s.name + "."
    K, V = kv

    def hbm(name, shape, dtype=None):
        return b.hbm(p + name, shape, dtype)

    wq, wk, wv = hbm("w_q", (D, Hk, G, hd)), hbm("w_k", (D, Hk, hd)), hbm("w_v", (D, Hk, hd))
    wo, w_down = hbm("w_o", (Hk, G, hd, D)), hbm("w_down", (F, D))
    w_up = {n: hbm(f"w_{n}", (D, F)) for n in (("gate", "up") if s.gemma else ("fc1",))}
    norms = [[hbm(f"ln{i}_{n}", (D,)) for n in (("scale",) if s.gemma else ("gamma", "beta"))] for i in (1, 2)]
    if s.gemma:
        cos, sin = hbm("rope_cos", (T, hd), "fp32"), hbm("rope_sin", (T, hd), "fp32")
    else:
        bq, bk, bv = hbm("b_q", (Hk, G, 1, hd)), hbm("b_k", (Hk, 1, hd)), hbm("b_v", (Hk, 1, hd))
        bo, b_fc1, b_down = hbm("b_o", (D,)), hbm("b_fc1", (F,)), hbm("b_down", (D,))
    q_buf, o_buf = hbm("q", (N, Hk, G, T, hd)), hbm("attn_out", (N, Hk, G, T, hd))
    h_attn, act, h_out = hbm("h_attn", (N, T, D)), hbm("mlp_act", (N, T, F)), hbm("h_out", (N, T, D))

    if cond is not None:  # per norm: the modulation Dense, and its gate kept for the residual
        ada = {i: {part: (hbm(f"ln{i}_w_{part}", (D, D)), hbm(f"ln{i}_b_{part}", (D,)))
                   for part in ("scale", "shift", "gate")} for i in (1, 2)}
        gates = {i: hbm(f"ln{i}_gate", (N, 1, D)) for i in (1, 2)}

    def norm(i, x):
        if cond is not None:
            y, gate = ada_rms_norm(b, f"{p}ln{i}.", x, load(b, f"{p}load_cond{i}", cond), ada[i], s.eps)
            b.store_tile(f"{p}store_gate{i}", gate, gates[i])
            return y
        ws = [load(b, f"{p}load_ln{i}_{j}", w) for j, w in enumerate(norms[i - 1])]
        if s.gemma:
            return rms_norm(b, f"{p}ln{i}.", x, ws[0], s.eps)
        return layer_norm(b, f"{p}ln{i}.", x, ws[0], ws[1], s.eps)

    def biased(name, y, bias):
        return y if s.gemma else b.tensor_add(p + name, y, load(b, p + "load_" + name, bias))

    def gated(i, y):
        return y if cond is None else b.tensor_mul(f"{p}gate{i}", y, load(b, f"{p}load_gate{i}", gates[i]))

    def layer(h):
        @b.block(name=p + "qkv", launch=True)
        def qkv():
            x = norm(1, load(b, p + "load_x", h))
            q = biased("q_bias", b.einsum(p + "q_proj", "ntd,dkge->nkgte", x, load(b, p + "load_w_q", wq)),
                       None if s.gemma else bq)
            k = biased("k_bias", b.einsum(p + "k_proj", "ntd,dke->nkte", x, load(b, p + "load_w_k", wk)),
                       None if s.gemma else bk)
            v = biased("v_bias", b.einsum(p + "v_proj", "ntd,dke->nkte", x, load(b, p + "load_w_v", wv)),
                       None if s.gemma else bv)
            if s.gemma:
                c, sn = load(b, p + "load_cos", cos), load(b, p + "load_sin", sin)
                q, k = rope(b, p + "q_", q, c, sn), rope(b, p + "k_", k, c, sn)
            for name, t, dst in (("q", q, q_buf), ("k", k, K), ("v", v, V)):
                b.store_tile(p + "store_" + name, t, dst)

        @b.block(name=p + "attention", launch=True)
        def attn():
            attention(b, q_buf, K, V, o_buf, q_blk=q_blk, kv_blk=kv_blk, kv_len=kv_len, prefix=p,
                      fill_acc=True)

        @b.block(name=p + "o_proj", launch=True)
        def o_proj():
            o = b.einsum(p + "out_proj", "nkgte,kged->ntd", load(b, p + "load_attn", o_buf),
                         load(b, p + "load_w_o", wo))
            o = gated(1, biased("o_bias", o, None if s.gemma else bo))
            h1 = b.tensor_add(p + "residual_attn", o, load(b, p + "load_res", h))
            return b.store_tile(p + "store_h_attn", h1, h_attn)

        @b.block(name=p + "mlp_up", launch=True)
        def mlp_up():
            x = norm(2, load(b, p + "load_h_attn", h_attn))
            ups = [b.einsum(f"{p}{n}_proj", "ntd,df->ntf", x, load(b, f"{p}load_w_{n}", w))
                   for n, w in w_up.items()]
            if s.gemma:
                a = b.tensor_mul(p + "glu", gelu_tanh(b, p + "gelu.", ups[0]), ups[1])
            else:
                a = gelu_tanh(b, p + "gelu.", biased("fc1_bias", ups[0], b_fc1))
            b.store_tile(p + "store_act", a, act)

        @b.block(name=p + "mlp_down", launch=True)
        def mlp_down():
            y = b.einsum(p + "down_proj", "ntf,fd->ntd", load(b, p + "load_act", act),
                         load(b, p + "load_w_down", w_down))
            y = gated(2, biased("down_bias", y, None if s.gemma else b_down))
            h2 = b.tensor_add(p + "residual_mlp", y, load(b, p + "load_res2", h_attn))
            return b.store_tile(p + "store_h", h2, h_out)

        return mlp_down

    layer.__name__ = p + "layer"
    (h_last,) = b.reduce_loop(s.depth, init=[h0], name=p + "layers")(carrying(s.name + "_h")(layer))
    return h_last
