"""Devices as data: every shipped file loads and is sourced; the loader is strict."""

from pathlib import Path

import pytest
import sympy
import yaml

from perfcast.hardware import SpecError, device_names, get_device, load_device_file
from perfcast.ir.errors import UserError

REQUIRED = ["h100-sxm", "h200-sxm", "b200-sxm", "a100-sxm-80gb", "mi300x", "tpu-v5e", "tpu-v5p",
            "ascend-910b", "ascend-910c-die", "gb200", "b300-sxm", "gb300", "mi325x", "mi355x"]


def test_catalog_has_the_required_devices():
    assert set(REQUIRED) <= set(device_names())


@pytest.mark.parametrize("name", REQUIRED)
def test_shipped_device_loads_with_bf16_and_sources(name):
    d = get_device(name)
    assert d.name == name
    assert d.matrix_flops_per_s("bf16") > 0
    assert d.hbm_bandwidth_bytes_per_s > 0 and d.hbm_capacity_bytes > 0
    assert d.spec.datasheet.links, "every device has scale-up links"
    assert all(len(s) > 10 for s in d.spec.sources.values())


def test_exact_values():
    d = get_device("h100-sxm")
    assert d.matrix_flops_per_s("bf16") == sympy.Integer(989_400_000_000_000)
    assert d.hbm_bandwidth_bytes_per_s == sympy.Integer(3_350_000_000_000)


# Dense bf16 FLOP per clock of the whole part, from its unit counts: the clock in each file is
# the one the matrix peak is quoted at, so peak / clock gives these back (to the rounding of the
# published peak).
FLOP_PER_CLOCK = {
    "h100-sxm": 132 * 4 * 1024,        # 132 SMs x 4 tensor cores x 512 FMA x 2 = 540,672
    "h200-sxm": 132 * 4 * 1024,        # same GH100 configuration
    "a100-sxm-80gb": 108 * 4 * 512,    # 108 SMs x 4 tensor cores x 256 FMA x 2 = 221,184
    "b200-sxm": 148 * 8192,            # 148 SMs x 8192 (twice Hopper's per SM) = 1,212,416
    "mi300x": 304 * 2048,              # 304 CUs x 2048 = 622,592
    "gb200": 148 * 8192,               # B200's GPU at 1,200 W: same SMs, 2.5e15 / 1,212,416 = 2.062 GHz
    "b300-sxm": 148 * 8192,            # Blackwell Ultra: same dense BF16 rate per SM (estimate: 148 SMs)
    "gb300": 148 * 8192,
    "mi325x": 304 * 2048,              # MI300X's CDNA 3 compute dies
    "mi355x": 256 * 4096,              # 256 CDNA 4 CUs x 4096 (twice CDNA 3 per CU) = 1,048,576
    "tpu-v5e": 4 * 128 * 128 * 2,      # 4 MXUs of 128x128 = 131,072
    "tpu-v5p": 2 * 4 * 128 * 128 * 2,  # 2 TensorCores x 4 MXUs = 262,144
    "ascend-910b": 24 * 16**3 * 2,     # 24 cube cores x 16x16x16 MAC = 196,608
    "ascend-910c-die": 24 * 16**3 * 2,
}


@pytest.mark.parametrize("name", sorted(FLOP_PER_CLOCK))
def test_clock_is_the_one_the_matrix_peak_is_quoted_at(name):
    d = get_device(name)
    per_clock = d.matrix_flops_per_s("bf16") / d.clock_hz
    assert abs(per_clock / FLOP_PER_CLOCK[name] - 1) < sympy.Rational(3, 1000)


def test_clock_values_are_exact():
    # H100: 989.4e12 / (132 * 4096) = 1.830e9 (the tensor clock, not the 1.98 GHz max boost)
    assert get_device("h100-sxm").clock_hz == sympy.Integer(1_830_000_000)
    assert get_device("b200-sxm").clock_hz == sympy.Integer(1_856_000_000)
    assert get_device("cpu-local").clock_hz == sympy.Integer(2_445_400_000)
    assert isinstance(get_device("mi300x").clock_hz, sympy.Rational)


@pytest.mark.parametrize("name", sorted(set(REQUIRED) | {"cpu-local"}))
def test_resources_are_whole_device_units_and_link_ports(name):
    d = get_device(name)
    ports = sum(link.count for link in d.spec.datasheet.links.values())
    expected = {"matrix": 1, "vector": 1, "hbm": 1, "onchip": 1} | ({"link": ports} if ports else {})
    assert d.resources == expected
    assert all(d.resource_units(r) == n for r, n in expected.items())
    assert {f"resources.{r}" for r in ("matrix", "vector", "hbm", "onchip")} | {"clock_hz"} <= set(d.spec.sources)


def test_link_ports_default_to_the_link_count():
    assert get_device("h100-sxm").resource_units("link") == 18  # 18 NVLink4 links
    assert get_device("tpu-v5p").resource_units("link") == 6  # 3D torus: 6 neighbours


def test_unknown_resource_is_an_error_naming_the_valid_ones():
    with pytest.raises(UserError, match=r"device h100-sxm has no resource 'tensor'; resources: "
                                        r"matrix, vector, hbm, onchip, link$"):
        get_device("h100-sxm").resource_units("tensor")
    with pytest.raises(UserError, match=r"no resource 'link' \(its datasheet lists no links\); "
                                        r"resources: matrix, vector, hbm, onchip$"):
        get_device("cpu-local").resource_units("link")


def test_explicit_link_ports_are_sourced_and_used(tmp_path):
    def edit(d):
        d["datasheet"]["resources"]["link"] = 9
        d["sources"]["resources.link"] = "half the NVLink ports, for a test"
    assert load_device_file(_variant(tmp_path, edit)).resource_units("link") == 9


def test_missing_dtype_is_an_error():
    with pytest.raises(SpecError, match="no matrix rate for fp4"):
        get_device("h100-sxm").matrix_flops_per_s("fp4")


def test_unknown_device_suggests_close_names():
    with pytest.raises(SpecError, match="did you mean h100-sxm"):
        get_device("h100")


def _variant(tmp_path: Path, edit) -> Path:
    data = yaml.safe_load(Path(get_device("h100-sxm").path).read_text())
    edit(data)
    out = tmp_path / "dev.yaml"
    out.write_text(yaml.safe_dump(data))
    load_device_file.cache_clear()
    return out


@pytest.mark.parametrize("edit, message", [
    (lambda d: d["datasheet"].pop("hbm_bandwidth_bytes_per_s"), "key 'datasheet.hbm_bandwidth_bytes_per_s': missing key"),
    (lambda d: d["datasheet"].update(l2_bytes=1.0), "key 'datasheet.l2_bytes': unknown key"),
    (lambda d: d["datasheet"].update(hbm_capacity_bytes=-1.0), "key 'datasheet.hbm_capacity_bytes': input should be greater than 0"),
    (lambda d: d["datasheet"].update(hbm_capacity_bytes="lots"), "key 'datasheet.hbm_capacity_bytes': input should be a valid number"),
    (lambda d: d["datasheet"]["matrix_flops_per_s"].update(bf17=1.0), "datasheet.matrix_flops_per_s.bf17"),
    (lambda d: d["sources"].pop("hbm_capacity_bytes"), "key 'sources.hbm_capacity_bytes': missing source for hbm_capacity_bytes"),
    (lambda d: d["sources"].update(bogus="x"), "key 'sources.bogus': source given for unknown value bogus"),
    (lambda d: d["calibration"].pop("kernel_static_latency_s"), "calibration.kernel_static_latency_s': missing key"),
    (lambda d: d["calibration"]["efficiency"]["matrix"]["points"].reverse(), "strictly increasing"),
    (lambda d: d["calibration"]["efficiency"]["matrix"]["points"].append([1e15, 1.5]), "less than or equal to 1"),
    (lambda d: d["datasheet"].pop("clock_hz"), "key 'datasheet.clock_hz': missing key"),
    (lambda d: d["datasheet"].update(clock_hz=0.0), "key 'datasheet.clock_hz': input should be greater than 0"),
    (lambda d: d["datasheet"].update(clock_hz="1.83 GHz"), "key 'datasheet.clock_hz': input should be a valid number"),
    (lambda d: d["sources"].pop("clock_hz"), "key 'sources.clock_hz': missing source for clock_hz"),
    (lambda d: d["datasheet"].pop("resources"), "key 'datasheet.resources': missing key"),
    (lambda d: d["datasheet"]["resources"].pop("hbm"), "key 'datasheet.resources.hbm': missing key"),
    (lambda d: d["datasheet"]["resources"].update(tensor=1), "key 'datasheet.resources.tensor': unknown key"),
    (lambda d: d["datasheet"]["resources"].update(matrix=0), "key 'datasheet.resources.matrix': input should be greater than 0"),
    (lambda d: d["datasheet"]["resources"].update(vector=-2), "key 'datasheet.resources.vector': input should be greater than 0"),
    (lambda d: d["datasheet"]["resources"].update(onchip=1.0), "key 'datasheet.resources.onchip': input should be a valid integer"),
    (lambda d: d["sources"].pop("resources.matrix"), "key 'sources.resources.matrix': missing source for resources.matrix"),
    (lambda d: d["datasheet"]["resources"].update(link=4), "key 'sources.resources.link': missing source for resources.link"),
    (lambda d: d["datasheet"]["resources"].update(link=0), "key 'datasheet.resources.link': input should be greater than 0"),
    (lambda d: d["datasheet"]["resources"].update(link=19), "key 'datasheet.resources.link': 19 link ports but the links count 18"),
    (lambda d: d["sources"].update({"resources.link": "no such value"}), "key 'sources.resources.link': source given for unknown value"),
])
def test_strict_loader_names_file_and_key(tmp_path, edit, message):
    path = _variant(tmp_path, edit)
    with pytest.raises(SpecError) as info:
        load_device_file(path)
    text = str(info.value)
    assert text.startswith(str(path)) and "\n" not in text
    assert message in text


def test_unreadable_and_invalid_yaml(tmp_path):
    with pytest.raises(SpecError, match="cannot read"):
        load_device_file(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed\n")
    with pytest.raises(SpecError, match="not valid YAML"):
        load_device_file(bad)


def test_exponent_without_dot_is_a_number(tmp_path):
    text = Path(get_device("h100-sxm").path).read_text().replace("3.35e+12", "3.35e12", 1)
    p = tmp_path / "d.yaml"
    p.write_text(text)
    assert load_device_file(p).hbm_bandwidth_bytes_per_s == 3_350_000_000_000
