"""Hostile and malformed model configs through the CLI, in this process: every case ends in exit
2 with one line naming the key, or in a plausible result — never a traceback, a hang or a model
priced from a config it does not describe.

Generated cases (``@settings(max_examples=…)`` each): bad values 80, broken structure 40, bytes
and JSON syntax 60, dropped keys 25, valid variations 15, mixed 30 — 250 in all. Most are refused
before anything is built; the valid ones capture a two-layer model for real (about 0.1–2 s)."""

import json
import math
import time
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fuzzing import check_answered, run_cli
from perfcast.models import load_model_config
from perfcast.models.architecture import architecture
from perfcast.models.validate import KEYS, Size, kinds
from perfcast.models.vision import FAMILIES

#: Shipped configs cut to two layers: dense GQA, a MoE, GPT-J's renamed keys, MLA with group routing,
#: Falcon's fused attention, a vision-language model (its vision part checked too).
BASES = {
    "qwen3-8b": {"num_hidden_layers": 2},
    "qwen3-30b-a3b": {"num_hidden_layers": 2},
    "gpt-j-6b": {"n_layer": 2},
    "deepseek-v3": {"num_hidden_layers": 2, "first_k_dense_replace": 1},
    "falcon-40b": {"num_hidden_layers": 2},
    "qwen2.5-vl-7b-instruct": {"num_hidden_layers": 2},
}
DROP = object()  # a change that removes the key
COMMANDS = (("text-generate", "--json"), ("explain", "--json"),
            ("text-generate", "--decode", "--context-length", "16", "--json"))
SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def base(name: str) -> dict:
    data = json.loads(load_model_config(name).path.read_text())
    data.update(BASES[name])
    return data


def row(name: str):
    """The architecture row of a base's language model."""
    model_type = base(name)["model_type"]
    return architecture(FAMILIES[model_type].text_type if model_type in FAMILIES else model_type)


def file_keys(name: str) -> dict[str, Size]:
    """The integer keys of the base's file that its architecture's kinds check (file names); a
    key the row derives when null (GPT-J's ``n_inner``) is nullable."""
    data, arch = base(name), row(name)
    back = {v: k for k, v in arch.keys.items()}
    specs = {back.get(k, k): replace(spec, nullable=spec.nullable or k in arch.derived)
             for kind in kinds(arch) & set(KEYS) for k, spec in KEYS[kind].items() if isinstance(spec, Size)}
    if arch.experts:
        specs[arch.experts["count"]] = Size(2 ** 16)
    return {k: s for k, s in specs.items() if k in data}


def bad_values(spec: Size) -> list:
    """Values no integer key of ``spec`` may take."""
    out = ["8", 8.0, 8.5, True, False, -1, spec.maximum + 1, 2 ** 63, [8], {"v": 8}]
    if not spec.nullable:
        out.append(None)
    if spec.minimum >= 1:
        out.append(0)
    return out


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tmp_path_factory.mktemp("configs")


def run(folder, content, command=COMMANDS[0], case=None):
    """Write ``content`` (a dict, or bytes as they are) and run ``perfcast COMMAND PATH``."""
    path = folder / "config.json"
    path.write_bytes(content if isinstance(content, bytes) else json.dumps(content).encode())
    rc, out, err = run_cli(command[0], str(path), *command[1:])
    check_answered(rc, out, err, case)
    return rc, out, err


@settings(max_examples=80, **SETTINGS)
@given(st.data())
def test_a_bad_value_of_a_size_key_is_refused_naming_the_key(folder, data):
    name = data.draw(st.sampled_from(sorted(BASES)))
    keys = file_keys(name)
    key = data.draw(st.sampled_from(sorted(keys)))
    value = data.draw(st.sampled_from(bad_values(keys[key])))
    config = base(name)
    config[key] = value
    command = data.draw(st.sampled_from(COMMANDS))
    rc, _, err = run(folder, config, command, (name, key, value))
    assert rc == 2 and f"key '{key}'" in err, (name, key, value, err)


def _structure_cases(name: str) -> list[tuple[str, dict, str]]:
    """(what, changes, the error's words) that break how a base's sizes fit together."""
    c = base(name)
    heads = c.get("num_attention_heads", c.get("n_head"))
    cases = [("unknown activation", {"activation_function" if "activation_function" in c else "hidden_act": "swishy"},
              "is not an activation transformers knows"),
             ("unknown RoPE type", {"rope_scaling": {"rope_type": "ntk-by-parts", "factor": 2.0}},
              "'rope_scaling.rope_type': 'ntk-by-parts' is not a RoPE type transformers knows"),
             ("RoPE factor below 1", {"rope_scaling": {"rope_type": "linear", "factor": 0.5}},
              "'rope_scaling.factor': expected a finite number at least 1"),
             ("YaRN beta 0", {"rope_scaling": {"rope_type": "yarn", "factor": 4.0, "beta_fast": 0}},
              "'rope_scaling.beta_fast': expected a finite number above 0"),
             ("rope_scaling a string", {"rope_scaling": "yarn"}, "'rope_scaling': expected a mapping"),
             ("layer_types too short", {"layer_types": ["full_attention"]}, "1 entries, expected"),
             ("a negative epsilon", {"rms_norm_eps": -1e-6, "layer_norm_epsilon": -1e-6},
              "expected a finite number above 0"),
             ("dropout above 1", {"attention_dropout": 1.5},
              "'attention_dropout': expected a finite number at least 0"),
             ("padding id outside the vocabulary", {"pad_token_id": 10 ** 9}, "'pad_token_id': expected a token id")]
    kv_key = next((k for k in ("num_key_value_heads", "num_kv_heads") if k in c), None)
    if kv_key and "kv_lora_rank" not in c:
        cases.append(("KV heads that do not divide the heads",
                      {kv_key: next(k for k in range(heads - 1, 0, -1) if heads % k)},
                      "does not divide num_attention_heads"))
    if "kv_lora_rank" not in c:  # attention that sizes heads as hidden / heads without head_dim
        hidden, kv = c.get("hidden_size", c.get("n_embd")), c.get(kv_key, 1)
        odd = next(kv * m for m in (3, 5, 7, 9) if hidden % (kv * m))
        cases.append(("heads that do not divide the hidden size", {"head_dim": DROP, "n_head" if "n_head" in c
                                                                   else "num_attention_heads": odd},
                      f"{odd} does not divide"))
    arch = row(name)
    if arch.experts:
        count = arch.experts["count"]
        cases += [("no experts", {count: 0}, f"'{count}': expected an integer from 1"),
                  ("top-k 0", {"num_experts_per_tok": 0}, "'num_experts_per_tok': expected an integer from 1"),
                  ("top-k above the experts", {"num_experts_per_tok": c[count] + 1},
                   f"expected an integer from 1 to {count} = {c[count]}"),
                  ("a second expert count", {"num_local_experts": c[count] // 2}, "differs from")]
    return cases


@settings(max_examples=40, **SETTINGS)
@given(st.data())
def test_sizes_that_do_not_fit_together_are_refused(folder, data):
    name = data.draw(st.sampled_from(sorted(BASES)))
    what, changes, words = data.draw(st.sampled_from(_structure_cases(name)))
    config = {k: v for k, v in {**base(name), **changes}.items() if v is not DROP}
    rc, _, err = run(folder, config, data.draw(st.sampled_from(COMMANDS)), (name, what))
    assert rc == 2 and words in err, (name, what, err)


def _text_mutations():
    """Byte-level damage to a config file: each is refused before anything is built."""
    number = st.sampled_from(["NaN", "Infinity", "-Infinity", "1e400", "-1e999", "9" * 60])

    def replace_number(text, draw):
        spots = [i for i, ch in enumerate(text) if ch.isdigit() and text[i - 1] in " :["]
        i = draw(st.sampled_from(spots))
        j = i
        while j < len(text) and (text[j].isdigit() or text[j] in ".e-+"):
            j += 1
        return (text[:i] + draw(number) + text[j:]).encode()

    def duplicate_key(text, draw):
        key = draw(st.sampled_from(sorted(json.loads(text))))
        return text.replace("{", '{"%s": 1, ' % key, 1).encode()

    def deep(text, draw):
        depth = draw(st.integers(33, 200_000))
        return text.replace("{", '{"nest": %s%s, ' % ("[" * depth, "]" * depth), 1).encode()

    def not_utf8(text, draw):
        i = draw(st.integers(0, len(text)))
        return text[:i].encode() + bytes([draw(st.integers(0x80, 0xFF))]) + text[i:].encode()

    def nul(text, draw):
        i = draw(st.integers(0, len(text)))
        return text[:i].encode() + b"\0" + text[i:].encode()

    def truncated(text, draw):
        return text[:draw(st.integers(0, len(text) - 1))].encode()

    def not_an_object(text, draw):
        return draw(st.sampled_from([b"[]", b'"llama"', b"3", b"null", b"", b"\xef\xbb\xbf"]))

    return [replace_number, duplicate_key, deep, not_utf8, nul, truncated, not_an_object]


@settings(max_examples=60, **SETTINGS)
@given(st.data())
def test_a_damaged_file_is_refused_in_one_line(folder, data):
    name = data.draw(st.sampled_from(sorted(BASES)))
    mutate = data.draw(st.sampled_from(_text_mutations()))
    content = mutate(json.dumps(base(name), indent=1), data.draw)
    rc, _, err = run(folder, content, data.draw(st.sampled_from(COMMANDS)), (name, mutate.__name__))
    assert rc == 2 and "config.json" in err, (name, mutate.__name__, err)


@settings(max_examples=25, **SETTINGS)
@given(st.data())
def test_a_config_missing_keys_is_priced_or_refused(folder, data):
    """Dropping keys leaves the config class's defaults (priced) or a required key missing."""
    name = data.draw(st.sampled_from(sorted(BASES)))
    config = base(name)
    dropped = data.draw(st.lists(st.sampled_from(sorted(k for k in config if k != "model_type")),
                                 min_size=1, max_size=3, unique=True))
    for k in dropped:
        config.pop(k)
    rc, _, err = run(folder, config, data.draw(st.sampled_from(COMMANDS)), (name, dropped))
    assert rc == 0 or "missing" in err or "key '" in err, (name, dropped, err)


@settings(max_examples=15, **SETTINGS)
@given(st.data())
def test_valid_variations_are_priced(folder, data):
    """Sizes that fit together are never refused: the model is captured and priced."""
    name = data.draw(st.sampled_from(["qwen3-8b", "qwen3-30b-a3b"]))
    heads = data.draw(st.sampled_from([4, 8, 16]))
    config = base(name)
    config.update(num_attention_heads=heads, num_key_value_heads=data.draw(st.sampled_from([h for h in (1, 2, 4)
                                                                                             if heads % h == 0])),
                  head_dim=data.draw(st.sampled_from([32, 64])), hidden_size=data.draw(st.sampled_from([256, 512])),
                  intermediate_size=data.draw(st.integers(1, 1024)), vocab_size=data.draw(st.integers(16, 4096)),
                  rms_norm_eps=data.draw(st.floats(1e-9, 1e-2)), rope_theta=data.draw(st.floats(1.0, 1e7)),
                  hidden_act=data.draw(st.sampled_from(["silu", "gelu", "relu", "gelu_pytorch_tanh"])),
                  rope_scaling=data.draw(st.sampled_from([None, {"rope_type": "linear", "factor": 2.0},
                                                          {"rope_type": "dynamic", "factor": 4.0}])))
    if name == "qwen3-30b-a3b":
        experts = data.draw(st.integers(1, 16))
        config.update(num_experts=experts, num_experts_per_tok=data.draw(st.integers(1, experts)),
                      moe_intermediate_size=data.draw(st.integers(1, 256)))
    rc, out, err = run(folder, config, data.draw(st.sampled_from(COMMANDS)), (name, config))
    assert rc == 0, err


def _any_value():
    return st.one_of(st.none(), st.booleans(), st.integers(-2 ** 70, 2 ** 70),
                     st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=20),
                     st.lists(st.integers(-3, 3), max_size=4), st.just({"rope_type": "yarn"}))


@settings(max_examples=30, **SETTINGS)
@given(st.data())
def test_any_value_anywhere_is_answered(folder, data):
    """Any JSON value under any key of a base (or a new one): exit 2 in one line, or a price."""
    name = data.draw(st.sampled_from(sorted(BASES)))
    config = base(name)
    key = data.draw(st.one_of(st.sampled_from(sorted(config)), st.sampled_from(["head_dim", "sliding_window",
                                                                                 "rope_parameters", "layer_types",
                                                                                 "num_experts", "text_config"])))
    config[key] = data.draw(_any_value())
    run(folder, config, data.draw(st.sampled_from(COMMANDS)), (name, key, config[key]))


# The failures the hardening issue names, each exactly.
@pytest.mark.parametrize("model, changes, message", [
    ("qwen3-8b", {"hidden_size": None}, "key 'hidden_size': expected an integer from 1 to 1,048,576, got None"),
    ("qwen3-8b", {"hidden_size": "4096"}, "key 'hidden_size': expected an integer from 1 to 1,048,576, got '4096'"),
    ("qwen3-8b", {"hidden_size": 4096.0}, "key 'hidden_size': expected an integer from 1 to 1,048,576, got 4096.0"),
    ("qwen3-8b", {"hidden_size": 10 ** 12}, "key 'hidden_size': expected an integer from 1 to 1,048,576, "
                                            "got 1000000000000"),
    ("qwen3-8b", {"num_attention_heads": 0}, "key 'num_attention_heads': expected an integer from 1 to 4,096, got 0"),
    ("qwen3-8b", {"num_key_value_heads": 0}, "key 'num_key_value_heads': expected an integer from 1 to 4,096, got 0"),
    ("qwen3-8b", {"head_dim": 0}, "key 'head_dim': expected an integer from 1 to 1,048,576, got 0"),
    ("qwen3-8b", {"rope_scaling": {"rope_type": "bogus", "factor": 2.0}},
     "key 'rope_scaling.rope_type': 'bogus' is not a RoPE type transformers knows (expected one of 7: default, "
     "dynamic, linear, llama3, …)"),
    ("qwen3-8b", {"hidden_act": "bogus"}, "key 'hidden_act': 'bogus' is not an activation transformers knows "
                                          "(expected one of 24: silu, gelu, gelu_pytorch_tanh, gelu_new, relu, …)"),
    ("qwen3-8b", {"num_hidden_layers": 1_000_000},
     "key 'num_hidden_layers': expected an integer from 1 to 1,024 (every layer is built before identical ones are "
     "grouped; the deepest published decoder has 126), got 1000000"),
    ("qwen3-8b", {"num_key_value_heads": 5},
     "key 'num_key_value_heads': 5 does not divide num_attention_heads = 32 (each KV head serves an equal group of "
     "query heads)"),
    ("qwen3-30b-a3b", {"num_experts": 0},
     "key 'num_experts': expected an integer from 1 to 65,536 (a qwen3_moe model routes tokens to experts; without "
     "a MoE layer it would be priced dense), got 0"),
    ("qwen3-30b-a3b", {"num_experts_per_tok": 0},
     "key 'num_experts_per_tok': expected an integer from 1 to 65,536, got 0"),
    ("gpt-j-6b", {"n_embd": 4040}, "key 'n_head': 16 does not divide n_embd = 4040 (the head size is hidden / heads)"),
    ("deepseek-v3", {"topk_group": 9}, "key 'topk_group': expected an integer from 1 to n_group = 8, got 9"),
])
@pytest.mark.parametrize("command", ["text-generate", "explain"])
def test_each_named_failure_is_one_line(folder, model, changes, message, command):
    config = {**json.loads(load_model_config(model).path.read_text()), **changes}
    start = time.monotonic()
    rc, out, err = run(folder, config, (command,))
    assert rc == 2 and err == f"perfcast {command}: error: {folder / 'config.json'}: {message}\n", err
    assert time.monotonic() - start < 5  # refused before anything is built


def test_a_non_finite_constant_is_refused_naming_the_file(folder):
    text = load_model_config("qwen3-8b").path.read_text().replace('"rms_norm_eps": 1e-06', '"rms_norm_eps": NaN')
    rc, _, err = run(folder, text.encode())
    assert rc == 2 and "config.json: NaN is not a JSON number (expected a finite number)" in err


def test_the_issue_s_silently_priced_configs_now_fail(folder):
    """KV heads that do not divide the heads, no experts and top-k 0 were priced as other models."""
    for model, changes in [("qwen3-8b", {"num_key_value_heads": 5}), ("qwen3-30b-a3b", {"num_experts": 0}),
                           ("qwen3-30b-a3b", {"num_experts_per_tok": 0})]:
        rc, out, _ = run(folder, {**json.loads(load_model_config(model).path.read_text()), **changes})
        assert rc == 2 and out == ""


def test_a_small_valid_config_prices_like_its_catalog_entry(folder):
    """Validation changes nothing for a valid config: the two-layer Qwen3-8B priced from a path
    reports finite figures and the layers it was given."""
    rc, out, err = run(folder, base("qwen3-8b"), ("text-generate", "--json"))
    doc = json.loads(out)
    assert rc == 0 and doc["memory"]["fits"] and math.isfinite(doc["performance_models"]["analytic"]["total_time_s"])
