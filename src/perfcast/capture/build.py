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

import contextlib
import copy

import sympy
import torch
from torch._guards import SLoc
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext

from perfcast.capture import hf_imports, serving, vision_lm
from perfcast.capture.record import Recorder, dtype_name, plain, size_expr
from perfcast.capture.types import Capture, LayerGroup, TensorMeta
from perfcast.ir import UserError, dim
from perfcast.models import ModelConfig, architecture
from perfcast.models.architecture import file_config

TORCH_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


class _ShapeEnv(ShapeEnv):
    """A ShapeEnv that does not look up the Python source line of each symbol and guard it
    makes. Those lines only annotate torch's debug messages, and the lookup's list of files to
    skip (``symbolic_shapes.uninteresting_files``) imports ``torch.export`` and AOTAutograd: a
    third of a cold capture's own time."""

    def _get_stack_summary(self, is_debug: bool = False, framework_loc=None) -> tuple[SLoc, str]:
        return SLoc(framework_loc, None), ""


def _dispatcher(symbolic: bool):
    """torch's Python dispatcher for a symbolic capture on torch older than 2.13: composite ops
    (``linear`` → ``matmul``) then decompose through their Python implementations, written for
    symbolic sizes. torch 2.11's C++ ``matmul`` calls ``numel()`` on a 3-D input with a symbolic
    batch and fails ("Cannot call numel() on tensor with symbolic sizes/strides": every batch > 1
    decode of the GPU closed loop on the device machine's torch 2.11). On perfcast's torch (2.13)
    the C++ path stands: the Python one guards differently (Llama 4's chunked prefill loses the
    guard that keeps it exact only at its hint's length), so it is not used where it is not needed."""
    if not symbolic or torch.__version__ >= "2.13":
        return contextlib.nullcontext()
    from torch._dispatch.python import enable_python_dispatcher

    return enable_python_dispatcher()


def layer_signature(layer: torch.nn.Module) -> tuple:
    parts = []
    for name, mod in layer.named_modules():
        own = tuple((n, tuple(p.shape), str(p.dtype)) for n, p in mod.named_parameters(recurse=False))
        # the layer type also from the config's layer_types (Llama 4's chunked and NoPE layers
        # have the same modules), and whether the module applies RoPE
        extra = (getattr(mod, "sliding_window", None), serving.layer_type(mod),
                 getattr(mod, "attention_type", None), getattr(mod, "use_rope", None))
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
    hf_imports.models()
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    from huggingface_hub.errors import StrictDataclassError

    from perfcast.models.vision import is_vision_language

    # a vision-language config is built whole (its vision tower too: capture/vision.py); a deep
    # copy, as transformers' config classes write into nested dicts (rope_scaling gains
    # rope_theta) and the model's data must stay what the capture cache keys on
    data = dict(model.data) if is_vision_language(model) else file_config(model.data, model.architecture)
    data = copy.deepcopy(data)
    try:
        with hf_imports.config_warnings(str(model.path)):
            config = CONFIG_MAPPING[data.pop("model_type")](**data)
    except (ValueError, TypeError, KeyError, AttributeError, StrictDataclassError) as e:
        # what perfcast's own checks (perfcast.models.validate) leave to the config class
        raise UserError(f"{model.path}: not a valid {model.model_type} config: {_reason(e)}") from None
    config.perfcast_source = str(model.path)  # named by build_model's errors
    return config


def _reason(e: Exception) -> str:
    """A transformers error on one line and cut short (it may quote the whole config)."""
    reason = " ".join(str(e).split())
    return reason if len(reason) <= 200 else f"{reason[:200]}…"


def build_model(config, dtype: str):
    """The causal LM on the meta device: every parameter has a shape and a dtype, none has
    storage or values (weights are never initialised); its parts in their serving forms
    (:mod:`perfcast.capture.substitutions`), as its architecture row says."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    from perfcast.capture import substitutions

    hf_imports.modeling_utils()
    serving.register()
    arch = architecture(config.model_type)
    config = copy.deepcopy(config)
    # Quantization is perfcast's own (--quantize); a checkpoint's quantizer is not run.
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    if config.model_type in vision_lm.TEXT_MODELS:  # a vision-language model's decoder
        return vision_lm.build(config, TORCH_DTYPES[dtype])
    # the auto mapping imports only this model type's module (its folder may be another type's:
    # qwen3_5_moe_text lives in qwen3_5_moe)
    cls = MODEL_FOR_CAUSAL_LM_MAPPING[type(config)]
    try:
        with torch.device("meta"):
            model = cls._from_config(config, dtype=TORCH_DTYPES[dtype],
                                     attn_implementation=arch.attn_implementation or serving.IMPL,
                                     experts_implementation=serving.IMPL)
    except (ValueError, TypeError, KeyError, AttributeError, AssertionError, ZeroDivisionError) as e:
        # a value perfcast.models.validate does not check that a module refuses (nn.Embedding's
        # padding index, GenerationConfig's fields): the file's fault, said in one line
        where = getattr(config, "perfcast_source", "config")
        raise UserError(f"{where}: transformers cannot build a {config.model_type} model from it: "
                        f"{_reason(e)}") from None
    if getattr(config, "perfcast_head_dim", None) and arch.head_projections:
        substitutions.resize_heads(model, arch, int(config.perfcast_head_dim))
    substitutions.apply(model, arch)
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


def _linear_params(model, arch) -> set[str]:
    out = set()
    for mname, mod in model.named_modules():
        for pname, p in mod.named_parameters(recurse=False):
            full = arch.canonical(f"{mname}.{pname}" if mname else pname)
            if isinstance(mod, torch.nn.Linear) and pname == "weight":
                out.add(full)
            elif pname in ("gate_up_proj", "down_proj", "up_proj") and p.dim() == 3:
                out.add(full)  # stacked expert weights
    return out


def _module_tracker(model, recorder: Recorder, arch):
    return track_modules({id(m): arch.canonical(n) for n, m in model.named_modules()}, recorder)


def track_modules(names: dict[int, str], recorder: Recorder):
    """Forward hooks that keep ``recorder.module`` at the running module's name (``names`` by
    module id); returns the hook handles to remove."""
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
    shape_env = _ShapeEnv(duck_shape=False) if symbolic else None
    fake = FakeTensorMode(shape_env=shape_env)
    # FakeTensorMode's cache of op outputs pays for itself over many calls of the same ops on the
    # same shapes; one capture runs each op a few times at most, and building and replaying
    # entries (symbolic shapes above all) costs more than the meta kernels it saves
    fake.cache_enabled = False
    model = build_model(config, dtype)
    arch = architecture(config.model_type)
    inner, layers, (embed, rotary, norm) = _decoder(model, arch)
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

    params = {arch.canonical(n): TensorMeta(tuple(size_expr(d) for d in p.shape), dtype_name(p.dtype), True, -1)
              for n, p in model.named_parameters()}
    used = [m for m in (embed, rotary, norm, model.lm_head) if m is not None]
    used += [layers[g.representative] for g in groups]
    recorder = Recorder(params=_fake_parameters(used, fake))
    hooks = _module_tracker(model, recorder, arch)
    try:
        with fake, _dispatcher(symbolic), torch.no_grad(), serving.serving(serving.Session(past_len, decode)), recorder:
            h = embed(ids)
            if images is not None:
                recorder.module = "model.image_embeds"
                h = images.merge(h, ids)
                recorder.module = ""
            pe = _rotary_tables(rotary, h, positions, model.config)
            for g in groups:
                recorder.layer = g.representative
                layer = layers[g.representative]
                h = layer(h, **_layer_kwargs(layer, pe(g.representative), positions))
                h = h[0] if isinstance(h, tuple) else h
            recorder.layer = None
            if images is not None:
                recorder.module = "model.deepstack"
                h = images.after_layers(h)
                recorder.module = ""
            h = norm(h)
            if not decode:
                h = h[:, -1:, :]  # logits for the last position of each sequence only
            recorder.module = "lm_head"
            logits = model.lm_head(h)
            cap = getattr(model.config, "final_logit_softcapping", None)
            if cap:  # Gemma 2 (modeling_gemma2.py Gemma2ForCausalLM.forward): cap·tanh(logits/cap)
                recorder.module = "logits_softcap"
                torch.tanh(logits / cap) * cap
    finally:
        for hk in hooks:
            hk.remove()
    guards = ()
    if shape_env is not None:
        names = {s: symbols[str(s)] for g in shape_env.guards for s in g.expr.free_symbols
                 if str(s) in symbols}
        guards = tuple(plain(g.expr.xreplace(names)) for g in shape_env.guards)
    return Capture(recorder.records, groups, params, _linear_params(model, arch), symbols, guards)


def _rotary_tables(rotary, h, positions, config):
    """layer index -> its rotary tables: one table for all layers, or one per layer type where
    the rotary module takes one (Gemma 3: local and global layers have their own RoPE bases),
    or None (no shared rotary module: GPT-J and Falcon rotate inside their attention, or ALiBi)."""
    import inspect
    import types

    if rotary is None:
        return lambda i: None
    # Dynamic NTK and LongRoPE (transformers modeling_rope_utils.dynamic_rope_update) choose their
    # inverse frequencies by the largest position id, a value fake tensors do not hold; the
    # tables' shapes and ops are the same either way, so the capture runs the undecorated forward.
    rotary.forward = types.MethodType(inspect.unwrap(type(rotary).forward), rotary)
    if "layer_type" in inspect.signature(rotary.forward).parameters:
        tables = {t: rotary(h, positions, t) for t in dict.fromkeys(config.layer_types)}
        return lambda i: tables[config.layer_types[i]]
    table = rotary(h, positions)
    return lambda i: table


def _layer_kwargs(layer, pe, positions) -> dict:
    """The decoder layer's arguments: no mask (the substituted attention derives causality), the
    rotary tables and positions, and None for any other argument the layer requires (Falcon's
    ``alibi``: its attention reads the config instead)."""
    import inspect

    out = {"attention_mask": None, "position_embeddings": pe, "position_ids": positions}
    params = list(inspect.signature(layer.forward).parameters.values())[1:]  # after hidden_states
    for p in params:
        if p.default is inspect.Parameter.empty and p.kind is p.POSITIONAL_OR_KEYWORD and p.name not in out:
            out[p.name] = None
    return out


def _decoder(model, arch):
    """(the decoder module, its layers, (embedding, rotary table or None, final norm)): found by
    the row's ``layers`` path and its canonical module names."""
    inner = model.get_submodule(arch.layers.rsplit(".", 1)[0])
    back = {v: k for k, v in arch.modules.items()}
    parts = tuple(getattr(inner, back.get(n, n), None) for n in ("embed_tokens", "rotary_emb", "norm"))
    return inner, list(model.get_submodule(arch.layers)), parts
