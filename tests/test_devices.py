"""Devices as data: every shipped file loads and is sourced; the loader is strict."""

from pathlib import Path

import pytest
import sympy
import yaml

from perfcast.hardware import SpecError, device_names, get_device, load_device_file

REQUIRED = ["h100-sxm", "h200-sxm", "b200-sxm", "a100-sxm-80gb", "mi300x", "tpu-v5e", "tpu-v5p",
            "ascend-910b", "ascend-910c-die"]


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
