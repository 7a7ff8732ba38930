"""Finding profiling databases: the shipped ones, and any tree laid out like them.

A database root holds ``{device}/{framework}/{version}/op_mapping.yaml`` for each measured
combination (collectives in ``{device}/{comm-library}/{version}/``, which has no mapping of its
own). :func:`find_database` picks one directory:

- ``path`` that holds an ``op_mapping.yaml`` is the database itself;
- otherwise ``{path or the shipped root}/{device}/{framework}/{version}/``: the named framework
  (when ``framework`` is None, the first present of :data:`FRAMEWORK_ORDER`, then any other
  by name) at the named version, or its newest (:func:`version_key`: release candidates before
  their release, post-releases after — ``1.3.0rc20 < 1.3.0rc23 < 1.3.0 < 1.3.0.post1``).

A combination that is not there is a one-line error naming what is.

Kernel tables are ``{KernelType}.csv`` or ``{KernelType}.csv.gz`` (gzip: the shipped tables;
pandas reads both); :func:`table_files` finds them and refuses a directory that has both forms
of one table.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from perfcast.hardware.spec import SpecError, read_yaml
from perfcast.inputs.versions import version_key  # noqa: F401  (re-exported)

#: The framework picked when none is asked for: TensorRT-LLM first — the only framework shipped
#: before vLLM and SGLang were, so a caller that names none keeps pricing as before, and the one
#: whose measured tables cover every kernel family (MLA included) on every shipped device.
FRAMEWORK_ORDER = ("trtllm", "vllm", "sglang")

#: File suffixes of a kernel table, in the order they are looked for.
TABLE_SUFFIXES = (".csv", ".csv.gz")


def shipped_root() -> Path:
    from importlib import resources

    return Path(str(resources.files("perfcast") / "data" / "profiling"))


def table_name(path: Path) -> str:
    """``MatMul.csv`` and ``MatMul.csv.gz`` → ``MatMul``."""
    name = path.name
    for suffix in sorted(TABLE_SUFFIXES, key=len, reverse=True):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return path.stem


def table_files(directory: Path) -> dict[str, Path]:
    """The kernel tables in ``directory`` by name (``X.csv`` or ``X.csv.gz``), sorted."""
    found: dict[str, Path] = {}
    for suffix in TABLE_SUFFIXES:
        for path in sorted(Path(directory).glob(f"*{suffix}")):
            name = table_name(path)
            if name in found:
                raise SpecError(f"{directory}: table {name} is both {found[name].name} and {path.name}; keep one")
            found[name] = path
    return dict(sorted(found.items()))


@dataclass(frozen=True)
class Database:
    """One ``{device}/{framework}/{version}`` directory of a database root."""

    device: str
    framework: str
    version: str
    path: Path


def databases(root: str | Path | None = None, device: str | None = None) -> list[Database]:
    """Every database under ``root`` (default: the shipped ones), optionally of one device,
    sorted by device, then framework in :data:`FRAMEWORK_ORDER`, then newest version first."""
    root = Path(root) if root is not None else shipped_root()
    pattern = f"{device}/*/*/op_mapping.yaml" if device else "*/*/*/op_mapping.yaml"
    found = [Database(p.parts[-4], p.parts[-3], p.parts[-2], p.parent) for p in root.glob(pattern)]
    found.sort(key=lambda d: version_key(d.version), reverse=True)  # stable: newest first within
    found.sort(key=lambda d: (d.device, _framework_rank(d.framework)))
    return found


def _framework_rank(framework: str) -> tuple:
    return (FRAMEWORK_ORDER.index(framework), "") if framework in FRAMEWORK_ORDER else (len(FRAMEWORK_ORDER), framework)


def _have(found: list[Database]) -> str:
    return ", ".join(f"{d.framework} {d.version}" for d in found) or "none"


def find_database(device: str, path: str | Path | None = None, framework: str | None = None,
                  version: str | None = None) -> Path:
    """The database directory for ``device`` (see the module docstring for the selection)."""
    root = Path(path) if path is not None else shipped_root()
    if (root / "op_mapping.yaml").exists():
        return _check_direct(root, framework, version)
    where = f"under {root}" if path is not None else "shipped with perfcast"
    found = databases(root, device) if root.is_dir() else []
    if not found:
        devices = sorted({d.device for d in databases(root)}) if root.is_dir() else []
        raise SpecError(f"no profiling database for {device} {where} (expected "
                        f"{root}/{device}/<framework>/<version>/op_mapping.yaml; databases exist for: "
                        f"{', '.join(devices) or 'no device'}); pass --profiling-database DIR")
    if framework is not None:
        same = [d for d in found if d.framework == framework]
        if not same:
            raise SpecError(f"no {framework} profiling database for {device} {where} (have: {_have(found)})")
        found = same
    if version is not None:
        same = [d for d in found if d.framework == found[0].framework and d.version == version]
        if not same:
            have = [d for d in found if d.framework == found[0].framework]
            raise SpecError(f"no {found[0].framework} {version} profiling database for {device} {where} "
                            f"(have: {_have(have)})")
        found = same
    return found[0].path


def _check_direct(root: Path, framework: str | None, version: str | None) -> Path:
    """A directory given as the database itself: a framework or version asked for must be the
    one its mapping declares (a request that cannot apply is an error, not ignored)."""
    if framework is None and version is None:
        return root
    if (root / "op_mapping.yaml").resolve().parent != root.resolve():  # a link out: the loader says so
        return root
    data = read_yaml(root / "op_mapping.yaml")
    has = (str(data.get("framework")), str(data.get("version"))) if isinstance(data, dict) else ("?", "?")
    if (framework is not None and framework != has[0]) or (version is not None and version != has[1]):
        asked = " ".join(x for x in (framework, version) if x is not None)
        raise SpecError(f"{root / 'op_mapping.yaml'}: a {has[0]} {has[1]} database, not {asked}")
    return root
