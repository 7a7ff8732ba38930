"""What databases exist: ``perfcast db list`` — device, framework, version, kernel types and
their row counts, for the shipped databases or any root laid out like them.

Row counts are read off the tables themselves (lines after the header; a ``.csv.gz`` is
decompressed on the fly, not parsed), so they are what a lookup would load, whatever a
manifest says.
"""

from __future__ import annotations

import gzip
import zlib
from pathlib import Path

from perfcast.hardware.spec import SpecError, parse_spec, read_yaml
from perfcast.perf.database_files import Mapping, database_root, inside
from perfcast.perf.databases import Database, databases, table_files


def count_rows(path: Path) -> int:
    """Data rows of a ``.csv`` or ``.csv.gz`` table (its lines minus the header)."""
    opener = gzip.open if path.name.endswith(".gz") else open
    lines, last = 0, b"\n"
    try:
        with opener(path, "rb") as f:
            while chunk := f.read(1 << 20):
                lines += chunk.count(b"\n")
                last = chunk[-1:]
    except (OSError, EOFError, zlib.error) as e:  # gzip.BadGzipFile is an OSError
        raise SpecError(f"{path}: cannot read ({e}; run perfcast db check)") from None
    return max(0, lines + (last != b"\n") - 1)


def describe(db: Database) -> dict:
    """One database: where it is, its kernel tables and its collectives, with row counts. Its
    mapping is validated and every file it names must lie inside the database root, as when it
    is loaded."""
    from perfcast.perf.profiling import communication_dir

    mapping_path = db.path / "op_mapping.yaml"
    mapping: Mapping = parse_spec(Mapping, mapping_path, read_yaml(mapping_path))
    folder = db.path.resolve()
    base = database_root(folder, mapping.device, mapping.framework, mapping.version)
    kernels = {}
    for name, spec in mapping.kernels.items():
        path = inside(base, folder, spec.file, f"{mapping_path}: key 'kernels.{name}.file'")
        if not path.is_file():
            raise SpecError(f"{mapping_path}: kernel {name} names {spec.file}, which is missing")
        kernels[name] = count_rows(path)
    out = {"device": db.device, "framework": db.framework, "version": db.version, "path": str(db.path),
           "kernels": kernels, "ops": len(mapping.ops)}
    if mapping.communication:
        directory = communication_dir(folder, base, mapping)
        out["communication"] = {"path": str(directory),
                                "tables": {n: count_rows(inside(base, directory, p.name, f"{directory}: table {n}"))
                                           for n, p in table_files(directory).items()}}
    source = _source(folder, base)
    if source:
        out["source"] = source
    return out


def _source(folder: Path, base: Path) -> str | None:
    manifest = folder / "MANIFEST.yaml"
    if not manifest.exists():
        return None
    data = read_yaml(inside(base, folder, manifest.name, str(manifest)))
    src = data.get("source") if isinstance(data, dict) else None
    if isinstance(src, dict) and src.get("package"):
        return f"{src['package']} {src.get('package_version', '')}".strip()
    return None


def list_databases(root: str | Path | None = None, device: str | None = None) -> list[dict]:
    """:func:`describe` for every database under ``root`` (default: the shipped ones)."""
    return [describe(db) for db in databases(root, device)]
