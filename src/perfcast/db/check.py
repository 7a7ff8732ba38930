"""Check a profiling database and report every problem, not just the first.

:class:`perfcast.perf.profiling.ProfilingDataSource` stops at the first problem when it loads a
database; a database author (or an importer's test) wants the whole list. The checks are the
loader's own (the same pydantic ``Mapping`` schema, :func:`~perfcast.perf.profiling.table_problems`
per kernel table, :func:`~perfcast.perf.profiling.reference_problems` for the ops), so a
database that checks clean loads. Collective tables under the mapping's ``communication``
directory have no spec: every column but the statistics (``latency_us``, ``std_us``, … and
``kernel_source``) is taken as a key.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from pydantic import ValidationError

from perfcast.hardware.spec import SpecError, error_messages, read_yaml
from perfcast.perf.databases import table_files
from perfcast.perf.profiling import STATISTICS, KernelSpec, Mapping, reference_problems, table_problems


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
    comm_dirs: list[Path] = []
    for path in mappings:
        comm = _check_mapping(path, report)
        if comm is not None and comm not in comm_dirs:
            comm_dirs.append(comm)
    for comm in comm_dirs:
        _check_collectives(comm, report)
    return report


def _add(report: Report, table, problems: list[str]) -> None:
    report.problems += problems
    if table is not None:
        report.tables += 1
        report.rows += len(table.rows)


def _check_mapping(path: Path, report: Report) -> Path | None:
    """Schema, kernel tables and op references of one mapping; its communication dir if any."""
    try:
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
        _check_kernels_of_invalid(path, data.get("kernels"), report)
        return None
    for name, spec in mapping.kernels.items():
        _add(report, *table_problems(path.parent, name, spec))
    comm = (path.parent / mapping.communication).resolve() if mapping.communication else None
    if comm is not None and not comm.is_dir():
        report.problems.append(f"{path}: key 'communication': {mapping.communication} is not a directory")
        comm = None
    collectives = list(_tables(comm) or {}) if comm is not None else []  # problems: _check_collectives
    report.problems += reference_problems(mapping, path, collectives)
    return comm


def _tables(directory: Path, report: Report | None = None) -> dict[str, Path] | None:
    """The directory's tables, or None (the problem recorded in ``report``, if given)."""
    try:
        return table_files(directory)
    except SpecError as e:
        if report is not None:
            report.problems.append(str(e))
        return None


def _check_kernels_of_invalid(path: Path, kernels, report: Report) -> None:
    """Tables whose own spec is valid are still checked when the mapping as a whole is not."""
    if not isinstance(kernels, dict):
        return
    for name, raw in kernels.items():
        try:
            spec = KernelSpec.model_validate(raw)
        except ValidationError:
            continue  # already reported against the mapping
        _add(report, *table_problems(path.parent, str(name), spec))


def _check_collectives(comm: Path, report: Report) -> None:
    import pandas as pd

    csvs = _tables(comm, report)
    if csvs is None:
        return
    if not csvs:
        report.problems.append(f"{comm}: no collective tables (*.csv, *.csv.gz)")
    for name, csv in csvs.items():
        try:
            columns = list(pd.read_csv(csv, nrows=0).columns)
        except Exception as e:  # pandas raises many types for malformed files
            report.problems.append(f"{csv}: cannot read as CSV ({e})")
            continue
        keys = [c for c in columns if c not in STATISTICS]
        if not keys:
            report.problems.append(f"{csv}: no key columns besides latency_us")
            continue
        _add(report, *table_problems(comm, name, KernelSpec(file=csv.name, keys=keys)))
