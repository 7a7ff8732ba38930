"""Device specifications as data: a strict schema for the YAML files in ``devices/``.

Datasheet values and calibration (efficiency tables, per-kernel static latency) are kept
apart: ``datasheet`` holds the vendor's numbers (and the clock and resource units that a
cycle-level schedule reads), each with an entry in ``sources``;
``calibration`` holds figures derived from per-op measurements (or labelled assumptions), with
sources of their own. The loader rejects a missing, unknown, mistyped or non-positive key with
one line naming the file and the key.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from perfcast.ir.dtypes import DTYPES
from perfcast.ir.errors import UserError

DType = Literal[DTYPES]  # type: ignore[valid-type]
Positive = Annotated[float, Field(strict=True, gt=0)]
PositiveInt = Annotated[int, Field(strict=True, gt=0)]
Efficiency = Annotated[float, Field(strict=True, gt=0, le=1)]
Text = Annotated[str, Field(strict=True, min_length=1)]


class SpecError(UserError):
    """A device (or other spec) file is invalid; the message is one line naming file and key."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Link(_Strict):
    bandwidth_bytes_per_s: Positive  # per link, per direction
    count: PositiveInt
    latency_s: Positive


#: The resources of a device's reservation tables, in report order.
RESOURCES = ("matrix", "vector", "hbm", "onchip", "link")


class Resources(_Strict):
    """How many units of each resource run at once. A leaf priced at a resource's datasheet rate
    occupies all of its units: where that rate is the whole device's (the sum over all SMs, CUs
    or cores), the resource is one unit. ``link`` counts link ports and defaults to the total
    ``count`` over ``links``."""

    matrix: PositiveInt
    vector: PositiveInt
    hbm: PositiveInt  # the HBM / DMA path
    onchip: PositiveInt  # on-chip memory ports (shared memory, LDS, VMEM, L1)
    link: PositiveInt | None = None


class Datasheet(_Strict):
    matrix_flops_per_s: dict[DType, Positive] = Field(min_length=1)
    vector_flops_per_s: dict[DType, Positive] = Field(min_length=1)
    hbm_capacity_bytes: Positive
    hbm_bandwidth_bytes_per_s: Positive
    onchip_capacity_bytes: Positive
    onchip_bandwidth_bytes_per_s: Positive
    clock_hz: Positive  # the clock the matrix peak is quoted at; the cycle of reservation tables
    #: independent cores a kernel spreads its tiles over (SMs, CUs, AI cube cores, MXUs): the
    #: calibrated kernel forms count waves and serial work against it
    compute_units: PositiveInt | None = None
    resources: Resources
    links: dict[str, Link] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _ports(self):
        total = sum(link.count for link in self.links.values())
        if self.resources.link is not None and self.resources.link > total:
            raise ValueError(f"@resources.link: {self.resources.link} link ports but the links "
                             f"count {total}")
        return self


class Curve(_Strict):
    """Efficiency (achieved / peak) as a function of a leaf's size, piecewise linear between
    points, flat beyond the first and last."""

    size: Literal["flops", "bytes"]
    points: list[tuple[Positive, Efficiency]] = Field(min_length=1)

    @model_validator(mode="after")
    def _ascending(self):
        xs = [x for x, _ in self.points]
        if any(b <= a for a, b in zip(xs, xs[1:])):
            raise ValueError("points must be sorted by strictly increasing size")
        return self


class EfficiencyTables(_Strict):
    matrix: Curve | None = None
    vector: Curve | None = None
    memory: Curve | None = None


class Calibration(_Strict):
    kernel_static_latency_s: Positive
    efficiency: EfficiencyTables
    #: a device without measured kernels of its own prices kernel classes with this device's
    #: fitted fractions of peak (at its own peaks), and says so
    kernels_from: Annotated[str, Field(strict=True, pattern=r"^[a-z0-9][a-z0-9.-]*$")] | None = None
    sources: dict[str, Text]

    @model_validator(mode="after")
    def _sourced(self):
        needed = {"kernel_static_latency_s"} | {
            f"efficiency.{k}" for k, v in self.efficiency if v is not None} | (
            {"kernels_from"} if self.kernels_from else set())
        _check_sources(needed, self.sources)
        return self


class DefaultEngine(_Strict):
    """The serving engine a step on this device is priced as when none is asked for, and why
    (an engine profile of :mod:`perfcast.engines`)."""

    name: Text
    reason: Text


class DeviceSpec(_Strict):
    name: Annotated[str, Field(strict=True, pattern=r"^[a-z0-9][a-z0-9.-]*$")]
    description: Text
    vendor: Text
    datasheet: Datasheet
    sources: dict[str, Text]
    calibration: Calibration
    default_engine: DefaultEngine | None = None

    @model_validator(mode="after")
    def _sourced(self):
        _check_sources(set(_leaf_paths(self.datasheet.model_dump(exclude_none=True))), self.sources)
        return self


def _leaf_paths(tree: dict, prefix: str = ""):
    for key, value in tree.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict):
            yield from _leaf_paths(value, path + ".")
        else:
            yield path


def _check_sources(needed: set[str], sources: dict[str, str]) -> None:
    """Every value in ``needed`` has a source, and every source names such a value. The error
    names its key relative to the model (``@sources.KEY:``), resolved by :func:`_first_error`."""
    missing = sorted(needed - set(sources))
    if missing:
        raise ValueError(f"@sources.{missing[0]}: missing source for {missing[0]}")
    unknown = sorted(set(sources) - needed)
    if unknown:
        raise ValueError(f"@sources.{unknown[0]}: source given for unknown value {unknown[0]}")


# YAML 1.1 (PyYAML) reads ``3.35e12`` as a string; accept the YAML 1.2 float forms too.
class _Loader(yaml.SafeLoader):
    pass


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?(?:[eE][-+]?[0-9]+)$"),
    list("-+0123456789"),
)


def read_yaml(path: Path) -> object:
    """Parse a YAML file; errors become one-line :class:`SpecError`."""
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise SpecError(f"{path}: cannot read ({e.strerror})") from None
    try:
        return yaml.load(text, Loader=_Loader)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise SpecError(f"{path}: not valid YAML{where}: {getattr(e, 'problem', e)}") from None


def _first_error(path: Path, err: ValidationError) -> SpecError:
    return SpecError(error_messages(path, err)[0])


def error_messages(path: Path, err: ValidationError) -> list[str]:
    """One line per validation error (``path: key 'LOC': what``)."""
    return [_message(path, e) for e in err.errors()]


def _message(path: Path, e) -> str:
    loc = ".".join(str(p) for p in e["loc"])
    kind = e["type"]
    if kind == "missing":
        what = "missing key"
    elif kind == "extra_forbidden":
        what = "unknown key"
    elif kind == "value_error":
        msg = e["msg"].removeprefix("Value error, ")
        if msg.startswith("@"):
            sub, _, msg = msg[1:].partition(": ")
            loc = f"{loc}.{sub}" if loc else sub
        return f"{path}: key '{loc}': {msg}"
    elif kind in ("union_tag_invalid", "union_tag_not_found"):  # the input is a whole mapping: not echoed
        what = e["msg"][0].lower() + e["msg"][1:]
    else:
        what = f"{e['msg'].lower()} (got {e.get('input')!r})"
    return f"{path}: key '{loc}': {what}"


def parse_spec(model: type[BaseModel], path: Path, data: object) -> BaseModel:
    """Validate ``data`` (read from ``path``) against ``model``; one-line errors."""
    if not isinstance(data, dict):
        raise SpecError(f"{path}: expected a mapping at the top level")
    try:
        return model.model_validate(data)
    except ValidationError as err:
        raise _first_error(path, err) from None


def load_spec(path: Path) -> DeviceSpec:
    return parse_spec(DeviceSpec, path, read_yaml(path))


def shipped_files(folder: str) -> dict[str, Path]:
    """The YAML files shipped in ``perfcast/hardware/<folder>``, by name (file stem)."""
    from importlib import resources

    root = resources.files("perfcast.hardware") / folder
    return {Path(str(p)).stem: Path(str(p)) for p in root.iterdir() if str(p).endswith(".yaml")}


def get_shipped(what: str, folder: str, name: str, load):
    """The shipped ``what`` (device, topology) called ``name``, loaded by ``load(path)``; an
    unknown name is an error that suggests the closest, and a file whose ``name`` key differs
    from its file name is refused."""
    import difflib

    shipped = shipped_files(folder)
    if name not in shipped:
        close = difflib.get_close_matches(name, shipped, n=3, cutoff=0.4)
        hint = f"; did you mean {', '.join(close)}?" if close else f"; known: {', '.join(sorted(shipped))}"
        raise SpecError(f"unknown {what} {name!r}{hint}")
    item = load(shipped[name])
    if item.name != name:
        raise SpecError(f"{item.path}: key 'name' is {item.name!r}, expected {name!r} (the file name)")
    return item
