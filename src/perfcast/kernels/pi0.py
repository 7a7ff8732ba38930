"""One control step of the π0 vision-language-action policy, written in the DSL (Black et al.,
"π0: A Vision-Language-Action Flow Model for General Robot Control", arXiv:2410.24164, §IV;
structure from openpi ``src/openpi/models/pi0.py`` ``Pi0.sample_actions``).

1. **Prefix** (once per step): each of the ``images`` camera images (224×224 in 14×14 patches:
   256 tokens) through the SigLIP So400m/14 encoder and its linear head to the language model's
   width; the ``L`` instruction tokens through Gemma's embedding (scaled by √width: openpi
   ``gemma.py`` ``Embedder.encode``); the Gemma-2B language model over the ``P = 256·images + L``
   prefix tokens, with bidirectional attention (the prefix is one block of openpi's attention
   mask), writing each layer's keys and values — the KV cache.
2. **k denoising steps** of flow matching (paper §IV: the Euler update
   ``x ← x + dt·v_θ(x, t)``, ``dt = −1/k``, openpi ``sample_actions``): each step embeds the robot
   state (one token, ``state_proj``) and the noisy chunk of ``H`` actions with the flow time
   (``action_in_proj``, then ``action_time_mlp_in`` over ``[action, time]``, swish,
   ``action_time_mlp_out``), runs the 300M action expert over those ``S = H + 1`` tokens — each
   layer attending the prefix's cached keys of the same layer and the suffix's own —, projects
   the last ``H`` tokens to velocities (``action_out_proj``) and takes the Euler step.

**π0.5** (Physical Intelligence, "π0.5: a Vision-Language-Action Model with Open-World
Generalization", arXiv:2504.16054; openpi ``Pi0Config(pi05=True)``) keeps the prefix (the
robot state discretised into the prompt's tokens) and changes the action expert: the suffix is
the ``H`` action tokens (``action_in_proj``); the flow time goes through ``time_mlp_in``/``out``
(swish after each) into every RMSNorm of the expert as an adaptive norm (scale, shift, and a gate
on the residual branch), the final norm included.

Design symbols: ``B`` observations per step (batch), ``images``, ``L`` text tokens, ``k`` steps,
``H`` the chunk length. Model sizes are parameters of :func:`pi0_step` with π0's published sizes
as defaults (:data:`SIGLIP_SO400M`, :data:`GEMMA_2B`, :data:`GEMMA_300M`).

Assumptions: attention of the suffix is full over prefix and suffix (π0's mask keeps the state
token off the action tokens: ``B·heads·H·head_dim·4`` FLOPs per layer and step not saved); the
suffix's keys are written into the cache's tail instead of concatenated to a copy of it (openpi
``gemma.py`` ``Attention`` concatenates: one more pass over the cache per layer and step); the
sinusoidal time embedding (``B·width`` sin/cos values per step) is read as a table, not
computed; the final norm of the prefix output is unused and left out (XLA removes it); every
flash-attention tile is a whole tile (``padded``: the last partial tile is computed in full).
"""

from __future__ import annotations

from perfcast.dsl import TraceError
from perfcast.ir import dims
from perfcast.kernels.registry import TIME, Figure, kernel
from perfcast.kernels.transformer import Stack, ada_rms_norm, const, layer_norm, layers, load, rms_norm

# big_vision ``big_vision/models/vit.py`` ``decode_variant("So400m/14")``: width 1152, depth 27,
# mlp_dim 4304, 16 heads (Alabdulmohsin et al., arXiv:2305.13035); openpi builds it with
# ``variant="So400m/14"``, ``pool_type="none"`` and a head to the language model's width.
SIGLIP_SO400M = Stack("vit", width=1152, depth=27, mlp_dim=4304, heads=16, kv_heads=16, head_dim=72, gemma=False)
# openpi ``src/openpi/models/gemma.py`` ``get_config("gemma_2b")`` and ``("gemma_300m")``.
GEMMA_2B = Stack("vlm", width=2048, depth=18, mlp_dim=16384, heads=8, kv_heads=1, head_dim=256, gemma=True)
GEMMA_300M = Stack("expert", width=1024, depth=18, mlp_dim=4096, heads=8, kv_heads=1, head_dim=256, gemma=True)
PALIGEMMA_VOCAB = 257152  # openpi gemma.py PALIGEMMA_VOCAB_SIZE
PATCHES = 256  # (224 / 14)² patches per image
PATCH_DIM = 14 * 14 * 3  # one RGB patch, flattened: the patch embedding's contraction
ACTION_DIM = 32  # openpi pi0_config.Pi0Config.action_dim (state and actions padded to it)
# FlashAttention-2 on H100 runs head dim 256 in 64×64 tiles ("2 CTAs per SM": flash-attention
# csrc/flash_attn/src/flash_fwd_launch_template.h, run_mha_fwd_hdim256); the vision stack's
# head dim 72 uses the same tiles.
Q_BLK = KV_BLK = 64

# openpi pi0_config.Pi0Config: action_horizon 50, max_token_len 48; sample_actions(num_steps=10);
# three cameras (openpi models/model.py IMAGE_KEYS: base_0_rgb, left_wrist_0_rgb, right_wrist_0_rgb).
_DEFAULTS = dict(B=1, images=3, L=48, k=10, H=50)

_B, _H = dims("B H")
FIGURES = (
    Figure("control_rate", "Hz", 1 / TIME,
           "control steps per second for each of the B observations (robots) of a step: steps back "
           "to back on one device, one chunk each"),
    Figure("action_rate", "actions/s", _H / TIME,
           "actions per second per robot when each chunk of H actions is executed open-loop before "
           "the next step's chunk is used (the bound for an execution horizon of H; h < H executed "
           "actions per chunk give h / time)"),
    Figure("batch_action_rate", "actions/s", _B * _H / TIME,
           "action_rate summed over the B observations of a step"),
)
_STATE_NOTE = ("suffix attention is full over prefix + suffix (π0 masks the state token off the "
               "actions: not saved)")
NOTES = (
    "suffix keys/values written into the cache's tail (openpi concatenates to a copy: one more "
    "cache pass per layer and step, not priced)",
    "sinusoidal flow-time embedding read as a table (its B·1024 sin/cos per step not priced)",
    "flash-attention tiles are whole 64×64 tiles (padded): the last partial tile is computed in full",
    "the state/action projections and the time MLP in bf16 (openpi: fp32)",
)


@kernel("pi0", defaults=_DEFAULTS, padded=True, figures=FIGURES, notes=(_STATE_NOTE, *NOTES),
        description="π0 VLA control step: SigLIP + Gemma-2B prefill of images and text, then k "
                    "flow-matching steps of the 300M action expert over H actions")
def pi0(b):
    return pi0_step(b)


# openpi pi0_config.Pi0Config(pi05=True): max_token_len 200 (the prompt carries the discretised
# state), action_horizon 50.
@kernel("pi05", defaults=dict(_DEFAULTS, L=200), padded=True, figures=FIGURES, notes=NOTES,
        description="π0.5 VLA control step: as pi0, the flow time through adaptive RMSNorms of the "
                    "action expert and the state in the prompt (no state token)")
def pi05(b):
    return pi0_step(b, pi05=True)


def pi0_step(b, *, pi05: bool = False, vision: Stack = SIGLIP_SO400M, vlm: Stack = GEMMA_2B,
             expert: Stack = GEMMA_300M, vocab: int = PALIGEMMA_VOCAB, action_dim: int = ACTION_DIM, q_blk: int = Q_BLK,
             kv_blk: int = KV_BLK):
    """Trace one control step; returns the final action chunk ``(B, H, action_dim)``. ``pi05``:
    π0.5's action expert (no state token, the flow time through adaptive RMSNorms)."""
    B, n_img, L, k, H = b.dims("B images L k H")
    P, S = PATCHES * n_img + L, H if pi05 else H + 1
    D = vlm.width
    prefix = b.hbm("prefix", (B, P, D))
    # the KV cache, per layer: the prefix's keys then the suffix's (one layer's slice, read and
    # written once per layer by both stacks' loops)
    cache = (b.hbm("k_cache", (B, vlm.kv_heads, P + S, vlm.head_dim)),
             b.hbm("v_cache", (B, vlm.kv_heads, P + S, vlm.head_dim)))
    if (expert.kv_heads, expert.head_dim) != (vlm.kv_heads, vlm.head_dim):
        raise TraceError("the action expert attends the VLM's cache: its kv_heads and head_dim must match")

    _vision(b, vision, B * n_img, D, prefix, q_blk, kv_blk)

    @b.block(name="vlm.embed", launch=True)
    def text_tokens():
        # the gather reads the L rows and writes them (the prefix's last L rows: its rule counts
        # both); the √D scale is fused into it
        ids = load(b, "vlm.load_token_ids", b.hbm("token_ids", (B, L), "int32"))
        rows = b.gather("vlm.embed_lookup", b.hbm("vlm.embedding", (vocab, D)), ids, (B, L, D))
        b.tensor_mul("vlm.embed_scale", rows, const(b, "vlm.sqrt_width", f"sqrt({D})"))

    layers(b, vlm, prefix, cache, kv_len=P, q_blk=q_blk, kv_blk=kv_blk)
    return _denoise(b, expert, (B, H, S, P + S, k), action_dim, cache, q_blk, kv_blk, pi05)


def _vision(b, s: Stack, N, width, prefix, q_blk, kv_blk):
    """SigLIP over ``N`` images: patch embedding (a stride-14 14×14 convolution is a GEMM over
    the flattened patches) plus learned position embeddings, ``s.depth`` ViT layers, the final
    LayerNorm and the linear head to the language model's width, written into the prefix's
    first ``N·256`` rows (a ``(N, 256, width)`` view of them)."""
    D = s.width
    pixels = b.hbm("pixels", (N, PATCHES, PATCH_DIM))
    x = b.hbm("vit.tokens", (N, PATCHES, D))

    @b.block(name="vit.embed", launch=True)
    def embed():
        e = b.einsum("vit.patch_proj", "ntc,cd->ntd", load(b, "vit.load_pixels", pixels),
                     load(b, "vit.load_w_patch", b.hbm("vit.w_patch", (PATCH_DIM, D))))
        e = b.tensor_add("vit.patch_bias", e, load(b, "vit.load_b_patch", b.hbm("vit.b_patch", (D,))))
        e = b.tensor_add("vit.pos_embed", e, load(b, "vit.load_pos", b.hbm("vit.pos_embedding", (PATCHES, D))))
        b.store_tile("vit.store_tokens", e, x)

    kv = tuple(b.hbm(f"vit.{n}", (N, s.kv_heads, PATCHES, s.head_dim)) for n in ("k", "v"))
    h = layers(b, s, x, kv, kv_len=PATCHES, q_blk=q_blk, kv_blk=kv_blk)

    @b.block(name="vit.head", launch=True)
    def head():
        y = layer_norm(b, "vit.final_norm.", load(b, "vit.load_out", h),
                       load(b, "vit.load_norm_gamma", b.hbm("vit.norm_gamma", (D,))),
                       load(b, "vit.load_norm_beta", b.hbm("vit.norm_beta", (D,))), s.eps)
        w_head = load(b, "vit.load_w_head", b.hbm("vit.w_head", (D, width)))
        y = b.einsum("vit.head_proj", "ntd,de->nte", y, w_head)
        y = b.tensor_add("vit.head_bias", y, load(b, "vit.load_b_head", b.hbm("vit.b_head", (width,))))
        b.store_tile("vit.store_image_tokens", y, prefix)


def _denoise(b, s: Stack, sizes, action_dim, cache, q_blk, kv_blk, pi05):
    """``k`` Euler steps of the action expert, carrying the action chunk ``x``. Everything is
    bf16: openpi runs the small state/action projections and the time MLP in fp32 (about
    ``2·H·D·(action_dim + 3·D)`` FLOPs a step, 0.3 GFLOP at the defaults), priced here at the bf16
    rate."""
    B, H, S, T_kv, k = sizes
    D, p = s.width, s.name + "."
    suffix = b.hbm("suffix", (B, S, D))
    x0 = b.hbm("noise", (B, H, action_dim))
    x_next = b.hbm("actions", (B, H, action_dim))

    def w(name, shape):
        return b.hbm(p + name, shape)

    def dense(name, x, wt, bias, eq="nti,io->nto"):
        y = b.einsum(p + name, eq, x, load(b, p + "load_" + wt.name[len(p):], wt))
        return b.tensor_add(p + name + "_bias", y, load(b, p + "load_" + bias.name[len(p):], bias))

    w_in, b_in = w("w_action_in", (action_dim, D)), w("b_action_in", (D,))
    w_out, b_out = w("w_action_out", (D, action_dim)), w("b_action_out", (action_dim,))
    time_emb = b.hbm(p + "time_embedding", (B, 1, D))
    mlp = [(w(f"w_time_mlp_{n}", (D, D)), w(f"b_time_mlp_{n}", (D,))) for n in ("in", "out")]
    if pi05:
        cond = b.hbm(p + "time_cond", (B, 1, D))
        final = {part: (w(f"final_norm_w_{part}", (D, D)), w(f"final_norm_b_{part}", (D,)))
                 for part in ("scale", "shift", "gate")}
    else:
        cond, mid = None, b.hbm(p + "action_time", (B, H, D))
        state = b.hbm("state", (B, 1, action_dim))
        w_state, b_state = w("w_state", (action_dim, D)), w("b_state", (D,))
        w_mlp_t = w("w_time_mlp_in_time", (D, D))  # the time half of action_time_mlp_in

    def step(x_t):
        if pi05:
            @b.block(name=p + "time_mlp", launch=True)
            def time_mlp():  # π0.5: swish(Dense(swish(Dense(t_emb)))) conditions every norm
                t = load(b, p + "load_time", time_emb)
                for i, (wt, bias) in enumerate(mlp):
                    t = b.silu(f"{p}swish{i}", dense(f"time_mlp_{i}", t, wt, bias))
                b.store_tile(p + "store_time_cond", t, cond)

            @b.block(name=p + "embed_actions", launch=True)
            def embed_actions():  # the suffix is the H action tokens
                a = dense("action_in_proj", load(b, p + "load_noisy_actions", x_t), w_in, b_in)
                b.store_tile(p + "store_action_tokens", a, suffix)
        else:
            @b.block(name=p + "embed_state", launch=True)
            def embed_state():  # the suffix's first token
                token = dense("state_proj", load(b, p + "load_state", state), w_state, b_state)
                b.store_tile(p + "store_state_token", token, suffix)

            @b.block(name=p + "embed_actions", launch=True)
            def embed_actions():
                a = dense("action_in_proj", load(b, p + "load_noisy_actions", x_t), w_in, b_in)
                # openpi concatenates [action tokens, time tokens broadcast over H] and applies one
                # 2·D → D Dense: the two halves of that contraction, the broadcast materialised
                t = b.tensor_add(p + "time_broadcast", b.fill(p + "zeros", (B, H, D)),
                                 load(b, p + "load_time", time_emb))
                t = b.einsum(p + "time_mlp_in_time", "nti,io->nto", t, load(b, p + "load_w_mlp_t", w_mlp_t))
                y = b.tensor_add(p + "time_mlp_in", dense("time_mlp_in_action", a, *mlp[0]), t)
                b.store_tile(p + "store_action_time", b.silu(p + "swish", y), mid)

            @b.block(name=p + "time_mlp_out", launch=True)
            def time_mlp_out():  # the suffix's last H tokens
                tokens = dense("time_mlp_out_proj", load(b, p + "load_mid", mid), *mlp[1])
                b.store_tile(p + "store_action_tokens", tokens, suffix)

        h = layers(b, s, suffix, cache, kv_len=T_kv, q_blk=S, kv_blk=kv_blk, cond=cond)

        @b.block(name=p + "velocity", launch=True)
        def velocity():  # the last H tokens' velocity and the Euler step x + dt·v, dt = −1/k
            y = b.load_tile(p + "load_h_actions", h, (B, H, D))
            if pi05:  # the final norm's gate is unused
                y, _ = ada_rms_norm(b, p + "final_norm.", y, load(b, p + "load_cond_final", cond), final,
                                    s.eps)
            else:
                scale = load(b, p + "load_final_norm", w("final_norm_scale", (D,)))
                y = rms_norm(b, p + "final_norm.", y, scale, s.eps)
            v = dense("action_out_proj", y, w_out, b_out)
            dt_v = b.tensor_mul(p + "dt_v", v, const(b, p + "dt", "-1/k"))
            x = b.tensor_add(p + "euler", load(b, p + "load_x_t", x_t), dt_v)
            return b.store_tile(p + "store_actions", x, x_next)

        return velocity

    step.__name__ = "denoise_step"
    (x,) = b.reduce_loop(k, init=[x0], name="denoise")(step)
    return x
