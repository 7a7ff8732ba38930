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
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from perfcast.hardware.spec import SpecError, parse_spec, read_yaml
from perfcast.ir import Leaf, itemsize
from perfcast.perf.databases import find_database, shipped_root, table_files  # noqa: F401  (re-exported)
from perfcast.perf.empirical import DataSource, Miss, QueryResult
from perfcast.perf.features import NEUTRAL, features
from perfcast.perf.model import Provenance
from perfcast.perf.tables import KernelTable

Category = Literal["composite", "communication", "attention_special", "elementwise", "moe_fused",
                   "zero_cost", "accepted_miss", "compute"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class KernelSpec(_Strict):
    file: str
    keys: list[str] = Field(min_length=1)
    axes: list[str] = Field(default_factory=list)
    transform: dict[str, Literal["linear", "sqrt", "log"]] = Field(default_factory=dict)


class OpEntry(_Strict):
    category: Category
    kernel_type: str | None = None
    alternate_kernel_types: list[str] = Field(default_factory=list)
    reason: str | None = None


class Mapping(_Strict):
    schema_version: Literal[1] = Field(alias="schema")
    device: Annotated[str, Field(min_length=1)]
    framework: Annotated[str, Field(min_length=1)]
    version: Annotated[str, Field(min_length=1)]
    communication: str | None = None
    kernels: dict[str, KernelSpec]
    ops: dict[str, OpEntry]


@lru_cache(maxsize=8)
def load_database(root: Path) -> "ProfilingDataSource":
    """A database loaded once per process (its tables are read-only once loaded), so pricing
    many ops or several requests does not re-read the CSVs."""
    return ProfilingDataSource(root)


def normalize(op: str) -> str:
    """``torch.ops.aten.mm.default`` → ``aten.mm.default``."""
    return op.removeprefix("torch.ops.")


def load_table(root: Path, name: str, spec: KernelSpec) -> KernelTable:
    """The kernel table ``name``; its first problem (see :func:`table_problems`) as a SpecError."""
    table, problems = table_problems(root, name, spec)
    if problems:
        raise SpecError(problems[0])
    return table


def table_problems(root: Path, name: str, spec: KernelSpec) -> tuple[KernelTable | None, list[str]]:
    """Read one kernel's CSV (plain or gzip) and collect every problem (missing file or columns,
    non-positive or non-numeric latencies, repeated keys) instead of stopping at the first; the
    table is None when there is any. ``perfcast db check`` reports them all; loading raises on
    the first. Only the key columns and ``latency_us`` are parsed (a ``kernel_source`` or
    statistics column is the file's, not the lookup's)."""
    import pandas as pd

    path = root / spec.file
    if not path.exists():
        return None, [f"{root / 'op_mapping.yaml'}: kernel {name} names {spec.file}, which is missing"]
    try:
        header = list(pd.read_csv(path, nrows=0).columns)
        wanted = [c for c in (*spec.keys, "latency_us") if c in header]
        # "1000" is a shape, not a number; a dtype or routing name is text
        df = pd.read_csv(path, usecols=wanted, dtype={c: str for c in TEXT_COLUMNS if c in wanted})
    except Exception as e:  # pandas raises many types for malformed files
        return None, [f"{path}: cannot read as CSV ({e})"]
    problems = [f"{path}: missing column {c!r} (expected {', '.join(spec.keys)}, latency_us)"
                for c in (*spec.keys, "latency_us") if c not in header]
    if "latency_us" in df.columns:
        latency = pd.to_numeric(df["latency_us"], errors="coerce")
        bad = df.index[~(latency > 0)]
        if len(bad):
            more = f" ({len(bad)} rows)" if len(bad) > 1 else ""
            problems.append(f"{path}: line {int(bad[0]) + 2}: latency_us must be positive{more}")
    if problems:
        return None, problems
    keys = list(zip(*(_column(df[k]) for k in spec.keys)))
    rows = dict(zip(keys, latency.astype(float).tolist()))
    if len(rows) != len(keys):
        return None, [f"{path}: duplicate keys ({len(keys) - len(rows)} rows repeat a key)"]
    try:
        return KernelTable(name, tuple(spec.keys), tuple(spec.axes), rows, dict(spec.transform), str(path)), []
    except ValueError as e:
        return None, [f"{root / 'op_mapping.yaml'}: {e}"]


#: Key columns read as text even when every value looks like a number.
TEXT_COLUMNS = ("shape", "dtype", "kv_dtype", "routing")


def _column(series) -> list:
    """One key column as Python values: whole-number floats (a column with a blank) as ints,
    so a key built from a leaf's integer features matches."""
    if series.dtype.kind == "f" and bool((series.dropna() % 1 == 0).all()):
        return [int(v) if v == v else v for v in series.tolist()]
    return series.tolist()


def reference_problems(mapping: Mapping, mapping_path: Path, collectives=()) -> list[str]:
    """Ops whose kernel types are not defined under ``kernels`` (or, for communication ops,
    there or among the communication directory's tables: an engine's own all-reduce is a kernel
    of the framework database, NCCL's are the communication directory's)."""
    def known(entry):
        return {*mapping.kernels, *collectives} if entry.category == "communication" else set(mapping.kernels)

    return [f"{mapping_path}: key 'ops.{op}': kernel type {k!r} is not under "
            + ("'kernels' or the communication tables" if entry.category == "communication" else "'kernels'")
            for op, entry in mapping.ops.items()
            for k in (entry.kernel_type, *entry.alternate_kernel_types)
            if k is not None and k not in known(entry)]


#: Columns of a measured table that are statistics or provenance, not keys.
STATISTICS = ("latency_us", "std_us", "p10_us", "p90_us", "samples", "rounds", "how", "kernel_source")


def collective_specs(comm: Path) -> dict[str, KernelSpec]:
    """Collective tables: every CSV (or CSV.gz) of the communication directory; keys are its
    columns other than the statistics, interpolated in ``bytes`` (linear: the α–β model between
    two sizes)."""
    import pandas as pd

    specs = {}
    for name, path in table_files(comm).items():
        cols = [c for c in pd.read_csv(path, nrows=0).columns if c not in STATISTICS]
        specs[name] = KernelSpec(file=path.name, keys=cols, axes=["bytes"] if "bytes" in cols else [])
    return specs


class ProfilingDataSource(DataSource):
    def __init__(self, root: str | Path):
        self.root = Path(root)
        mapping_path = self.root / "op_mapping.yaml"
        if not self.root.is_dir():
            raise SpecError(f"{self.root}: profiling database directory not found")
        if not mapping_path.exists():
            raise SpecError(f"{mapping_path}: missing (a profiling database needs op_mapping.yaml)")
        self.mapping: Mapping = parse_spec(Mapping, mapping_path, read_yaml(mapping_path))
        self.tables = {n: load_table(self.root, n, s) for n, s in self.mapping.kernels.items()}
        if self.mapping.communication is not None:
            comm = (self.root / self.mapping.communication).resolve()
            if not comm.is_dir():
                raise SpecError(f"{mapping_path}: key 'communication': {comm} is not a directory")
            self.tables.update({n: load_table(comm, n, s) for n, s in collective_specs(comm).items()})
        unknown = reference_problems(self.mapping, mapping_path, self.tables)
        if unknown:
            raise SpecError(unknown[0])

    def lookup(self, op: Leaf) -> QueryResult | Miss:
        name = normalize(str(op.attr("op") or op.kind))
        entry = self.mapping.ops.get(name)
        if (entry is None or entry.category == "composite") and op.attr("members"):
            return self._composite(name, op.attr("members"))
        if entry is None:
            return Miss(f"no mapping for {name}")
        if entry.category == "zero_cost":
            return QueryResult(0.0, Provenance.MEASURED, f"{name}: zero cost by mapping")
        if entry.category == "accepted_miss":
            return QueryResult(0.0, Provenance.MEASURED, f"{name}: accepted miss: {entry.reason}")
        if entry.category == "composite":
            return Miss(f"{name}: composite lookup is not available for this leaf")
        try:
            feats = features(op)
        except ValueError as e:
            return Miss(f"{name}: {e}")
        if entry.category == "elementwise":
            return self._elementwise(name, entry, feats)
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
            if itemsize(other) == itemsize(feats["dtype"]):
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
        if missed:
            source = Provenance.PARTIAL
        elif all(a.source is Provenance.MEASURED for a in hits):
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
            if all(other[k] == feats.get(k) for k in table.keys if k != "dtype"):
                ratio = itemsize(feats["dtype"]) / itemsize(other["dtype"])
                return QueryResult(float(latency * ratio), Provenance.INTERPOLATED,
                                   f"{entry.kernel_type}: derived from {other['dtype']} by byte ratio {ratio}")
        return Miss(got)
