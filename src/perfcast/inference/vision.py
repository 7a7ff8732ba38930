"""A vision-language model's serving step: the vision encoder over the step's images, then the
language model over the prompt with the image tokens in it.

- **Images**: each of the step's sequences carries ``per_query`` images of ``height × width``
  pixels; each becomes ``(H/patch)·(W/patch)/merge²`` tokens after the processor's resize
  (:mod:`perfcast.models.vision`). The prefill's new tokens per sequence are the text tokens
  (``--query-length``) plus the image tokens.
- **One step** runs the encoder, then the language model's prefill (vLLM
  ``GPUModelRunner.execute_model`` runs ``_execute_mm_encoder`` for the scheduled images before
  the forward pass and gathers their embeddings into it): the step time is the two in sequence.
  A decode step is the language model's alone: its context already holds the image tokens.
- **Memory**: the encoder's weights stay resident beside the language model's; activations are
  the larger of the two passes' peaks (they run one after the other).
- **Layout** (:data:`ENCODER_MODES`, the engine's default first): vLLM splits the encoder's
  weights over the tensor-parallel ranks by default (``vllm/config/multimodal.py``:
  ``mm_encoder_tp_mode = "weights"``, "split the weights of each layer across TP ranks"), or with
  ``"data"`` "split the batched input data across TP ranks ... while hosting the full weights on
  each TP rank"; SGLang likewise, data-parallel with ``--mm-enable-dp-encoder`` (docs.sglang.io,
  "DP for Multi-Modal Encoder"); TensorRT-LLM's PyTorch Qwen2-VL path runs transformers' own
  vision tower on every rank (``tensorrt_llm/_torch/models/modeling_qwen2vl.py``): replicated.
  ``data`` gives each rank ⌈images / tp⌉ images and all-gathers the merged embeddings (with
  DeepStack's levels: vLLM concatenates them to the encoder's output) over tp.
  Data-parallel replicas encode their own sequences' images; with pipeline stages the first
  stage's devices encode all of them (the encoder runs before the first micro-batch enters), and
  the encoder's weights are counted on the fullest stage.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from perfcast import engines
from perfcast.capture import lower
from perfcast.capture import parallel as par
from perfcast.engines.launch import launch_for
from perfcast.inference import memory
from perfcast.inputs.limits import MAX_TOKENS
from perfcast.ir import Graph, Leaf, UserError, leaves
from perfcast.ir.rules import make_leaf
from perfcast.models import vision as vmodels
from perfcast.rollup import Evaluation, FastRollup, LaunchModel, rollup

#: engine framework → the vision encoder's layouts it offers, its default first (see the module
#: docstring); an engine not listed runs the encoder replicated.
ENCODER_MODES = {"vllm": ("weights", "data"), "vllm_ascend": ("weights", "data"), "sglang": ("weights", "data"),
                 "trtllm": ("replicated",), "torch": ("replicated",)}


@dataclass(frozen=True)
class ImageRequest:
    per_query: int
    height: int
    width: int


@dataclass
class VisionPart:
    """The encoder's share of a step: its images, tokens, time per model, kernels and memory."""

    mode: str  # weights | data | replicated (ENCODER_MODES)
    images: int  # images one device encodes in the step
    grid: tuple[int, int, int]
    resized: tuple[int, int]
    tokens_per_image: int
    tp: int
    lowered: object
    rollups: dict[str, FastRollup]
    evaluations: dict[str, Evaluation]
    weights_bytes: int
    parameters: int
    activation_peak_bytes: int
    processor_source: str
    notes: list[str] = field(default_factory=list)

    def time_s(self, name: str) -> float:
        return self.evaluations[name].time_s if self.evaluations else 0.0

    @property
    def patches(self) -> int:
        t, h, w = self.grid
        return self.images * t * h * w


def is_vision_language(model) -> bool:
    return vmodels.is_vision_language(model)


def check(req) -> None:
    """The image flags against the model and the phase: one-line errors."""
    im = req.images
    if req.encoder_tp_mode is not None and req.image_tokens is None and not vmodels.is_vision_language(req.model):
        raise UserError(f"--encoder-tp-mode: {req.model.name} ({req.model.model_type}) has no vision encoder")
    if im is None:
        return
    for flag, v in (("--image-batch-size", im.per_query), ("--image-height", im.height), ("--image-width", im.width)):
        if v < 1:
            raise UserError(f"{flag} must be at least 1 (got {v})")
    if req.image_tokens is None and not vmodels.is_vision_language(req.model):
        raise UserError(f"--image-batch-size: {req.model.name} ({req.model.model_type}) is a text-only model; "
                        f"images need a vision-language model ({', '.join(vmodels.FAMILIES)})")
    if req.decode:
        raise UserError("--image-batch-size with --decode: a decode step runs no encoder (the images are already in "
                        "the KV cache: count their tokens in --context-length)")


def simulate(req, simulate_text):
    """The step of a vision-language model ``req.model`` (see the module docstring);
    ``simulate_text`` prices a language-model request."""
    check(req)
    vl = req.model
    im = req.images
    proc = vmodels.processor(vl)
    text = vmodels.language_model(vl)
    fam = vmodels.family(vl)
    tokens = im.per_query * proc.tokens(im.height, im.width) if im else 0
    if im and req.num_queries * (req.query_length + tokens) > MAX_TOKENS:
        raise UserError(f"--image-batch-size {im.per_query}: {tokens:,} image tokens per sequence make more than "
                        f"the {MAX_TOKENS:,} tokens in one step that attention kernels count in 32-bit integers")
    deepstack = len(vmodels.vision_config(vl).get("deepstack_visual_indexes") or []) if fam.deepstack else 0
    lm_req = replace(req, model=text, query_length=req.query_length + tokens, encoder_tp_mode=None,
                     image_tokens=(tokens, int(text.data["hidden_size"]), deepstack) if tokens else None)
    result = simulate_text(lm_req)
    part = encode(req, proc, lm_req) if im else resident(req, lm_req)
    m = result.memory
    result.memory = replace(m, weights_bytes=m.weights_bytes + part.weights_bytes, parameters=m.parameters + part.parameters,
                            activation_peak_bytes=max(m.activation_peak_bytes, part.activation_peak_bytes))
    result.vision = part
    result.notes = part.notes + result.notes
    return result


def encoder_mode(req) -> str:
    profile = req.profile()
    modes = ENCODER_MODES.get(profile.framework, ("replicated",))
    mode = req.encoder_tp_mode or modes[0]
    if mode not in modes:
        raise UserError(f"--encoder-tp-mode {mode}: {profile.name} runs the vision encoder "
                        + " or ".join(modes) + (" (its default)" if len(modes) == 1 else ""))
    return mode


def _encoder_tp(req) -> int:
    return req.layout.tp if encoder_mode(req) == "weights" else 1


def resident(req, lm_req) -> VisionPart:
    """A step without images: the encoder only holds its weights."""
    from perfcast.capture import hf_config
    from perfcast.capture.vision import encoder_parameters

    tp = _encoder_tp(req)
    params, wbytes = encoder_parameters(hf_config(req.model), req.dtype, tp)
    return VisionPart(encoder_mode(req), 0, (0, 0, 0), (0, 0), 0, tp, None, {}, {}, wbytes, params, 0, "",
                      [f"vision encoder: {params:,} parameters resident ({wbytes:,} bytes per device), idle in this step"])


def encode(req, proc, lm_req) -> VisionPart:
    """Capture, parallelize, apply the engine to, lower and price one encoder pass over the
    images of one device's sequences."""
    from perfcast.capture import hf_config
    from perfcast.capture.vision import Images, capture_encoder
    from perfcast.inference.step_notes import pricing_notes
    from perfcast.inference.textgen import make_model

    im = req.images
    grid = proc.grid(im.height, im.width)
    # a data-parallel rank's sequences: with pipeline stages the first encodes every micro-batch's
    count = math.ceil(req.num_queries / req.layout.dp) * im.per_query
    mode, tp = encoder_mode(req), _encoder_tp(req)
    gather = req.layout.tp if mode == "data" and req.layout.tp > 1 else 1
    count = math.ceil(count / gather)  # this rank's share of the images
    vc = vmodels.vision_config(req.model)
    cap = capture_encoder(hf_config(req.model), Images(count, grid), dtype=req.dtype, tp=tp, gather=gather)
    cap = par.parallelize(cap, par.Layout(tp=tp), {}) if tp > 1 else cap
    profile = req.profile()
    applied = engines.apply(profile, cap, decode=False, device=req.device.name, hidden_size=int(vc["hidden_size"]))
    low = lower(applied.capture, model_dtype=req.dtype, name=f"{req.model.name}.vision", plan=applied.plan,
                engine=profile.name)
    low = replace(low, graph=_without_cache(low.graph))
    mesh = lm_req.mesh()
    patches = count * math.prod(grid)
    launch = launch_for(profile, decode=False, tokens=patches, device=req.device)
    rollups, evals = {}, {}
    for name in req.performance_models:
        r = rollup(low.graph, make_model(name, req.device, req.profiling_database, mesh, profile),
                   LaunchModel(launch.mode, launch.host_interval_s))
        rollups[name], evals[name] = r, r.evaluate({})
    params, wbytes = memory.weights(cap, None)
    h, w = proc.resized(im.height, im.width)
    notes = [f"vision encoder: {count} image(s) per device of {im.height}×{im.width} px, resized to {h}×{w} "
             f"({grid[1]}×{grid[2]} patches of {proc.patch_size} px, {proc.tokens(im.height, im.width)} tokens each, "
             f"{proc.merge_size}×{proc.merge_size} patches merged per token); "
             + _layout_note(mode, req.layout.tp, profile.name),
             f"vision encoder in {req.dtype}" + (f": --quantize {req.quantize} applies to the language model only"
                                                 if req.quantize else "")]
    notes += [f"vision encoder — {n}" for n in pricing_notes(rollups)]
    if low.unknown:
        notes.append(f"vision encoder: {sum(low.unknown.values())} op calls have no cost rule and are NOT priced: "
                     + ", ".join(f"{op} ×{n}" for (op, _), n in low.unknown.most_common(5)))
    return VisionPart(mode, count, grid, (h, w), proc.tokens(im.height, im.width), tp, low, rollups, evals, wbytes, params,
                      memory.activation_peak(cap), proc.source, notes)


def _layout_note(mode: str, tp: int, engine: str) -> str:
    if tp == 1:
        return f"one device ({engine})"
    return {"weights": f"weights split over tp {tp} ({engine}, encoder TP mode 'weights')",
            "data": f"images split over the tp {tp} ranks, full weights on each, merged embeddings all-gathered "
                    f"({engine}, encoder TP mode 'data')",
            "replicated": f"replicated: every one of the tp {tp} ranks encodes every image ({engine})"}[mode]


def _without_cache(op):
    """The encoder's attention keeps no KV cache: no cache write inside the attention kernel
    (its cost re-derived by the attention rule with ``cache_write`` false), and no cache-write
    kernel of the kind an engine's attention rule adds for a decoder."""
    if isinstance(op, Leaf):
        if op.kind != "attention":
            return op
        return make_leaf("attention", op.name, op.inputs, op.outputs, **{**dict(op.attrs), "cache_write": False})
    graph = op if isinstance(op, Graph) else op.body
    ops = tuple(_without_cache(o) for o in graph.ops if not _is_cache_write(o))
    return replace(op, ops=ops) if isinstance(op, Graph) else replace(op, body=replace(graph, ops=ops))


def _is_cache_write(op) -> bool:
    """A cache-write kernel: a leaf, or a launched kernel graph, of that kernel class."""
    if isinstance(op, Leaf) or isinstance(op, Graph) and op.launch:
        return any(leaf.attr("kernel_class") == "cache_write" for leaf in leaves(op))
    return False
