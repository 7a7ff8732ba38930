"""Kernel calibrations as data: per device and per engine version, the fitted parameters of
each kernel class (see :mod:`perfcast.perf.kernel_fit` for the form), with where they came from.

Files: ``calibration/<device>/<framework>-<version>.yaml``, written by ``perfcast db calibrate``
from a profiling database's measured kernels and never edited by hand. Every fit names its
measured rows and its out-of-sample error. The loader is strict (one line naming file and key).
"""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, model_validator

from perfcast.hardware.spec import (MAX_FIGURE, NonNegative, Positive, SpecError, Text, _Strict, at_least, at_most,
                                    parse_spec, read_yaml)
from perfcast.inputs.versions import version_key

#: A fitted figure without a sign (a residual's log ratio, its cells' centres), finite
Figure = Annotated[float, Field(strict=True), at_least(-MAX_FIGURE), at_most(MAX_FIGURE)]


class RampSpec(_Strict):
    peak_fraction: Positive
    half_time_s: Positive
    slope: Positive


class ResidualSpec(_Strict):
    axes: tuple[Text, Text]
    centres: tuple[list[Figure], list[Figure]]
    log_ratio: list[list[Figure]]

    @model_validator(mode="after")
    def _grid(self):
        rows, cols = len(self.centres[0]), len(self.centres[1])
        if rows < 2 or cols < 2:
            raise ValueError("@centres: each axis needs at least two cell centres")
        if len(self.log_ratio) != rows or any(len(r) != cols for r in self.log_ratio):
            raise ValueError(f"@log_ratio: expected a {rows} x {cols} grid")
        for axis in self.centres:
            if any(b <= a for a, b in zip(axis, axis[1:])):
                raise ValueError("@centres: cell centres must increase strictly")
        return self


class OutOfSample(_Strict):
    folds: Annotated[int, Field(strict=True, ge=2)]
    median: NonNegative
    p90: NonNegative


class FitSpec(_Strict):
    static_s: NonNegative
    overlap: Annotated[float, Field(strict=True, ge=1), at_most(MAX_FIGURE)]
    compute: RampSpec | None = None
    memory: RampSpec | None = None
    item_s: dict[str, NonNegative] = Field(default_factory=dict)
    residual: ResidualSpec | None = None
    rows: Annotated[int, Field(strict=True, gt=0)]
    out_of_sample: OutOfSample
    source: Text


class CalibrationFile(_Strict):
    schema_version: Literal[1] = Field(alias="schema")
    device: Text
    framework: Text
    version: Text
    database: Text  # the profiling database the fits were made from
    fits: dict[str, FitSpec] = Field(min_length=1)  # "<class>/<variant>" → fit
    # "<class>/<variant>" → why the database's table of it was not fitted (the device's other
    # engines' fit prices it, and the note says why)
    rejected: dict[str, Text] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _keys(self):
        for key in (*self.fits, *self.rejected):
            if not re.fullmatch(r"[a-z][a-z0-9._]*/[A-Za-z0-9_+]+", key):
                raise ValueError(f"@fits.{key}: expected '<kernel class>/<variant>', e.g. gemm/bf16")
        return self


def calibration_root() -> Path:
    from importlib import resources

    return Path(str(resources.files("perfcast.hardware") / "calibration"))


@lru_cache(maxsize=None)
def load_calibration_file(path: Path) -> CalibrationFile:
    return parse_spec(CalibrationFile, path, read_yaml(path))


def calibration_files(device: str) -> list[Path]:
    folder = calibration_root() / device
    return sorted(folder.glob("*.yaml")) if folder.is_dir() else []


def find_calibration(device: str, framework: str | None = None, version: str | None = None) -> Path | None:
    """The shipped calibration of ``device`` for ``framework`` (the newest version unless
    ``version`` is given); without a framework, the first framework by name (trtllm before vllm
    before sglang, the engines' order of preference in aiconfigurator's own tables). None when
    the device has none for the framework."""
    found = []
    for path in calibration_files(device):
        fw, _, ver = path.stem.partition("-")
        if framework is not None and fw != framework:
            continue
        if version is not None and ver != version:
            continue
        found.append((_PREFERENCE.get(fw, 9), fw, version_key(ver), path))
    if not found:
        return None
    best_fw = min(found)[:2]
    return max((f for f in found if f[:2] == best_fw), key=lambda f: f[2])[3]


_PREFERENCE = {"trtllm": 0, "vllm": 1, "sglang": 2}


def check_device(cal: CalibrationFile, path: Path, device: str) -> None:
    if cal.device != device:
        raise SpecError(f"{path}: key 'device' is {cal.device!r}, expected {device!r} (its folder)")


def calibrated_devices() -> list[str]:
    """Devices with shipped kernel calibrations (measured kernels of their own)."""
    root = calibration_root()
    return sorted(p.name for p in root.iterdir() if p.is_dir() and any(p.glob("*.yaml"))) if root.is_dir() else []


def nearest_calibrated(spec, specs: dict) -> tuple[str, float] | None:
    """The calibrated device closest to ``spec`` in log bf16 matrix peak and log HBM bandwidth
    (Euclidean; the two numbers that set where a kernel sits on the roofline), with the
    distance. ``specs``: calibrated device name → its DeviceSpec."""
    import math

    def point(s):
        rates = s.datasheet.matrix_flops_per_s
        peak = rates.get("bf16") or rates.get("fp16") or max(rates.values())
        return math.log(peak), math.log(s.datasheet.hbm_bandwidth_bytes_per_s)

    here = point(spec)
    best = min(((math.dist(here, point(s)), n) for n, s in specs.items() if n != spec.name), default=None)
    return (best[1], best[0]) if best else None
