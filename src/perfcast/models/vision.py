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

import json
import math
from dataclasses import dataclass

from perfcast.ir import UserError
from perfcast.models.catalog import ModelConfig


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


def language_model(model: ModelConfig) -> ModelConfig:
    """The language model inside a vision-language config, as a flat config of its own
    transformers type (``qwen3_vl_text``…): the hub files keep it either at the top level
    (Qwen2.5-VL) or under ``text_config`` (Qwen3-VL). The checkpoint's top-level
    ``tie_word_embeddings`` holds for its ``lm_head``."""
    fam = FAMILIES[model.model_type]
    data = model.data
    if isinstance(data.get("text_config"), dict):
        text = dict(data["text_config"])
        if "quantization_config" in data:
            text.setdefault("quantization_config", data["quantization_config"])
    else:
        text = {k: v for k, v in data.items() if k not in ("vision_config", "text_config")}
    if "tie_word_embeddings" in data:
        text["tie_word_embeddings"] = data["tie_word_embeddings"]
    text["model_type"] = fam.text_type
    return ModelConfig(model.name, text, model.path, model.source)


def vision_config(model: ModelConfig) -> dict:
    cfg = model.data.get("vision_config")
    if not isinstance(cfg, dict):
        raise UserError(f"{model.path}: key 'vision_config': missing (a {model.model_type} config has one)")
    return cfg


def _int_key(cfg: dict, key: str, where: str) -> int:
    v = cfg.get(key)
    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
        raise UserError(f"{where}: key {key!r}: expected a positive integer, got {v!r}")
    return v


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
        try:
            pre = json.loads(beside.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise UserError(f"{beside}: not a readable preprocessor config ({e})") from None
        size = pre.get("size") or {}
        lo, hi = pre.get("min_pixels", size.get("shortest_edge")), pre.get("max_pixels", size.get("longest_edge"))
        for key, v in (("min_pixels", lo), ("max_pixels", hi)):
            if not isinstance(v, int) or v < 1:
                raise UserError(f"{beside}: key {key!r} (or size.shortest_edge/longest_edge): expected a positive "
                                f"integer, got {v!r}")
        return ImageProcessor(pre.get("patch_size", patch), pre.get("merge_size", merge),
                              pre.get("temporal_patch_size", temporal), lo, hi, str(beside))
    return ImageProcessor(patch, merge, temporal, PROCESSOR_DEFAULTS["min_pixels"], PROCESSOR_DEFAULTS["max_pixels"],
                          "no preprocessor_config.json known: transformers 5.24.0 Qwen2VLImageProcessor default pixel "
                          "bounds, the vision config's patch and merge sizes")
