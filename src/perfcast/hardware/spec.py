"""Device specifications as data: a strict schema for the YAML files in ``devices/``.

Datasheet values and calibration (efficiency tables, per-kernel static latency) are kept
apart: ``datasheet`` holds the vendor's numbers (and the clock and resource units that a
cycle-level schedule reads), each with an entry in ``sources``;
``calibration`` holds figures derived from per-op measurements (or labelled assumptions), with
sources of their own. The loader rejects a missing, unknown, mistyped or non-positive key with
one line naming the file and the key.
"""

from __future__ import annotations

import functools

from pathlib import Path
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, model_validator

from perfcast.inputs import excerpt, load_yaml, problems_error
from perfcast.ir.dtypes import DTYPES
from perfcast.ir.errors import UserError

#: The range of a figure in a spec, in SI units. The largest shipped figure is 1.5e16 (FP4
#: FLOP/s), the smallest rate 9.4e8 (cpu-local's bf16 FLOP/s); beyond these bounds a figure is
#: a typo or a unit error, and within them every product and quotient of figures stays finite
#: in a float report (a bandwidth of 5e-324 B/s would make a transfer take an infinite time).
MAX_FIGURE = 1e30
MIN_FIGURE = 1e-30
#: The most units, ports, links or devices (per tier of a topology) a count in a spec gives.
MAX_COUNT = 1_000_000
#: The least efficiency (achieved / peak): below it a leaf would take a million times its ideal
#: time, which no measurement shows (the shipped curves start at 0.001).
MIN_EFFICIENCY = 1e-6


def at_least(minimum: float) -> AfterValidator:
    """A bound whose message reads as a figure (``1e-30``, not pydantic's thirty digits)."""

    def check(value: float) -> float:
        if value < minimum:
            raise ValueError(f"expected at least {minimum:g}, got {value!r}")
        return value

    return AfterValidator(check)


def at_most(maximum: float) -> AfterValidator:
    """A bound whose message reads as a figure (``1e+30``, not pydantic's thirty-one digits)."""

    def check(value: float) -> float:
        if value > maximum:
            raise ValueError(f"expected at most {maximum:g}, got {value!r}")
        return value

    return AfterValidator(check)


DType = Literal[DTYPES]  # type: ignore[valid-type]
Positive = Annotated[float, Field(strict=True, gt=0), at_least(MIN_FIGURE), at_most(MAX_FIGURE)]
NonNegative = Annotated[float, Field(strict=True, ge=0), at_most(MAX_FIGURE)]  # a fitted latency may be zero
PositiveInt = Annotated[int, Field(strict=True, gt=0, le=MAX_COUNT)]
Efficiency = Annotated[float, Field(strict=True, gt=0, le=1), at_least(MIN_EFFICIENCY)]
Text = Annotated[str, Field(strict=True, min_length=1)]


class SpecError(UserError):
    """A device (or other spec) file is invalid; the message is one line naming file and key, or
    a report of every problem in the file, a line each."""


class _Strict(BaseModel):
    # NaN and infinity (YAML's .nan, .inf, and 1e400) are not figures
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


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
    #: an NVIDIA GPU's CUDA compute capability (``major.minor``): which kernels' tile shapes apply
    #: (FlashMLA's sparse kernels pad query heads to 64 on SM90, 128 on SM100+)
    compute_capability: Annotated[str, Field(strict=True, pattern=r"^[0-9]+\.[0-9]+$")] | None = None
    #: how much longer this system's host takes to issue an engine's eager forward than the x86
    #: hosts the engines' per-kernel host intervals were measured on (None: the same); scales
    #: every engine's host launch interval on it (docs/design/engines.md, "Launches")
    host_issue_scale: Positive | None = None
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
    #: kernel class → the device whose fits of it price this one where its own measured tables
    #: have none of that class (at this device's peaks, labelled derived), e.g. a kernel the
    #: profiling campaign ran on the previous generation only
    classes_from: dict[Annotated[str, Field(strict=True, pattern=r"^[a-z][a-z0-9_.]*$")],
                       Annotated[str, Field(strict=True, pattern=r"^[a-z0-9][a-z0-9.-]*$")]] = {}
    sources: dict[str, Text]

    @model_validator(mode="after")
    def _sourced(self):
        needed = {"kernel_static_latency_s"} | {
            f"efficiency.{k}" for k, v in self.efficiency if v is not None} | (
            {"kernels_from"} if self.kernels_from else set()) | {f"classes_from.{c}" for c in self.classes_from}
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


def _check_sources(needed: set[str], sources: dict[str, str], key: str = "sources") -> None:
    """Every value in ``needed`` has a source, and every source names such a value. Each
    problem is a line naming its key relative to the model (``@sources.KEY: what``), resolved by
    :func:`problems`."""
    found = source_problems(needed, sources, key)
    if found:
        raise ValueError("\n".join(found))


def source_problems(needed: set[str], sources: dict[str, str], key: str = "sources") -> list[str]:
    """What :func:`_check_sources` refuses, a line per value without a source or source without
    a value, under ``key`` (the mapping that holds the sources)."""
    return ([f"@{key}.{k}: missing source for {k}" for k in sorted(needed - set(sources))]
            + [f"@{key}.{k}: source given for unknown value {k}" for k in sorted(set(sources) - needed)])


def read_yaml(path: Path) -> object:
    """Parse a YAML file with perfcast's safe loader (:func:`perfcast.inputs.load_yaml`: YAML 1.2
    numbers, bounded size, aliases and depth, no repeated keys); errors become a
    :class:`SpecError` naming the file."""
    try:
        return load_yaml(path)
    except SpecError:
        raise
    except UserError as e:
        raise SpecError(str(e)) from None


def error_messages(path: Path, err: ValidationError) -> list[str]:
    """One line per validation error (``path: key 'LOC': what``)."""
    return [f"{path}: {p}" for p in problems(err)]


def problems(err: ValidationError) -> list[str]:
    """One line per problem pydantic found (``key 'LOC': what``), in the order of the model's
    fields; a model check that finds several problems reports each on its own line."""
    return [line for e in err.errors() for line in _problem(e)]


def _problem(e) -> list[str]:
    loc = ".".join(_key(p) for p in e["loc"])
    kind = e["type"]
    if kind == "value_error":  # a model check: "@KEY: what" per line, KEY relative to the model
        out = []
        for msg in e["msg"].removeprefix("Value error, ").splitlines():
            where = loc
            if msg.startswith("@"):
                sub, _, msg = msg[1:].partition(": ")
                where = f"{loc}.{sub}" if loc else sub
            out.append(f"key '{where}': {msg}")
        return out
    if kind == "missing":
        what = "missing key"
    elif kind == "extra_forbidden":
        what = "unknown key"
    elif kind in ("union_tag_invalid", "union_tag_not_found"):  # the input is a whole mapping: not echoed
        what = e["msg"][0].lower() + e["msg"][1:]
    else:
        what = f"{e['msg'].lower()} (got {excerpt(e.get('input'))})"
    return [f"key '{loc}': {what}"]


def _key(part: object) -> str:
    """A key of a location as a report shows it: as written when it is short and printable,
    else a short excerpt (a key of junk may hold a newline or ten thousand characters)."""
    text = str(part)
    return text if text.isprintable() and len(text) <= 60 and "'" not in text else excerpt(part)


def parse_spec(model: type[BaseModel], path: Path, data: object) -> BaseModel:
    """Validate ``data`` (read from ``path``) against ``model``. Every problem is reported at
    once: one line when there is one, else ``path: N problems`` and a line per problem."""
    if not isinstance(data, dict):
        got = "an empty file" if data is None else f"got {excerpt(data)}"
        raise SpecError(f"{path}: expected a mapping at the top level ({got})")
    try:
        return model.model_validate(data)
    except ValidationError as err:
        raise problems_error(path, problems(err), SpecError) from None


def load_spec(path: Path) -> DeviceSpec:
    return parse_spec(DeviceSpec, path, read_yaml(path))


def shipped_files(folder: str) -> dict[str, Path]:
    """The YAML files shipped in ``perfcast/hardware/<folder>``, by name (file stem); the
    folder is listed once per process (the package's files do not change under it)."""
    return dict(_shipped_files(folder))


@functools.lru_cache(maxsize=None)
def _shipped_files(folder: str) -> tuple[tuple[str, Path], ...]:
    from importlib import resources

    root = resources.files("perfcast.hardware") / folder
    return tuple(sorted((Path(str(p)).stem, Path(str(p))) for p in root.iterdir() if str(p).endswith(".yaml")))


def template_path(what: str) -> Path:
    """The commented starting file for a ``what`` (``device``, ``topology``) of one's own: every
    key with its unit and meaning, placeholder values from a real part, and a source for each."""
    from importlib import resources

    return Path(str(resources.files("perfcast.hardware") / "templates" / f"{what}.yaml"))


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
