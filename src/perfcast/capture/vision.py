"""The vision encoder of a vision-language model, captured on fake tensors for one batch of images.

The encoder is transformers 5.24.0's own module (``Qwen2_5_VisionTransformerPretrainedModel``,
``Qwen3VLVisionModel``, ``Qwen3VLMoeVisionModel``) built on the meta device and driven step by
step as its ``forward`` runs it: the patch embedding (a Conv3d with stride = kernel = (temporal
patch, patch, patch)), Qwen3-VL's learned position embedding (bilinear: 4 table rows per patch),
Qwen2.5-VL's window reordering (a gather of merge² rows), the 2-D rotary table, the blocks, the
patch merger (norm, then an MLP on merge² patches concatenated) and Qwen3-VL's DeepStack mergers.

- **Attention** is substituted (as the decoder's is, :mod:`perfcast.capture.serving`): each
  image (full-attention blocks) or each window (Qwen2.5-VL's windowed blocks) attends to itself
  only, non-causally, with no KV cache — ``flash_attn_varlen_func`` over ``cu_seqlens`` in
  ``Qwen2_5_VLVisionAttention.forward``. The ragged batch is recorded as one attention call per
  distinct sequence length, batched over the sequences of that length, so the attended pairs are
  exactly Σ lengthᵢ² (window lengths from ``get_vision_window_index``, transformers
  ``vision_utils.py``: windows of ``window_size / patch / merge`` merged tokens a side, the last
  row and column of windows cut at the grid's edge). With windows of several lengths the calls'
  outputs are concatenated: a copy of the attention output the one varlen kernel does not make
  (memory-bound, a small share of a block).
- **Module paths** follow the decoder's naming (``model.layers.N.self_attn.qkv``,
  ``model.layers.N.mlp.down_proj``, ``…norm1`` / ``…norm2``), so the engine profiles' role table
  (:mod:`perfcast.engines.roles`) and the tensor-parallel plan (:mod:`perfcast.capture.parallel`)
  read a vision block as they read a decoder layer. The merger and each DeepStack merger are
  named as one further MLP block each (``model.layers.{depth + k}.mlp``): an MLP whose partial
  sums are reduced at its output under tensor parallelism.
- **Data parallelism over tp** (vLLM's ``mm_encoder_tp_mode = "data"``): each rank encodes its
  share of the images with the full weights, then the merged embeddings are all-gathered.
- **Tensor parallelism** (``tp`` > 1) captures one rank's shapes: heads, the MLP intermediate and
  the mergers' hidden width divided (Megatron-LM column/row-parallel linears, arXiv:1909.08053 §3;
  vLLM builds the Qwen-VL vision blocks from ``QKVParallelLinear`` / ``RowParallelLinear``). A
  width that ``tp`` does not divide is rounded up: the largest rank's share.
"""

from __future__ import annotations

import importlib
import math
import types
from dataclasses import dataclass

import sympy
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from perfcast.capture import serving
from perfcast.capture.build import track_modules
from perfcast.capture.record import Recorder, dtype_name, size_expr
from perfcast.capture.types import Capture, LayerGroup, OpRecord, TensorMeta

#: model_type → (transformers model folder, vision tower class)
ENCODERS = {
    "qwen2_5_vl": ("qwen2_5_vl", "Qwen2_5_VisionTransformerPretrainedModel"),
    "qwen3_vl": ("qwen3_vl", "Qwen3VLVisionModel"),
    "qwen3_vl_moe": ("qwen3_vl_moe", "Qwen3VLMoeVisionModel"),
}


@dataclass(frozen=True)
class Images:
    """``count`` still images of ``grid`` = (t, h, w) patches each (the processor's
    ``image_grid_thw``)."""

    count: int
    grid: tuple[int, int, int]

    @property
    def patches(self) -> int:
        t, h, w = self.grid
        return self.count * t * h * w


def window_lengths(grid: tuple[int, int, int], merge: int, window_merged: int) -> dict[int, int]:
    """Patches per attention window → how many windows have that length, for one image
    (``get_vision_window_index``: windows of ``window_merged`` merged tokens a side, the last
    ones cut at the grid's edge; each merged token is merge² patches)."""
    t, gh, gw = grid
    rows, cols = gh // merge, gw // merge

    def sides(n):
        full, rest = divmod(n, window_merged)
        return {window_merged: full, **({rest: 1} if rest else {})}

    out: dict[int, int] = {}
    for a, na in sides(rows).items():
        for b, nb in sides(cols).items():
            n = a * b * merge * merge
            out[n] = out.get(n, 0) + t * na * nb
    return out


def _attention_forward(self, hidden_states, cu_seqlens=None, position_embeddings=None, **kwargs):
    """A vision block's attention over ``self._perfcast_lengths`` (sequence length → count):
    qkv projection, 2-D rotary on q and k, one non-causal attention call per length."""
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import apply_rotary_pos_emb_vision

    n = hidden_states.shape[0]
    heads, d = self._perfcast_heads, self.head_dim
    q, k, v = self.qkv(hidden_states).reshape(n, 3, heads, d).permute(1, 0, 2, 3).unbind(0)
    cos, sin = position_embeddings
    q, k = apply_rotary_pos_emb_vision(q, k, cos, sin)
    outs, start = [], 0
    for length, count in sorted(self._perfcast_lengths.items(), reverse=True):
        rows = length * count
        part = [x[start:start + rows].reshape(count, length, heads, d).transpose(1, 2) for x in (q, k, v)]
        o = torch.ops.perfcast.attention(*part, 0, False, 0, False, 0, 0, 0.0)  # (count, length, heads, d)
        outs.append(o.reshape(rows, heads * d))
        start += rows
    out = outs[0] if len(outs) == 1 else torch.cat(outs, dim=0)
    return self.proj(out)


def _linear(old: torch.nn.Linear, in_features: int, out_features: int) -> torch.nn.Linear:
    with torch.device("meta"):
        return torch.nn.Linear(in_features, out_features, bias=old.bias is not None, dtype=old.weight.dtype)


def _shard(encoder, tp: int) -> None:
    """One tensor-parallel rank's modules: column-parallel qkv / gate / up / fc1, row-parallel
    proj / down / fc2, heads divided."""
    def split(n):
        return math.ceil(n / tp)

    for blk in encoder.blocks:
        a = blk.attn
        a._perfcast_heads = split(a.num_heads)
        width = a._perfcast_heads * a.head_dim
        a.qkv, a.proj = _linear(a.qkv, a.dim, 3 * width), _linear(a.proj, width, a.dim)
        mlp = blk.mlp
        for col, row in (("gate_proj", None), ("up_proj", "down_proj"), ("linear_fc1", "linear_fc2")):
            if hasattr(mlp, col):
                c = getattr(mlp, col)
                setattr(mlp, col, _linear(c, c.in_features, split(c.out_features)))
                if row:
                    r = getattr(mlp, row)
                    setattr(mlp, row, _linear(r, split(r.in_features), r.out_features))
    for m in _mergers(encoder):
        fc1, fc2 = (m.mlp[0], m.mlp[2]) if hasattr(m, "mlp") else (m.linear_fc1, m.linear_fc2)
        new1, new2 = _linear(fc1, fc1.in_features, split(fc1.out_features)), _linear(fc2, split(fc2.in_features), fc2.out_features)
        if hasattr(m, "mlp"):
            m.mlp[0], m.mlp[2] = new1, new2
        else:
            m.linear_fc1, m.linear_fc2 = new1, new2


def _mergers(encoder) -> list:
    return [encoder.merger, *getattr(encoder, "deepstack_merger_list", [])]


def _names(encoder) -> dict[int, str]:
    """Module → the path it is recorded under (see the module docstring)."""
    depth = len(encoder.blocks)
    names = {id(m): f"visual.{n}" if n else "visual" for n, m in encoder.named_modules()}
    rename = {"attn": "self_attn", "norm1": "input_layernorm", "norm2": "post_attention_layernorm"}
    for i, blk in enumerate(encoder.blocks):
        for n, m in blk.named_modules():
            head, _, tail = n.partition(".")
            n = ".".join(filter(None, (rename.get(head, head), tail)))
            names[id(m)] = f"model.layers.{i}" + (f".{n}" if n else "")
    subs = {"ln_q": "merger_norm", "norm": "merger_norm", "mlp": "mlp", "mlp.0": "mlp.fc1", "mlp.1": "mlp.act_fn",
            "mlp.2": "mlp.fc2", "linear_fc1": "mlp.fc1", "act_fn": "mlp.act_fn", "linear_fc2": "mlp.fc2"}
    for k, m in enumerate(_mergers(encoder)):
        for n, sub in m.named_modules():
            names[id(sub)] = f"model.layers.{depth + k}" + (f".{subs[n]}" if n else "")
    return names


def build_encoder(config, torch_dtype, tp: int = 1):
    """The vision tower of a VLM config on the meta device (no weights), one rank's share."""
    folder, name = ENCODERS[config.model_type]
    cls = getattr(importlib.import_module(f"transformers.models.{folder}.modeling_{folder}"), name)
    with torch.device("meta"):
        encoder = cls._from_config(config.vision_config, dtype=torch_dtype)
    for blk in encoder.blocks:
        blk.attn._perfcast_heads = blk.attn.num_heads
        blk.attn.forward = types.MethodType(_attention_forward, blk.attn)
    if tp > 1:
        _shard(encoder, tp)
    return encoder.eval()


def encoder_parameters(config, dtype: str = "bf16", tp: int = 1) -> tuple[int, int]:
    """(parameters, bytes) of one rank's vision encoder."""
    from perfcast.capture.build import TORCH_DTYPES

    encoder = build_encoder(config, TORCH_DTYPES[dtype], tp)
    params = list(encoder.parameters())
    return sum(p.numel() for p in params), sum(p.numel() * p.element_size() for p in params)


def capture_encoder(config, images: Images, *, dtype: str = "bf16", tp: int = 1, gather: int = 1) -> Capture:
    """Capture one encoder pass over ``images`` (all of one grid) on one tensor-parallel rank;
    ``gather`` > 1: the ranks encoded different images and all-gather their merged embeddings
    (with DeepStack's levels beside them) over ``tp``."""
    from perfcast.capture.build import TORCH_DTYPES, _fake_parameters

    serving.register()
    encoder = build_encoder(config, TORCH_DTYPES[dtype], tp)
    vc = config.vision_config
    merge = vc.spatial_merge_size
    n = images.patches
    windows = getattr(encoder, "fullatt_block_indexes", None)
    full = {images.grid[0] * images.grid[1] * images.grid[2]: images.count}
    per_window = {}
    if windows is not None:  # Qwen2.5-VL: windowed blocks except fullatt_block_indexes
        per_window = {length: c * images.count for length, c in
                      window_lengths(images.grid, merge, vc.window_size // merge // vc.patch_size).items()}
    kinds = {i: ("full" if windows is None or i in windows else "window") for i in range(len(encoder.blocks))}
    groups = [LayerGroup((kind,), tuple(i for i in kinds if kinds[i] == kind)) for kind in dict.fromkeys(kinds.values())]
    for g in groups:
        encoder.blocks[g.representative].attn._perfcast_lengths = full if g.signature == ("full",) else per_window

    fake = FakeTensorMode()
    names = _names(encoder)
    params = {names[id(m)] + f".{p}": TensorMeta(tuple(size_expr(d) for d in w.shape), dtype_name(w.dtype), True, -1)
              for m in encoder.modules() for p, w in m.named_parameters(recurse=False)}
    recorder = Recorder(params=_fake_parameters([encoder], fake))
    hooks = track_modules(names, recorder)
    pe = encoder.patch_embed
    try:
        with fake, torch.no_grad(), recorder:
            pixels = torch.empty((n, pe.in_channels * pe.temporal_patch_size * pe.patch_size ** 2),
                                 dtype=TORCH_DTYPES[dtype], device="meta")
            # A Conv3d whose stride equals its kernel sees each patch once: it is the GEMM of the
            # flattened patches with the flattened kernels (N × C·T·P² by C·T·P² × hidden).
            recorder.module = "visual.patch_embed.proj"
            h = torch.nn.functional.linear(pixels, pe.proj.weight.reshape(pe.embed_dim, -1), pe.proj.bias)
            recorder.module = ""
            if hasattr(encoder, "pos_embed"):  # Qwen3-VL: bilinear interpolation of a learned table
                recorder.module = "visual.pos_embed"
                index = torch.zeros((n, 4), dtype=torch.int64, device="meta")
                weight = torch.empty((n, 4), dtype=h.dtype, device="meta")
                h = h + (encoder.pos_embed(index) * weight[:, :, None]).sum(1).to(h.dtype)
            positions = torch.zeros((n, 2), dtype=torch.int64, device="meta")
            cos, sin = encoder.rotary_pos_emb(h, positions)
            if windows is not None:  # hidden states and rotary tables reordered window by window
                recorder.module = "visual.window_index"
                order = torch.zeros((n // merge ** 2,), dtype=torch.int64, device="meta")
                h, cos, sin = (encoder.permute_input_for_window_attn(x, order, seq_len=n) for x in (h, cos, sin))
            recorder.module = ""
            for g in groups:
                recorder.layer = g.representative
                h = encoder.blocks[g.representative](h, cu_seqlens=None, position_embeddings=(cos, sin))
            recorder.layer = None
            for m in _mergers(encoder)[1:]:  # DeepStack: features of some blocks, merged
                m(h)
            out = encoder.merger(h)
            if windows is not None:
                recorder.module = "visual.window_index"
                out = out[torch.zeros((out.shape[0],), dtype=torch.int64, device="meta")]
    finally:
        for hk in hooks:
            hk.remove()
    if gather > 1:
        levels = len(_mergers(encoder))  # the merger's output and each DeepStack merger's
        tokens, width = int(out.shape[0]), int(out.shape[1]) * levels
        src = TensorMeta((sympy.Integer(tokens), sympy.Integer(width)), dtype_name(out.dtype), False,
                         1 + max(t.uid for r in recorder.records for t in (*r.inputs, *r.outputs)))
        dst = TensorMeta((sympy.Integer(tokens * gather), sympy.Integer(width)), src.dtype, False, src.uid + 1)
        recorder.records.append(OpRecord("perfcast.all_gather.default", (src,), (dst,), ("tp", gather),
                                         "visual.gather", None))
    linear = {f"{names[id(m)]}.weight" for m in encoder.modules() if isinstance(m, torch.nn.Linear)}
    linear.add(names[id(pe.proj)] + ".weight")
    return Capture(recorder.records, groups, params, linear)
