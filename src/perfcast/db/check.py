"""Check a profiling database and report every problem, not just the first.

:class:`perfcast.perf.profiling.ProfilingDataSource` stops at the first problem when it loads a
database; a database author (or an importer's test) wants the whole list. The checks are the
loader's own (the same pydantic ``Mapping`` schema, the same paths kept inside the database root,
:func:`~perfcast.perf.profiling.table_problems` per kernel table,
:func:`~perfcast.perf.profiling.collective_tables` for the communication directory,
:func:`~perfcast.perf.profiling.reference_problems` for the ops, and the device, framework and
version agreeing with ``MANIFEST.yaml`` and the folders), so a database that checks clean loads.
Collective tables under the mapping's ``communication`` directory have no spec: every column but
the statistics (``latency_us``, ``std_us``, … and ``kernel_source``) is taken as a key.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from pydantic import ValidationError

from perfcast.hardware.spec import SpecError, error_messages, read_yaml
from perfcast.perf.database_files import database_root, identity_problems, inside
from perfcast.perf.databases import table_files
from perfcast.perf.profiling import (KernelSpec, Mapping, collective_tables, communication_dir, reference_problems,
                                     table_problems)


@dataclass
class Report:
    problems: list[str] = field(default_factory=list)
    tables: int = 0  # tables that loaded
    rows: int = 0  # their rows


def check_database(root: Path) -> list[str]:
    """One message per problem in the database at ``root`` (a directory holding
    ``op_mapping.yaml``, or a tree of them); empty if it is sound."""
    return inspect(root).problems


def inspect(root: Path) -> Report:
    """Check every ``op_mapping.yaml`` at or under ``root`` and the collective tables they
    point to; count what loaded."""
    root, report = Path(root), Report()
    if not root.is_dir():
        report.problems.append(f"{root}: profiling database directory not found")
        return report
    mappings = [root / "op_mapping.yaml"] if (root / "op_mapping.yaml").exists() \
        else sorted(root.rglob("op_mapping.yaml"))
    if not mappings:
        report.problems.append(f"{root}: no op_mapping.yaml at or under it")
    comm_dirs: list[tuple[Path, Path]] = []
    for path in mappings:
        comm = _check_mapping(path, report)
        if comm is not None and comm not in comm_dirs:
            comm_dirs.append(comm)
    for comm, base in comm_dirs:
        tables, problems = collective_tables(comm, base)
        report.problems += problems
        report.tables += len(tables)
        report.rows += sum(len(t.rows) for t in tables.values())
    return report


def _add(report: Report, table, problems: list[str]) -> None:
    report.problems += problems
    if table is not None:
        report.tables += 1
        report.rows += len(table.rows)


def _check_mapping(path: Path, report: Report) -> tuple[Path, Path] | None:
    """Schema, identity, kernel tables and op references of one mapping; its communication
    directory and the database root it must lie in, if any."""
    folder = path.parent.resolve()
    try:
        inside(folder, folder, path.name, str(path))
        data = read_yaml(path)
    except SpecError as e:
        report.problems.append(str(e))
        return None
    if not isinstance(data, dict):
        report.problems.append(f"{path}: expected a mapping at the top level")
        return None
    try:
        mapping = Mapping.model_validate(data)
    except ValidationError as err:
        report.problems += error_messages(path, err)
        base = database_root(folder, data.get("device"), data.get("framework"), data.get("version"))
        _check_kernels_of_invalid(folder, base, data.get("kernels"), report)
        return None
    base = database_root(folder, mapping.device, mapping.framework, mapping.version)
    report.problems += identity_problems(folder, mapping)
    for name, spec in mapping.kernels.items():
        _add(report, *table_problems(folder, name, spec, base))
    comm = None
    if mapping.communication is not None:
        try:
            comm = communication_dir(folder, base, mapping)
        except SpecError as e:
            report.problems.append(str(e))
    collectives = []
    if comm is not None:
        try:
            collectives = list(table_files(comm))  # their problems: collective_tables, once per directory
        except SpecError:
            pass
    report.problems += reference_problems(mapping, path, collectives)
    return (comm, base) if comm is not None else None


def _check_kernels_of_invalid(folder: Path, base: Path, kernels, report: Report) -> None:
    """Tables whose own spec is valid are still checked when the mapping as a whole is not."""
    if not isinstance(kernels, dict):
        return
    for name, raw in kernels.items():
        try:
            spec = KernelSpec.model_validate(raw)
        except ValidationError:
            continue  # already reported against the mapping
        _add(report, *table_problems(folder, str(name), spec, base))
