"""What databases exist: ``perfcast db list`` — device, framework, version, kernel types and
their row counts, for the shipped databases or any root laid out like them.

Row counts are read off the tables themselves (lines after the header; a ``.csv.gz`` is
decompressed on the fly, not parsed), so they are what a lookup would load, whatever a
manifest says.
"""

from __future__ import annotations

import gzip
from pathlib import Path

from perfcast.hardware.spec import SpecError, read_yaml
from perfcast.perf.databases import Database, databases, table_files


def count_rows(path: Path) -> int:
    """Data rows of a ``.csv`` or ``.csv.gz`` table (its lines minus the header)."""
    opener = gzip.open if path.name.endswith(".gz") else open
    lines, last = 0, b"\n"
    with opener(path, "rb") as f:
        while chunk := f.read(1 << 20):
            lines += chunk.count(b"\n")
            last = chunk[-1:]
    return max(0, lines + (last != b"\n") - 1)


def describe(db: Database) -> dict:
    """One database: where it is, its kernel tables and its collectives, with row counts."""
    mapping_path = db.path / "op_mapping.yaml"
    mapping = read_yaml(mapping_path)
    if not isinstance(mapping, dict) or not isinstance(mapping.get("kernels"), dict):
        raise SpecError(f"{mapping_path}: expected a mapping with 'kernels' (run perfcast db check)")
    kernels = {}
    for name, spec in mapping["kernels"].items():
        path = db.path / str(spec.get("file", ""))
        if not path.is_file():
            raise SpecError(f"{mapping_path}: kernel {name} names {spec.get('file')}, which is missing")
        kernels[name] = count_rows(path)
    out = {"device": db.device, "framework": db.framework, "version": db.version, "path": str(db.path),
           "kernels": kernels, "ops": len(mapping.get("ops") or {})}
    comm = mapping.get("communication")
    if comm:
        directory = (db.path / comm).resolve()
        out["communication"] = {"path": str(directory),
                                "tables": {n: count_rows(p) for n, p in table_files(directory).items()}}
    source = _source(db.path / "MANIFEST.yaml")
    if source:
        out["source"] = source
    return out


def _source(manifest: Path) -> str | None:
    if not manifest.exists():
        return None
    data = read_yaml(manifest)
    src = data.get("source") if isinstance(data, dict) else None
    if isinstance(src, dict) and src.get("package"):
        return f"{src['package']} {src.get('package_version', '')}".strip()
    return None


def list_databases(root: str | Path | None = None, device: str | None = None) -> list[dict]:
    """:func:`describe` for every database under ``root`` (default: the shipped ones)."""
    return [describe(db) for db in databases(root, device)]
