"""Pricing a leaf with its kernel class's calibrated fit.

:class:`KernelCalibration` holds one device's fits for one engine version (a shipped
calibration file, or another device's when this one has no measured kernels of its own: then
the fits are *borrowed* — the lender's fractions of peak and kernel granularity at this device's
peaks — and every note says so). :meth:`KernelCalibration.price` turns a leaf into a time:
exact (a rational) when its sizes are numbers; an opaque function application such as
``t_gemm_bf16(2*B*4096*6144, …)`` when they are symbolic, which :meth:`realize` evaluates at a
point and :meth:`numpy_functions` vectorises for ``lambdify``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import sympy

from perfcast.hardware.calibration import (_PREFERENCE, CalibrationFile, FitSpec, calibration_files,
                                           check_device, find_calibration, load_calibration_file)
from perfcast.hardware.device import Device, exact
from perfcast.hardware.spec import SpecError
from perfcast.ir import Leaf
from perfcast.perf.classify import classify
from perfcast.perf.kernel_classes import CLASSES, NEAREST, KernelClass, Shape
from perfcast.perf.kernel_fit import KernelFit, KernelWork, Ramp, Residual


def to_fit(spec: FitSpec) -> KernelFit:
    ramp = (lambda r: Ramp(r.peak_fraction, r.half_time_s, r.slope) if r is not None else None)
    res = spec.residual
    return KernelFit(spec.static_s, spec.overlap, ramp(spec.compute), ramp(spec.memory), dict(spec.item_s),
                     Residual(tuple(res.axes), (tuple(res.centres[0]), tuple(res.centres[1])),
                              tuple(tuple(r) for r in res.log_ratio)) if res is not None else None)


@dataclass
class KernelCalibration:
    device: Device  # the device priced
    file: CalibrationFile
    path: Path
    units: int  # compute units the fits count work against (the lender's when borrowed)
    lender: str | None = None  # the device whose fits these are, when borrowed
    others: tuple[CalibrationFile, ...] = ()  # the same device's other engines, for classes this one lacks
    #: kernel class → (another device's calibration of this framework, its compute units): the
    #: device spec's ``calibration.classes_from``, for a class none of this device's files fit
    kin: dict[str, tuple[CalibrationFile, int]] = field(default_factory=dict)
    _fits: dict[str, KernelFit] = field(default_factory=dict)
    _from: dict[str, CalibrationFile] = field(default_factory=dict)
    _functions: dict[str, tuple] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return self.label_of(self.file)

    def label_of(self, cal: CalibrationFile, key: str | None = None) -> str:
        """Whose fits ``cal`` holds; for another engine's fit of ``key``, why this engine's own is
        missing (its tables have none, or its table was rejected, with the reason)."""
        own = f"{cal.framework} {cal.version} fit on {cal.device} measurements"
        if key is not None and self._kin(key) is cal:
            return own + (f", borrowed for {self.device.name} (device spec calibration.classes_from: its own "
                          f"measured tables have no {key.split('/', 1)[0]})")
        if cal is not self.file:
            why = self.file.rejected.get(key) if key is not None else None
            own += f"; {self.file.framework} {self.file.version}'s " + (
                f"own table rejected: {why}" if why else "tables have none")
        return own + (f", borrowed for {self.device.name}" if self.lender else "")

    def source_of(self, key: str) -> str:
        return self.label_of(self._from[key], key)

    def fit(self, key: str) -> KernelFit | None:
        """The class's fit from this engine's calibration, else from the device's other engines
        (in the order trtllm, vllm, sglang; the note names which)."""
        if key not in self._fits:
            kin = self._kin(key)
            for cal in (self.file, *self.others, *((kin,) if kin is not None else ())):
                if key in cal.fits:
                    self._fits[key], self._from[key] = to_fit(cal.fits[key]), cal
                    break
        return self._fits.get(key)

    def _kin(self, key: str) -> CalibrationFile | None:
        """The other device's calibration that fits ``key``'s class for this one, if the device
        spec names one (``calibration.classes_from``)."""
        got = self.kin.get(key.split("/", 1)[0])
        return got[0] if got else None

    def borrowed(self, key: str) -> bool:
        """Whether the fit ``key`` is another device's, taken for a class this device's tables lack."""
        return self.fit(key) is not None and self._from[key] is self._kin(key)

    def lookup(self, leaf: Leaf) -> tuple[str, KernelClass, Shape, KernelFit, str] | None:
        """(the leaf's key, its class, shape, the fit that prices it, that fit's key). A format
        this calibration has no fit for takes the nearest fit whose kernel does the same work
        (:data:`perfcast.perf.kernel_classes.NEAREST`, then the class's own ``siblings``, then
        its fallback class's), at the format's own bytes and rate: the two keys then differ and
        the result is labelled derived."""
        got = classify(leaf)
        if got is None:
            return None
        cls, shape = got
        if cls.device_shape is not None:
            shape = {**shape, **cls.device_shape(self.device)}
        variant = cls.variant(shape)
        key = f"{cls.name}/{variant}"
        own = dict(cls.siblings).get(variant, ())
        for name in (cls.name, *((cls.fallback,) if cls.fallback else ())):
            for alt in (variant, *NEAREST.get(variant, ()), *(own if name == cls.name else ())):
                fit = self.fit(f"{name}/{alt}")
                if fit is not None:
                    return key, cls, shape, fit, f"{name}/{alt}"
        return None

    def price(self, key: str, cls: KernelClass, shape: Shape, fit: KernelFit, rate, bandwidth):
        """(time, breakdown) of one kernel: exact numbers, or opaque applications."""
        kin = self.kin.get(key.split("/", 1)[0]) if self.borrowed(key) else None
        work = cls.work(shape, kin[1] if kin else self.units)
        items = sorted(fit.item_s)
        axes = list(fit.residual.axes) if fit.residual is not None else []
        args = [work.flops, work.bytes, rate, bandwidth, *(work.items[i] for i in items),
                *(work.axes[a] for a in axes)]
        args = [sympy.sympify(a) for a in args]
        if all(a.is_number for a in args):
            vals = [float(a) for a in args]
            w = _work(vals, items, axes)
            terms = fit.terms(w, vals[2], vals[3])
            time = exact(float(fit.time(w, vals[2], vals[3])))
            breakdown = {_term(k): exact(float(v)) for k, v in terms.items()}
            breakdown["latency.kernel"] = exact(fit.static_s)
            return time, breakdown
        f_time, f_compute, f_memory = self._opaque(key, fit, items, axes)
        breakdown = {"latency.kernel": exact(fit.static_s)}
        if fit.compute is not None:
            breakdown["compute"] = f_compute(args[0], args[2])
        if fit.memory is not None:
            breakdown["memory.hbm"] = f_memory(args[1], args[3])
        return f_time(*args), breakdown

    def used(self) -> list[str]:
        """The fit keys whose opaque functions symbolic prices have called so far."""
        return sorted(self._functions)

    def restore(self, keys) -> None:
        """Create the opaque functions of ``keys`` (as :meth:`used` listed them) without pricing a
        leaf, so a cached lambdified expression finds them in :meth:`numpy_functions`;
        :class:`KeyError` for a key this calibration has no fit for."""
        for key in keys:
            fit = self.fit(key)
            if fit is None:
                raise KeyError(key)
            self._opaque(key, fit, sorted(fit.item_s), list(fit.residual.axes) if fit.residual is not None else [])

    def _opaque(self, key: str, fit: KernelFit, items: list[str], axes: list[str]):
        if key not in self._functions:
            base = re.sub(r"[^A-Za-z0-9]+", "_", key).strip("_")

            def time(*a):
                return fit.time(_work(a, items, axes), a[2], a[3])

            def compute(w, rate):
                return np.asarray(w, dtype=float) / (rate * fit.compute(w, rate))

            def memory(q, bw):
                return np.asarray(q, dtype=float) / (bw * fit.memory(q, bw))

            self._functions[key] = tuple(
                (sympy.Function(f"{prefix}_{base}", positive=True), impl)
                for prefix, impl in (("t", time), ("tc", compute), ("tm", memory)))
        return tuple(f for f, _ in self._functions[key])

    def realize(self, expr: sympy.Expr) -> sympy.Expr:
        for func, impl in (pair for triple in self._functions.values() for pair in triple):
            expr = expr.replace(func, lambda *a, _f=func, _i=impl: exact(float(_i(*map(float, a))))
                                if all(sympy.sympify(x).is_number for x in a) else _f(*a))
        return expr

    def numpy_functions(self) -> dict[str, object]:
        return {str(func): impl for triple in self._functions.values() for func, impl in triple}


def _work(vals, items: list[str], axes: list[str]) -> KernelWork:
    n = len(items)
    return KernelWork(vals[0], vals[1], dict(zip(items, vals[4:4 + n])), dict(zip(axes, vals[4 + n:])))


def _term(name: str) -> str:
    return {"compute": "compute", "memory": "memory.hbm"}.get(name, f"latency.{name}")


def kernel_calibration(device: Device, framework: str | None = None,
                       version: str | None = None) -> KernelCalibration | None:
    """The device's own fits for the engine's framework (the version asked for, else the newest
    of that framework); for a device without measured kernels, its lender's (at this device's
    peaks, labelled borrowed; the lender's default framework when it has none for this one).
    None when neither has fits."""
    lender = device.lender
    name = device.name if lender is None else lender
    path = find_calibration(name, framework, version) or find_calibration(name, framework)
    if path is None and lender is not None:
        path = find_calibration(name)
    if path is None:
        return None
    cal = load_calibration_file(path)
    check_device(cal, path, name)
    owner = device if lender is None else _device(name)
    units = owner.spec.datasheet.compute_units
    if units is None:
        return None
    others = tuple(load_calibration_file(p) for p in calibration_files(name) if p != path)
    others = tuple(sorted(others, key=lambda c: _PREFERENCE.get(c.framework, 9)))
    kin = {}
    for cls_name, other in owner.spec.calibration.classes_from.items():
        if cls_name not in CLASSES:
            raise SpecError(f"device {owner.name}: calibration.classes_from: {cls_name!r} is not a kernel class "
                            f"(expected one of {', '.join(sorted(CLASSES.keys()))})")
        lender_device = _device(other)  # an unknown device: its own error
        kin_path = find_calibration(lender_device.name, cal.framework)
        if kin_path is not None:
            kin_cal = load_calibration_file(kin_path)
            check_device(kin_cal, kin_path, other)
            kin[cls_name] = (kin_cal, lender_device.spec.datasheet.compute_units)
    return KernelCalibration(device, cal, path, units, lender, others, kin)


def _device(name: str) -> Device:
    from perfcast.hardware.device import get_device

    return get_device(name)
