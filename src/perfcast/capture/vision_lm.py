"""The language model of a vision-language model, as the capture drives it.

transformers keeps a VLM's decoder as a ``…TextModel`` (embeddings, decoder layers, final norm,
rotary table) inside ``…ForConditionalGeneration``, with ``lm_head`` beside it. Built here as a
causal LM of its own — ``model`` and ``lm_head`` — it has the module paths of any decoder
(``model.layers.N.self_attn.q_proj``), so capture, parallel plans, engine roles and memory
read it as they read a text model.

With images in the prefill, three things differ from a text prompt (:class:`ImageTokens`):

- **M-RoPE positions**: every token has three position ids (temporal, height, width;
  Qwen2-VL, arXiv:2409.12191 §2.1): ``position_ids`` of shape ``(3, B, S)``. Text tokens have
  three equal ids; an image's tokens take its grid's (t, h, w) offsets from the text before it,
  and text after an image continues from the largest id + 1
  (``Qwen2_5_VLModel.get_rope_index``). Only the ids' count enters the cost: the rotary table
  is computed for 3 ids per token.
- **The image embeddings** replace the image placeholder tokens' embeddings:
  ``inputs_embeds.masked_scatter(image_mask, image_embeds)`` (``Qwen2_5_VLModel.forward``;
  vLLM ``_merge_multimodal_embeddings`` writes ``inputs_embeds[is_multimodal] = mm_embeds``).
- **DeepStack** (Qwen3-VL): the features of encoder blocks ``deepstack_visual_indexes`` are
  added to the image tokens' hidden states after the first ``len(…)`` decoder layers
  (``Qwen3VLTextModel._deepstack_process``: clone, gather the image rows, add, write back). The
  capture records those ops once per level after the decoder stack (their cost does not depend
  on where between the layers they run).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

import torch

from perfcast.capture import serving

#: text sub-config type → (transformers model folder, its decoder class)
TEXT_MODELS = {
    "qwen2_5_vl_text": ("qwen2_5_vl", "Qwen2_5_VLTextModel"),
    "qwen3_vl_text": ("qwen3_vl", "Qwen3VLTextModel"),
    "qwen3_vl_moe_text": ("qwen3_vl_moe", "Qwen3VLMoeTextModel"),
}


class LanguageModel(torch.nn.Module):
    """``model`` (the decoder) and ``lm_head``: the causal-LM layout the capture drives."""

    def __init__(self, model: torch.nn.Module, lm_head: torch.nn.Module):
        super().__init__()
        self.model = model
        self.lm_head = lm_head
        self.config = model.config  # what the capture reads of a causal LM (rotary layer types, soft-capping)


def build(config, torch_dtype) -> LanguageModel:
    """The language model of a VLM on the meta device (no weights), with perfcast's attention
    and experts implementations; ``lm_head`` shares the embedding when the checkpoint ties them."""
    folder, name = TEXT_MODELS[config.model_type]
    cls = getattr(importlib.import_module(f"transformers.models.{folder}.modeling_{folder}"), name)
    with torch.device("meta"):
        decoder = cls._from_config(config, dtype=torch_dtype, attn_implementation=serving.IMPL,
                                   experts_implementation=serving.IMPL)
        head = torch.nn.Linear(config.hidden_size, config.vocab_size, bias=False, dtype=torch_dtype)
    if getattr(config, "tie_word_embeddings", False):
        head.weight = decoder.embed_tokens.weight
    for layer in decoder.layers:
        _keep_head_dim(layer.self_attn, config)
    return LanguageModel(decoder, head).eval()


def _keep_head_dim(attn: torch.nn.Module, config) -> None:
    """``Qwen2_5_VLAttention`` sizes its heads as hidden / heads, ignoring ``head_dim``: a
    tensor-parallel rank's config (heads divided, ``head_dim`` kept: parallel.rank_config) needs
    the projections rebuilt at the whole model's head size."""
    d = getattr(config, "head_dim", None)
    if not d or getattr(attn, "head_dim", d) == d:
        return
    heads, kv = config.num_attention_heads, config.num_key_value_heads

    def linear(old, i, o):
        with torch.device("meta"):
            return torch.nn.Linear(i, o, bias=old.bias is not None, dtype=old.weight.dtype)

    attn.head_dim, attn.scaling = d, d ** -0.5
    attn.q_proj = linear(attn.q_proj, config.hidden_size, heads * d)
    attn.k_proj = linear(attn.k_proj, config.hidden_size, kv * d)
    attn.v_proj = linear(attn.v_proj, config.hidden_size, kv * d)
    attn.o_proj = linear(attn.o_proj, heads * d, config.hidden_size)


@dataclass(frozen=True)
class ImageTokens:
    """The image tokens of a prefill step: ``per_sequence`` of each sequence's new tokens are
    image tokens, their embeddings ``hidden`` wide (the encoder's output), with ``deepstack``
    further feature levels (Qwen3-VL)."""

    per_sequence: int
    hidden: int
    deepstack: int = 0

    def positions(self, ids: torch.Tensor) -> torch.Tensor:
        """M-RoPE position ids, one (t, h, w) triple per token: made by the processor on the host
        and copied in, so their values are no device work."""
        b, s = ids.shape
        return torch.zeros((3, b, s), dtype=torch.int64, device="meta")

    def _embeds(self, rows: int, like: torch.Tensor) -> torch.Tensor:
        return torch.empty((rows, self.hidden), dtype=like.dtype, device="meta")

    def merge(self, h: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """The placeholder tokens' embeddings replaced by the encoder's image embeddings: the
        placeholders found by comparing the ids with the image token's
        (``Qwen2_5_VLModel.get_placeholder_mask``: ``input_ids == image_token_id``)."""
        b, s, _ = h.shape
        mask = (ids == 0).unsqueeze(-1).expand_as(h)
        return h.masked_scatter(mask, self._embeds(b * self.per_sequence, h))

    def after_layers(self, h: torch.Tensor) -> torch.Tensor:
        """DeepStack: each level's features added to the image tokens' rows."""
        b, s, d = h.shape
        rows = b * self.per_sequence
        for _ in range(self.deepstack):
            index = torch.zeros((rows,), dtype=torch.int64, device="meta")
            flat = h.clone().reshape(b * s, d)
            flat = flat.index_put((index,), flat[index] + self._embeds(rows, h))
            h = flat.reshape(b, s, d)
        return h
