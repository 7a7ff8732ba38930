"""A config's RoPE parameters (``rope_scaling`` or ``rope_parameters``) checked as transformers
5.24.0 reads them (``modeling_rope_utils.py``): a known ``rope_type`` (an unknown one is a
KeyError when the model is built), the keys that type requires, and numbers that keep its
formulas finite. Where transformers only logs a warning and computes with the value (a YaRN
``beta_fast`` of 0 divides by zero, a Llama 3 ``high_freq_factor`` equal to the low one too),
perfcast refuses it.
"""

from __future__ import annotations

from perfcast.inputs import excerpt
from perfcast.models.architecture import Architecture
from perfcast.models.validate import LAYER_TYPES, POSITIONS_MAX, Check, Real, Size

#: transformers 5.24.0: ``"default"`` (``compute_default_rope_parameters``) and the keys of
#: ``modeling_rope_utils.ROPE_INIT_FUNCTIONS``.
ROPE_TYPES = ("default", "dynamic", "linear", "llama3", "longrope", "proportional", "yarn")
#: rope_type → the keys it requires (``RotaryEmbeddingConfigMixin._validate_<type>_rope_parameters``;
#: ``original_max_position_embeddings`` defaults to ``max_position_embeddings`` there).
REQUIRED = {"linear": ("factor",), "dynamic": ("factor",), "yarn": ("factor",),
            "llama3": ("factor", "low_freq_factor", "high_freq_factor"),
            "longrope": ("short_factor", "long_factor")}
#: The numbers a RoPE entry may hold. ``factor`` scales the context (at least 1: transformers'
#: validators); YaRN's ``beta_fast``/``beta_slow`` divide (``find_correction_dim``).
NUMBERS = {"factor": Real(above=1.0, inclusive=True), "rope_theta": Real(), "attention_factor": Real(),
           "beta_fast": Real(), "beta_slow": Real(), "mscale": Real(inclusive=True),
           "mscale_all_dim": Real(inclusive=True), "low_freq_factor": Real(), "high_freq_factor": Real(),
           "partial_rotary_factor": Real(maximum=1.0), "original_max_position_embeddings": Size(POSITIONS_MAX)}
ROPE_KEYS = ("rope_scaling", "rope_parameters")


def check_rope(c: Check, arch: Architecture, applies: set[str], values: dict) -> None:
    """Each RoPE entry of the config ``c`` checks: one dict, or one per layer type (Gemma 3)."""
    for key in ROPE_KEYS:
        rope = c.get(key)
        if rope is None:
            continue
        if not isinstance(rope, dict):
            raise c.fail(key, f"expected a mapping of RoPE parameters or null, got {excerpt(rope)}")
        nested = "rope_type" not in rope and "type" not in rope and rope and all(
            k in LAYER_TYPES and (v is None or isinstance(v, dict)) for k, v in rope.items())
        for sub, entry in (((f"{key}.{k}", v) for k, v in rope.items()) if nested else [(key, rope)]):
            if entry is not None:
                _entry(Check(entry, c.where, f"{c.prefix}{sub}."), arch, applies, values)


def _entry(c: Check, arch: Architecture, applies: set[str], values: dict) -> None:
    type_key = "rope_type" if "rope_type" in c.data else "type"
    given = c.data.get(type_key, "default")
    aliases = arch.rope_aliases
    c.choice(type_key, given, tuple(dict.fromkeys(ROPE_TYPES + tuple(aliases))), "a RoPE type transformers knows")
    rope_type = aliases.get(given, given)
    for key in REQUIRED.get(rope_type, ()):
        if c.data.get(key) is None:
            raise c.fail(key, f"missing (a {rope_type} RoPE needs {', '.join(REQUIRED[rope_type])})")
    got = {k: (c.size(k, spec) if isinstance(spec, Size) else c.real(k, spec)) for k, spec in NUMBERS.items()}
    if rope_type == "llama3" and got["high_freq_factor"] < got["low_freq_factor"]:
        # _compute_llama3_parameters smooths between the two wavelengths (none when equal: Llama 4 Scout)
        raise c.fail("high_freq_factor", f"expected at least low_freq_factor = {got['low_freq_factor']:g}, "
                                         f"got {got['high_freq_factor']:g}")
    rotary = _rotary_dim(applies, values, got["partial_rotary_factor"])
    for key in ("short_factor", "long_factor"):  # LongRoPE: one rescale factor per rotated pair
        if key in c.data:
            v = c.data[key]
            ok = isinstance(v, list) and all(isinstance(x, (int, float)) and not isinstance(x, bool)
                                             and 0 < x < float("inf") for x in v)
            if not ok:
                raise c.fail(key, f"expected a list of positive finite numbers, got {excerpt(v)}")
            if rotary is not None and len(v) != rotary // 2:
                raise c.fail(key, f"{len(v)} entries, expected one per rotated pair: {rotary // 2}")
    if "mrope_section" in c.data:  # multimodal RoPE: the rotated pairs split into t, h, w sections
        v = c.data["mrope_section"]
        if not (isinstance(v, list) and v and all(isinstance(x, int) and not isinstance(x, bool) and x >= 0
                                                  for x in v)):
            raise c.fail("mrope_section", f"expected a list of sizes (integers ≥ 0), got {excerpt(v)}")
        if rotary is not None and sum(v) != rotary // 2:
            raise c.fail("mrope_section", f"sections sum to {sum(v)}, expected the {rotary // 2} rotated pairs "
                                          f"of the head")


def _rotary_dim(applies: set[str], values: dict, partial: float | None) -> int | None:
    """The rotated part of a head (head size × partial_rotary_factor), where the config fixes it."""
    if "mla" in applies or values.get("rotary_dim") is not None:
        return None
    head = values.get("head_dim") or values["hidden_size"] // values["num_attention_heads"]
    return int(head * (partial if partial is not None else values.get("partial_rotary_factor") or 1.0))
