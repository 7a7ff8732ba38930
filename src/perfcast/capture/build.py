"""Build a Hugging Face causal LM on fake tensors and capture one serving step.

The model is built from its config under ``FakeTensorMode`` (shapes and dtypes, no storage),
with perfcast's attention and experts implementations (:mod:`perfcast.capture.serving`). The
step is driven layer by layer — embedding, rotary tables, decoder layers, final norm, logits —
so that the capture controls what a serving engine controls: which positions produce logits
(the last one of each sequence in prefill) and how much context the KV cache holds.

Identical decoder layers are captured once: layers are grouped by a structural signature (their
submodules' types, parameter shapes, attention window and layer type) and one representative of
each group runs; the lowering rolls it into ``Loop(count, layer)``.
"""

from __future__ import annotations

import copy
import importlib
import types

import sympy
import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext

from perfcast.capture import serving, vision_lm
from perfcast.capture.record import Recorder, dtype_name, size_expr
from perfcast.capture.types import Capture, LayerGroup, TensorMeta
from perfcast.ir import UserError, dim
from perfcast.models import ModelConfig

TORCH_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def layer_signature(layer: torch.nn.Module) -> tuple:
    parts = []
    for name, mod in layer.named_modules():
        own = tuple((n, tuple(p.shape), str(p.dtype)) for n, p in mod.named_parameters(recurse=False))
        extra = (getattr(mod, "sliding_window", None), getattr(mod, "layer_type", None),
                 getattr(mod, "attention_type", None))
        parts.append((name, type(mod).__name__, own, extra))
    return tuple(parts)


def group_layers(layers) -> list[LayerGroup]:
    order: dict[tuple, list[int]] = {}
    for i, layer in enumerate(layers):
        order.setdefault(layer_signature(layer), []).append(i)
    return [LayerGroup(sig, tuple(idx)) for sig, idx in order.items()]


def hf_config(model: ModelConfig):
    """The transformers config object of a catalog/path config; errors name the file.
    The config class is looked up for its model type alone (not through AutoConfig, which
    indexes every architecture transformers has)."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    data = dict(model.data)
    try:
        return CONFIG_MAPPING[data.pop("model_type")](**data)
    except (ValueError, TypeError, KeyError) as e:
        raise UserError(f"{model.path}: not a valid {model.model_type} config: {e}") from None


def build_model(config, dtype: str):
    """The causal LM on the meta device: every parameter has a shape and a dtype, none has
    storage or values (weights are never initialised)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    serving.register()
    config = copy.deepcopy(config)
    # Quantization is perfcast's own (--quantize); a checkpoint's quantizer is not run.
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    if config.model_type in vision_lm.TEXT_MODELS:  # a vision-language model's decoder
        return vision_lm.build(config, TORCH_DTYPES[dtype])
    module = importlib.import_module(f"transformers.models.{config.model_type}.modeling_{config.model_type}")
    cls = getattr(module, MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[config.model_type])
    with torch.device("meta"):
        model = cls._from_config(config, dtype=TORCH_DTYPES[dtype], attn_implementation=serving.IMPL,
                                 experts_implementation=serving.IMPL)
    return model.eval()


def _fake_parameters(modules, fake: FakeTensorMode) -> set[int]:
    """Replace the parameters of ``modules`` by fake tensors (shape and dtype only); returns
    their ids, so the recorder can tell weight traffic from activations."""
    ids = set()
    for mod in modules:
        for sub in mod.modules():
            for name, p in list(sub._parameters.items()):
                if p is not None and not isinstance(p, FakeTensor):
                    sub._parameters[name] = torch.nn.Parameter(fake.from_tensor(p, static_shapes=True), requires_grad=False)
                if sub._parameters[name] is not None:
                    ids.add(id(sub._parameters[name]))
            for name, b in list(sub._buffers.items()):
                if b is not None and not isinstance(b, FakeTensor):
                    sub._buffers[name] = fake.from_tensor(b, static_shapes=True)
    return ids


def _linear_params(model) -> set[str]:
    out = set()
    for mname, mod in model.named_modules():
        for pname, p in mod.named_parameters(recurse=False):
            full = f"{mname}.{pname}" if mname else pname
            if isinstance(mod, torch.nn.Linear) and pname == "weight":
                out.add(full)
            elif pname in ("gate_up_proj", "down_proj", "up_proj") and p.dim() == 3:
                out.add(full)  # stacked expert weights
    return out


def _module_tracker(model, recorder: Recorder):
    names = {id(m): n for n, m in model.named_modules()}
    stack: list[str] = []

    def pre(mod, args):
        stack.append(recorder.module)
        recorder.module = names.get(id(mod), recorder.module)

    def post(mod, args, out):
        recorder.module = stack.pop()

    return (torch.nn.modules.module.register_module_forward_pre_hook(pre),
            torch.nn.modules.module.register_module_forward_hook(post))


def capture(config, *, dtype: str = "bf16", batch: int = 1, new_tokens: int = 1, past: int = 0,
            decode: bool = False, symbolic: bool = False, reroll: bool = True,
            images: vision_lm.ImageTokens | None = None) -> Capture:
    """Capture one step. ``symbolic`` makes batch, new tokens (prefill) and context (when
    ``past`` > 0 or decoding) ShapeEnv symbols, reported as the dims ``B``, ``S``, ``C``; the given
    sizes are then only hints. ``images``: a vision-language prefill's image tokens (M-RoPE
    positions, the image embeddings merged in, DeepStack; :mod:`perfcast.capture.vision_lm`)."""
    shape_env = ShapeEnv(duck_shape=False) if symbolic else None
    fake = FakeTensorMode(shape_env=shape_env)
    model = build_model(config, dtype)
    inner = model.model
    layers = list(inner.layers)
    for mod in model.modules():
        if hasattr(mod, "kv_a_proj_with_mqa") and hasattr(mod, "kv_b_proj"):
            mod.forward = types.MethodType(serving.mla_forward, mod)  # MLA in its serving form
    groups = group_layers(layers) if reroll else [LayerGroup((i,), (i,)) for i in range(len(layers))]

    symbols: dict[str, sympy.Symbol] = {}
    with fake:
        ids = torch.zeros((batch, new_tokens), dtype=torch.int64, device="meta")
        holder = torch.empty((past,), dtype=torch.int8, device="meta") if (past or decode) else None
    if symbolic:
        dyn = [DimDynamic.DYNAMIC, DimDynamic.DYNAMIC if not decode else DimDynamic.STATIC]
        ids = fake.from_tensor(torch.zeros((batch, new_tokens), dtype=torch.int64, device="meta"),
                               symbolic_context=StatelessSymbolicContext(dynamic_sizes=dyn))
        symbols[str(size_expr(ids.shape[0]))] = dim("B")
        if not decode:
            symbols[str(size_expr(ids.shape[1]))] = dim("S")
        if holder is not None:
            holder = fake.from_tensor(torch.empty((past,), dtype=torch.int8, device="meta"),
                                      symbolic_context=StatelessSymbolicContext(dynamic_sizes=[DimDynamic.DYNAMIC]))
            symbols[str(size_expr(holder.shape[0]))] = dim("C")
    past_len = holder.shape[0] if holder is not None else 0
    with fake:
        positions = (torch.arange(ids.shape[1], device="meta") + past_len).unsqueeze(0)
        if images is not None:
            positions = images.positions(ids)

    params = {n: TensorMeta(tuple(size_expr(d) for d in p.shape), dtype_name(p.dtype), True, -1)
              for n, p in model.named_parameters()}
    used = [inner.embed_tokens, inner.rotary_emb, inner.norm, model.lm_head,
            *(layers[g.representative] for g in groups)]
    recorder = Recorder(params=_fake_parameters(used, fake))
    hooks = _module_tracker(model, recorder)
    try:
        with fake, torch.no_grad(), serving.serving(serving.Session(past_len, decode)), recorder:
            h = inner.embed_tokens(ids)
            if images is not None:
                recorder.module = "model.image_embeds"
                h = images.merge(h, ids)
                recorder.module = ""
            pe = inner.rotary_emb(h, positions)
            for g in groups:
                recorder.layer = g.representative
                h = layers[g.representative](h, attention_mask=None, position_embeddings=pe,
                                             position_ids=positions)
                h = h[0] if isinstance(h, tuple) else h
            recorder.layer = None
            if images is not None:
                recorder.module = "model.deepstack"
                h = images.after_layers(h)
                recorder.module = ""
            h = inner.norm(h)
            if not decode:
                h = h[:, -1:, :]  # logits for the last position of each sequence only
            recorder.module = "lm_head"
            model.lm_head(h)
    finally:
        for hk in hooks:
            hk.remove()
    guards = ()
    if shape_env is not None:
        names = {s: symbols[str(s)] for g in shape_env.guards for s in g.expr.free_symbols
                 if str(s) in symbols}
        guards = tuple(g.expr.xreplace(names) for g in shape_env.guards)
    return Capture(recorder.records, groups, params, _linear_params(model), symbols, guards)
