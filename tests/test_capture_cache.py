"""The capture cache: an entry is data (JSON of a fixed set of SymPy node types), keyed by
everything the capture depends on and written atomically; a damaged, foreign or hostile entry is
captured anew — never executed, never a crash."""

import gzip
import json
import logging
import math
import os
import pickle
import threading

import pytest
import sympy
from hypothesis import example, given, settings
from hypothesis import strategies as st

import fuzzing
from perfcast.capture import Capture, LayerGroup, OpRecord, TensorMeta, cache, codec, lower
from perfcast.ir import BYTES_HBM, FLOPS_MATRIX, FLOPS_VECTOR, cost, dim
from perfcast.models import load_model_config
from perfcast.models import vision as vmodels

B, S, C = dim("B"), dim("S"), dim("C")

# dense, MoE, MLA, chunked attention (a Mod context and a specialisation guard), a VLM's language model
CASES = [("llama-3.1-8b", False), ("llama-3.1-8b", True), ("qwen3-30b-a3b", True), ("deepseek-v3", False),
         ("deepseek-v3", True), ("llama-4-scout", False), ("llama-4-scout", True), ("qwen3-vl-8b-instruct", False)]


def _model(name):
    m = load_model_config(name)
    return vmodels.language_model(m) if vmodels.is_vision_language(m) else m


@pytest.fixture(scope="module")
def entries(tmp_path_factory):
    """(model, decode) → (fresh capture, key, entry path, the entry's bytes), each captured once."""
    out = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("cache")))
        for name, decode in CASES:
            m = _model(name)
            cap, hit = cache.symbolic_capture(m, dtype="bf16", decode=decode, context=decode)
            key = cache.entry_key(m, "bf16", decode, decode, True)
            path = cache.entry_path(m, key)
            assert not hit and path.is_file()
            out[name, decode] = (cap, key, path, path.read_bytes())
    return out


@pytest.fixture
def entry(entries, tmp_path, monkeypatch):
    """llama-3.1-8b's decode entry, alone in a fresh cache folder: (capture, key, path, bytes)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    cap, key, old, data = entries["llama-3.1-8b", True]
    path = cache.cache_dir() / old.name
    path.parent.mkdir(parents=True)
    path.write_bytes(data)
    return cap, key, path, data


def _gzip(doc_or_text) -> bytes:
    text = doc_or_text if isinstance(doc_or_text, str) else json.dumps(doc_or_text)
    return gzip.compress(text.encode(), mtime=0)


def _document(data: bytes) -> dict:
    return json.loads(gzip.decompress(data))


def _unreadable(path, key) -> str:
    with pytest.raises(cache.Unreadable) as e:
        cache.load(path, key)
    return str(e.value)


# ------------------------------------------------------------------------------ round trips


@pytest.mark.parametrize(("name", "decode"), CASES, ids=[f"{n}-{'decode' if d else 'prefill'}" for n, d in CASES])
def test_an_entry_reads_back_as_the_capture_it_stores(entries, name, decode):
    cap, key, path, _ = entries[name, decode]
    back = cache.load(path, key)
    assert back.records == cap.records and back.groups == cap.groups and back.params == cap.params
    assert back.guards == cap.guards and back.symbols == cap.symbols and back.linear_params == cap.linear_params
    assert back == cap
    point = {B: 5, S: 17, C: 33}
    assert cache.valid_at(back, point) == cache.valid_at(cap, point)
    fresh, cached = (cost(lower(c, point=point).graph) for c in (cap, back))
    assert all(fresh.get(k) == cached.get(k) for k in (FLOPS_MATRIX, FLOPS_VECTOR, BYTES_HBM))


def test_captures_hold_plain_sympy_only(entries):
    # llama-4's chunked attention attends to the context modulo the chunk: SymPy's Mod, not torch's
    cap = entries["llama-4-scout", True][0]
    pasts = {r.scalars[0] for r in cap.records if r.op == "perfcast.attention.default"}
    assert sympy.Mod(sympy.Symbol("s93", integer=True, positive=True), 8192) in pasts
    # its prefill is exact only at the hint's prompt length: the guard says so, and survives the cache
    assert entries["llama-4-scout", False][0].guards == (sympy.Eq(64 * S, 320),)


def test_torch_shape_functions_become_sympy_of_the_same_value():
    from torch.utils._sympy import functions as f

    from perfcast.capture.record import plain

    x, y = sympy.Symbol("s0", integer=True, positive=True), sympy.Symbol("s1", integer=True, positive=True)
    cases = [f.FloorDiv(x, 3), f.CleanDiv(x, 4), f.CeilDiv(x, 3), f.Mod(x, 8192), f.PythonMod(x, 7),
             f.Max(x, y), f.Min(x, y), f.PowByNatural(x, 2), f.FloorDiv(f.Mod(x, 64) + y, 2)]
    for torch_expr in cases:
        ours = plain(torch_expr)
        assert not [n for n in sympy.preorder_traversal(ours) if type(n).__module__.startswith("torch")]
        for point in ({x: 3, y: 10}, {x: 8200, y: 1}, {x: 12, y: 12}, {x: 1, y: 7}):
            assert ours.xreplace(point) == torch_expr.xreplace(point), (torch_expr, point)
    assert plain(f.Mod(x, 8192)) == sympy.Mod(x, 8192) and plain(f.FloorDiv(x, 3)) == sympy.floor(x / 3)
    assert plain(f.Identity(x + 1)) == x + 1  # (torch's Identity stays unevaluated even at a point)
    assert plain(sympy.Eq(f.Mod(x, 8) + 1, y)) == sympy.Eq(sympy.Mod(x, 8) + 1, y)  # inside a guard


def _synthetic() -> Capture:
    """A capture with every node type and scalar kind the format has."""
    odd = sympy.Symbol("n", integer=True, nonnegative=True)
    shapes = [B, 2 * S + 1, sympy.Max(B, S), sympy.Min(B, 2 * S), sympy.floor(C / 4), sympy.ceiling(C / 3),
              sympy.Mod(C, 8192), B**2 * S, sympy.Rational(1, 3) * B + odd, sympy.Integer(2**100), sympy.Integer(-1)]
    t_in = TensorMeta(tuple(shapes[:6]), "bf16", False, 0)
    t_out = TensorMeta(tuple(shapes[6:]), "complex64", False, 1, (False, True, False, False, False))
    w = TensorMeta((sympy.Integer(4096), sympy.Integer(14336)), "fp8", True, -1)
    guards = (sympy.Eq(64 * S, 320), sympy.Ne(B, 3), sympy.Lt(B, C), sympy.Le(S, C), sympy.Gt(C, 1),
              sympy.Ge(C, 2), sympy.And(sympy.Lt(B, C), sympy.Ge(S, 2)), sympy.Or(sympy.Eq(B, 2), sympy.Gt(B, 4)),
              sympy.Not(sympy.Eq(B, S)), sympy.true, sympy.false, sympy.Lt(1 / (B + 1), sympy.Rational(1, 2)))
    scalars = (None, True, False, 0, -5, 2**63, 1.5, -math.inf, math.inf, "torch.float32", "", C / 2, B * S)
    records = [OpRecord("aten.mm.default", (t_in, w), (t_out,), scalars, "model.layers.0.mlp", 0),
               OpRecord("aten.add.Tensor", (t_out, t_out), (t_in,), (), "lm_head", None)]
    groups = [LayerGroup((("mlp", "LlamaMLP", (("w", (4096, 14336), "torch.bfloat16"),), (None, "full", None, True)),),
                         (0, 1, 2))]
    return Capture(records, groups, {"model.layers.0.mlp.w": w}, {"model.layers.0.mlp.w"},
                   {"s0": B, "s1": S, "s2": C}, guards)


def test_every_node_type_and_scalar_kind_round_trips():
    cap = _synthetic()
    text = json.dumps(codec.encode(cap), allow_nan=False)  # strict JSON: no NaN or Infinity tokens
    assert codec.decode(json.loads(text)) == cap
    nan = Capture([OpRecord("aten.mul.Tensor", (), (), (math.nan,), "m", None)], [], {}, set())
    assert math.isnan(codec.decode(json.loads(json.dumps(codec.encode(nan)))).records[0].scalars[0])


@pytest.mark.parametrize("value", [sympy.Float(1.5) * B, sympy.sin(B), sympy.Dummy("d", integer=True), sympy.oo],
                         ids=["Float", "sin", "Dummy", "oo"])
def test_a_value_outside_the_format_is_not_stored(tmp_path, monkeypatch, caplog, value):
    cap = Capture([OpRecord("aten.mm.default", (), (), (value,), "m", None)], [], {}, set())
    with pytest.raises(codec.Invalid, match="cannot store"):
        codec.encode(cap)
    # symbolic_capture still answers with the capture; it only keeps nothing
    from perfcast.capture import build

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(build, "capture", lambda *a, **k: cap)
    with caplog.at_level(logging.DEBUG, logger="perfcast.capture.cache"):
        got, hit = cache.symbolic_capture(_model("llama-3.1-8b"), dtype="bf16", decode=True, context=True)
    assert got is cap and not hit
    assert not list(tmp_path.rglob("*.gz")) and "not written (cannot store" in caplog.text


# ------------------------------------------------------------------------- the decoder refuses


def _sym(name="B"):
    return ["Symbol", name, {"integer": True, "positive": True}]


def _doc(exprs=(), **fields):
    doc = {"records": [], "groups": [], "params": {}, "linear_params": [], "symbols": {}, "guards": [],
           "exprs": list(exprs), "tensors": []}
    doc.update(fields)
    return doc


def _deep(n):
    e = B
    for i in range(n):
        e = (e + i + 1) * S
    return e


def _shared(n):
    e = B
    for _ in range(n):
        e = (e + 1) * (e + 2)
    return e


REFUSED = [
    (_doc([["Evil", 0]]), "exprs[0]: unknown node 'Evil' with 1 arguments"),
    (_doc([["__import__", "os"]]), "unknown node '__import__'"),
    (_doc([_sym(), ["Max", 0, 0]]), "exprs[1]: Max of these arguments is not as SymPy writes it"),
    (_doc([_sym(), ["Not", 0]]), "exprs[1]: Not of a condition expected"),
    (_doc([_sym(), ["Integer", 32], ["Pow", 0, 1], ["Pow", 2, 1]]), "exprs[3]: too large an expression"),
    (_doc([["Integer", 2], ["Integer", -1], ["Pow", 0, 1]]), "exprs[2]: a power of a number"),
    (_doc([["Add", 1, 2], _sym(), _sym("S")]), "exprs[0]: an argument that is not an earlier node"),
    (_doc([["Integer", 1.5]]), "exprs[0]: expected an integer, got 1.5"),
    (_doc([["Integer", True]]), "exprs[0]: expected an integer, got True"),
    (_doc([["Integer", 2**5000]]), "exprs[0]: too large an expression"),
    (_doc([["Rational", 2, 4]]), "exprs[0]: a Rational in lowest terms"),
    (_doc([_sym(), ["Pow", 0, 0]]), "exprs[1]: a power with an exponent that is not a number"),
    (_doc([["Symbol", "x", {"positive": True, "negative": True}]]), "exprs[0]: contradictory assumptions"),
    (_doc([["Symbol", "x", {"evil": True}]]), "exprs[0]: expected SymPy assumptions"),
    (_doc([["Symbol", "x", {"positive": "yes"}]]), "exprs[0]: expected SymPy assumptions"),
    (_doc([["Symbol", "", {}]]), "exprs[0]: expected a symbol name"),
    (_doc([_sym(), ["Integer", 0], ["Mod", 0, 1]]), "exprs[2]: a modulus that is not a positive integer"),
    (_doc([_sym(), _sym("S"), ["Mod", 0, 1]]), "exprs[2]: a modulus that is not a positive integer"),
    (_doc([_sym(), _sym("S"), _sym("C"), ["Eq", 0, 1, 2]]), "exprs[3]: Eq of 3 arguments"),
    (_doc([_sym(), ["Add", 0]]), "exprs[1]: Add of 1 arguments"),
    (_doc([["true"], _sym(), ["Add", 0, 1]]), "exprs[2]: Add of a number expected"),
    (_doc([["Integer", 2]], guards=[0]), "guards: expected conditions"),
    (_doc([_sym()], guards=[0]), "guards: expected conditions"),
    (_doc([["Integer", 2]], symbols={"s0": 0}), "symbols: expected Symbol nodes"),
    (_doc([_sym()], symbols={"s0": 5}), "symbols['s0']: 5 is not an index of its table"),
    (_doc([_sym()], tensors=[[[0], "bf16", False, 0, [True, False]]]), "tensors[0]: one broadcast flag per dim"),
    (_doc([["true"]], tensors=[[[0], "bf16", False, 0, []]]), "tensors[0]: a dim that is a condition"),
    (_doc(tensors=[[[], "bf16", "no", 0, []]]), "tensors[0]: expected true or false, got 'no'"),
    (_doc(groups=[[[], []]]), "groups[0]: expected distinct layer indices"),
    (_doc(groups=[[[{"a": 1}], [0]]]), "groups[0]: a signature holding dict"),
    (_doc(records=[["aten.mm.default", [], [], [], "m", 3]]), "records[0]: layer 3 is no group's representative"),
    (_doc(records=[["aten.mm.default", [], [], [[1, 2]], "m", None]]), "records[0]: a scalar [1, 2]"),
    (_doc(records=[["aten.mm.default", [], [], [{"float": "evil"}], "m", None]]), "records[0]: a scalar"),
    (_doc(records=[["aten.mm.default", [], [], [{"expr": 9}], "m", None]]), "records[0]: 9 is not an index"),
    (_doc(records=[["aten.mm.default", [0], [], [], "m", None]]), "records[0]: 0 is not an index"),
    (_doc(records=[["aten.mm.default", [], []]]), "records[0]: expected a list of 6"),
    ({**_doc(), "extra": 1}, "capture: expected the fields"),
    ([], "capture: expected an object"),
]


@pytest.mark.parametrize(("doc", "message"), REFUSED, ids=[m.split(":")[-1][:40] for _, m in REFUSED])
def test_the_decoder_refuses_what_the_encoder_never_writes(doc, message):
    with pytest.raises(codec.Invalid) as e:
        codec.decode(doc)
    assert message in str(e.value) and "\n" not in str(e.value) and len(str(e.value)) < 200


@pytest.mark.parametrize("expr", [_deep(70), _shared(20), B**64 * S**64 * C**64 + 1],
                         ids=["deep", "shared-blow-up", "huge-degree"])
def test_an_expression_too_large_to_evaluate_is_refused(expr):
    guard = sympy.Gt(expr, 0, evaluate=False)  # (SymPy itself takes seconds to decide this one)
    with pytest.raises(codec.Invalid, match="too large an expression"):
        codec.decode(codec.encode(Capture([], [], {}, set(), guards=(guard,))))


# --------------------------------------------------------------------------- files on disk


def test_entries_are_written_atomically(entry, monkeypatch):
    cap, key, path, data = entry
    calls = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        calls.append("fsync")
        real_fsync(fd)

    def replace(a, b):
        calls.append(("replace", os.path.dirname(a)))
        real_replace(a, b)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    cache.store(path, key, cap)
    assert calls == ["fsync", ("replace", str(path.parent))]  # synced, then renamed within the folder
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]  # no temporary file left
    assert path.read_bytes() == data  # the same capture and key write the same bytes

    # a writer stopped before the rename leaves the old entry whole, and no temporary file
    def killed(a, b):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", killed)
    with pytest.raises(KeyboardInterrupt):
        cache.store(path, key, _synthetic())
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]
    assert cache.load(path, key) == cap


def test_concurrent_writers_never_show_a_reader_half_an_entry(entry):
    cap, key, path, _ = entry
    other = _synthetic()
    stop = threading.Event()

    def write(c):
        while not stop.is_set():
            cache.store(path, key, c)

    writers = [threading.Thread(target=write, args=(c,)) for c in (cap, other)]
    for w in writers:
        w.start()
    try:
        seen = [cache.load(path, key) for _ in range(40)]
    finally:
        stop.set()
        for w in writers:
            w.join()
    assert all(s == cap or s == other for s in seen)
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]


def test_an_entry_for_another_key_is_not_used(entry, monkeypatch):
    cap, key, path, data = entry
    for field, value in [("versions", {**key["versions"], "perfcast": "0.0.0"}),
                         ("versions", {**key["versions"], "torch": "1.0"}), ("dtype", "fp16"), ("decode", False),
                         ("code", "0" * 64), ("config", {**key["config"], "num_hidden_layers": 31})]:
        assert "an entry for another key" in _unreadable(path, {**key, field: value})
    doc = _document(data)
    for change in [{"format": 1}, {"magic": "pickle"}, {"key": None}, {"extra": 1}]:
        path.write_bytes(_gzip({**doc, **change}))
        assert _unreadable(path, key) in ("not a cache entry of this kind and format", "unexpected fields",
                                          "an entry for another key")
    # another perfcast version asks for another file, and captures anew
    m = _model("llama-3.1-8b")
    monkeypatch.setattr(cache, "versions", lambda: {**key["versions"], "perfcast": "9.9"})
    assert cache.entry_path(m, cache.entry_key(m, "bf16", True, True, True)) != path
    path.write_bytes(data)
    assert cache.symbolic_capture(m, dtype="bf16", decode=True, context=True) == (cap, False)


def test_any_config_and_model_name_make_a_usable_key(tmp_path, monkeypatch):
    import dataclasses
    import datetime

    from test_capture import TINY_LLAMA

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    config = tmp_path / f"{'long-' * 47}.json"  # an entry named after it would pass 255 bytes
    config.write_text(json.dumps(TINY_LLAMA))
    m = load_model_config(str(config))
    first, hit = cache.symbolic_capture(m, dtype="bf16", decode=True, context=True)
    assert not hit and cache.symbolic_capture(m, dtype="bf16", decode=True, context=True) == (first, True)
    # a value JSON has no type for (a date from a YAML config) keys by its text, alike every time
    dated = dataclasses.replace(m, data={**m.data, "released": datetime.date(2024, 7, 23)})
    key = cache.entry_key(dated, "bf16", True, True, True)
    assert key["config"]["released"] == "2024-07-23" and key == cache.entry_key(dated, "bf16", True, True, True)
    # a NaN has no strict-JSON token: that entry is not written, and nothing is left behind
    with pytest.raises(ValueError, match="Out of range float"):
        cache.store(tmp_path / "nan.json.gz", {**key, "config": {"eps": math.nan}}, first)
    assert not list(tmp_path.glob("*nan*")) and not list(tmp_path.glob(".*"))


FILES = {
    "empty": lambda p, d: p.write_bytes(b""),
    "random bytes": lambda p, d: p.write_bytes(os.urandom(4096)),
    "plain JSON": lambda p, d: p.write_bytes(gzip.decompress(d)),
    "not UTF-8": lambda p, d: p.write_bytes(gzip.compress(b"\xff\xfe{}")),
    "NaN": lambda p, d: p.write_bytes(_gzip('{"magic": NaN}')),
    "nested": lambda p, d: p.write_bytes(_gzip("[" * 200_000 + "]" * 200_000)),
    "wrong shape": lambda p, d: p.write_bytes(_gzip({"magic": cache.MAGIC, "format": cache.FORMAT})),
    "a list": lambda p, d: p.write_bytes(_gzip([1, 2, 3])),
    "trailing data": lambda p, d: p.write_bytes(d + b"more"),
    "two streams": lambda p, d: p.write_bytes(d + d),
    "too large": lambda p, d: os.truncate(p, cache.MAX_ENTRY_BYTES + 1),
    "a directory": lambda p, d: (p.unlink(), p.mkdir()),
    "a FIFO": lambda p, d: (p.unlink(), os.mkfifo(p)),
    "a symlink to an entry": lambda p, d: (p.rename(p.with_name("elsewhere")), p.symlink_to(p.with_name("elsewhere"))),
    "a symlink to /dev/zero": lambda p, d: (p.unlink(), p.symlink_to("/dev/zero")),
}


@pytest.mark.parametrize("kind", list(FILES))
def test_a_file_that_is_not_an_entry_is_captured_anew(entry, caplog, capsys, kind):
    cap, key, path, data = entry
    FILES[kind](path, data)
    assert "\n" not in _unreadable(path, key)
    with caplog.at_level(logging.DEBUG, logger="perfcast.capture.cache"):
        got, hit = cache.symbolic_capture(_model("llama-3.1-8b"), dtype="bf16", decode=True, context=True)
    assert got == cap and not hit
    assert "not used" in caplog.text and "Traceback" not in caplog.text
    assert capsys.readouterr().err == ""  # a debug note at most, never on stderr
    if kind.startswith(("a FIFO", "a symlink")):  # replaced by a regular entry; a symlink's target untouched
        assert path.is_file() and not path.is_symlink() and cache.load(path, key) == cap
    if kind == "a symlink to an entry":
        assert path.with_name("elsewhere").read_bytes() == data


def test_a_gzip_bomb_is_not_inflated_past_the_limit(entry, monkeypatch):
    _, key, path, _ = entry
    monkeypatch.setattr(cache, "MAX_JSON_BYTES", 1 << 20)
    path.write_bytes(gzip.compress(b" " * (4 << 20)))
    assert _unreadable(path, key) == f"inflates to more than {1 << 20:,} bytes"


# ------------------------------------------------------------------- hypothesis: corruption


class Plant:
    """A pickle whose loading creates ``path``: what a hostile cache entry would run."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def _payloads(marker):
    live = [pickle.dumps(Plant(marker), protocol=p) for p in (0, 2, pickle.HIGHEST_PROTOCOL)]
    return live + [gzip.compress(p) for p in live]


def test_the_planted_pickle_is_live(tmp_path):
    marker = tmp_path / "ran"
    pickle.loads(_payloads(marker)[2])
    assert marker.exists()
    marker.unlink()
    pickle.loads(gzip.decompress(_payloads(marker)[5]))
    assert marker.exists()


@settings(max_examples=20, deadline=None)
@given(cut=st.integers(min_value=0, max_value=10**9))
def test_a_truncated_entry_is_never_used(entries, tmp_path_factory, cut):
    cap, key, _, data = entries["llama-3.1-8b", True]
    path = tmp_path_factory.mktemp("cut") / "entry.json.gz"
    path.write_bytes(data[: cut % len(data)])
    _unreadable(path, key)


@settings(max_examples=20, deadline=None)
@given(flips=st.lists(st.tuples(st.integers(min_value=0, max_value=10**9), st.integers(min_value=1, max_value=255)),
                      min_size=1, max_size=4))
def test_flipped_bytes_are_never_read_as_another_capture(entries, tmp_path_factory, flips):
    cap, key, _, data = entries["deepseek-v3", True]
    damaged = bytearray(data)
    for at, bits in flips:
        damaged[at % len(data)] ^= bits
    path = tmp_path_factory.mktemp("flip") / "entry.json.gz"
    path.write_bytes(bytes(damaged))
    try:
        assert cache.load(path, key) == cap  # only bytes gzip ignores (its header's time stamp, OS)
    except cache.Unreadable:
        pass


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
                    | st.text(max_size=8), lambda kids: st.lists(kids, max_size=3)
                    | st.dictionaries(st.text(max_size=4), kids, max_size=3), max_leaves=6)


@settings(max_examples=15, deadline=None)
@given(data=st.data())
def test_an_unknown_node_type_is_never_decoded(entries, data):
    cap, key, _, blob = entries["llama-4-scout", True]
    doc = _document(blob)
    exprs = doc["capture"]["exprs"]
    i = data.draw(st.integers(0, len(exprs) - 1))
    known = {*codec.FUNCTIONS, "Integer", "Rational", "Symbol", "true", "false"}
    tag = data.draw(st.text(min_size=1, max_size=12).filter(lambda t: t not in known))
    exprs[i] = [tag, *data.draw(st.lists(JSON, max_size=3))]
    with pytest.raises(codec.Invalid, match=r"exprs\[\d+\]: unknown node"):
        codec.decode(doc["capture"])


@settings(max_examples=15, deadline=None)
@given(data=st.data())
def test_any_change_to_the_document_is_data_never_code(entries, tmp_path_factory, data):
    """A value anywhere in the document replaced by any JSON (a pickle's bytes as a string too):
    the entry is refused, or read as a capture — never anything else."""
    cap, key, _, blob = entries["deepseek-v3", False]
    marker = tmp_path_factory.mktemp("marker") / "ran"
    doc = _document(blob)
    node, where = doc, []
    while isinstance(node, (dict, list)) and node and (not where or data.draw(st.booleans())):
        k = data.draw(st.sampled_from(sorted(node) if isinstance(node, dict) else range(len(node))))
        where.append((node, k))
        node = node[k]
    parent, k = where[-1]
    parent[k] = data.draw(JSON | st.just(pickle.dumps(Plant(marker), protocol=0).decode("latin-1")))
    path = marker.parent / "entry.json.gz"
    path.write_bytes(_gzip(doc))
    try:
        assert isinstance(cache.load(path, key), Capture)
    except cache.Unreadable as e:
        assert "\n" not in str(e)
    assert not marker.exists()


def _corrupt(kind, path, data, marker, n):
    if kind == "truncate":
        path.write_bytes(data[: n % len(data)])
    elif kind == "flip":  # past gzip's 10-byte header (whose time stamp and OS byte it ignores)
        damaged = bytearray(data)
        damaged[10 + n % (len(data) - 10)] ^= 0x55
        path.write_bytes(bytes(damaged))
    elif kind == "pickle":
        path.write_bytes(_payloads(marker)[n % 6])
    elif kind == "old pickle entry":  # what earlier perfcast versions wrote: never opened
        path.unlink()
        path.with_name(path.name.removesuffix(cache.SUFFIX) + ".pkl").write_bytes(_payloads(marker)[n % 3])
    elif kind == "unknown node":
        doc = _document(data)
        doc["capture"]["exprs"][n % len(doc["capture"]["exprs"])] = ["Plant", str(marker)]
        path.write_bytes(_gzip(doc))
    elif kind == "another version":
        doc = _document(data)
        doc["key"]["versions"]["perfcast"] = f"0.{n}"
        path.write_bytes(_gzip(doc))


ARGS = ("text-generate", "llama-3.1-8b", "--decode", "--num-queries", "4", "--context-length", "64", "--json")


def _answer(out):
    doc = json.loads(out)
    return {k: v for k, v in doc.items() if k not in ("capture", "timings_s")}, doc["capture"]


@pytest.fixture(scope="module")
def fresh_answer(entries, tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("fresh")))
        rc, out, err = fuzzing.run_cli(*ARGS)
    assert rc == 0 and err == ""
    return _answer(out)


KINDS = ["truncate", "flip", "pickle", "old pickle entry", "unknown node", "another version"]


@settings(max_examples=4, deadline=None)
@example(kind="truncate", n=100)
@example(kind="flip", n=500)
@example(kind="pickle", n=5)
@example(kind="old pickle entry", n=0)
@example(kind="unknown node", n=3)
@example(kind="another version", n=1)
@given(kind=st.sampled_from(KINDS), n=st.integers(min_value=0, max_value=10**6))
def test_the_cli_answers_alike_from_a_damaged_entry_and_runs_nothing(entries, fresh_answer, tmp_path_factory, kind, n):
    _, _, old, data = entries["llama-3.1-8b", True]
    tmp = tmp_path_factory.mktemp("cli")
    path, marker = tmp / "perfcast" / "captures" / old.name, tmp / "ran"
    path.parent.mkdir(parents=True)
    path.write_bytes(data)
    _corrupt(kind, path, data, marker, n)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_CACHE_HOME", str(tmp))
        rc, out, err = fuzzing.run_cli(*ARGS)
    fuzzing.check_answered(rc, out, err, (kind, n))
    assert rc == 0 and err == "" and not marker.exists()
    answer, how = _answer(out)
    assert answer == fresh_answer[0]
    assert how == "symbolic capture"  # captured anew, and the entry is whole again
    key = cache.entry_key(_model("llama-3.1-8b"), "bf16", True, True, True)
    assert cache.load(path, key) == entries["llama-3.1-8b", True][0]


def test_python_dispatcher_only_for_a_torch_whose_matmul_fails_on_symbolic_sizes(monkeypatch):
    """torch 2.11's C++ matmul calls numel() on a symbolic 3-D input (the device machine's torch):
    a symbolic capture there runs under the Python dispatcher; on torch 2.13 the C++ path stands,
    as the Python one guards differently (test_captures_hold_plain_sympy_only)."""
    import contextlib

    import torch
    from torch.torch_version import TorchVersion

    from perfcast.capture.build import _dispatcher

    monkeypatch.setattr(torch, "__version__", TorchVersion("2.11.0+cu130"))
    assert not isinstance(_dispatcher(True), contextlib.nullcontext)
    assert isinstance(_dispatcher(False), contextlib.nullcontext)
    monkeypatch.setattr(torch, "__version__", TorchVersion("2.13.0+cpu"))
    assert isinstance(_dispatcher(True), contextlib.nullcontext)
