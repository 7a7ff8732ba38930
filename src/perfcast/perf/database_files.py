"""What a profiling database may say and where its files may be.

- The ``op_mapping.yaml`` schema (pydantic, strict): names are short plain strings, a table is a
  relative ``.csv`` / ``.csv.gz`` path, a kernel's axes are numeric key columns, a transform
  applies to an axis, an op of a priced category names its kernel type.
- Paths: every file a database names (its tables, its ``communication`` directory and the
  tables there, its ``MANIFEST.yaml``) is resolved, symlinks followed, and must lie inside the
  database's root — its device folder when the database lies at
  ``{device}/{framework}/{version}/`` in folders named as its mapping names them (collectives
  live in ``{device}/{comm-library}/{version}/``, a sibling), else the database's own folder. An absolute path, or one that climbs out (``../../../../etc/passwd``, a symlink
  to elsewhere), is refused with one line: perfcast never opens a file outside the database it
  was given.
- Identity: the device the mapping declares must agree with the folders it lies in and the
  ``MANIFEST.yaml`` beside it.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator, model_validator

from perfcast.hardware.spec import SpecError, read_yaml
from perfcast.inputs import excerpt
from perfcast.perf.databases import TABLE_SUFFIXES

#: Key columns read as text even when every value looks like a number (``1000`` is a shape, not a
#: number); every other key column holds non-negative numbers (sizes, counts, flags).
TEXT_COLUMNS = ("shape", "dtype", "kv_dtype", "routing")

#: Columns of a measured table that are statistics or provenance, not keys.
STATISTICS = ("latency_us", "std_us", "p10_us", "p90_us", "samples", "rounds", "how", "kernel_source")


def _name(value: object) -> str:
    if not (isinstance(value, str) and _NAME.fullmatch(value)):
        raise ValueError(f"expected a name of letters, digits and . _ + - (at most 100 characters), "
                         f"got {excerpt(value)}")
    return value


def _text(limit: int, what: str):
    def check(value: object) -> str:
        if not (isinstance(value, str) and 0 < len(value) <= limit and value.isprintable()):
            raise ValueError(f"expected {what} (printable, at most {limit} characters), got {excerpt(value)}")
        return value
    return check


def _one_of(*choices: str):
    def check(value: object) -> str:
        if value not in choices or not isinstance(value, str):
            raise ValueError(f"expected one of {', '.join(choices)}, got {excerpt(value)}")
        return value
    return check


_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]{0,99}")
#: A device, framework, version, kernel-type or column name: what folder and file names allow
#: (``2.13.0+cpu`` is torch's version string). Checked before pydantic's own checks, so a
#: refusal quotes a short excerpt of the value.
Name = Annotated[str, BeforeValidator(_name)]
#: A path relative to the mapping: printable (no NUL: an OS refuses it), bounded.
RelPath = Annotated[str, BeforeValidator(_text(1000, "a relative path"))]
OpName = Annotated[str, BeforeValidator(_text(300, "an op name"))]
Reason = Annotated[str, BeforeValidator(_text(1000, "a reason"))]
Transform = Annotated[str, BeforeValidator(_one_of("linear", "sqrt", "log"))]

#: Categories that price a leaf from a table, so name one.
PRICED = ("communication", "attention_special", "elementwise", "moe_fused", "compute")
Category = Annotated[str, BeforeValidator(_one_of("composite", "zero_cost", "accepted_miss", *PRICED))]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _relative(value: str) -> str:
    if Path(value).is_absolute():
        raise ValueError(f"{excerpt(value)} is an absolute path; a database names its files relative to its folder")
    return value


class KernelSpec(_Strict):
    file: RelPath
    keys: list[Name] = Field(min_length=1, max_length=64)
    axes: list[Name] = Field(default_factory=list)
    transform: dict[Name, Transform] = Field(default_factory=dict)

    @field_validator("file")
    @classmethod
    def _table_file(cls, value: str) -> str:
        if not value.endswith(TABLE_SUFFIXES):
            raise ValueError(f"{excerpt(value)} is not a table (expected a .csv or .csv.gz file)")
        return _relative(value)

    @model_validator(mode="after")
    def _columns(self):
        if len(set(self.keys)) != len(self.keys):
            raise ValueError("@keys: a column is named twice")
        if "latency_us" in self.keys:
            raise ValueError("@keys: latency_us is the measurement, not a key column")
        for a in self.axes:
            if a not in self.keys:
                raise ValueError(f"@axes: {a!r} is not one of the keys")
            if a in TEXT_COLUMNS:
                raise ValueError(f"@axes: {a!r} holds names, not numbers to interpolate in")
        for a in self.transform:
            if a not in self.axes:
                raise ValueError(f"@transform: {a!r} is not one of the axes")
        return self


class OpEntry(_Strict):
    category: Category
    kernel_type: Name | None = None
    alternate_kernel_types: list[Name] = Field(default_factory=list)
    reason: Reason | None = None

    @model_validator(mode="after")
    def _kernel_named(self):
        if self.category in PRICED and self.kernel_type is None:
            raise ValueError(f"@kernel_type: missing (a {self.category} op is priced from a kernel table)")
        if self.category not in PRICED and (self.kernel_type or self.alternate_kernel_types):
            raise ValueError(f"@kernel_type: a {self.category} op is priced from no table; drop it")
        return self


class Mapping(_Strict):
    schema_version: Literal[1] = Field(alias="schema")
    device: Name
    framework: Name
    version: Name
    communication: RelPath | None = None
    kernels: dict[Name, KernelSpec]
    ops: dict[OpName, OpEntry]

    @field_validator("schema_version", mode="before")
    @classmethod
    def _schema_is_an_int(cls, value):
        if type(value) is not int:  # YAML `true` equals 1 in Python; `1.0` is not the schema number
            raise ValueError(f"expected the integer 1, got {excerpt(value)}")
        return value

    @field_validator("communication")
    @classmethod
    def _communication_relative(cls, value: str | None) -> str | None:
        return None if value is None else _relative(value)



def database_root(folder: Path, device: object, framework: object, version: object) -> Path:
    """The folder every path of the database at ``folder`` (resolved) must lie in: the device
    folder when the database lies at ``{device}/{framework}/{version}/`` exactly as its mapping
    names them (as ``perfcast db import`` and ``perfcast profile`` write it), else ``folder``
    itself — so a mapping cannot widen its reach by naming the folders above wherever it was
    unpacked."""
    up = folder.parent.parent
    if folder.name == version and folder.parent.name == framework and up.name == device and up != folder.parent:
        return up
    return folder


def inside(root: Path, folder: Path, name: str, where: str) -> Path:
    """``folder / name`` resolved (symlinks followed), or a SpecError naming ``where`` when
    ``name`` is absolute or the path leads out of ``root``."""
    if Path(name).is_absolute():
        raise SpecError(f"{where}: {excerpt(name)} is an absolute path; a database names its files relative "
                        f"to its folder")
    try:
        target = (folder / name).resolve()
        base = root.resolve()
    except (OSError, ValueError, RuntimeError) as e:  # a symlink loop, a name the OS refuses
        raise SpecError(f"{where}: {excerpt(name)}: cannot resolve ({e})") from None
    if not target.is_relative_to(base):
        shown = str(target) if len(str(target)) <= 160 else str(target)[:160] + "…"
        raise SpecError(f"{where}: {excerpt(name)} leads to {shown}, outside the database "
                        f"root {base}; a database reads only files inside its device folder")
    return target


def identity_problems(folder: Path, mapping: Mapping, manifest: bool = True) -> list[str]:
    """Where the mapping's device, framework or version disagrees with the
    ``{device}/{framework}/{version}`` folders it lies in (when the other two agree: a tree laid
    out for finding databases), or (``manifest``) its device with the ``MANIFEST.yaml`` beside it. Loading compares the folders
    only (the manifest is documentation, and parsing it would cost a shipped database's load
    ~10 %); ``perfcast db check`` compares both."""
    problems = []
    where = folder / "op_mapping.yaml"
    folders = (folder.parent.parent.name, folder.parent.name, folder.name)
    declared = (mapping.device, mapping.framework, mapping.version)
    if sum(a == b for a, b in zip(folders, declared)) == 2:  # laid out as a database tree, one name off
        problems.append(f"{where}: declares {'/'.join(declared)} but lies in "
                        f"{excerpt('/'.join(folders), 120)}/ (the folders name the device, framework and "
                        f"version a database is found by)")
    manifest = folder / "MANIFEST.yaml" if manifest else None
    if manifest is not None and (manifest.exists() or manifest.is_symlink()):
        try:
            root = database_root(folder, mapping.device, mapping.framework, mapping.version)
            data = read_yaml(inside(root, folder, "MANIFEST.yaml", str(manifest)))
        except SpecError as e:
            return [*problems, str(e)]
        said = data.get("device") if isinstance(data, dict) else None
        if said is not None and said != mapping.device:
            problems.append(f"{manifest}: key 'device': {excerpt(said)}, but {where} declares {mapping.device}")
    return problems
