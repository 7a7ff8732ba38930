"""Devices at run time: the validated spec with exact (Rational) accessors for pricing."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property, lru_cache
from pathlib import Path

import sympy

from perfcast.hardware.spec import (RESOURCES, Curve, DeviceSpec, SpecError, get_shipped, load_spec,
                                    shipped_files)
from perfcast.ir.errors import UserError


#: What-if multipliers a device can be priced under (:func:`scaled`).
WHAT_IF = ("hbm_bandwidth", "matrix_rate", "link_bandwidth")


def scaled(device: "Device", what_if: dict[str, float]) -> "Device":
    """``device`` with datasheet figures multiplied: ``hbm_bandwidth`` (HBM bytes/s),
    ``matrix_rate`` (every dtype's matrix rate), ``link_bandwidth`` (every link type's bytes/s,
    which the calibrated collectives scale with). The name is kept, so the engine's calibrated
    kernel fits still apply — they take the datasheet rates as parameters. A hardware what-if,
    not a real part: reports that use one say so."""
    bad = sorted(set(what_if) - set(WHAT_IF))
    if bad:
        raise UserError(f"what-if {bad[0]!r}: expected one of {', '.join(WHAT_IF)}")
    for k, v in what_if.items():
        if not 0 < v < 1e6:
            raise UserError(f"what-if {k} × {v}: the multiplier must be positive and below 1e6")
    sheet = device.spec.datasheet
    f = {k: float(what_if.get(k, 1.0)) for k in WHAT_IF}
    new = sheet.model_copy(update={
        "hbm_bandwidth_bytes_per_s": sheet.hbm_bandwidth_bytes_per_s * f["hbm_bandwidth"],
        "matrix_flops_per_s": {k: v * f["matrix_rate"] for k, v in sheet.matrix_flops_per_s.items()},
        "links": {k: link.model_copy(update={"bandwidth_bytes_per_s": link.bandwidth_bytes_per_s * f["link_bandwidth"]})
                  for k, link in sheet.links.items()}})
    return Device(device.spec.model_copy(update={"datasheet": new}), device.path)


def exact(value: float) -> sympy.Rational:
    """A YAML number as an exact rational (``3.35e12`` → ``3350000000000``)."""
    return sympy.Rational(repr(float(value)))


@dataclass(frozen=True)
class Device:
    spec: DeviceSpec
    path: Path

    @property
    def name(self) -> str:
        return self.spec.name

    def matrix_flops_per_s(self, dtype: str) -> sympy.Rational:
        """Peak matrix-unit rate for ``dtype``; a dtype the part lacks is an error, never a
        silent substitute."""
        rates = self.spec.datasheet.matrix_flops_per_s
        if dtype not in rates:
            raise SpecError(f"{self.path}: device {self.name} has no matrix rate for {dtype} "
                            f"(has: {', '.join(rates)})")
        return exact(rates[dtype])

    def vector_flops_per_s(self, dtype: str) -> sympy.Rational:
        """Peak vector rate for ``dtype``; falls back to the fp32 rate (vector units compute
        16-bit types at least at the fp32 rate), and says so through :meth:`vector_dtype`."""
        return exact(self.spec.datasheet.vector_flops_per_s[self.vector_dtype(dtype)])

    def vector_dtype(self, dtype: str) -> str:
        rates = self.spec.datasheet.vector_flops_per_s
        return dtype if dtype in rates else "fp32" if "fp32" in rates else next(iter(rates))

    @property
    def hbm_bandwidth_bytes_per_s(self) -> sympy.Rational:
        return exact(self.spec.datasheet.hbm_bandwidth_bytes_per_s)

    @property
    def hbm_capacity_bytes(self) -> sympy.Rational:
        return exact(self.spec.datasheet.hbm_capacity_bytes)

    @property
    def onchip_bandwidth_bytes_per_s(self) -> sympy.Rational:
        return exact(self.spec.datasheet.onchip_bandwidth_bytes_per_s)

    @property
    def clock_hz(self) -> sympy.Rational:
        """The clock the matrix peak is quoted at: one cycle of a reservation table lasts
        ``1 / clock_hz`` seconds."""
        return exact(self.spec.datasheet.clock_hz)

    @property
    def resources(self) -> dict[str, int]:
        """Units of each resource (``matrix``, ``vector``, ``hbm``, ``onchip``, ``link``), in
        that order; ``link`` is the number of link ports (by default the total link count) and is
        absent on a device without links."""
        r = self.spec.datasheet.resources
        ports = r.link if r.link is not None else sum(x.count for x in self.spec.datasheet.links.values())
        units = {"matrix": r.matrix, "vector": r.vector, "hbm": r.hbm, "onchip": r.onchip, "link": ports}
        return {k: units[k] for k in RESOURCES if units[k] > 0}

    def resource_units(self, resource: str) -> int:
        """How many units of ``resource`` run at once; a leaf priced at the resource's full
        datasheet rate occupies all of them."""
        units = self.resources
        if resource not in units:
            lacks = " (its datasheet lists no links)" if resource == "link" else ""
            raise UserError(f"device {self.name} has no resource {resource!r}{lacks}; "
                            f"resources: {', '.join(units)}")
        return units[resource]

    @property
    def kernel_static_latency_s(self) -> sympy.Rational:
        return exact(self.spec.calibration.kernel_static_latency_s)

    def efficiency(self, unit: str) -> Curve | None:
        """The efficiency curve of ``unit`` (matrix, vector, memory): the device's own, else its
        lender's (see :meth:`lender`), else None (uncalibrated)."""
        own = getattr(self.spec.calibration.efficiency, unit)
        if own is not None or self.lender is None:
            return own
        return getattr(get_device(self.lender).spec.calibration.efficiency, unit)

    @cached_property
    def lender(self) -> str | None:
        """The calibrated device whose fitted kernel forms and efficiency curves price this one
        when it has no measured kernels of its own: ``calibration.kernels_from`` if set, else
        the nearest calibrated device by bf16 matrix peak and HBM bandwidth. None for a device
        with calibrations of its own, and for ``cpu-local`` (measured on this machine)."""
        from perfcast.hardware.calibration import calibrated_devices, nearest_calibrated

        if self.spec.calibration.kernels_from:
            return self.spec.calibration.kernels_from
        own = calibrated_devices()
        if self.name in own or self.spec.vendor == "local" or not own:
            return None
        got = nearest_calibrated(self.spec, {n: get_device(n).spec for n in own})
        return got[0] if got else None


def device_names() -> list[str]:
    return sorted(shipped_files("devices"))


@lru_cache(maxsize=None)
def load_device_file(path: str | Path) -> Device:
    path = Path(path)
    return Device(load_spec(path), path)


def get_device(name: str) -> Device:
    """A shipped device by name; an unknown name is an error that suggests the closest."""
    return get_shipped("device", "devices", name, load_device_file)
