"""Vision-language models: which config types carry a vision encoder, the language model's own
config inside them, and the image processor's rule for how many tokens an image becomes.
Reading these needs no torch; building the encoder is the capture's job
(:mod:`perfcast.capture.vision`).

Image tokens follow transformers 5.24.0's ``Qwen2VLImageProcessor`` (the processor class of
Qwen2-VL, Qwen2.5-VL and Qwen3-VL, ``models/qwen2_vl/image_processing_qwen2_vl.py``): the image
is resized by ``smart_resize`` to sides divisible by ``factor = patch_size · merge_size`` with
its pixel count inside ``[min_pixels, max_pixels]``; the encoder sees a
``(1, H/patch, W/patch)`` grid of patches (a still image is one temporal patch: the processor
repeats it ``temporal_patch_size`` times, ``patchify``); the patch merger turns every
``merge × merge`` patches into one language-model token, so an image is
``(H/patch)·(W/patch)/merge²`` tokens (``get_number_of_image_patches`` and
``Qwen2_5_VLProcessor.replace_image_token``: ``grid_thw.prod() // merge_size**2``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from perfcast.inputs import excerpt, read_json
from perfcast.ir import UserError
from perfcast.models.architecture import architecture
from perfcast.models.catalog import ModelConfig
from perfcast.models.validate import (ACTIVATIONS, COMMON_ACTIVATIONS, HEADS_MAX, LAYERS_MAX, POSITIONS_MAX,
                                      VOCAB_MAX, WIDTH_MAX, Check, Size, check_config)


@dataclass(frozen=True)
class VisionFamily:
    """One vision-language architecture: its language model's config type, and what its
    encoder does between the patches and the tokens."""

    text_type: str  # the transformers model_type of the language model's sub-config
    window_attention: bool  # Qwen2.5-VL: windowed blocks between full-attention blocks
    deepstack: bool  # Qwen3-VL: features of some blocks added to the first decoder layers


#: model_type → family (transformers 5.24.0 model folders qwen2_5_vl, qwen3_vl, qwen3_vl_moe).
FAMILIES: dict[str, VisionFamily] = {
    "qwen2_5_vl": VisionFamily("qwen2_5_vl_text", window_attention=True, deepstack=False),
    "qwen3_vl": VisionFamily("qwen3_vl_text", window_attention=False, deepstack=True),
    "qwen3_vl_moe": VisionFamily("qwen3_vl_moe_text", window_attention=False, deepstack=True),
}

#: Qwen2VLImageProcessor's class defaults in transformers 5.24.0 (``size`` shortest/longest
#: edge in pixels), used when no preprocessor_config.json is known for a config.
PROCESSOR_DEFAULTS = {"min_pixels": 56 * 56, "max_pixels": 28 * 28 * 1280}


def family(model: ModelConfig) -> VisionFamily | None:
    return FAMILIES.get(model.model_type)


def is_vision_language(model: ModelConfig) -> bool:
    return model.model_type in FAMILIES


def _text(data: dict) -> tuple[dict, str]:
    """(the language model's keys of a vision-language config, where they sit in the file): its
    ``text_config`` (Qwen3-VL), or the file's top level without the vision config (Qwen2.5-VL)."""
    if isinstance(data.get("text_config"), dict):
        text = dict(data["text_config"])
        if "quantization_config" in data:
            text.setdefault("quantization_config", data["quantization_config"])
        return text, "text_config."
    return {k: v for k, v in data.items() if k not in ("vision_config", "text_config")}, ""


def language_model(model: ModelConfig) -> ModelConfig:
    """The language model inside a vision-language config, as a flat config of its own
    transformers type (``qwen3_vl_text``…): the hub files keep it either at the top level
    (Qwen2.5-VL) or under ``text_config`` (Qwen3-VL). The checkpoint's top-level
    ``tie_word_embeddings`` holds for its ``lm_head``."""
    fam = FAMILIES[model.model_type]
    text, _ = _text(model.data)
    if "tie_word_embeddings" in model.data:
        text["tie_word_embeddings"] = model.data["tie_word_embeddings"]
    text["model_type"] = fam.text_type
    return ModelConfig(model.name, text, model.path, model.source)


#: The vision encoder's integer keys (transformers 5.24.0 Qwen2_5_VLVisionConfig, Qwen3VLVisionConfig);
#: perfcast reads hidden_size and the processor's patch sizes itself.
VISION_KEYS = {
    "depth": Size(LAYERS_MAX), "hidden_size": Size(WIDTH_MAX, required=True), "num_heads": Size(HEADS_MAX),
    "intermediate_size": Size(WIDTH_MAX), "out_hidden_size": Size(WIDTH_MAX),
    "patch_size": Size(4096, required=True), "spatial_merge_size": Size(64, required=True),
    "temporal_patch_size": Size(64, required=True), "in_channels": Size(64), "in_chans": Size(64),
    "window_size": Size(POSITIONS_MAX), "num_position_embeddings": Size(VOCAB_MAX),
}


def check(model: ModelConfig) -> None:
    """A vision-language config checked as a whole: its language model as its text type's row
    says (:func:`perfcast.models.validate.check_config`), and its vision encoder's sizes."""
    fam, where = FAMILIES[model.model_type], str(model.path)
    if "text_config" in model.data and not isinstance(model.data["text_config"], dict):
        raise UserError(f"{where}: key 'text_config': expected a mapping, got {excerpt(model.data['text_config'])}")
    text, prefix = _text(model.data)
    check_config(text, architecture(fam.text_type), where, prefix)
    c = Check(vision_config(model), where, "vision_config.")
    v = {key: c.size(key, spec) for key, spec in VISION_KEYS.items()}
    if v["num_heads"] is not None:
        c.divides("num_heads", v["num_heads"], "hidden_size", v["hidden_size"], "the head size is hidden / heads")
    if v["out_hidden_size"] is not None and v["out_hidden_size"] != text["hidden_size"]:
        raise c.fail("out_hidden_size", f"expected the language model's {prefix}hidden_size = {text['hidden_size']} "
                                        f"(the merger's output joins its tokens), got {v['out_hidden_size']}")
    if v["window_size"] is not None and v["window_size"] % (v["patch_size"] * v["spatial_merge_size"]):
        # Qwen2.5-VL windows whole merged patches: window_size // spatial_merge_size // patch_size
        raise c.fail("window_size", f"expected a multiple of patch_size × spatial_merge_size = "
                                    f"{v['patch_size'] * v['spatial_merge_size']}, got {v['window_size']}")
    if "hidden_act" in c.data:
        c.choice("hidden_act", c.data["hidden_act"], ACTIVATIONS, "an activation transformers knows",
                 COMMON_ACTIVATIONS)
    depth = v["depth"] or 1
    c.index_list("fullatt_block_indexes", depth, "depth")
    stack = c.index_list("deepstack_visual_indexes", depth, "depth")
    if stack is not None and fam.deepstack and len(stack) > text["num_hidden_layers"]:
        raise c.fail("deepstack_visual_indexes", f"{len(stack)} entries, more than the {text['num_hidden_layers']} "
                                                 f"decoder layers their features join")


def vision_config(model: ModelConfig) -> dict:
    cfg = model.data.get("vision_config")
    if not isinstance(cfg, dict):
        got = f"expected a mapping, got {excerpt(cfg)}" if "vision_config" in model.data else "missing"
        raise UserError(f"{model.path}: key 'vision_config': {got} (a {model.model_type} config has one)")
    return cfg


def _int_key(cfg: dict, key: str, where: str) -> int:
    v = cfg.get(key)
    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
        raise UserError(f"{where}: key {key!r}: expected a positive integer, got {excerpt(v)}")
    return v


#: The largest image side a processor may resize to, in pixels (about 1 G pixels in all).
PIXELS_MAX = 2 ** 30


def _preprocessor(path, patch: int, merge: int, temporal: int) -> ImageProcessor:
    """The processor of a ``preprocessor_config.json`` beside a config: its pixel bounds (also as
    ``size.shortest_edge`` / ``longest_edge``) and any patch sizes it states."""
    pre = read_json(path)
    if not isinstance(pre, dict):
        raise UserError(f"{path}: expected a JSON object (a preprocessor_config.json), got {type(pre).__name__}")
    size = pre.get("size")
    if size is not None and not isinstance(size, dict):
        raise UserError(f"{path}: key 'size': expected a mapping, got {excerpt(size)}")
    size = size or {}
    c = Check({"min_pixels": pre.get("min_pixels", size.get("shortest_edge")),
               "max_pixels": pre.get("max_pixels", size.get("longest_edge")),
               "patch_size": pre.get("patch_size", patch), "merge_size": pre.get("merge_size", merge),
               "temporal_patch_size": pre.get("temporal_patch_size", temporal)}, str(path))
    lo, hi = (c.size(k, Size(PIXELS_MAX, required=True)) for k in ("min_pixels", "max_pixels"))
    if lo > hi:
        raise c.fail("max_pixels", f"expected at least min_pixels = {lo:,}, got {hi:,}")
    return ImageProcessor(c.size("patch_size", Size(4096)), c.size("merge_size", Size(64)),
                          c.size("temporal_patch_size", Size(64)), lo, hi, str(path))


@dataclass(frozen=True)
class ImageProcessor:
    """The image processor's sizes (transformers ``Qwen2VLImageProcessor``) and where they came
    from."""

    patch_size: int
    merge_size: int
    temporal_patch_size: int
    min_pixels: int
    max_pixels: int
    source: str

    @property
    def factor(self) -> int:
        return self.patch_size * self.merge_size

    def resized(self, height: int, width: int) -> tuple[int, int]:
        """``smart_resize`` (image_processing_qwen2_vl.py): sides rounded to the factor, then
        scaled down (floor) to at most ``max_pixels`` or up (ceil) to at least ``min_pixels``,
        keeping the aspect ratio as closely as the factor allows."""
        if max(height, width) / min(height, width) > 200:
            raise UserError(f"--image-height {height} / --image-width {width}: the processor refuses aspect "
                            f"ratios above 200 (smart_resize)")
        f = self.factor
        h, w = round(height / f) * f, round(width / f) * f
        if h * w > self.max_pixels:
            beta = math.sqrt(height * width / self.max_pixels)
            h, w = max(f, math.floor(height / beta / f) * f), max(f, math.floor(width / beta / f) * f)
        elif h * w < self.min_pixels:
            beta = math.sqrt(self.min_pixels / (height * width))
            h, w = math.ceil(height * beta / f) * f, math.ceil(width * beta / f) * f
        return h, w

    def grid(self, height: int, width: int) -> tuple[int, int, int]:
        """(t, h, w) patches the encoder sees for one still image (``image_grid_thw``)."""
        h, w = self.resized(height, width)
        return 1, h // self.patch_size, w // self.patch_size

    def tokens(self, height: int, width: int) -> int:
        """Language-model tokens of one image: patches / merge²."""
        t, gh, gw = self.grid(height, width)
        return t * gh * gw // self.merge_size ** 2


def processor(model: ModelConfig) -> ImageProcessor:
    """The processor of a catalog model (its ``processor`` entry in SOURCES.yaml, copied from the
    repository's preprocessor_config.json), of a config path with a preprocessor_config.json
    beside it, or else the processor class's defaults with the vision config's patch sizes."""
    vc = vision_config(model)
    where = f"{model.path}: vision_config"
    patch = _int_key(vc, "patch_size", where)
    merge = _int_key(vc, "spatial_merge_size", where)
    temporal = _int_key(vc, "temporal_patch_size", where)
    shipped = model.source.get("processor")
    if shipped:
        return ImageProcessor(shipped["patch_size"], shipped["merge_size"], shipped["temporal_patch_size"],
                              shipped["min_pixels"], shipped["max_pixels"], shipped["source"])
    beside = model.path.parent / "preprocessor_config.json"
    if beside.exists():
        return _preprocessor(beside, patch, merge, temporal)
    return ImageProcessor(patch, merge, temporal, PROCESSOR_DEFAULTS["min_pixels"], PROCESSOR_DEFAULTS["max_pixels"],
                          "no preprocessor_config.json known: transformers 5.24.0 Qwen2VLImageProcessor default pixel "
                          "bounds, the vision config's patch and merge sizes")
