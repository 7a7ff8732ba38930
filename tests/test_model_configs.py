"""Model configs are checked as a whole where they are read (perfcast.models.validate): every
shipped config passes, the names copied from transformers still match it, the JSON reader
refuses what strict JSON does not allow, and `explain` says when a model cannot fit."""

import json

import pytest

from perfcast.inputs import parse_json, read_json
from perfcast.ir import UserError
from perfcast.models import catalog_names, load_model_config, vision
from perfcast.models.architecture import table
from perfcast.models.rope import ROPE_TYPES
from perfcast.models.validate import ACTIVATIONS, CACHE_IMPLEMENTATIONS, LAYER_TYPES, kinds


def test_every_shipped_config_passes_as_a_whole():
    for name in catalog_names():
        model = load_model_config(name)
        if vision.is_vision_language(model):
            vision.processor(model)  # its vision part and processor too
    assert len(catalog_names()) >= 30


def test_the_names_copied_from_transformers_still_match_it():
    from transformers.activations import ACT2FN
    from transformers.configuration_utils import ALLOWED_ATTN_LAYER_TYPES, _LEGACY_LAYER_TYPE_REMAP
    from transformers.generation.configuration_utils import ALL_CACHE_IMPLEMENTATIONS
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    assert set(ACTIVATIONS) == set(ACT2FN)
    assert set(ROPE_TYPES) == {"default", *ROPE_INIT_FUNCTIONS}
    assert set(LAYER_TYPES) == {*ALLOWED_ATTN_LAYER_TYPES, *_LEGACY_LAYER_TYPE_REMAP}
    assert set(CACHE_IMPLEMENTATIONS) == {*ALL_CACHE_IMPLEMENTATIONS, "paged"}


def test_rope_aliases_name_types_the_rows_config_class_reads():
    """phi3 reads 'su' and 'yarn' as LongRoPE, qwen2_5_vl 'mrope' as the default RoPE."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    for row in table().values():
        for alias, meant in row.rope_aliases.items():
            assert meant in ROPE_TYPES
            cfg = CONFIG_MAPPING[row.model_type](
                hidden_size=256, num_attention_heads=4, rope_scaling={"type": alias, "factor": 2.0,
                                                                      "short_factor": [1.0] * 32,
                                                                      "long_factor": [1.0] * 32,
                                                                      "original_max_position_embeddings": 4096})
            assert cfg.rope_parameters["rope_type"] == meant


def test_kinds_follow_the_row():
    assert kinds(table()["deepseek_v3"]) == {"decoder", "mla", "experts"}
    assert kinds(table()["glm_moe_dsa"]) == {"decoder", "mla", "dsa", "experts"}
    assert kinds(table()["llama"]) == {"decoder", "attention"}


@pytest.mark.parametrize("text, message", [
    ('{"a": NaN}', "f.json: NaN is not a JSON number (expected a finite number)"),
    ('{"a": -Infinity}', "f.json: -Infinity is not a JSON number"),
    ('{"a": 1e400}', "f.json: the number '1e400' is beyond a double"),
    ('{"a": 1, "b": {"c": 2, "c": 3}}', "f.json: key 'c' appears twice in one object"),
    ('{"a": ' + "9" * 50 + "}", "f.json: an integer of 50 digits (expected at most 40)"),
    ("[" * 33 + "]" * 33, "f.json: nested 33 levels deep (expected at most 32)"),
    ("[" * 100_000 + "]" * 100_000, "f.json: nested too deeply (expected at most 32 levels)"),
    ('{"a": 1', "f.json: not valid JSON at line 1 column 8"),
])
def test_strict_json(text, message):
    with pytest.raises(UserError) as e:
        parse_json(text, "f.json")
    assert message in str(e.value) and "\n" not in str(e.value)


def test_json_files_must_be_utf8_text(tmp_path):
    p = tmp_path / "config.json"
    p.write_bytes(b'{"model_type": "ll\xe9ama"}')  # offset 18: {, "model_type" (12), ":", " ", quote, ll
    with pytest.raises(UserError, match=r"not UTF-8 text \(byte 0xe9 at offset 18\)"):
        read_json(p)
    p.write_bytes(b'{"model_type": "llama"}\0')
    with pytest.raises(UserError, match="a binary file"):
        read_json(p)
    p.write_text(json.dumps({"a": [1, 2.5, None, True]}))
    assert read_json(p) == {"a": [1, 2.5, None, True]}


def test_a_preprocessor_config_is_read_strictly(tmp_path):
    import shutil

    shutil.copy(load_model_config("qwen2.5-vl-7b-instruct").path, tmp_path / "config.json")
    model = load_model_config(str(tmp_path / "config.json"))
    pre = tmp_path / "preprocessor_config.json"
    for text, message in [('{"min_pixels": NaN, "max_pixels": 100}', "NaN is not a JSON number"),
                          ('{"min_pixels": 3136, "max_pixels": 100}', "key 'max_pixels': expected at least "
                                                                      "min_pixels = 3,136, got 100"),
                          ('{"min_pixels": 3136, "max_pixels": 1e6}', "key 'max_pixels': expected an integer"),
                          ('{"min_pixels": 3136, "max_pixels": 10000, "patch_size": 0}', "key 'patch_size'"),
                          ('[1]', "expected a JSON object (a preprocessor_config.json)")]:
        pre.write_text(text)
        with pytest.raises(UserError, match=message.replace("(", r"\(").replace(")", r"\)")):
            vision.processor(model)


def test_explain_says_when_the_weights_alone_do_not_fit():
    """Llama 3.1 405B on one H100: 405,853,388,800 parameters × 2 bytes (bf16) = 811,706,777,600
    bytes against the 85,520,809,984 bytes an H100 reports (81,559 MiB) less the engine's 10 %
    reserve (8,552,080,998) = 76,968,728,986: short by 734,738,048,614 bytes whatever B and S are."""
    from fuzzing import run_cli

    rc, out, err = run_cli("explain", "llama-3.1-405b", "--device", "h100-sxm", "--json")
    doc = json.loads(out)
    assert rc == 0 and doc["deployable"] is False
    assert doc["memory"] == {"capacity_bytes": 85_520_809_984, "weights_bytes": 811_706_777_600,
                             "reserved_bytes": 8_552_080_998, "free_bytes_before_kv_cache": 0, "fits": False,
                             "shortfall_bytes": 734_738_048_614, "parameters": 405_853_388_800}
    assert doc["notes"][0].startswith("DOES NOT FIT: the weights alone need 811,706,777,600 bytes of the "
                                      "76,968,728,986 the engine may use on h100-sxm")
    rc, out, err = run_cli("explain", "llama-3.1-405b", "--device", "h100-sxm")
    assert rc == 0 and "DOES NOT FIT: the weights alone need 811.7 GB of the 76.97 GB" in out


def test_explain_shows_the_room_left_when_the_weights_fit():
    """Llama 3.1 8B: 8,030,261,248 parameters × 2 bytes = 16,060,522,496 of the 76,968,728,986 bytes usable
    (90 % of the 85,520,809,984 an H100 reports)."""
    from fuzzing import run_cli

    rc, out, err = run_cli("explain", "llama-3.1-8b", "--json")
    mem = json.loads(out)["memory"]
    assert rc == 0 and mem["fits"] and mem["weights_bytes"] == 2 * mem["parameters"] == 16_060_522_496
    assert mem["free_bytes_before_kv_cache"] == 76_968_728_986 - 16_060_522_496


def _refusal(tmp_path, model: str, change) -> str:
    """The error of catalog config ``model`` changed by ``change(config)``, after the file name."""
    config = json.loads(load_model_config(model).path.read_text())
    change(config)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    with pytest.raises(UserError) as e:
        load_model_config(str(path))
    assert str(e.value).startswith(f"{path}: ") and "\n" not in str(e.value)
    return str(e.value)[len(f"{path}: "):]


def _set(where: str, value):
    """A change that sets the dotted key ``where`` (``text_config.rope_parameters``)."""
    def change(config):
        *parents, key = where.split(".")
        for p in parents:
            config = config[p]
        config[key] = value
    return change


@pytest.mark.parametrize("model, where, value, message", [
    # Gemma 3 states one RoPE per layer type: each entry is checked under its own name
    ("gemma-3-12b", "text_config.rope_scaling", {"full_attention": {"rope_type": "linear", "factor": 8.0},
                                                 "sliding_attention": {"rope_type": "lineal"}},
     "key 'text_config.rope_scaling.sliding_attention.rope_type': 'lineal' is not a RoPE type transformers knows "
     "(expected one of 7: linear, …)"),
    # _compute_llama3_parameters smooths between the two wavelengths: high below low inverts it
    ("llama-3.1-8b", "rope_scaling.high_freq_factor", 0.5,
     "key 'rope_scaling.high_freq_factor': expected at least low_freq_factor = 1, got 0.5"),
    # LongRoPE rescales each rotated pair: a 128-wide head has 64 pairs
    ("llama-3.1-8b", "rope_scaling", {"rope_type": "longrope", "short_factor": [1.0] * 64,
                                      "long_factor": [1.0] * 63},
     "key 'rope_scaling.long_factor': 63 entries, expected one per rotated pair: 64"),
    # M-RoPE sections split the 64 pairs of Qwen3-VL's 128-wide heads (24 + 20 + 20)
    ("qwen3-vl-8b-instruct", "text_config.rope_scaling.mrope_section", [24, 20, 21],
     "key 'text_config.rope_scaling.mrope_section': sections sum to 65, expected the 64 rotated pairs of the head"),
    ("qwen2.5-vl-7b-instruct", "vision_config.out_hidden_size", 4096,
     "key 'vision_config.out_hidden_size': expected the language model's hidden_size = 3584 (the merger's output "
     "joins its tokens), got 4096"),
    ("qwen2.5-vl-7b-instruct", "vision_config.window_size", 100,
     "key 'vision_config.window_size': expected a multiple of patch_size × spatial_merge_size = 28, got 100"),
    ("qwen2.5-vl-7b-instruct", "vision_config.fullatt_block_indexes", [7, 32],
     "key 'vision_config.fullatt_block_indexes': entry 1: expected a layer index from 0 to 31, got 32"),
    ("qwen3-vl-8b-instruct", "vision_config.num_heads", 10,
     "key 'vision_config.num_heads': 10 does not divide vision_config.hidden_size = 1152"),
    ("qwen3-vl-8b-instruct", "text_config", "none", "key 'text_config': expected a mapping, got 'none'"),
    ("kimi-k2.5", "text_config.n_group", 7,
     "key 'text_config.n_group': 7 does not divide text_config.n_routed_experts = 384"),
    ("gpt-j-6b", "hidden_size", 1024, "key 'hidden_size': 1024 differs from n_embd = 4096 (one size under two names)"),
    ("llama-3.1-8b", "num_local_experts", 8,
     "key 'num_local_experts': a llama model has no routed experts: its layers would be priced dense"),
    ("llama-3.1-8b", "text_config", {"hidden_size": 8}, "key 'text_config': a sub-config in a llama language model's"),
    ("falcon-40b", "head_dim", 64, "key 'head_dim': a falcon model derives its head size as hidden_size / "
                                   "num_attention_heads (expected no head_dim)"),
    ("deepseek-v3", "head_dim", 128, "key 'head_dim': expected qk_rope_head_dim = 64 (MLA's rotated part), got 128"),
    ("gpt-oss-120b", "layer_types", ["full_attention", "global"] * 18,
     "key 'layer_types': entry 1: expected full_attention, sliding_attention, chunked_attention, window_attention, …,"
     " got 'global'"),
    ("mixtral-8x7b", "pad_token_id", 32000, "key 'pad_token_id': expected a token id from -32,000 to vocab_size − 1 "
                                            "= 31,999, got 32000"),
    ("gemma-2-9b", "cache_implementation", "hybird", "key 'cache_implementation': 'hybird' is not a cache "
                                                     "transformers knows (expected one of 11: hybrid"),
    ("phi-4", "resid_pdrop", 1.5, "key 'resid_pdrop': expected a finite number at least 0 and at most 1, got 1.5"),
])
def test_each_structural_rule_is_one_line_naming_the_key(tmp_path, model, where, value, message):
    assert message in _refusal(tmp_path, model, _set(where, value))


def test_rope_types_the_row_aliases_are_accepted(tmp_path):
    """Qwen2.5-VL's hub config says 'mrope' (its config class reads the default RoPE); Phi-3
    configs say 'su' for LongRoPE — a Phi-3 with LongRoPE over its 128-wide heads loads."""
    assert load_model_config("qwen2.5-vl-7b-instruct").data["rope_scaling"]["type"] == "mrope"
    config = json.loads(load_model_config("phi-4").path.read_text())
    config["rope_scaling"] = {"type": "su", "short_factor": [1.0] * 64, "long_factor": [2.0] * 64}
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert load_model_config(str(tmp_path / "config.json")).data["rope_scaling"]["type"] == "su"
