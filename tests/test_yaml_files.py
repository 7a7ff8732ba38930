"""The YAML files perfcast reads: the safe loader (perfcast.inputs.yamlfile), one report of
everything wrong in a spec file, numbers that must be finite and in range, and the templates."""

import json
import time
from pathlib import Path

import pytest
import yaml
from pydantic import BaseModel

from fuzzing import check_answered, run_cli
from perfcast.engines.spec import load_profile_file, profiles_dir
from perfcast.hardware import SpecError, get_device, load_device_file
from perfcast.hardware.spec import DeviceSpec, read_yaml, template_path
from perfcast.hardware.topology import TopologySpec, get_topology, load_topology_file
from perfcast.inputs import dump_yaml, load_yaml, parse_yaml, yamlfile
from perfcast.ir import UserError

H100 = Path(get_device("h100-sxm").path)
HGX = Path(get_topology("hgx-h100").path)

#: Nine levels of ten aliases: 10⁹ strings once expanded ("billion laughs").
BOMB = "lol: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
    f"lol{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]\n" for i in range(1, 10))


def _write(tmp_path: Path, text: str | bytes, name: str = "dev.yaml") -> Path:
    path = tmp_path / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return path


def _device_text(**replace: str) -> str:
    text = H100.read_text()
    for old, new in replace.items():
        assert old in text
        text = text.replace(old, new, 1)
    return text


def _error(*argv: str) -> str:
    """The error lines of ``perfcast ARGV`` that must fail (exit 2, no traceback, no flood)."""
    rc, out, err = run_cli(*argv)
    check_answered(rc, out, err, argv)
    assert rc == 2 and out == "", (rc, out, err)
    return err


# --- the loader ----------------------------------------------------------------------------------

def test_yaml_1_2_core_scalars():
    text = ("a: 3.35e12\nb: 1:30\nc: yes\nd: off\ne: 0o17\nf: 0x1F\ng: 010\nh: 1_000\ni: .inf\nj: -.Inf\n"
            "k: ~\nl: True\nm: 2024-01-01\nn: 1e400\no: '1.5'\n")
    got = parse_yaml(text, "x.yaml")
    nan = parse_yaml("v: .nan\n", "x.yaml")["v"]
    assert nan != nan
    assert got == {"a": 3.35e12, "b": "1:30", "c": "yes", "d": "off", "e": 15, "f": 31, "g": 10, "h": "1_000",
                   "i": float("inf"), "j": float("-inf"), "k": None, "l": True, "m": "2024-01-01",
                   "n": float("inf"), "o": "1.5"}
    # YAML 1.1 (PyYAML's safe_load) reads the same text otherwise
    old = yaml.safe_load(text)
    assert (old["a"], old["b"], old["c"], old["g"], old["h"]) == ("3.35e12", 90, True, 8, 1000)


@pytest.mark.parametrize("text, message", [
    ("a: 1\nb: 2\na: 3\n", "x.yaml: line 3: key 'a' given twice (YAML keeps only the last; remove one)"),
    ("a: !!python/object/apply:os.system [echo hi]\n",
     "x.yaml: line 1: tag '!!python/object/apply:os.system' is not plain YAML data"),
    ("a: !!binary aGk=\n", "x.yaml: line 1: tag '!!binary' is not plain YAML data"),
    ("a: !!timestamp 2024-01-01\n", "x.yaml: line 1: tag '!!timestamp' is not plain YAML data"),
    ("a: !mine 1\n", "x.yaml: line 1: tag '!mine' is not plain YAML data"),
    ("a: !!int 1:30\n", "x.yaml: line 1: !!int '1:30' is not a YAML 1.2 int"),
    ("a: &x [1, *x]\n", "x.yaml: line 1: alias '*x' refers to a node that contains it"),
    ("a: *nowhere\n", "x.yaml: not valid YAML at line 1: found undefined alias 'nowhere'"),
    ("? [1, 2]\n: a\n", "x.yaml: line 1: a mapping or list as a mapping key"),
    ("a: " + "9" * 5000 + "\n", "x.yaml: line 1: an integer of 5,000 digits"),
    ("a: [1\n", "x.yaml: not valid YAML at line 2: while parsing a flow sequence"),
    ("a: 1\n---\nb: 2\n", "x.yaml: not valid YAML at line 2: expected a single document in the stream"),
    ("".join(f"{'  ' * i}k{i}:\n" for i in range(3000)) + "  " * 3000 + "x: 1\n",
     "x.yaml: line 64: nested more than 64 levels deep"),
    ("a: &b [1]\n" + "".join(f"c{i}: *b\n" for i in range(101)),
     "x.yaml: line 102: more than 100 aliases (perfcast reads at most 100)"),
    (BOMB, "x.yaml: line 5: more than 100,000 nodes once aliases are expanded (an alias bomb?)"),
])
def test_loader_refuses_with_one_line_naming_file_and_line(text, message):
    with pytest.raises(UserError) as info:
        parse_yaml(text, "x.yaml")
    assert str(info.value).startswith(message) and "\n" not in str(info.value)


def test_repeated_keys_are_all_listed():
    with pytest.raises(UserError) as info:
        parse_yaml("a: 1\nb:\n  c: 1\n  c: 2\na: 3\n", "x.yaml")
    assert str(info.value).splitlines() == [
        "x.yaml: 2 problems",
        "line 4: key 'c' given twice (YAML keeps only the last; remove one)",
        "line 5: key 'a' given twice (YAML keeps only the last; remove one)"]


def test_python_parser_refuses_the_same():
    """Without libyaml the pure-Python parser feeds the same composer and its limits."""
    loader, yamlfile._LOADER = yamlfile._LOADER, yamlfile._loader_class(yamlfile._PyParser)
    try:
        assert parse_yaml(H100.read_text(), "x") == load_yaml(H100)
        for text, message in ((BOMB, "more than 100,000 nodes"), ("a: 1\na: 2\n", "key 'a' given twice"),
                              ("a: " + "[" * 3000 + "]" * 3000, "nested more than 64 levels deep")):
            with pytest.raises(UserError, match=message):
                parse_yaml(text, "x")
    finally:
        yamlfile._LOADER = loader


def test_flow_nesting_thousands_deep_is_one_line(tmp_path):
    err = _error("devices", "--device-file", str(_write(tmp_path, "a: " + "[" * 100_000 + "]" * 100_000 + "\n")))
    assert len(err.splitlines()) == 1
    assert "nested more than 64 levels deep" in err or "exceeded maximum nesting depth" in err  # ours, or libyaml's


def test_dumped_yaml_reads_back_unchanged():
    data = {"a": "1e5", "b": "0o17", "c": "yes", "d": "1:30", "e": 1e5, "f": ".5", "g": "null", "h": [1, "2"]}
    text = dump_yaml(data, sort_keys=False)
    assert parse_yaml(text, "x") == data and yaml.safe_load(text) == data


def test_every_shipped_yaml_reads_as_before():
    """The YAML 1.2 reading changes no value of a shipped file (1.1 plus the exponent floats)."""
    for path in sorted(Path(H100).parents[1].parent.rglob("*.yaml")):
        text = path.read_text()
        assert parse_yaml(text, path) == yaml.load(text, Loader=_Yaml11WithExponents), path


class _Yaml11WithExponents(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):
    pass


_Yaml11WithExponents.add_implicit_resolver(
    "tag:yaml.org,2002:float", yamlfile._PATTERNS["float"], list("-+0123456789."))


# --- the failures the loader must answer with one line -------------------------------------------

def test_alias_bomb_in_a_device_file_fails_fast(tmp_path):
    path = _write(tmp_path, BOMB)
    start = time.perf_counter()
    err = _error("devices", "--device-file", str(path), "--json")
    assert time.perf_counter() - start < 2
    assert err == (f"perfcast devices: error: {path}: line 5: more than 100,000 nodes once aliases are expanded "
                   f"(an alias bomb?)\n")


def test_a_smaller_bomb_is_quoted_as_a_short_excerpt(tmp_path):
    """Four levels of ten (10,000 strings, under the node budget) where a number belongs: the
    error quotes an excerpt, not the 100,000-character expansion."""
    bomb = "x: &b0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
        f"x{i}: &b{i} [{', '.join([f'*b{i - 1}'] * 10)}]\n" for i in range(1, 4))
    text = bomb + _device_text(**{"hbm_capacity_bytes: 85520809984": "hbm_capacity_bytes: *b3"})
    path = _write(tmp_path, text)
    err = _error("devices", "--device-file", str(path))
    assert f"{path}: 5 problems" in err and len(err) < 1000
    assert "  key 'datasheet.hbm_capacity_bytes': input should be a valid number (got [[[['lol', 'lol', 'lol'" in err


def test_sexagesimal_is_not_a_number(tmp_path):
    path = _write(tmp_path, _device_text(**{"hbm_capacity_bytes: 85520809984": "hbm_capacity_bytes: 1:30"}))
    assert _error("devices", "--device-file", str(path)) == (
        f"perfcast devices: error: {path}: key 'datasheet.hbm_capacity_bytes': input should be a valid number "
        f"(got '1:30')\n")


def test_yes_is_not_a_boolean(tmp_path):
    text = HGX.read_text().replace("    kind: switch\n", "    kind: switch\n    wraparound: yes\n", 1)
    path = _write(tmp_path, text, "t.yaml")
    assert "key 'tiers.0.wraparound': input should be a valid boolean (got 'yes')" in _error(
        "topologies", "--topology-file", str(path))


def test_duplicate_key_in_a_device_file(tmp_path):
    path = _write(tmp_path, _device_text(**{"  clock_hz: 1.83e+09\n": "  clock_hz: 1.83e+09\n  clock_hz: 1.98e+09\n"}))
    assert _error("devices", "--device-file", str(path)) == (
        f"perfcast devices: error: {path}: line 20: key 'clock_hz' given twice (YAML keeps only the last; "
        f"remove one)\n")


@pytest.mark.parametrize("value, message", [
    (".inf", "input should be a finite number (got inf)"),
    (".nan", "input should be a finite number (got nan)"),
    ("1e400", "input should be a finite number (got inf)"),
    ("-.inf", "input should be a finite number (got -inf)"),
    ("1e31", "expected at most 1e+30, got 1e+31"),
    ("1e-320", "expected at least 1e-30, got 1e-320"),
])
def test_non_finite_or_absurd_figures_are_refused(tmp_path, value, message):
    path = _write(tmp_path, _device_text(**{"hbm_capacity_bytes: 85520809984": f"hbm_capacity_bytes: {value}"}))
    err = _error("devices", "--device-file", str(path), "--json")
    assert err == f"perfcast devices: error: {path}: key 'datasheet.hbm_capacity_bytes': {message}\n"


def test_inf_in_a_topology_and_an_engine_profile(tmp_path):
    topo = _write(tmp_path, HGX.read_text().replace("link_latency_s: 5.0e-6", "link_latency_s: .inf"), "t.yaml")
    assert "key 'tiers.1.link_latency_s': input should be a finite number (got inf)" in _error(
        "topologies", "--topology-file", str(topo), "--json")
    engine = (profiles_dir() / "eager.yaml").read_text()
    assert "value_s: " in engine
    bad = _write(tmp_path, engine.replace("value_s: ", "value_s: .nan #", 1), "e.yaml")
    with pytest.raises(SpecError, match=r"value_s': input should be a finite number \(got nan\)"):
        load_profile_file(bad)


def test_non_utf8_and_binary_files(tmp_path):
    text = _device_text(**{"description: NVIDIA": "description: Gerät"})
    latin1 = _write(tmp_path, text.encode("latin-1", "replace"))
    offset = latin1.read_bytes().index(b"\xe4")
    assert _error("devices", "--device-file", str(latin1)) == (
        f"perfcast devices: error: {latin1}: not UTF-8 text (byte 0xe4 at offset {offset:,})\n")
    binary = _write(tmp_path, b"\x7fELF\x02\x01\x01\x00" + bytes(range(256)), "bin.yaml")
    assert _error("topologies", "--topology-file", str(binary)) == (
        f"perfcast topologies: error: {binary}: a binary file (NUL byte at offset 7); expected UTF-8 text\n")


def test_a_file_over_the_size_limit(tmp_path):
    path = _write(tmp_path, "a: " + "x" * yamlfile.MAX_YAML_BYTES + "\n")
    assert f"more than the {yamlfile.MAX_YAML_BYTES:,} perfcast reads" in _error("devices", "--device-file", str(path))


def test_no_tag_runs_code(tmp_path):
    marker = tmp_path / "ran"
    text = f"name: !!python/object/apply:os.system ['touch {marker}']\n"
    with pytest.raises(SpecError, match="tag '!!python/object/apply:os.system' is not plain YAML data"):
        read_yaml(_write(tmp_path, text))
    assert not marker.exists()


# --- one report of everything wrong in a file ----------------------------------------------------

def test_five_missing_keys_are_named_at_once(tmp_path):
    text = "".join(line for line in H100.read_text().splitlines(keepends=True)
                   if not line.startswith(("vendor:", "  hbm_capacity_bytes:", "  hbm_bandwidth_bytes_per_s:",
                                           "  clock_hz:", "  kernel_static_latency_s:")))
    path = _write(tmp_path, text)
    assert _error("devices", "--device-file", str(path)).splitlines() == [
        f"perfcast devices: error: {path}: 5 problems",
        "  key 'vendor': missing key",
        "  key 'datasheet.hbm_capacity_bytes': missing key",
        "  key 'datasheet.hbm_bandwidth_bytes_per_s': missing key",
        "  key 'datasheet.clock_hz': missing key",
        "  key 'calibration.kernel_static_latency_s': missing key"]


def test_missing_and_stale_sources_are_listed_together(tmp_path):
    data = load_yaml(H100)
    data["sources"].pop("clock_hz")
    data["sources"].pop("hbm_capacity_bytes")
    data["sources"]["l2_bytes"] = "stale"
    path = _write(tmp_path, dump_yaml(data))
    with pytest.raises(SpecError) as info:
        load_device_file(path)
    assert str(info.value).splitlines() == [
        f"{path}: 3 problems",
        "key 'sources.clock_hz': missing source for clock_hz",
        "key 'sources.hbm_capacity_bytes': missing source for hbm_capacity_bytes",
        "key 'sources.l2_bytes': source given for unknown value l2_bytes"]


def test_topology_problems_are_listed_together(tmp_path):
    data = load_yaml(HGX)
    data["tiers"][0].update(kind="dragonfly", link_bandwidth_bytes_per_s="25 GB/s")
    data["tiers"][1].pop("shape")
    data["colour"] = "green"
    path = _write(tmp_path, dump_yaml(data), "t.yaml")
    assert _error("topologies", "--topology-file", str(path)).splitlines() == [
        f"perfcast topologies: error: {path}: 4 problems",
        "  key 'tiers.0.kind': input should be 'torus', 'ring', 'switch' or 'full_mesh' (got 'dragonfly')",
        "  key 'tiers.0.link_bandwidth_bytes_per_s': input should be a valid number (got '25 GB/s')",
        "  key 'tiers.1.shape': missing key",
        "  key 'colour': unknown key"]


def test_topology_sources_and_calibration_sources_together(tmp_path):
    data = load_yaml(HGX)
    data["sources"].pop("nvlink.link_latency_s")
    data["calibration_sources"].pop("nvlink.all_to_all")
    path = _write(tmp_path, dump_yaml(data), "t.yaml")
    with pytest.raises(SpecError) as info:
        load_topology_file(path)
    assert str(info.value).splitlines()[1:] == [
        "key 'sources.nvlink.link_latency_s': missing source for nvlink.link_latency_s",
        "key 'calibration_sources.nvlink.all_to_all': missing source for nvlink.all_to_all"]


def test_engine_profile_problems_are_listed_together(tmp_path):
    data = load_yaml(profiles_dir() / "vllm.yaml")
    data.pop("framework")
    data["rules"][1]["colour"] = "red"
    path = _write(tmp_path, dump_yaml(data), "e.yaml")
    err = _error("engines", "--engine-file", str(path), "--json").splitlines()
    assert err[0] == f"perfcast engines: error: {path}: 2 problems"
    assert err[1] == "  key 'framework': missing key" and err[2].endswith(".colour': unknown key")


def test_a_long_report_is_cut(tmp_path):
    data = load_yaml(H100)
    data["datasheet"]["matrix_flops_per_s"] = {f"x{i}": 1.0 for i in range(50)}
    path = _write(tmp_path, dump_yaml(data))
    lines = _error("devices", "--device-file", str(path)).splitlines()
    assert lines[0] == f"perfcast devices: error: {path}: 50 problems"
    assert len(lines) == 32 and lines[-1] == "  … and 20 more"


# --- templates -----------------------------------------------------------------------------------

def _template(tmp_path: Path, command: str) -> Path:
    rc, out, err = run_cli(command, "--template")
    assert (rc, err) == (0, "")
    return _write(tmp_path, out, f"my-{command}.yaml")


def test_device_template_loads_as_is_with_h100_values(tmp_path):
    path = _template(tmp_path, "devices")
    rc, out, err = run_cli("devices", "--device-file", str(path), "--json")
    assert (rc, err) == (0, "")
    (row,) = json.loads(out)["devices"]
    assert row["name"] == "my-device"
    mine, h100 = load_device_file(path).spec.datasheet, get_device("h100-sxm").spec.datasheet
    assert mine.model_dump(exclude={"matrix_flops_per_s", "vector_flops_per_s"}) == h100.model_dump(
        exclude={"matrix_flops_per_s", "vector_flops_per_s"})
    assert all(h100.matrix_flops_per_s[t] == v for t, v in mine.matrix_flops_per_s.items())
    # it prices: a kernel on the template device
    rc, out, err = run_cli("kernel", "flash-attention", "--device-file", str(path), "--json")
    check_answered(rc, out, err, "template")
    assert rc == 0 and json.loads(out)["totals"]["time_s"] > 0


def test_topology_template_loads_as_is_with_hgx_h100_tiers(tmp_path):
    path = _template(tmp_path, "topologies")
    mine, hgx = load_topology_file(path), get_topology("hgx-h100")
    assert [(t.kind, t.dims, t.links_per_device, t.link_bandwidth_bytes_per_s, t.link_latency_s) for t in mine.tiers] \
        == [(t.kind, t.dims, t.links_per_device, t.link_bandwidth_bytes_per_s, t.link_latency_s) for t in hgx.tiers]
    assert mine.device == "h100-sxm" and mine.name == "my-topology"


def _keys(model):
    """Every key of ``model`` and of the models its fields hold, recursively."""
    import typing

    def models(annotation):
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            yield annotation
        for arg in typing.get_args(annotation):
            yield from models(arg)

    for name, info in model.model_fields.items():
        yield info.alias or name
        for sub in models(info.annotation):
            yield from _keys(sub)


@pytest.mark.parametrize("what, model", [("device", DeviceSpec), ("topology", TopologySpec)])
def test_template_names_every_key(what, model):
    text = template_path(what).read_text()
    assert sorted(key for key in set(_keys(model)) if f"{key}:" not in text) == []


def test_template_flags():
    assert _error("devices", "--template", "--json") == (
        "perfcast devices: error: --template prints a YAML file; --json does not apply\n")
    rc, out, err = run_cli("devices", "--template", "--device-file", str(H100))
    assert rc == 2 and "not allowed with argument --template" in err
