"""The cases of the hardening census (``benchmarks/hardening_census.py``): perfcast command lines
and the files they read, generated from shipped files by mutation, deterministically from a seed.

Five populations — model configs, device YAMLs, topology YAMLs, profiling databases and flag
values. A case is only argv and files (no perfcast API), so the same cases run against any
checkout. Each case says whether it *must* be refused: a bad value or structure that, accepted,
can only be priced wrong (num_experts 0, a database of another device, ``1:30`` as a capacity,
a link latency of -1). Cases whose right answer is open (a huge but finite figure, an unknown
extra key, a truncated file that may still parse) are not marked: there either answer keeps the
promise as long as it is an error line or finite figures.

The base files are read from this checkout's ``src`` (``--src`` only chooses what runs them).
"""

from __future__ import annotations

import copy
import gzip
import hashlib
import json
import random
import re
from dataclasses import dataclass
from pathlib import Path

import yaml

SHIPPED = Path(__file__).resolve().parents[1] / "src" / "perfcast"
#: the argv and file placeholder for the case's own folder
DIR = "{dir}"


@dataclass(frozen=True)
class Case:
    population: str
    kind: str  # what was mutated, e.g. "datasheet.hbm_capacity_bytes = nan"
    argv: tuple[str, ...]  # perfcast's arguments; DIR stands for the case's folder
    must_refuse: bool
    files: tuple[tuple[str, bytes], ...] = ()  # (path relative to the case folder, content)
    links: tuple[tuple[str, str], ...] = ()  # (path, symlink target)
    outside_s: float | None = None  # a priced time that can only come from a table outside the database

    def key(self) -> str:
        """A stable text of the case (for the census' digest)."""
        parts = [self.population, self.kind, repr(self.argv), str(self.must_refuse), repr(self.links)]
        parts += [f"{p}:{hashlib.sha256(b).hexdigest()}" for p, b in self.files]
        return "|".join(parts)


def _sample(rng: random.Random, items: list, n: int) -> list:
    """``n`` of ``items`` in their original order (all of them when there are fewer)."""
    if len(items) <= n:
        return items
    keep = sorted(rng.sample(range(len(items)), max(n, 0)))
    return [items[i] for i in keep]


def _fill(rng: random.Random, core: list, pool: list, n: int) -> list:
    """Every one of ``core`` (the forms that broke perfcast, and those every file kind must
    survive), then as many of ``pool`` (a grid of values by key), drawn by ``rng``, as make ``n``."""
    pool = [item for item in pool if item not in core]
    return core + _sample(rng, pool, n - len(core))


# --- junk shared by the YAML populations ------------------------------------------------------

def _bomb(levels: int, width: int, key: str = "extra") -> str:
    """A 'billion laughs' alias bomb under ``key``: ``width ** levels`` leaves."""
    lines = [f"{key}:", f"  b0: &b0 [{', '.join(['lol'] * width)}]"]
    lines += [f"  b{i}: &b{i} [{', '.join([f'*b{i - 1}'] * width)}]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


#: a tag that runs a command where a loader constructs Python objects (the census looks for PWNED)
RUN_CODE = "!!python/object/apply:os.system ['touch PWNED']"
#: raw text put where a YAML value was: (token, must be refused where a number goes)
YAML_TOKENS = [
    ("1:30", True), ("1:30:00", True), ("1e400", True), ("-1e400", True), (".nan", True), (".inf", True),
    ("-.inf", True), ("1_000", True), ("yes", True), ("off", True), ("~", True), ("''", True),
    (RUN_CODE, True), ("!!binary aGk=", True),
    ("!custom 1", True), ("!!timestamp 2024-01-01", True), ("*undefined", True), ("[[[[]]]]", True),
    ("'unterminated", True), ("{a: 1, a: 2}", True), ("0x50", False), ("3.35 TB/s", True),
]
#: the tokens that broke perfcast: in every seed's cases, at the first numeric key
NAMED_TOKENS = ("1:30", "1e400", ".inf", RUN_CODE)


def _set_value(text: str, key: str, value: str, nth: int = 0) -> str:
    """``text`` with the ``nth`` line ``KEY: ...`` given ``value`` instead."""
    pattern = re.compile(rf"^(\s*-?\s*{re.escape(key)}:)[ \t]*(.*)$", re.M)
    matches = list(pattern.finditer(text))
    m = matches[nth]
    return text[:m.start()] + f"{m.group(1)} {value}" + text[m.end():]


def _repeat_key(text: str, key: str, value: str) -> str:
    """``text`` with the line ``KEY: ...`` followed by a second ``KEY: value`` at its indent."""
    m = re.search(rf"^(\s*){re.escape(key)}:.*$", text, re.M)
    indent = m.group(1).lstrip("\n")
    return text[:m.end()] + f"\n{indent}{key}: {value}" + text[m.end():]


def _with(tree, path: str, value=None, drop: bool = False):
    """A deep copy of ``tree`` with ``path`` (dotted; list indices as numbers) set or dropped."""
    tree = copy.deepcopy(tree)
    *parents, last = path.split(".")
    node = tree
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node[part]
    if isinstance(node, list):
        last = int(last)
    if drop:
        del node[last]
    else:
        node[last] = value
    return tree


def _dump(tree) -> bytes:
    return yaml.safe_dump(tree, sort_keys=False, allow_unicode=True, width=1000).encode()


def _text_mutations(text: str, rng: random.Random, numeric_keys: list[str], string_key: str):
    """Mutations of a YAML file's text, each (what, new content, must be refused): those of the
    whole file, and a grid of raw tokens put where a number goes."""
    raw = text.encode()
    grid = []
    for key in numeric_keys:
        for token, must in YAML_TOKENS:
            grid.append((f"{key}: {token}", _set_value(text, key, token).encode(), must))
        grid.append((f"{key} repeated", _repeat_key(text, key, "1.0").encode(), True))
    first = text.split(":", 1)[0]
    # named as in the grid: a drawn duplicate is dropped
    named = {f"{numeric_keys[0]}: {token}" for token in NAMED_TOKENS} | {f"{numeric_keys[0]} repeated"}
    out = [item for item in grid if item[0] in named]
    out += [
        (f"top-level {first!r} repeated", (text + f"\n{first}: other\n").encode(), True),
        ("alias bomb 10^9 (extra key)", (text + _bomb(9, 10)).encode(), True),
        ("alias bomb 4^4 (extra key)", (text + _bomb(4, 4)).encode(), False),
        # the bomb defined first (an anchor precedes its aliases), then used where a value goes
        (f"alias bomb 10^9 as {numeric_keys[0]}",
         (_bomb(9, 10) + _set_value(text, numeric_keys[0], "*b8")).encode(), True),
        (f"alias bomb 10^9 as {string_key}", (_bomb(9, 10) + _set_value(text, string_key, "*b8")).encode(), True),
        (f"alias bomb 5^5 as {string_key}", (_bomb(5, 5) + _set_value(text, string_key, "*b4")).encode(), True),
        ("nesting 10000 deep", (text + "extra: " + "[" * 10_000 + "]" * 10_000 + "\n").encode(), True),
        ("nesting 100000 deep (mappings)", (text + "extra: " + "{a: " * 100_000 + "1" + "}" * 100_000 + "\n")
         .encode(), True),
        ("nesting 30 deep", (text + "extra: " + "[" * 30 + "]" * 30 + "\n").encode(), False),
        ("latin-1 byte", raw.replace(b"NVIDIA", b"NVIDIA \xe9", 1), True),
        ("NUL byte", raw[:40] + b"\x00" + raw[40:], True),
        ("UTF-16", text.encode("utf-16"), True),
        ("binary", bytes(rng.randrange(256) for _ in range(4096)), True),
        ("empty", b"", True),
        ("a list", b"- a\n- b\n", True),
        ("a scalar", b"42\n", True),
        ("tab indentation", raw.replace(b"\n  ", b"\n\t", 3), True),
        ("merge key", (text + "extra: &m {a: 1}\nmore:\n  <<: *m\n").encode(), False),
        ("CRLF line ends", raw.replace(b"\n", b"\r\n"), False),
        ("UTF-8 BOM", b"\xef\xbb\xbf" + raw, False),
    ]
    for _ in range(4):
        cut = rng.randrange(1, len(raw) - 1)
        out.append((f"cut at byte {cut}", raw[:cut], False))
    for _ in range(3):
        at = rng.randrange(len(raw))
        flipped = bytearray(raw)
        flipped[at] ^= 1 << rng.randrange(8)
        out.append((f"bit flip at byte {at}", bytes(flipped), False))
    return out, grid


_JUNK_VALUES = [  # (value, label, must be refused where a positive figure goes)
    (float("nan"), "nan", True), (float("inf"), "inf", True), (float("-inf"), "-inf", True),
    (-1, "-1", True), (0, "0", True), (1e30, "1e30", False), (1e-300, "1e-300", False), (2**63, "2**63", False),
    ("fast", "a string", True), ([1, 2], "a list", True), ({"a": 1}, "a mapping", True),
    (True, "true", True), (None, "null", True),
]


def _value_mutations(tree, paths: dict[str, str], drops: dict[str, bool]) -> list[tuple[str, bytes, bool]]:
    """Mutations of a YAML file's data: every junk value at each of ``paths`` (path → kind:
    'positive', 'nonnegative', 'count' or 'efficiency'), and each of ``drops`` removed (path → must be refused)."""
    out = []
    for path, kind in paths.items():
        for value, label, must in _JUNK_VALUES:
            if kind == "nonnegative" and label == "0":
                must = False
            if kind == "count" and label in ("1e30", "1e-300", "2**63"):
                must = True  # not a count
            if kind == "efficiency" and label in ("1e30", "2**63"):
                must = True  # achieved above peak
            out.append((f"{path} = {label}", _dump(_with(tree, path, value)), must))
        if kind == "count":
            out.append((f"{path} = 1.5", _dump(_with(tree, path, 1.5)), True))
    for path, must in drops.items():
        out.append((f"{path} missing", _dump(_with(tree, path, drop=True)), must))
    return out


# --- model configs ------------------------------------------------------------------------------

def configs(rng: random.Random, n: int) -> list[Case]:
    """Mutated shipped configs (dense Llama-3.1-8B, MoE Qwen3-30B-A3B) through ``text-generate``
    and ``explain``."""
    folder = SHIPPED / "models" / "configs"
    # (base, what, content or None: no file, must): the structure and the file's text always, a
    # grid of values by key drawn from
    muts: list[tuple[str, str, bytes | None, bool]] = []
    grid: list[tuple[str, str, bytes | None, bool]] = []
    sizes = ["hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
             "num_hidden_layers", "vocab_size"]
    for base, extra in (("llama-3.1-8b", []), ("qwen3-30b-a3b", ["num_experts", "num_experts_per_tok",
                                                                  "moe_intermediate_size", "head_dim"])):
        cfg = json.loads((folder / f"{base}.json").read_text())

        def put(what, must, _cfg=cfg, _base=base, _to=muts, **changes):
            c = dict(_cfg)
            for k, v in changes.items():
                if v is _DROP:
                    c.pop(k, None)
                else:
                    c[k] = v
            _to.append((_base, what, json.dumps(c, indent=2).encode(), must))

        for key in sizes + extra:
            orig = cfg[key]
            unused = base == "qwen3-30b-a3b" and key == "intermediate_size"  # no dense MLP layer reads it
            # null, these take a documented default (KV heads: the heads, MHA; head_dim: hidden / heads)
            defaulted = key in ("num_key_value_heads", "head_dim")
            # 2**20 is a plausible size but for these: more KV heads than heads, more experts per
            # token than experts, heads that do not divide Llama's hidden size
            too_many = key in ("num_key_value_heads", "num_experts_per_tok") or (
                key == "num_attention_heads" and "head_dim" not in cfg)
            for value, must in ((None, not defaulted), (str(orig), True), (orig + 0.5, True), (True, True),
                                (0, True), (-1, True), (2**63, True), (1e30, True), (1 << 20, too_many)):
                put(f"{key} = {json.dumps(value)}", must and not unused, _to=grid, **{key: value})
            # a key left out takes the config class's default, as transformers reads the file (shipped
            # configs rely on it: Gemma 3 states no vocab_size, Falcon no intermediate size)
            put(f"{key} missing", False, _to=grid, **{key: _DROP})
        put("as shipped", False)
        put("num_attention_heads = 0", True, num_attention_heads=0)
        put("num_key_value_heads = 0", True, num_key_value_heads=0)
        # as the grid names them (a drawn duplicate is dropped)
        put(f'hidden_size = "{cfg["hidden_size"]}"', True, hidden_size=str(cfg["hidden_size"]))
        put(f"num_hidden_layers = {2**63}", True, num_hidden_layers=2**63)
        heads = cfg["num_attention_heads"]
        put("num_key_value_heads does not divide the heads", True, num_key_value_heads=heads // 2 + 1)
        put("num_key_value_heads = 3", True, num_key_value_heads=3)
        put("more KV heads than heads", True, num_key_value_heads=heads * 2)
        if "head_dim" not in cfg:
            put("heads do not divide hidden_size", True, num_attention_heads=heads - 1, num_key_value_heads=1)
            put("num_attention_heads = 24", True, num_attention_heads=24)
        put("num_hidden_layers = 1000000", False, num_hidden_layers=1_000_000)
        put("max_position_embeddings = -1", True, max_position_embeddings=-1)
        put("max_position_embeddings = 2**40", False, max_position_embeddings=2**40)
        for act in ("gelu_fancy", "", 42):
            put(f"hidden_act = {act!r}", True, hidden_act=act)
        put("rope_scaling.rope_type unknown", True, rope_scaling={"rope_type": "bogus", "factor": 2.0})
        put("rope_scaling a string", True, rope_scaling="linear")
        for const in ("rope_theta", "rms_norm_eps"):
            for value in (float("nan"), float("inf"), -1.0, 0.0):
                put(f"{const} = {value}", False, _to=grid, **{const: value})
        put("model_type unknown", True, model_type="bogus_arch")
        put("model_type missing", True, model_type=_DROP)
        put("model_type a number", True, model_type=7)
        put("architectures unknown", False, architectures=["BogusForCausalLM"])
        put("quantization_config unknown method", True, quantization_config={"quant_method": "bogus"})
        put("quantization_config a list", True, quantization_config=[1, 2])
        put("torch_dtype unknown", False, torch_dtype="bfloat17")
        if "num_experts" in cfg:
            e = cfg["num_experts"]
            put("num_experts = 0 (a dense model?)", True, num_experts=0)
            put("num_experts_per_tok = 0", True, num_experts_per_tok=0)
            put("num_experts_per_tok > num_experts", True, num_experts_per_tok=e + 1)
            put("num_experts = 4 < top-k 8", True, num_experts=4)
            put("decoder_sparse_step = 0", True, decoder_sparse_step=0)
            put("mlp_only_layers out of range", False, mlp_only_layers=[1000])
        text = json.dumps(cfg, indent=2)
        raw = text.encode()
        muts += [
            (base, "NaN literal", text.replace('"rms_norm_eps": ', '"rms_norm_eps": NaN, "x": ').encode(), False),
            (base, "Infinity as hidden_size", re.sub(r'"hidden_size": \d+', '"hidden_size": Infinity', text)
             .encode(), True),
            (base, "1e400 as rope_theta", re.sub(r'"rope_theta": [0-9.e+]+', '"rope_theta": 1e400', text)
             .encode(), False),
            (base, "duplicate key", text.replace('"num_hidden_layers"', '"num_hidden_layers": 2, "num_hidden_layers"',
                                                 1).encode(), False),
            (base, "nesting 100000 deep", (text[:-1] + ', "extra": ' + "[" * 100_000 + "]" * 100_000 + "}")
             .encode(), False),
            (base, "latin-1 byte", raw.replace(b'"silu"', b'"sil\xfc"'), True),
            (base, "NUL byte", raw.replace(b'"silu"', b'"si\x00lu"'), True),
            (base, "UTF-16", text.encode("utf-16"), False),
            (base, "binary", bytes(rng.randrange(256) for _ in range(2048)), True),
            (base, "UTF-8 BOM", b"\xef\xbb\xbf" + raw, False),
        ]
        for _ in range(3):
            cut = rng.randrange(1, len(raw) - 1)
            muts.append((base, f"cut at byte {cut}", raw[:cut], True))
    muts += [("-", "empty", b"", True), ("-", "a list", b"[1, 2]", True), ("-", "null", b"null", True),
             ("-", "{}", b"{}", True), ("-", "a folder as the config", None, True), ("-", "no such file", b"", True)]
    cases = []
    for base, what, content, must in _fill(rng, muts, grid, n):
        command = rng.choice(["text-generate", "explain"])
        files: tuple = ()
        path = f"{DIR}/config.json"
        if what == "a folder as the config":
            files, path = (("model/config.json", b"{}"),), f"{DIR}/model"
        elif what == "no such file":
            path = f"{DIR}/missing/config.json"
        else:
            files = (("config.json", content),)
        cases.append(Case("configs", f"{base}: {what}", (command, path, "--json"), must, files))
    return cases


_DROP = object()


# --- devices ------------------------------------------------------------------------------------

def devices(rng: random.Random, n: int) -> list[Case]:
    """Mutations of the shipped h100-sxm.yaml through ``devices --device-file F --json`` and a
    cheap pricing, ``kernel flash-attention --device-file F --json``."""
    text = (SHIPPED / "hardware" / "devices" / "h100-sxm.yaml").read_text()
    tree = yaml.safe_load(text)
    ds = "datasheet."
    paths = {f"{ds}matrix_flops_per_s.bf16": "positive", f"{ds}vector_flops_per_s.fp32": "positive",
             f"{ds}hbm_capacity_bytes": "positive", f"{ds}hbm_bandwidth_bytes_per_s": "positive",
             f"{ds}onchip_capacity_bytes": "positive", f"{ds}onchip_bandwidth_bytes_per_s": "positive",
             f"{ds}clock_hz": "positive", f"{ds}compute_units": "count", f"{ds}resources.matrix": "count",
             f"{ds}links.nvlink.bandwidth_bytes_per_s": "positive", f"{ds}links.nvlink.count": "count",
             f"{ds}links.nvlink.latency_s": "nonnegative", "calibration.kernel_static_latency_s": "nonnegative",
             "calibration.efficiency.matrix.points.0.1": "efficiency"}
    drops = {"name": True, "datasheet": True, f"{ds}matrix_flops_per_s": True, f"{ds}matrix_flops_per_s.bf16": False,
             f"{ds}hbm_capacity_bytes": True, f"{ds}hbm_bandwidth_bytes_per_s": True,
             f"{ds}onchip_bandwidth_bytes_per_s": True, f"{ds}clock_hz": True, f"{ds}links": False,
             "description": False, "sources": False, "calibration": False, "default_engine": False}
    grid = _value_mutations(tree, paths, {})
    core = _value_mutations(tree, {}, drops) + [
        ("the file as shipped", text.encode(), False),
        ("efficiency 2.0 (above peak)", _dump(_with(tree, "calibration.efficiency.matrix.points.0.1", 2.0)), True),
        ("efficiency points unsorted", _dump(_with(tree, "calibration.efficiency.matrix.points",
                                                   tree["calibration"]["efficiency"]["matrix"]["points"][::-1])),
         False),
        ("name of another device", text.replace("name: h100-sxm", "name: h200-sxm").encode(), False),
        ("a key misspelt", text.replace("hbm_capacity_bytes:", "hbm_capacity_byte:", 1).encode(), True),
        ("an unknown dtype", text.replace("    bf16: 989.4e+12", "    bf17: 989.4e+12", 1).encode(), False),
    ]
    file_level, tokens = _text_mutations(text, rng, ["hbm_capacity_bytes", "clock_hz", "latency_s", "compute_units"],
                                         "description")
    core += file_level + [("no such file", None, True), ("a folder", None, True)]
    picked = _fill(rng, core, grid + tokens, n // 2)
    cases = []
    for what, content, must in picked:
        path, files = f"{DIR}/device.yaml", (("device.yaml", content),)
        if what == "no such file":
            path, files = f"{DIR}/missing.yaml", ()
        elif what == "a folder":
            path, files = f"{DIR}/folder", (("folder/x", b""),)
        for argv in (("devices", "--device-file", path, "--json"),
                     ("kernel", "flash-attention", "--device-file", path, "--json")):
            cases.append(Case("devices", what, argv, must, files))
    return cases


# --- topologies ---------------------------------------------------------------------------------

def topologies(rng: random.Random, n: int) -> list[Case]:
    """Mutations of the shipped hgx-h100.yaml through ``topologies --topology-file F --json`` and
    ``collective all_reduce --topology F --bytes 1e6 --json``."""
    text = (SHIPPED / "hardware" / "topologies" / "hgx-h100.yaml").read_text()
    tree = yaml.safe_load(text)
    t0, ll = "tiers.0.", "tiers.0.calibration.all_reduce.protocols.ll."
    paths = {f"{t0}link_bandwidth_bytes_per_s": "positive", f"{t0}link_latency_s": "nonnegative",
             f"{t0}links_per_device": "count", "tiers.1.link_bandwidth_bytes_per_s": "positive",
             f"{ll}bandwidth_efficiency": "efficiency", f"{ll}latency_s": "nonnegative",
             f"{ll}base_latency_s": "nonnegative"}
    drops = {"name": True, "device": False, "tiers": True, f"{t0}kind": True, f"{t0}shape": True,
             f"{t0}link_bandwidth_bytes_per_s": True, f"{t0}links_per_device": True, f"{t0}calibration": False,
             "sources": False, "tiers.1": False}
    grid = _value_mutations(tree, paths, {})
    muts = _value_mutations(tree, {}, drops) + [("the file as shipped", text.encode(), False)]
    for shape, must in (([0], True), ([-8], True), ([8.5], True), ([], True), ("8", True), ([2**40], True),
                        ([8, 8], False), ([1], False), ([[8]], True)):
        muts.append((f"tiers.0.shape = {shape}", _dump(_with(tree, f"{t0}shape", shape)), must))
    for label, value, must in (("kind hypercube", "hypercube", True), ("kind 7", 7, True), ("kind ring", "ring", False),
                               ("kind torus", "torus", False)):
        muts.append((f"tiers.0.{label}", _dump(_with(tree, f"{t0}kind", value)), must))
    muts += [
        # a topology of one's own device names a device that is not shipped: not an error
        ("device not shipped", _dump(_with(tree, "device", "h900-sxm")), False),
        ("device b200-sxm", _dump(_with(tree, "device", "b200-sxm")), False),
        ("device a list", _dump(_with(tree, "device", ["h100-sxm"])), True),
        ("tiers empty", _dump(_with(tree, "tiers", [])), True),
        ("tiers a string", _dump(_with(tree, "tiers", "nvlink")), True),
        ("efficiency 2.0 (above peak)", _dump(_with(tree, f"{ll}bandwidth_efficiency", 2.0)), True),
        ("a protocol renamed (its name is a label)", text.replace("ll: {", "lll: {", 1).encode(), False),
        ("unknown collective", text.replace("all_reduce:", "all_reduse:", 1).encode(), True),
        ("tier names repeated", _dump(_with(tree, "tiers.1.name", "nvlink")), False),
    ]
    file_level, tokens = _text_mutations(text, rng, ["link_bandwidth_bytes_per_s", "link_latency_s",
                                                     "links_per_device"], "description")
    picked = _fill(rng, muts + file_level + [("no such file", None, True)], grid + tokens, n // 2)
    cases = []
    for what, content, must in picked:
        path, files = f"{DIR}/topology.yaml", (("topology.yaml", content),)
        if content is None:
            path, files = f"{DIR}/missing.yaml", ()
        for argv in (("topologies", "--topology-file", path, "--json"),
                     ("collective", "all_reduce", "--topology", path, "--bytes", "1e6", "--json")):
            cases.append(Case("topologies", what, argv, must, files))
    return cases


# --- profiling databases ------------------------------------------------------------------------

DB = "db/h200-sxm/trtllm/1.3.0rc20"
NCCL = "db/h200-sxm/nccl/2.29.2"
#: the priced row's latency inside the database, and that of the table planted outside it (µs)
INSIDE_US, OUTSIDE_US = "45.7707", "7.0"
MAPPING = """\
schema: 1
device: h200-sxm
framework: trtllm
version: 1.3.0rc20
communication: ../../nccl/2.29.2
kernels:
  MatMul: {file: MatMul.csv, keys: [M, K, N, dtype], axes: [M, N, K]}
ops:
  aten.mm.default: {category: compute, kernel_type: MatMul}
  all_reduce: {category: communication, kernel_type: AllReduce}
"""


def _base_database() -> dict[str, bytes]:
    """A small database cut from the shipped H200 / TensorRT-LLM one: five bf16 4096 x 4096
    GEMMs, eight 8-GPU all-reduces; beside it, outside its root, a table that prices M=1024 at
    7 µs (a priced 7 µs can only come from there)."""
    root = SHIPPED / "data" / "profiling" / "h200-sxm"
    mm = gzip.decompress((root / "trtllm" / "1.3.0rc20" / "MatMul.csv.gz").read_bytes()).decode().splitlines()
    rows = [r for r in mm[1:] if r.split(",")[1:4] == ["4096", "4096", "bf16"]
            and r.split(",")[0] in ("256", "512", "1024", "2048", "4096")]
    ar = gzip.decompress((root / "nccl" / "2.29.2" / "AllReduce.csv.gz").read_bytes()).decode().splitlines()
    ar_rows = [r for r in ar[1:] if r.startswith("8,fp16,")][:8]
    assert len(rows) == 5 and f"1024,4096,4096,bf16,{INSIDE_US}" in rows and len(ar_rows) == 8
    return {f"{DB}/MatMul.csv": "\n".join([mm[0], *rows, ""]).encode(),
            f"{DB}/op_mapping.yaml": MAPPING.encode(),
            f"{NCCL}/AllReduce.csv": "\n".join([ar[0], *ar_rows, ""]).encode(),
            "outside/MatMul.csv": f"M,K,N,dtype,latency_us\n1024,4096,4096,bf16,{OUTSIDE_US}\n".encode()}


def _cell(table: bytes, row: int, col: int, value: str) -> bytes:
    lines = table.decode("utf-8", "replace").split("\n")
    cells = lines[row].split(",")
    cells[col] = value
    lines[row] = ",".join(cells)
    return "\n".join(lines).encode()


def databases(rng: random.Random, n: int) -> list[Case]:
    """Mutations of a small database through ``db check DIR`` and ``op mm … --performance-model
    profiling --profiling-database DIR --json``."""
    base = _base_database()
    mm, ar, mapping = base[f"{DB}/MatMul.csv"], base[f"{NCCL}/AllReduce.csv"], MAPPING
    muts: list[tuple[str, dict, bool]] = []  # (what, files changed (None: removed), must be refused)

    def table(what, content, must, path=f"{DB}/MatMul.csv"):
        muts.append((what, {path: content}, must))

    priced = 3  # the M=1024 row
    for value, must in (("nan", True), ("inf", True), ("-inf", True), ("1e400", True), ("-1", True), ("", True),
                        ("x", True), ("0", False), ("1e-320", False), ("1e12", False), ("NaN", True)):
        table(f"MatMul latency of the priced row = {value!r}", _cell(mm, priced, 4, value), must)
    for value in ("nan", "-1", "inf"):
        table(f"MatMul latency of another row = {value!r}", _cell(mm, 1, 4, value), True)
    for value, must in (("abc", True), ("", True), ("-256", True), ("1.5", False), ("1e400", True),
                        (str(2**63), False)):
        table(f"MatMul key M = {value!r}", _cell(mm, 1, 0, value), must)
    table("MatMul dtype = ''", _cell(mm, 2, 3, ""), True)
    table("MatMul dtype = 'bf17'", _cell(mm, 2, 3, "bf17"), False)
    lines = mm.decode().split("\n")
    table("MatMul row with an extra cell", "\n".join(lines[:2] + [lines[2] + ",9"] + lines[3:]).encode(), True)
    table("MatMul row missing a cell", "\n".join(lines[:2] + [lines[2].rsplit(",", 1)[0]] + lines[3:]).encode(), True)
    table("MatMul header only", (lines[0] + "\n").encode(), True)
    table("MatMul empty", b"", True)
    table("MatMul header latency_us renamed", mm.replace(b"latency_us", b"latency", 1), True)
    table("MatMul header M renamed", mm.replace(b"M,K,N", b"m,K,N", 1), True)
    table("MatMul header without a latency column", "\n".join(
        ",".join(line.split(",")[:4]) for line in lines).encode(), True)
    table("MatMul priced row twice, another latency", mm + _cell(mm, priced, 4, "99").split(b"\n")[priced] + b"\n",
          False)
    table("MatMul rows reversed", "\n".join([lines[0], *reversed([x for x in lines[1:] if x]), ""]).encode(), False)
    table("MatMul binary appended", mm + bytes(rng.randrange(256) for _ in range(256)), True)
    table("MatMul NUL in a cell", mm.replace(b"bf16", b"bf\x0016", 1), True)
    table("MatMul latin-1 byte", mm.replace(b"bf16", b"bf\xe916", 1), True)
    table("MatMul CRLF", mm.replace(b"\n", b"\r\n"), False)
    table("MatMul UTF-8 BOM", b"\xef\xbb\xbf" + mm, False)
    table("MatMul cells quoted", b"\n".join(b",".join(b'"' + c + b'"' for c in line.split(b",")) if line else line
                                            for line in mm.split(b"\n")), False)
    table("MatMul cut in the last row (no latency)", mm[:mm.rindex(b",")], True)
    table("MatMul 100000 cells in a row", mm + b",".join([b"1"] * 100_000) + b"\n", True)
    gz_mapping = mapping.replace("MatMul.csv", "MatMul.csv.gz")
    for what, packed, must in (("gzip", gzip.compress(mm, mtime=0), False),
                               ("gzip cut short", gzip.compress(mm, mtime=0)[:-9], True),
                               ("not gzip", mm, True),
                               ("gzip of binary", gzip.compress(bytes(range(256)) * 8, mtime=0), True)):
        muts.append((f"MatMul.csv.gz: {what}", {f"{DB}/MatMul.csv": None, f"{DB}/MatMul.csv.gz": packed,
                                                f"{DB}/op_mapping.yaml": gz_mapping.encode()}, must))
    arl = ar.decode().split("\n")
    for what, content in (("header only", (arl[0] + "\n").encode()), ("empty", b""),
                          ("latency column only", "\n".join(x.split(",")[-1] for x in arl).encode()),
                          ("a row with an extra cell", "\n".join(arl[:2] + [arl[2] + ",1"] + arl[3:]).encode()),
                          ("latency nan", _cell(ar, 2, 3, "nan")), ("bytes -1", _cell(ar, 2, 2, "-1")),
                          ("binary", bytes(rng.randrange(256) for _ in range(512)))):
        table(f"NCCL AllReduce {what}", content, True, f"{NCCL}/AllReduce.csv")

    def mapped(what, text, must, **extra):
        muts.append((what, {f"{DB}/op_mapping.yaml": text.encode() if isinstance(text, str) else text, **extra},
                     must))

    for path, must in (("../../../../../../../../etc/passwd", True), ("../../../../outside/MatMul.csv", True),
                       ("/etc/passwd", True), ("/dev/zero", True), ("nope.csv", True), ("''", True), (".", True),
                       ("./MatMul.csv", False)):
        mapped(f"mapping table file {path}", mapping.replace("file: MatMul.csv", f"file: {path}"), must)
    for path, must in (("../../../../../../../../etc", True), ("../../../../outside", True), ("/", True)):
        mapped(f"mapping communication {path}", mapping.replace("../../nccl/2.29.2", path), must)
    mapped("mapping without communication", mapping.replace("communication: ../../nccl/2.29.2\n", ""), False)
    for old, new, must in (("device: h200-sxm", "device: b200-sxm", True), ("device: h200-sxm\n", "", True),
                           ("device: h200-sxm", "device: 42", True), ("framework: trtllm", "framework: vllm", True),
                           ("version: 1.3.0rc20", "version: 9.9.9", False), ("schema: 1", "schema: 99", True),
                           ("keys: [M, K, N, dtype]", "keys: [M, K, N, dtype, Q]", True),
                           ("keys: [M, K, N, dtype]", "keys: []", True), ("axes: [M, N, K]", "axes: [Z]", True),
                           ("axes: [M, N, K]", "axes: [M], transform: {M: cube}", True),
                           ("axes: [M, N, K]", "axes: [M], transform: {M: sqrt}", False),
                           ("category: compute", "category: bogus", True),
                           ("kernel_type: MatMul", "kernel_type: Nope", True),
                           ("kernels:\n  MatMul: {file: MatMul.csv, keys: [M, K, N, dtype], axes: [M, N, K]}\n",
                            "kernels: {}\n", True),
                           ("device: h200-sxm", "device: h200-sxm\ndevice: b200-sxm", True),
                           ("device: h200-sxm", "device: !!python/object/apply:os.system ['touch PWNED']", True),
                           ("schema: 1", "schema: 1:30", True)):
        mapped(f"mapping {old.splitlines()[0]!r} -> {new.splitlines()[0] if new else 'removed'!r}",
               mapping.replace(old, new, 1), must)
    mapped("mapping alias bomb 10^9", mapping + _bomb(9, 10), True)
    mapped("mapping nesting 10000 deep", mapping + "extra: " + "[" * 10_000 + "]" * 10_000 + "\n", True)
    mapped("mapping latin-1 byte", mapping.encode().replace(b"trtllm", b"trtll\xe9", 1), True)
    mapped("mapping empty", "", True)
    mapped("mapping binary", bytes(rng.randrange(256) for _ in range(512)), True)
    muts.append(("mapping missing", {f"{DB}/op_mapping.yaml": None}, True))
    muts.append(("MatMul.csv missing", {f"{DB}/MatMul.csv": None}, True))
    muts.append(("MatMul.csv a symlink out of the database", {f"{DB}/MatMul.csv": None}, True))
    picked = _sample(rng, muts, n // 2 - 3)
    cases = []
    check = ("db", "check", f"{DIR}/{DB}")

    def op(device="h200-sxm"):
        return ("op", "mm", "--shape", "1024x4096", "--shape", "4096x4096", "--device", device,
                "--performance-model", "profiling", "--profiling-database", f"{DIR}/{DB}", "--json")

    outside = float(OUTSIDE_US) * 1e-6
    for what, changes, must in picked:
        files = {**base, **changes}
        links = ((f"{DB}/MatMul.csv", "../../../../outside/MatMul.csv"),) if "symlink" in what else ()
        content = tuple((p, b) for p, b in files.items() if b is not None)
        for argv in (check, op()):
            cases.append(Case("databases", what, argv, must, content, links, outside))
    content = tuple(base.items())
    cases.append(Case("databases", "sound database", check, False, content, (), outside))
    cases.append(Case("databases", "sound database", op(), False, content, (), outside))
    for device in ("h100-sxm", "b200-sxm", "mi300x"):
        cases.append(Case("databases", f"the H200 database priced on {device}", op(device), True, content, (),
                          outside))
    return cases


# --- flag values --------------------------------------------------------------------------------

#: what goes where a number goes, and which of them a flag of each kind must refuse
NUMBERS = ["nan", "NaN", "inf", "-inf", "1e400", "-1", "0", "1.5", str(2**63), "abc", "", "0x10", "1e30", "٣"]
_NOT_A_NUMBER = {"nan", "NaN", "inf", "-inf", "1e400", "abc", "", "0x10"}
BAD = {  # kind -> the values of NUMBERS it must refuse
    "count": _NOT_A_NUMBER | {"-1", "0", "1.5", str(2**63), "1e30"},  # an integer >= 1, bounded
    "size": _NOT_A_NUMBER | {"-1", "1.5", str(2**63), "1e30"},  # an integer >= 0, bounded
    "positive": _NOT_A_NUMBER | {"-1", "0"},  # a finite number > 0
    "nonnegative": _NOT_A_NUMBER | {"-1"},  # a finite number >= 0
    "fraction": _NOT_A_NUMBER | {"-1", "0", "1.5", str(2**63), "1e30"},  # in (0, 1]
    "bytes": _NOT_A_NUMBER | {"-1"},  # a message size (2**63 bytes fits a 64-bit address space)
}

COLLECTIVE = ("collective", "all_reduce", "--topology", "hgx-h200")
ADHOC = ("collective", "all_reduce", "--topology", "ring:8", "--link-bandwidth", "25e9")
KERNEL = ("kernel", "flash-attention")
MM = ("op", "mm", "--shape", "1024x4096", "--shape", "4096x4096")
TEXTGEN = ("text-generate", "llama-3.1-8b")
EXPLAIN = ("explain", "llama-3.1-8b")


def flags(rng: random.Random, n: int) -> list[Case]:
    """Flag values of every kind on ``collective``, ``kernel``, ``op``, ``text-generate`` and
    ``explain``: numbers that are not finite or out of range, junk, repeated flags, flags of
    other commands, a device that does not match the topology."""
    # (what, argv, must, files): the named cases always, a grid of numbers by flag drawn from
    core: list[tuple[str, tuple, bool, tuple]] = []
    grid: list[tuple[str, tuple, bool, tuple]] = []

    def number(what, head, flag, kind, tail=("--json",), values=NUMBERS, sep=" ", named=()):
        """``flag`` given each of ``values``; those ``named`` (values that broke perfcast) always."""
        for v in values:
            argv = (*head, *(flag.split() if sep == " " else ()), *((f"{flag}{v}",) if sep != " " else (v,)), *tail)
            (core if v in named else grid).append((f"{what} {v!r}", argv, v in BAD[kind], ()))

    def case(what, argv, must, files=()):
        core.append((what, tuple(argv), must, files))

    # collective
    number("collective --bytes", COLLECTIVE, "--bytes", "bytes", named=("-1", "nan", "inf"))
    number("collective ad hoc --link-bandwidth", ("collective", "all_reduce", "--topology", "ring:8", "--bytes", "1e6"),
           "--link-bandwidth", "positive", named=("nan", "0"))
    number("collective ad hoc --link-latency", (*ADHOC, "--bytes", "1e6"), "--link-latency", "nonnegative",
           named=("-1",))
    number("collective --group-size", (*COLLECTIVE, "--bytes", "1e6"), "--group-size", "count", named=("0",))
    number("collective --stride", (*COLLECTIVE, "--bytes", "1e6"), "--stride", "count", named=("0",))
    for op, must in (("all-gather", False), ("all_gather", False), ("reduce-scatter", False), ("All_Reduce", False),
                     ("bogus", True), ("", True), ("send_recv", False)):
        case(f"collective op {op!r}", ("collective", op, "--topology", "hgx-h200", "--bytes", "1e6", "--json"), must)
    for topo, must in (("ring:0", True), ("ring:-1", True), ("ring:nan", True), ("torus:0x2", True),
                       ("torus:2x2x2", False), ("mesh:4x", True), ("switch:99999999999", False), ("hgx-h900", True),
                       ("full_mesh:1", False), ("ring:8x", True), ("", True)):
        case(f"collective --topology {topo!r}", ("collective", "all_reduce", "--topology", topo, "--link-bandwidth",
                                                  "25e9", "--bytes", "1e6", "--json"), must)
    case("collective ad hoc ring without --link-bandwidth", ("collective", "all_reduce", "--topology", "ring:8",
                                                             "--bytes", "1e6", "--json"), True)
    for algo, must in (("ring", False), ("tree", False), ("bogus", True), ("", True)):
        case(f"collective --algorithm {algo!r}", (*COLLECTIVE, "--bytes", "1e6", "--algorithm", algo, "--json"), must)
    case("collective --bytes repeated", (*COLLECTIVE, "--bytes", "1e6", "--bytes", "2e6", "--json"), True)
    case("collective --topology repeated", (*COLLECTIVE, "--topology", "hgx-h100", "--bytes", "1e6", "--json"), True)
    case("collective --link-bandwidth on a shipped topology", (*COLLECTIVE, "--bytes", "1e6", "--link-bandwidth",
                                                               "1e9", "--json"), True)
    case("collective --link-latency on a shipped topology", (*COLLECTIVE, "--bytes", "1e6", "--link-latency",
                                                             "1e-3", "--json"), True)
    # a group larger than the topology grows its outermost tier (docs/design/topologies.md)
    case("collective --group-size beyond the topology", (*COLLECTIVE, "--bytes", "1e6", "--group-size", "100000",
                                                         "--json"), False)
    case("collective --group-size not filling the inner tier", (*COLLECTIVE, "--bytes", "1e6", "--group-size",
                                                                "1001", "--json"), True)
    for flag in (("--set", "H=1"), ("--device", "h100-sxm"), ("--tp-size", "2"), ("--shape", "4x4")):
        case(f"collective with {flag[0]}", (*COLLECTIVE, "--bytes", "1e6", *flag, "--json"), True)
    # kernel
    for sym in ("H", "T_q", "B"):
        number(f"kernel --set {sym}=", KERNEL, f"--set {sym}=", "count", sep="",
               named=("nan", "inf", "1e400") if sym == "H" else (str(2**63),) if sym == "T_q" else ())
    number("kernel --sweep H=1,", KERNEL, "--sweep H=1,", "count", sep="")
    number("kernel --symbolic-hw --set hbm_bandwidth_bytes_per_s=",
           (*KERNEL, "--symbolic-hw", "hbm_bandwidth_bytes_per_s"), "--set hbm_bandwidth_bytes_per_s=", "positive",
           sep="")
    number("kernel deepseek-moe ring:8 --link-bandwidth", ("kernel", "deepseek-moe", "--topology", "ring:8"),
           "--link-bandwidth", "positive", named=("nan",))
    for what, argv, must in (
            ("--set H=1e30", (*KERNEL, "--set", "H=1e30"), True),
            ("--set unknown symbol", (*KERNEL, "--set", "Q=1"), True),
            ("--set without '='", (*KERNEL, "--set", "H"), True),
            ("--set H twice", (*KERNEL, "--set", "H=8", "--set", "H=16"), True),
            ("--sweep of 0 values", (*KERNEL, "--sweep", "H="), True),
            ("--device twice", (*KERNEL, "--device", "h100-sxm", "--device", "h200-sxm"), True),
            ("--device unknown", (*KERNEL, "--device", "h900"), True),
            ("--device-file missing", (*KERNEL, "--device-file", f"{DIR}/none.yaml"), True),
            ("--device with --device-file", (*KERNEL, "--device", "h200-sxm", "--device-file",
                                            str(SHIPPED / "hardware" / "devices" / "h100-sxm.yaml")), True),
            ("--topology hgx-h200 with --device h100-sxm", (*KERNEL, "--device", "h100-sxm", "--topology",
                                                            "hgx-h200"), True),
            ("--topology hgx-h200", (*KERNEL, "--topology", "hgx-h200"), False),
            ("--link-bandwidth without --topology", (*KERNEL, "--link-bandwidth", "1e9"), True),
            ("--symbolic-hw unknown", (*KERNEL, "--symbolic-hw", "bogus"), True),
            ("--overlap unknown", (*KERNEL, "--overlap", "bogus"), True),
            ("--rollup slow", (*KERNEL, "--rollup", "slow"), False),
            ("unknown kernel", ("kernel", "bogus"), True),
            ("kernel name ''", ("kernel", ""), True),
            ("with --bytes", (*KERNEL, "--bytes", "1"), True),
            ("with --num-queries", (*KERNEL, "--num-queries", "2"), True)):
        case(f"kernel {what}", (*argv, "--json"), must)
    # op
    for shape, must in (("nanx4096", True), ("-1x4096", True), ("0x4096", False), ("1024x4096x", True), ("x", True),
                        ("", True), ("99999999999999999999x4096", True), ("1e3x4096", True), ("1024×4096", True),
                        ("1024x4095", True), ("1024", True)):
        case(f"op mm --shape {shape!r}", ("op", "mm", "--shape", shape, "--shape", "4096x4096", "--json"), must)
    for what, argv, must in (
            ("--dtype bf17", (*MM, "--dtype", "bf17"), True), ("--dtype ''", (*MM, "--dtype", ""), True),
            ("unknown op", ("op", "bogus.op", "--shape", "4x4"), False),
            ("--performance-model bogus", (*MM, "--performance-model", "bogus"), True),
            ("--engine bogus", (*MM, "--engine", "bogus"), True),
            ("--engine missing file", (*MM, "--engine", f"{DIR}/none.yaml"), True),
            ("--device twice", (*MM, "--device", "h100-sxm", "--device", "b200-sxm"), True),
            ("--arg nan", (*MM, "--arg", "nan"), True),
            ("no op and no --batch", ("op", "--shape", "4x4"), True),
            ("--profiling-database without profiling", (*MM, "--profiling-database", f"{DIR}"), True),
            ("with --set", (*MM, "--set", "H=1"), True)):
        case(f"op {what}", (*argv, "--json"), must)
    good = b"op,shapes,dtype\nmm,1024x4096;4096x4096,bf16\n"
    for what, content, must in (("sound", good, False), ("no header", b"mm,1024x4096;4096x4096,bf16\n", True),
                                ("header only", b"op,shapes,dtype\n", False), ("empty", b"", True),
                                ("binary", bytes(rng.randrange(256) for _ in range(512)), True),
                                ("nan in a shape", good.replace(b"1024x", b"nanx"), True),
                                ("2**63 in a shape", good.replace(b"1024x", str(2**63).encode() + b"x"), True),
                                ("an extra cell", good.replace(b",bf16\n", b",bf16,9\n"), True),
                                ("latin-1 byte", good.replace(b"bf16", b"bf\xe916"), True),
                                ("an unknown op", good + b"bogus.op,4x4,bf16\n", False)):
        case(f"op --batch CSV {what}", ("op", "--batch", f"{DIR}/ops.csv", "--json"), must, (("ops.csv", content),))
    case("op --batch missing file", ("op", "--batch", f"{DIR}/none.csv", "--json"), True)
    # text-generate: each refusal must come before the capture, each acceptance pays one
    number("text-generate --num-queries", TEXTGEN, "--num-queries", "count",
           values=["nan", "1e400", "-1", "0", str(2**63), "abc"])
    number("text-generate --query-length", TEXTGEN, "--query-length", "count",
           values=["inf", "-1", "0", str(2**63), "1.5"], named=(str(2**63),))
    number("text-generate --decode --context-length", (*TEXTGEN, "--decode"), "--context-length", "count",
           values=["nan", "-1", str(2**63), "1e30"])
    number("text-generate --tp-size", TEXTGEN, "--tp-size", "count", values=["0", "-1", "1.5", str(2**63), "nan"])
    number("text-generate --memory-utilization", TEXTGEN, "--memory-utilization", "fraction",
           values=["nan", "0", "-1", "1.5", "inf"])
    number("text-generate --top", TEXTGEN, "--top", "size", values=["-1", "nan", "abc"])
    for what, argv, must in (
            ("--tp-size 3 (does not divide 32 heads)", (*TEXTGEN, "--tp-size", "3"), True),
            ("--attention-dp without dp (MoE)", ("text-generate", "qwen3-30b-a3b", "--attention-dp"), True),
            ("--device b200-sxm --topology hgx-h100", (*TEXTGEN, "--device", "b200-sxm", "--topology", "hgx-h100",
                                                       "--tp-size", "8"), True),
            ("--device twice", (*TEXTGEN, "--device", "h100-sxm", "--device", "h200-sxm"), True),
            ("--num-devices 3 --tp-size 2", (*TEXTGEN, "--num-devices", "3", "--tp-size", "2"), True),
            ("--ep-size 2 on a dense model", (*TEXTGEN, "--ep-size", "2"), True),
            ("--image-batch-size 1 on a text model", (*TEXTGEN, "--image-batch-size", "1"), True),
            ("--decode without --context-length", (*TEXTGEN, "--decode"), True),
            ("--context-length without --decode", (*TEXTGEN, "--context-length", "100"), False),
            ("with --set", (*TEXTGEN, "--set", "H=1"), True),
            ("with --bytes", (*TEXTGEN, "--bytes", "1"), True),
            ("unknown model", ("text-generate", "llama-9"), True),
            ("model ''", ("text-generate", ""), True),
            ("model a missing file", ("text-generate", f"{DIR}/none/config.json"), True),
            ("--engine bogus", (*TEXTGEN, "--engine", "bogus"), True),
            ("--quantize bogus", (*TEXTGEN, "--quantize", "bogus"), True),
            ("--quantize experts=fp8 on a dense model", (*TEXTGEN, "--quantize", "experts=fp8"), False),
            ("--device mi300x --tp-size 8", (*TEXTGEN, "--device", "mi300x", "--tp-size", "8"), False),
            ("--performance-model profiling on mi300x", (*TEXTGEN, "--device", "mi300x", "--performance-model",
                                                         "profiling"), False),
            ("--overlap bogus", (*TEXTGEN, "--overlap", "bogus"), True)):
        case(f"text-generate {what}", (*argv, "--json"), must)
    # explain
    number("explain --context-length", EXPLAIN, "--context-length", "count",
           values=["nan", "-1", str(2**63), "abc"])
    for what, argv, must in (
            ("--device twice", (*EXPLAIN, "--device", "h100-sxm", "--device", "h200-sxm"), True),
            ("--device unknown", (*EXPLAIN, "--device", "h900"), True),
            ("--device-file binary", (*EXPLAIN, "--device-file", f"{DIR}/d.yaml"), True),
            ("with --num-queries", (*EXPLAIN, "--num-queries", "2"), True),
            ("with --tp-size", (*EXPLAIN, "--tp-size", "2"), True),
            ("--kv-cache-dtype fp9", (*EXPLAIN, "--kv-cache-dtype", "fp9"), True),
            ("--quantize bogus", (*EXPLAIN, "--quantize", "bogus"), True)):
        files = (("d.yaml", bytes(range(256))),) if "binary" in what else ()
        case(f"explain {what}", (*argv, "--json"), must, files)
    return [Case("flags", what, argv, must, files) for what, argv, must, files in _fill(rng, core, grid, n)]


POPULATIONS = {"configs": (configs, 130), "devices": (devices, 170), "topologies": (topologies, 150),
               "databases": (databases, 130), "flags": (flags, 240)}


def generate(seed: int = 0, only: list[str] | None = None) -> list[Case]:
    """The census' cases for ``seed``: each population from its own generator seeded by the
    seed and its name, so that choosing populations leaves each one's cases as they are."""
    cases = []
    for name, (make, n) in POPULATIONS.items():
        if only and name not in only:
            continue
        cases += make(random.Random(f"{seed}:{name}"), n)
    return cases
