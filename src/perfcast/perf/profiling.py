"""The profiling database: ``op_mapping.yaml`` plus one ``{KernelType}.csv`` per kernel type.

Layout: ``{device}/{framework}/{framework-and-library-versions}/`` holds compute kernels and the
mapping; collectives live in ``{device}/{comm-library}/{version}/`` and are reused across
framework versions (the mapping's ``communication`` entry points there). Tables are ``.csv`` or
gzip-compressed ``.csv.gz``. The schema is documented in ``docs/design/profiling.md``; finding a
database (device, framework, version) is :mod:`perfcast.perf.databases`.

Lookup of a leaf: its op name (``torch.ops.`` stripped) selects a mapping entry; its category
picks the path, in the design's dispatch order — composite, communication, attention_special,
elementwise, moe_fused, zero_cost, accepted_miss, compute (primary then alternate kernel types).
"""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache
from pathlib import Path

from perfcast.hardware.spec import SpecError, parse_spec, read_yaml
from perfcast.ir import Leaf, itemsize
from perfcast.perf.database_files import (STATISTICS, TEXT_COLUMNS, KernelSpec, Mapping,  # noqa: F401  (re-exported)
                                          OpEntry, database_root, identity_problems, inside)
from perfcast.perf.databases import find_database, shipped_root, table_files  # noqa: F401  (re-exported)
from perfcast.perf.empirical import DataSource, Miss, QueryResult
from perfcast.perf.features import NEUTRAL, features
from perfcast.perf.kernel_classes import DERIVED_ROWS
from perfcast.perf.model import Provenance
from perfcast.perf.table_csv import read_table
from perfcast.perf.tables import KernelTable

#: kernel classes an engine option gives a leaf (perfcast.perf.kernel_classes) → the only table
#: that measures their kernels: TensorRT-LLM's TRTLLM MoE backend, SGLang's DeepEP MoE (docs/design/engines.md)
CLASS_TABLES = {"moe.trtllm_gen": "GroupedMatMulMinLatency", "moe.deepep": "GroupedMatMulDeepEP"}


@lru_cache(maxsize=8)
def load_database(root: Path) -> "ProfilingDataSource":
    """A database loaded once per process (its tables are read-only once loaded), so pricing
    many ops or several requests does not re-read the CSVs."""
    return ProfilingDataSource(root)


def normalize(op: str) -> str:
    """``torch.ops.aten.mm.default`` → ``aten.mm.default``."""
    return op.removeprefix("torch.ops.")


def load_table(folder: Path, name: str, spec: KernelSpec, root: Path | None = None) -> KernelTable:
    """The kernel table ``name``; its first problem (see :func:`table_problems`) as a SpecError."""
    table, problems = table_problems(folder, name, spec, root)
    if problems:
        raise SpecError(problems[0])
    return table


def table_problems(folder: Path, name: str, spec: KernelSpec, root: Path | None = None) \
        -> tuple[KernelTable | None, list[str]]:
    """Read one kernel's table — ``spec.file`` in the mapping's ``folder``, which must lie
    inside the database ``root`` (default: the folder) — and collect every problem in it
    (:func:`perfcast.perf.table_csv.read_table`) instead of stopping at the first; the table is
    None when there is any. ``perfcast db check`` reports them all; loading raises on the first.
    Only the key columns and ``latency_us`` are parsed (a ``kernel_source`` or statistics column
    is the file's, not the lookup's)."""
    where = f"{folder / 'op_mapping.yaml'}: key 'kernels.{name}.file'"
    try:
        path = inside(root or folder, folder, spec.file, where)
    except SpecError as e:
        return None, [str(e)]
    if not path.exists():
        return None, [f"{folder / 'op_mapping.yaml'}: kernel {name} names {spec.file}, which is missing"]
    return read_table(path, name, list(spec.keys), spec.axes, spec.transform)


def communication_dir(folder: Path, root: Path, mapping: Mapping) -> Path:
    """The mapping's ``communication`` directory, inside the database root."""
    where = f"{folder / 'op_mapping.yaml'}: key 'communication'"
    comm = inside(root, folder, mapping.communication, where)
    if not comm.is_dir():
        raise SpecError(f"{where}: {mapping.communication} is not a directory")
    return comm


def collective_tables(comm: Path, root: Path) -> tuple[dict[str, KernelTable], list[str]]:
    """Collective tables: every CSV (or CSV.gz) of the communication directory (inside the
    database root); keys are its columns other than the statistics, interpolated in ``bytes``
    (linear: the α–β model between two sizes). The tables that read, and every problem."""
    try:
        files = table_files(comm)
    except SpecError as e:
        return {}, [str(e)]
    if not files:
        return {}, [f"{comm}: no collective tables (*.csv, *.csv.gz)"]
    tables, problems = {}, []
    for name, path in files.items():
        try:
            path = inside(root, comm, path.name, f"{comm}: table {name}")
        except SpecError as e:
            problems.append(str(e))
            continue
        table, found = read_table(path, name, None)
        problems += found
        if table is not None:
            tables[name] = table
    return tables, problems


def reference_problems(mapping: Mapping, mapping_path: Path, collectives=(), keys=None) -> list[str]:
    """Ops whose kernel types are not defined under ``kernels`` (or, for communication ops,
    there or among the communication directory's tables: an engine's own all-reduce is a kernel
    of the framework database, NCCL's are the communication directory's), and elementwise ops
    whose table is not keyed on ``dtype`` (the lookup scales by element size)."""
    def known(entry):
        return {*mapping.kernels, *collectives} if entry.category == "communication" else set(mapping.kernels)

    problems = [f"{mapping_path}: key 'ops.{op}': kernel type {k!r} is not under "
                + ("'kernels' or the communication tables" if entry.category == "communication" else "'kernels'")
                for op, entry in mapping.ops.items()
                for k in (entry.kernel_type, *entry.alternate_kernel_types)
                if k is not None and k not in known(entry)]
    return problems + [f"{mapping_path}: key 'ops.{op}': an elementwise op's kernel {entry.kernel_type} must be "
                       f"keyed on dtype (its keys: {', '.join(mapping.kernels[entry.kernel_type].keys)})"
                       for op, entry in mapping.ops.items()
                       if entry.category == "elementwise" and entry.kernel_type in mapping.kernels
                       and "dtype" not in mapping.kernels[entry.kernel_type].keys]


def _size(dtype: str):
    """Bytes per element of a table's dtype, or None for a format with no element size
    (``fp8_block``, ``w4a16``)."""
    try:
        return itemsize(dtype)
    except ValueError:
        return None


class ProfilingDataSource(DataSource):
    def __init__(self, root: str | Path):
        self.root = Path(root)
        if not self.root.is_dir():
            raise SpecError(f"{self.root}: profiling database directory not found")
        folder = self.root.resolve()
        mapping_path = self.root / "op_mapping.yaml"
        if not mapping_path.exists():
            raise SpecError(f"{mapping_path}: missing (a profiling database needs op_mapping.yaml)")
        inside(folder, folder, "op_mapping.yaml", str(mapping_path))
        self.mapping: Mapping = parse_spec(Mapping, mapping_path, read_yaml(mapping_path))
        base = database_root(folder, self.mapping.device, self.mapping.framework, self.mapping.version)
        for problem in identity_problems(folder, self.mapping, manifest=False):
            raise SpecError(problem)
        self.tables = {n: load_table(folder, n, s, base) for n, s in self.mapping.kernels.items()}
        if self.mapping.communication is not None:
            tables, problems = collective_tables(communication_dir(folder, base, self.mapping), base)
            if problems:
                raise SpecError(problems[0])
            self.tables.update(tables)
        unknown = reference_problems(self.mapping, mapping_path, self.tables)
        if unknown:
            raise SpecError(unknown[0])

    def fits(self, device: str, engine=None) -> tuple[str, ...]:
        """Whether the database can price ``device`` under ``engine`` (an engine profile: its
        ``name``, ``framework``, ``version`` and ``database`` — the framework and version its
        kernels were measured with — or None): a database measured on another device, or with
        another framework than the engine's database, is an error — its kernel times are not
        those of the step priced. Returns notes for what differs but still prices: another
        version of the engine's framework, or an engine that names no database of its own."""
        m, where = self.mapping, self.root / "op_mapping.yaml"
        if m.device != device:
            raise SpecError(f"{where}: a database measured on {m.device}, not on {device} (the device priced); "
                            f"a profiling database prices only the device it was measured on")
        if engine is None:
            return ()
        want = engine.database
        if want is None:
            if m.framework == engine.framework:
                return ()
            return (f"engine {engine.name} ({engine.framework} {engine.version}) names no database of its own: its "
                    f"kernels are priced from {m.framework} {m.version}'s measurements",)
        if m.framework != want.framework:
            raise SpecError(f"{where}: a {m.framework} {m.version} database, but engine {engine.name} runs "
                            f"{want.framework} {want.version} kernels; price it with the engine the database "
                            f"was measured with, or use a {want.framework} database")
        if m.version != want.version:
            return (f"engine {engine.name} runs {want.framework} {want.version} kernels; they are priced from "
                    f"the {m.framework} {m.version} measurements",)
        return ()

    def lookup(self, op: Leaf) -> QueryResult | Miss:
        name = normalize(str(op.attr("op") or op.kind))
        entry = self.mapping.ops.get(name)
        if (entry is None or entry.category == "composite") and op.attr("members"):
            return self._composite(name, op.attr("members"))
        if entry is None:
            return Miss(f"no mapping for {name}")
        if entry.category == "zero_cost":
            return QueryResult(0.0, Provenance.MAPPED, f"{name}: zero cost by mapping")
        if entry.category == "accepted_miss":
            return QueryResult(0.0, Provenance.MAPPED, f"{name}: accepted miss: {entry.reason}")
        if entry.category == "composite":
            return Miss(f"{name}: composite lookup is not available for this leaf")
        try:
            feats = features(op)
        except ValueError as e:
            return Miss(f"{name}: {e}")
        if entry.category == "elementwise":
            return self._elementwise(name, entry, feats)
        own = CLASS_TABLES.get(str(op.attr("kernel_class") or ""))
        if own is not None:  # an engine option's kernels: their own table or nothing
            if own not in self.tables:
                return Miss(f"{name}: kernel class {op.attr('kernel_class')} is measured in table {own}, which "
                            f"this database lacks")
            got = self._query(own, feats)
            return got if isinstance(got, QueryResult) else Miss(got)
        reasons = []
        for kernel in (entry.kernel_type, *entry.alternate_kernel_types):
            got = self._query(kernel, feats)
            if isinstance(got, QueryResult):
                return got
            reasons.append(got)
            if entry.category == "communication":
                got = self._same_width(kernel, feats)
                if isinstance(got, QueryResult):
                    return got
        return Miss("; ".join(reasons))

    def _same_width(self, kernel: str, feats: dict) -> QueryResult | None:
        """A collective moves bytes, not numbers: a message measured in another dtype of the same
        element size (NCCL tables are often fp16; the model is bf16) is the same message."""
        table = self.tables[kernel]
        if "dtype" not in table.keys:
            return None
        col = table.keys.index("dtype")
        for other in sorted({k[col] for k in table.rows} - {feats["dtype"]}):
            if _size(other) is not None and _size(other) == _size(feats["dtype"]):
                got = self._query(kernel, {**feats, "dtype": other})
                if isinstance(got, QueryResult):
                    return replace(got, note=f"{got.note}; measured in {other} (same element size as {feats['dtype']})")
        return None

    def _composite(self, name: str, members) -> QueryResult | Miss:
        """A fused kernel decomposed into its member ops, each looked up on its own: their sum
        (an upper bound — the fused kernel keeps intermediates on chip). PARTIAL when only some
        members hit; the rest is left to the fallback."""
        answers = [(m, self.lookup(m)) for m in members]
        hits = [a for _, a in answers if isinstance(a, QueryResult)]
        if not hits:
            return Miss(f"{name}: no member of the fused kernel is in the database")
        missed = tuple(m for m, a in answers if isinstance(a, Miss))
        priced = [a for a in hits if a.source is not Provenance.MAPPED]  # members with a kernel
        if missed:
            source = Provenance.PARTIAL
        elif not priced:
            source = Provenance.MAPPED
        elif all(a.source is Provenance.MEASURED for a in priced):
            source = Provenance.MEASURED
        else:
            source = Provenance.INTERPOLATED
        note = (f"{name}: sum of {len(hits)} of {len(answers)} member kernels measured unfused"
                + (f"; {len(missed)} priced by the fallback" if missed else ""))
        return QueryResult(sum(a.latency_us for a in hits), source, note, remainder=missed)

    def _query(self, kernel: str, feats: dict) -> QueryResult | str:
        table = self.tables[kernel]
        absent = [k for k in table.keys if k not in feats]
        if absent:
            return f"{kernel}: the leaf has no {absent[0]!r}"
        for k, neutral in NEUTRAL.items():
            if feats.get(k, neutral) != neutral and k not in table.keys:
                return f"{kernel}: the leaf has {k} {feats[k]}; the table's rows are all at {k} {neutral}"
        got = table.lookup(tuple(feats[k] for k in table.keys))
        if isinstance(got, str):
            return got
        latency, how = got
        derived = DERIVED_ROWS.get(str(feats.get("dtype")))
        if derived:  # rows computed from two measurements: the price says so
            return QueryResult(latency, Provenance.DERIVED, f"{kernel}: {how}, from derived rows ({derived})")
        source = Provenance.MEASURED if how == "exact" else Provenance.INTERPOLATED
        return QueryResult(latency, source, f"{kernel}: {how}")

    def _elementwise(self, name: str, entry: OpEntry, feats: dict) -> QueryResult | Miss:
        """Exact shape and dtype; else the same output shape measured in another dtype, scaled
        by the ratio of element sizes (a memory-bound kernel's time follows its bytes)."""
        table = self.tables[entry.kernel_type]
        got = self._query(entry.kernel_type, feats)
        if isinstance(got, QueryResult):
            return got
        for key, latency in table.rows.items():
            other = dict(zip(table.keys, key))
            if all(other[k] == feats.get(k) for k in table.keys if k != "dtype") and _size(other["dtype"]) \
                    and _size(feats["dtype"]):
                ratio = _size(feats["dtype"]) / _size(other["dtype"])
                return QueryResult(float(latency * ratio), Provenance.INTERPOLATED,
                                   f"{entry.kernel_type}: derived from {other['dtype']} by byte ratio {ratio}")
        return Miss(got)
