"""Fuzzing the spec loaders through the CLI: shipped device, topology and engine-profile files,
mutated in their data (a key dropped, renamed or added, a value replaced by junk: a wrong type,
zero, a negative, NaN, an infinity, a huge or tiny number, nested junk) or in their text (a key
repeated, a value replaced by YAML 1.1 forms, tags, aliases or an alias bomb, nesting thousands
deep, bytes that are not UTF-8, a NUL, a cut), then read by ``perfcast devices``,
``topologies`` and ``engines`` and, when they load, priced (``perfcast kernel`` on a device,
``perfcast collective`` on a topology). Each answer must keep the promise of
:func:`fuzzing.check_answered`: exit 2 with a short error, or exit 0 with finite, non-negative
figures.

Files whose figures are all valid but extreme (every number replaced by one within the
loaders' bounds) must load and price to finite figures.

Generated cases: 80 + 50 + 40 (devices) + 50 + 40 + 30 (topologies) + 40 (engine profiles) = 330.
"""

import itertools
import json
import math
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fuzzing import check_answered, run_cli
from perfcast.engines.spec import profiles_dir
from perfcast.hardware import get_device
from perfcast.hardware.topology import get_topology

DEVICES = {n: Path(get_device(n).path) for n in ("h100-sxm", "mi300x", "tpu-v5p", "gb200")}
TOPOLOGIES = {n: Path(get_topology(n).path) for n in ("hgx-h100", "tpu-v5p-4x4x4", "ascend-910b-8", "gb200-nvl72")}
ENGINES = {n: profiles_dir() / f"{n}.yaml" for n in ("vllm", "eager", "trtllm")}

_count = itertools.count()


def fuzz(max_examples: int):
    # the module-scoped work folder is the only fixture; a case is one CLI run or two
    return settings(max_examples=max_examples, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("fuzz-specs")


def _file(workdir: Path, content: bytes) -> str:
    # a new name per case: the loaders cache by path
    path = workdir / f"case{next(_count)}.yaml"
    path.write_bytes(content)
    return str(path)


# --- junk ---------------------------------------------------------------------------------------

_NUMBERS = st.one_of(
    st.sampled_from([0, -1, 0.0, -0.0, -3.35e12, 1e-320, 5e-324, 1e-30, 1e30, 1e31, 1e308, 2**63, 2**64 + 1,
                     10**40, math.inf, -math.inf, math.nan, 0.5, 1.5, True, False]),
    st.integers(min_value=-2**70, max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
)
_JUNK = st.recursive(
    st.one_of(st.none(), _NUMBERS, st.text(max_size=20),
              st.sampled_from(["1:30", "yes", "3.35 TB/s", "", "null", "bf17", "x" * 10_000])),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=12,
)

#: Raw text put where a value was: YAML 1.1 forms, tags, aliases, odd scalars.
_TOKENS = ["1:30", "1:30:00", "yes", "no", "on", "off", "0x1F", "0o17", "010", "1_000", ".inf", "-.inf", ".nan",
           "1e400", "-1e400", "1e-400", "~", "", "[]", "{}", "[[[[]]]]", "!!python/object/apply:os.system [ls]",
           "!!binary aGk=", "!!set {a, b}", "!!timestamp 2024-01-01", "!custom 1", "*undefined", "&x 1",
           "'unterminated", '"\\x00"', "? [a]", "{a: 1, a: 2}", "9" * 5000, "- - - -", "\t1"]

_BOMB = "bomb0: &b0 [l, l, l, l, l, l, l, l, l, l]\n" + "".join(
    f"bomb{i}: &b{i} [{', '.join([f'*b{i - 1}'] * 10)}]\n" for i in range(1, 9))


def _paths(doc, at=()):
    """Every path (keys and indices) to a node of ``doc``."""
    yield at
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from _paths(v, (*at, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield from _paths(v, (*at, i))


def _mutate_data(data, doc: dict) -> dict:
    """``doc`` with one node dropped, renamed, replaced by junk, or a key added beside it."""
    path = data.draw(st.sampled_from([p for p in _paths(doc) if p]))
    *parent_path, last = path
    parent = doc
    for k in parent_path:
        parent = parent[k]
    how = data.draw(st.sampled_from(["drop", "junk", "junk", "junk", "rename", "add"]))
    if how == "drop":
        del parent[last]
    elif how == "junk":
        parent[last] = data.draw(_JUNK)
    elif how == "rename" and isinstance(parent, dict):
        parent[str(last) + data.draw(st.sampled_from(["_gbps", "s", "_", " "]))] = parent.pop(last)
    elif isinstance(parent, dict):
        parent[data.draw(st.text(min_size=1, max_size=8))] = data.draw(_JUNK)
    else:
        parent.append(data.draw(_JUNK))
    return doc


def _mutate_text(data, text: str) -> bytes:
    """``text`` with one textual change: a line repeated, a value replaced by a raw token or an
    alias bomb, nesting thousands deep, a byte that is not UTF-8, a NUL, a cut."""
    lines = text.splitlines(keepends=True)
    valued = [i for i, line in enumerate(lines) if ": " in line and not line.lstrip().startswith("#")]
    i = data.draw(st.sampled_from(valued))
    key = lines[i].split(": ", 1)[0]
    how = data.draw(st.sampled_from(["repeat", "token", "token", "bomb", "deep", "bytes", "cut"]))
    if how == "repeat":
        lines.insert(i + 1, lines[i])
    elif how == "token":
        lines[i] = f"{key}: {data.draw(st.sampled_from(_TOKENS))}\n"
    elif how == "bomb":
        lines[i] = f"{key}: *b8\n"
        lines.insert(0, _BOMB)
    elif how == "deep":
        depth = data.draw(st.sampled_from([63, 64, 65, 1000, 20_000]))
        lines[i] = f"{key}: {'[' * depth}1{']' * depth}\n"
    raw = "".join(lines).encode()
    if how == "bytes":
        at = data.draw(st.integers(0, len(raw)))
        raw = raw[:at] + data.draw(st.sampled_from([b"\xff", b"\xc3", b"\x00", b"\xed\xa0\x80", b"\x1b[2J"])) + raw[at:]
    elif how == "cut":
        raw = raw[:data.draw(st.integers(0, len(raw)))]
    return raw


def _extreme_figures(data, doc: dict) -> dict:
    """``doc`` with a few of its numbers replaced by others within the loaders' bounds: a float
    figure by one in [1e-30, 1e30] (an efficiency by one in [1e-6, 1]), a count by one in
    [1, 10⁶]. Sorted curves stay sorted only by chance; the file may then be refused."""
    numeric = [p for p in _paths(doc) if p and isinstance(_at(doc, p), (int, float))
               and not isinstance(_at(doc, p), bool)]
    for path in data.draw(st.lists(st.sampled_from(numeric), min_size=1, max_size=6, unique=True)):
        *parent_path, last = path
        old = _at(doc, path)
        if isinstance(old, int):
            new = data.draw(st.sampled_from([1, 2, 3, 7, 1000, 10**6]))
        elif 0 < old <= 1 and "efficiency" in str(path) or (len(path) >= 2 and path[-1] == 1 and "points" in path):
            new = data.draw(st.sampled_from([1e-6, 1e-3, 0.5, 1.0]))
        else:
            new = data.draw(st.sampled_from([1e-30, 1e-12, 1.0, 1e12, 1e30]))
        _at(doc, parent_path)[last] = new
    return doc


def _at(doc, path):
    for k in path:
        doc = doc[k]
    return doc


def _answered(*argv: str) -> tuple[int, str]:
    rc, out, err = run_cli(*argv)
    check_answered(rc, out, err, argv)
    if rc == 0 and "--json" in argv:
        json.loads(out, parse_constant=lambda c: pytest.fail(f"{c} in the JSON of {argv}"))
    return rc, out


def _device(path: str) -> None:
    rc, _ = _answered("devices", "--device-file", path, "--json")
    if rc == 0:  # it loads: price a kernel on it
        _answered("kernel", "flash-attention", "--device-file", path, "--set", "T_q=512", "--set", "T_kv=512", "--json")


def _topology(path: str) -> None:
    rc, _ = _answered("topologies", "--topology-file", path, "--json")
    if rc == 0:  # it loads: price a collective on it
        _answered("collective", "all_reduce", "--topology", path, "--bytes", "1048576", "--group-size", "2", "--json")


# --- the tests ----------------------------------------------------------------------------------

@fuzz(80)
@given(data=st.data())
def test_device_data_mutations(workdir, data):
    doc = yaml.safe_load(DEVICES[data.draw(st.sampled_from(sorted(DEVICES)))].read_text())
    _device(_file(workdir, yaml.safe_dump(_mutate_data(data, doc)).encode()))


@fuzz(50)
@given(data=st.data())
def test_device_text_mutations(workdir, data):
    text = DEVICES[data.draw(st.sampled_from(sorted(DEVICES)))].read_text()
    _device(_file(workdir, _mutate_text(data, text)))


@fuzz(40)
@given(data=st.data())
def test_device_extreme_figures(workdir, data):
    doc = yaml.safe_load(DEVICES[data.draw(st.sampled_from(sorted(DEVICES)))].read_text())
    _device(_file(workdir, yaml.safe_dump(_extreme_figures(data, doc)).encode()))


@fuzz(50)
@given(data=st.data())
def test_topology_data_mutations(workdir, data):
    doc = yaml.safe_load(TOPOLOGIES[data.draw(st.sampled_from(sorted(TOPOLOGIES)))].read_text())
    _topology(_file(workdir, yaml.safe_dump(_mutate_data(data, doc)).encode()))


@fuzz(40)
@given(data=st.data())
def test_topology_text_mutations(workdir, data):
    text = TOPOLOGIES[data.draw(st.sampled_from(sorted(TOPOLOGIES)))].read_text()
    _topology(_file(workdir, _mutate_text(data, text)))


@fuzz(30)
@given(data=st.data())
def test_topology_extreme_figures(workdir, data):
    doc = yaml.safe_load(TOPOLOGIES[data.draw(st.sampled_from(sorted(TOPOLOGIES)))].read_text())
    _topology(_file(workdir, yaml.safe_dump(_extreme_figures(data, doc)).encode()))


@fuzz(40)
@given(data=st.data())
def test_engine_profile_mutations(workdir, data):
    name = data.draw(st.sampled_from(sorted(ENGINES)))
    text = ENGINES[name].read_text()
    if data.draw(st.booleans()):
        content = yaml.safe_dump(_mutate_data(data, yaml.safe_load(text))).encode()
    else:
        content = _mutate_text(data, text)
    _answered("engines", "--engine-file", _file(workdir, content), "--json")
