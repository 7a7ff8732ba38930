"""Writing a profiling database: kernel CSVs, ``op_mapping.yaml`` and ``MANIFEST.yaml``.

The layout and schema are those :mod:`perfcast.perf.profiling` reads: one ``{KernelType}.csv``
(or ``.csv.gz``) per kernel type (key columns, then ``latency_us``, then a ``kernel_source``
column when the rows come from more than one kernel) beside an ``op_mapping.yaml`` whose
``kernels`` entries name each file's keys, interpolation axes and axis transforms. Writers are
deterministic (rows sorted by key, fixed float format, gzip without a timestamp) so a re-import
diffs cleanly.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from perfcast.inputs import dump_yaml


#: Significant digits kept for ``latency_us`` (the sources carry about six).
LATENCY_FORMAT = "%.6g"


@dataclass
class Kernel:
    """One kernel type as written: its table spec and how its rows were obtained."""

    name: str
    keys: tuple[str, ...]
    axes: tuple[str, ...] = ()
    transform: dict[str, str] = field(default_factory=dict)
    source: str = ""  # the file the rows came from, relative to the source package
    selection: str = ""  # which source rows were kept and how columns were derived
    comment: str = ""  # written above the kernel's entry in op_mapping.yaml
    counts: dict[str, int] = field(default_factory=dict)
    unknown_dtypes: list[str] = field(default_factory=list)  # source dtype names dropped
    written: bool = True  # False: no rows survived, so no CSV and no mapping entry
    suffix: str = ".csv.gz"  # or ".csv"
    provenance: dict = field(default_factory=dict)  # framework, version, kernel sources (MANIFEST)

    @property
    def file(self) -> str:
        return f"{self.name}{self.suffix}"

    def spec(self) -> dict:
        out: dict = {"file": self.file, "keys": list(self.keys)}
        if self.axes:
            out["axes"] = list(self.axes)
        if self.transform:
            out["transform"] = dict(self.transform)
        return out


def finish(df, kernel: Kernel):
    """Drop non-positive or missing latencies and merge repeated keys (median; rows of one
    kernel source only — :func:`perfcast.db.aic_tables.one_kernel_per_key` has already kept one
    source per key), counting both; returns the rows sorted by key with ``latency_us`` next and
    ``kernel_source`` last when the rows come from more than one source."""
    keys = list(kernel.keys)
    good = df["latency_us"] > 0
    kernel.counts["dropped_latency"] = int((~good).sum())
    df = df[good]
    has_source = "kernel_source" in df.columns
    merged = df.groupby(keys, as_index=False, sort=True).agg(
        latency_us=("latency_us", "median"), **({"kernel_source": ("kernel_source", "first")} if has_source else {}))
    kernel.counts["merged_duplicates"] = len(df) - len(merged)
    kernel.counts["rows"] = len(merged)
    sources = merged["kernel_source"].value_counts().sort_index() if has_source else None
    if sources is not None:
        kernel.provenance["kernel_sources"] = {str(k): int(v) for k, v in sources.items()}
    several = sources is not None and len(sources) > 1
    return merged[[*keys, "latency_us", *(["kernel_source"] if several else [])]]


def write_csv(df, path: Path) -> None:
    """Write a table; ``*.csv.gz`` is gzip-compressed with no timestamp in its header, so the
    same rows give the same bytes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    compression = {"method": "gzip", "compresslevel": 9, "mtime": 0} if path.name.endswith(".gz") else None
    df.to_csv(path, index=False, float_format=LATENCY_FORMAT, lineterminator="\n", compression=compression)


def _flow(value) -> str:
    text = dump_yaml(value, default_flow_style=True, width=10_000, sort_keys=False)
    return text.strip().removesuffix("...").strip()  # a bare scalar ends with "..." (end of document)


def write_mapping(path: Path, header: str, meta: dict, kernels: list[Kernel], ops: dict[str, dict],
                  unmapped_note: str = "") -> None:
    """``op_mapping.yaml`` with one flow-style line per kernel and op; ``header`` and each
    kernel's ``comment`` become YAML comments."""
    lines = [f"# {line}".rstrip() for line in header.splitlines()]
    lines += [f"{k}: {_flow(v)}" for k, v in meta.items() if v is not None]
    lines.append("kernels:")
    for k in kernels:
        lines += [f"  # {line}" for line in k.comment.splitlines()]
        lines.append(f"  {k.name}: {_flow(k.spec())}")
    lines.append("ops:")
    lines += [f"  {op}: {_flow(entry)}" for op, entry in ops.items()]
    lines += [f"  # {line}" for line in unmapped_note.splitlines()]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")


def write_manifest(path: Path, manifest: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(dump_yaml(manifest, sort_keys=False, width=100, allow_unicode=True))
