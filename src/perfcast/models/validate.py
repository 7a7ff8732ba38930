"""A model config checked as a whole before anything is built from it: every key perfcast or
the transformers model reads has the right type and a sane range, and the sizes fit together
(heads divide the hidden size, KV heads divide the heads, top-k ≤ experts, known activations
and RoPE types). A problem is one line naming the file, the key as the file spells it, and
what was expected — never a traceback from the config class or the model, and never a model
priced from a config it does not describe (``num_experts: 0`` is not a dense model).

The checks are tables keyed by the architecture's kinds (:data:`KEYS`): a key of a kind the
row does not list is not read by its model and not checked. Reading needs no torch: the names
transformers knows (activations, RoPE types, layer types) are copied here from transformers
5.24.0, and ``tests/test_model_configs.py`` asserts they still match.
"""

from __future__ import annotations

import difflib
import math
import numbers
from dataclasses import dataclass

from perfcast.inputs import excerpt
from perfcast.ir import UserError
from perfcast.models.architecture import Architecture

#: The widest matrix dimension perfcast accepts: 20× the widest published (Llama 3.1 405B's
#: 53,248-wide MLP). Parameters live on the meta device, so width costs nothing to build; the
#: bound only keeps a typo from being priced.
WIDTH_MAX = 2 ** 20
#: Falcon-180B's 232 query heads are the most published.
HEADS_MAX = 2 ** 12
#: perfcast builds every decoder layer on the meta device (about 2 ms and 40 kB each) before it
#: captures one per distinct structure, so the layer count is the cost of a capture: 1,024 layers
#: take seconds, a million would take an hour and 40 GB. The deepest published decoder has 126
#: (Llama 3.1 405B).
LAYERS_MAX = 1024
#: Qwen3.5's 512 routed experts are the most published.
EXPERTS_MAX = 2 ** 16
#: Gemma's 262,208 tokens are the largest published vocabulary.
VOCAB_MAX = 2 ** 24
#: Llama 4 Scout's 10 M tokens are the longest published context.
POSITIONS_MAX = 2 ** 30

#: transformers 5.24.0 ``transformers.activations.ACT2FN``: what ``hidden_act`` may name.
ACTIVATIONS = ("gelu", "gelu_10", "gelu_accurate", "gelu_fast", "gelu_new", "gelu_python", "gelu_python_tanh",
               "gelu_pytorch_tanh", "hardswish", "laplace", "leaky_relu", "linear", "mish", "prelu", "quick_gelu",
               "relu", "relu2", "relu6", "sigmoid", "silu", "sqrtsoftplus", "swish", "tanh", "xielu")
COMMON_ACTIVATIONS = ("silu", "gelu", "gelu_pytorch_tanh", "gelu_new", "relu")
#: The config keys that name an activation (most models, Gemma, GPT-J, Falcon).
ACTIVATION_KEYS = ("hidden_act", "hidden_activation", "activation_function", "activation")
#: transformers 5.24.0 ``ALLOWED_ATTN_LAYER_TYPES`` and the legacy names it still reads
#: (configuration_utils.py ``_LEGACY_LAYER_TYPE_REMAP``).
LAYER_TYPES = ("full_attention", "sliding_attention", "chunked_attention", "window_attention", "indexed_attention",
               "compressed_sparse_attention", "heavily_compressed_attention", "minimax_m3_sparse", "conv", "moe",
               "hybrid", "hybrid_sliding", "reference_sliding_attention", "linear_attention",
               "mamba", "attention", "deepseek_sparse_attention", "qwen_sparse_attention")
#: transformers 5.24.0 ``generation.configuration_utils.ALL_CACHE_IMPLEMENTATIONS`` and "paged": what
#: ``GenerationConfig.validate`` accepts when the model is built (Gemma 2 states "hybrid").
CACHE_IMPLEMENTATIONS = ("static", "offloaded_static", "sliding_window", "hybrid", "hybrid_chunked",
                         "offloaded_hybrid", "offloaded_hybrid_chunked", "dynamic", "offloaded", "quantized", "paged")
#: Where ``PreTrainedConfig.get_text_config`` looks for a language model inside a config.
SUB_CONFIGS = ("text_config", "decoder", "generator", "text_encoder")
#: The config keys that count routed experts, whichever architecture a file claims.
EXPERT_COUNT_KEYS = ("n_routed_experts", "num_local_experts", "num_experts")


@dataclass(frozen=True)
class Size:
    """An integer key: from ``minimum`` to ``maximum``; ``null`` allowed where the config class
    reads it as "not set" (the head size derived, no window); ``required`` where perfcast reads
    it itself (the config class's default would stand in for the model it does not describe)."""

    maximum: int
    minimum: int = 1
    nullable: bool = False
    required: bool = False
    why: str = ""  # the reason for the bounds, shown with them


@dataclass(frozen=True)
class Real:
    """A number key: finite, above ``above`` (or at least it, ``inclusive``), at most ``maximum``."""

    above: float = 0.0
    maximum: float | None = None
    nullable: bool = False
    inclusive: bool = False


#: kind → key → check. ``decoder`` applies to every architecture; the others where the row's
#: parts (or its experts) name the kind. Keys are perfcast's names (the row's ``keys`` rename).
KEYS: dict[str, dict[str, Size | Real]] = {
    "decoder": {
        "hidden_size": Size(WIDTH_MAX, required=True),
        "num_hidden_layers": Size(LAYERS_MAX, required=True,
                                  why="every layer is built before identical ones are grouped; the deepest "
                                      "published decoder has 126"),
        "num_attention_heads": Size(HEADS_MAX, required=True),
        "vocab_size": Size(VOCAB_MAX),
        "num_key_value_heads": Size(HEADS_MAX, nullable=True),
        "head_dim": Size(WIDTH_MAX),  # null is an error in some config classes, a crash in others
        "intermediate_size": Size(WIDTH_MAX),
        "intermediate_size_mlp": Size(WIDTH_MAX),
        "max_position_embeddings": Size(POSITIONS_MAX),
        "original_max_position_embeddings": Size(POSITIONS_MAX),
        "sliding_window": Size(POSITIONS_MAX, nullable=True),
        "attention_chunk_size": Size(POSITIONS_MAX, nullable=True),
        "max_window_layers": Size(POSITIONS_MAX, minimum=0),
        "rotary_dim": Size(WIDTH_MAX, nullable=True),
        # per-layer patterns: layer i is of a kind when (i + 1) % step == 0
        "sliding_window_pattern": Size(LAYERS_MAX),
        "no_rope_layer_interval": Size(LAYERS_MAX),
        "full_attention_interval": Size(LAYERS_MAX),
        "rms_norm_eps": Real(maximum=1.0),
        "layer_norm_epsilon": Real(maximum=1.0),
        "layer_norm_eps": Real(maximum=1.0),
        "rope_theta": Real(),
        "partial_rotary_factor": Real(maximum=1.0),
        "attn_logit_softcapping": Real(nullable=True),
        "final_logit_softcapping": Real(nullable=True),
        "query_pre_attn_scalar": Real(),
    },
    "mla": {
        "kv_lora_rank": Size(WIDTH_MAX),
        "q_lora_rank": Size(WIDTH_MAX, nullable=True),  # DeepSeek-V2-Lite: no query compression
        "qk_nope_head_dim": Size(WIDTH_MAX),
        "qk_rope_head_dim": Size(WIDTH_MAX),
        "v_head_dim": Size(WIDTH_MAX),
    },
    "dsa": {
        "index_n_heads": Size(HEADS_MAX),
        "index_head_dim": Size(WIDTH_MAX),
        "index_topk": Size(POSITIONS_MAX),
    },
    "gated_delta_net": {
        "linear_num_key_heads": Size(HEADS_MAX),
        "linear_num_value_heads": Size(HEADS_MAX),
        "linear_key_head_dim": Size(WIDTH_MAX),
        "linear_value_head_dim": Size(WIDTH_MAX),
        "linear_conv_kernel_dim": Size(HEADS_MAX),
    },
    "experts": {
        "num_experts_per_tok": Size(EXPERTS_MAX, required=True),
        "experts_per_token": Size(EXPERTS_MAX),  # gpt-oss states top-k under both names
        "n_shared_experts": Size(EXPERTS_MAX),  # DeepSeek-V3 and GLM-5 always build the shared expert
        "n_group": Size(EXPERTS_MAX),
        "topk_group": Size(EXPERTS_MAX),
        "first_k_dense_replace": Size(LAYERS_MAX, minimum=0),
        "decoder_sparse_step": Size(LAYERS_MAX),
        "moe_layer_freq": Size(LAYERS_MAX),
        "interleave_moe_layer_step": Size(LAYERS_MAX),
        "routed_scaling_factor": Real(),
        "swiglu_limit": Real(nullable=True),
    },
}


class Check:
    """Checks of one config dict; ``names`` maps perfcast's key names to the file's, ``prefix``
    places the dict in its file (``text_config.``)."""

    def __init__(self, data: dict, where: str, prefix: str = "", names: dict | None = None):
        self.data, self.where, self.prefix, self.names = data, where, prefix, names or {}

    def name(self, key: str) -> str:
        return f"{self.prefix}{self.names.get(key, key)}"

    def fail(self, key: str, message: str) -> UserError:
        return UserError(f"{self.where}: key {self.name(key)!r}: {message}")

    def get(self, key: str):
        return self.data.get(key)

    def size(self, key: str, spec: Size) -> int | None:
        """The value of an integer key (None where absent, or null and allowed)."""
        if key not in self.data or (self.data[key] is None and spec.nullable):
            if spec.required:
                raise self.fail(key, f"missing (expected {_range(spec)})")
            return None
        v = self.data[key]
        if isinstance(v, bool) or not isinstance(v, numbers.Integral) or not spec.minimum <= v <= spec.maximum:
            raise self.fail(key, f"expected {_range(spec)}, got {excerpt(v)}")
        return int(v)

    def real(self, key: str, spec: Real) -> float | None:
        """The value of a number key (None where absent, or null and allowed)."""
        if key not in self.data or (self.data[key] is None and spec.nullable):
            return None
        v = self.data[key]
        low = f"at least {spec.above:g}" if spec.inclusive else f"above {spec.above:g}"
        expected = f"a finite number {low}" + (f" and at most {spec.maximum:g}" if spec.maximum is not None else "")
        if isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(v) \
                or (v < spec.above if spec.inclusive else v <= spec.above) \
                or (spec.maximum is not None and v > spec.maximum):
            raise self.fail(key, f"expected {expected}, got {excerpt(v)}")
        return float(v)

    def divides(self, key: str, value: int, whole_key: str, whole: int, why: str) -> None:
        if whole % value:
            raise self.fail(key, f"{value} does not divide {self.name(whole_key)} = {whole} ({why})")

    def choice(self, key: str, value, known: tuple, what: str, examples: tuple = ()) -> None:
        """``value`` is one of ``known``; else the closest names, or ``examples``, in the error."""
        if isinstance(value, str) and value in known:
            return
        close = difflib.get_close_matches(value, known, n=3) if isinstance(value, str) else []
        shown = list(close or examples or known[:4])
        more = ", …" if len(shown) < len(known) else ""
        raise self.fail(key, f"{excerpt(value)} is not {what} (expected one of {len(known)}: "
                             f"{', '.join(shown)}{more})")

    def index_list(self, key: str, bound: int, bound_key: str, *, length: int | None = None,
                   values: tuple | None = None) -> list | None:
        """A list of layer indices below ``bound``; or, with ``length``, one entry per layer, each
        among ``values``."""
        v = self.data.get(key)
        if v is None:
            return None
        if not isinstance(v, list):
            what = f"a list of {length} entries" if length is not None else "a list of layer indices"
            raise self.fail(key, f"expected {what}, got {excerpt(v)}")
        if length is not None and len(v) != length:
            raise self.fail(key, f"{len(v)} entries, expected {self.name(bound_key)} = {length}")
        for i, x in enumerate(v):
            if values is not None:
                if x not in values or isinstance(x, bool) or not isinstance(x, (int, str)):
                    shown = " or ".join(map(str, values)) if len(values) <= 4 else ", ".join(values[:4]) + ", …"
                    raise self.fail(key, f"entry {i}: expected {shown}, got {excerpt(x)}")
            elif isinstance(x, bool) or not isinstance(x, int) or not 0 <= x < bound:
                raise self.fail(key, f"entry {i}: expected a layer index from 0 to {bound - 1}, got {excerpt(x)}")
        return v


def _range(spec: Size) -> str:
    return f"an integer from {spec.minimum:,} to {spec.maximum:,}" + (f" ({spec.why})" if spec.why else "")


def kinds(arch: Architecture) -> set[str]:
    """The kinds of ``arch`` whose keys apply: its parts, MLA's keys under DSA, experts."""
    out = {"decoder", *arch.parts.values()}
    if "dsa" in out:
        out.add("mla")
    if arch.experts:
        out.add("experts")
    return out


def check_config(data: dict, arch: Architecture, where: str, prefix: str = "") -> None:
    """Refuse ``data`` (a language model's config under perfcast's key names, its row ``arch``)
    unless every key its kinds read is well-formed and the sizes fit together."""
    from perfcast.models.rope import check_rope  # the RoPE parameters: a table of their own

    c = Check(data, where, prefix, {v: k for k, v in arch.keys.items()})
    applies = kinds(arch)
    values = {}
    for kind in KEYS:
        if kind in applies:
            for key, spec in KEYS[kind].items():
                values[key] = c.size(key, spec) if isinstance(spec, Size) else c.real(key, spec)
    for key in ACTIVATION_KEYS:
        if key in data:
            c.choice(key, data[key], ACTIVATIONS, "an activation transformers knows", COMMON_ACTIVATIONS)
    if "tie_word_embeddings" in data and not isinstance(data["tie_word_embeddings"], bool):
        raise c.fail("tie_word_embeddings", f"expected true or false, got {excerpt(data['tie_word_embeddings'])}")
    for key in SUB_CONFIGS:
        if data.get(key) is not None:
            raise c.fail(key, f"a sub-config in a {arch.model_type} language model's config (transformers would read "
                              f"it as the model; expected none)")
    if data.get("is_encoder_decoder") not in (None, False):
        raise c.fail("is_encoder_decoder", f"expected false (perfcast prices decoders), "
                                           f"got {excerpt(data['is_encoder_decoder'])}")
    for key in data:  # torch.nn.Dropout takes a probability (built even where it never drops)
        if isinstance(key, str) and key.endswith(("dropout", "_pdrop")):
            c.real(key, Real(inclusive=True, maximum=1.0))
    if data.get("cache_implementation") is not None:
        c.choice("cache_implementation", data["cache_implementation"], CACHE_IMPLEMENTATIONS,
                 "a cache transformers knows")
    _token_ids(c, values["vocab_size"])
    _heads(c, arch, applies, values)
    layers = values["num_hidden_layers"]
    c.index_list("layer_types", layers, "num_hidden_layers", length=layers, values=LAYER_TYPES)
    c.index_list("no_rope_layers", layers, "num_hidden_layers", length=layers, values=(0, 1))  # Llama 4
    if "experts" in applies:
        _experts(c, arch, values)
    else:
        for key in EXPERT_COUNT_KEYS:
            if data.get(key):
                raise c.fail(key, f"a {arch.model_type} model has no routed experts: its layers would be "
                                  f"priced dense (expected no {key}, or a MoE architecture)")
    check_rope(c, arch, applies, values)


def _token_ids(c: Check, vocab: int | None) -> None:
    """Special token ids are integers (or lists of them, ``eos_token_id``); the padding id indexes
    the embedding (``torch.nn.Embedding(padding_idx=…)``: from −vocab to vocab − 1)."""
    for key, v in c.data.items():
        if not (isinstance(key, str) and key.endswith("_token_id")) or v is None:
            continue
        ids = v if isinstance(v, list) and key == "eos_token_id" else [v]
        if not all(isinstance(x, int) and not isinstance(x, bool) and abs(x) < 2 ** 31 for x in ids):
            raise c.fail(key, f"expected a token id (an integer) or null, got {excerpt(v)}")
    pad = c.data.get("pad_token_id")
    if pad is not None and vocab is not None and not -vocab <= pad < vocab:
        raise c.fail("pad_token_id", f"expected a token id from {-vocab:,} to {c.name('vocab_size')} − 1 = "
                                     f"{vocab - 1:,}, got {pad}")


def _heads(c: Check, arch: Architecture, applies: set[str], v: dict) -> None:
    heads, hidden = v["num_attention_heads"], v["hidden_size"]
    kv = v["num_key_value_heads"]
    if kv is not None:
        c.divides("num_key_value_heads", kv, "num_attention_heads", heads,
                  "each KV head serves an equal group of query heads")
    if arch.head_projections:  # the model sizes its heads as hidden / heads, whatever the file says
        if "head_dim" in c.data:
            raise c.fail("head_dim", f"a {arch.model_type} model derives its head size as "
                                     f"{c.name('hidden_size')} / {c.name('num_attention_heads')} "
                                     f"(expected no head_dim)")
        c.divides("num_attention_heads", heads, "hidden_size", hidden, "the head size is hidden / heads")
    elif "mla" not in applies and v["head_dim"] is None:
        c.divides("num_attention_heads", heads, "hidden_size", hidden,
                  "without head_dim the head size is hidden / heads")
    rotary = v["rotary_dim"]
    if rotary is not None:
        head = hidden // heads
        if rotary > head or rotary % 2:
            raise c.fail("rotary_dim", f"expected an even number of at most the head size {head}, got {rotary}")
    rope_dim = v.get("qk_rope_head_dim")
    if "mla" in applies and rope_dim is not None:
        if rope_dim % 2:
            raise c.fail("qk_rope_head_dim", f"expected an even size (RoPE rotates pairs), got {rope_dim}")
        if v["head_dim"] is not None and v["head_dim"] != rope_dim:
            # DeepseekV3Config / GlmMoeDsaConfig.__post_init__: head_dim = qk_rope_head_dim, the rotary
            # table's width; a file's own head_dim would override it for the rotary table alone
            raise c.fail("head_dim", f"expected {c.name('qk_rope_head_dim')} = {rope_dim} (MLA's rotated part), "
                                     f"got {v['head_dim']}")
    if "gated_delta_net" in applies and v["linear_num_key_heads"] and v["linear_num_value_heads"]:
        c.divides("linear_num_key_heads", v["linear_num_key_heads"], "linear_num_value_heads",
                  v["linear_num_value_heads"], "each key head serves an equal group of value heads")


def _experts(c: Check, arch: Architecture, v: dict) -> None:
    count_key, width_key = arch.experts["count"], arch.experts.get("intermediate")
    dense = f"a {arch.model_type} model routes tokens to experts; without a MoE layer it would be priced dense"
    experts = c.size(count_key, Size(EXPERTS_MAX, required=True, why=dense))
    for key in EXPERT_COUNT_KEYS:  # the config classes alias them (attribute_map): one count, not two
        if key != count_key and c.get(key) is not None and c.get(key) != experts:
            raise c.fail(key, f"{excerpt(c.get(key))} differs from {c.name(count_key)} = {experts} (transformers "
                              f"reads both as the expert count)")
    if width_key:
        c.size(width_key, Size(WIDTH_MAX, required=True))
    shared = arch.experts.get("shared_intermediate")
    if shared:
        c.size(shared, Size(WIDTH_MAX))
    for key in ("num_experts_per_tok", "experts_per_token"):
        k = v[key]
        if k is not None and k > experts:
            raise c.fail(key, f"expected an integer from 1 to {c.name(count_key)} = {experts}, got {k}")
    groups, top_groups = v["n_group"], v["topk_group"]
    if groups is not None:
        c.divides("n_group", groups, count_key, experts, "group-limited routing splits the experts evenly")
        if top_groups is not None:
            if top_groups > groups:
                raise c.fail("topk_group", f"expected an integer from 1 to {c.name('n_group')} = {groups}, "
                                           f"got {top_groups}")
            reach = top_groups * (experts // groups)
            if v["num_experts_per_tok"] > reach:
                raise c.fail("num_experts_per_tok", f"{v['num_experts_per_tok']} is more than the {reach} experts "
                                                    f"of the topk_group = {top_groups} groups routing picks from")
    layers = v["num_hidden_layers"]
    for key, lo, hi in (("first_k_dense_replace", 0, layers - 1), ("decoder_sparse_step", 1, layers),
                        ("interleave_moe_layer_step", 1, layers)):
        if v[key] is not None and v[key] > hi:
            raise c.fail(key, f"expected an integer from {lo} to {hi} for {layers} layers ({dense}), got {v[key]}")
    only = c.index_list("mlp_only_layers", layers, "num_hidden_layers")
    if only is not None and len(set(only)) >= layers:
        raise c.fail("mlp_only_layers", f"every one of the {layers} layers is dense ({dense})")
    moe = c.index_list("moe_layers", layers, "num_hidden_layers")
    if moe is not None and not moe:
        raise c.fail("moe_layers", f"no MoE layer ({dense})")


def check_aliases(data: dict, arch: Architecture, where: str, prefix: str = "") -> None:
    """A file that states one size under both its own name and perfcast's (GPT-J's ``n_embd``
    and ``hidden_size``) states it once: the config class would read one of two values."""
    for file_key, key in arch.keys.items():
        if file_key in data and key in data and data[file_key] != data[key]:
            raise UserError(f"{where}: key {prefix + key!r}: {excerpt(data[key])} differs from "
                            f"{prefix + file_key} = {excerpt(data[file_key])} (one size under two names)")
