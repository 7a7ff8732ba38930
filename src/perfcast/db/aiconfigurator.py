"""Import aiconfigurator's measured kernel tables as a perfcast profiling database.

Data source (data only; none of its code is used): the per-kernel latency tables shipped in the
PyPI package ``aiconfigurator-core`` (NVIDIA, Apache-2.0), under
``aiconfigurator_core/systems/data/<system>/<op>/<framework>/<version>/<table>.parquet`` and
``.../<system>/comm/nccl/<nccl version>/nccl_perf.parquet``. :mod:`perfcast.db.aic_tables`
converts each table into kernel types a perfcast leaf selects: ``MatMul`` (every GEMM dtype),
``ContextAttention`` / ``GenerationAttention``, ``ContextMLA`` / ``GenerationMLA``,
``GroupedMatMul`` (and TensorRT-LLM's ``GroupedMatMulMinLatency``), ``CustomAllReduce`` (and
``CustomAllReduceEager``), the FP8 quantize kernels ``ScaleMatrix`` / ``ComputeScale``, Gated
DeltaNet's ``GatedDeltaRule`` / ``GatedDeltaRuleDecode``, DSA's ``SparseMLAPrefill``; NCCL's
collectives go to ``<device>/nccl/<version>/``.

Versions. A framework version is one whose directory holds the GEMM and both attention tables;
by default the newest (:func:`perfcast.perf.databases.version_key`) — for the shipped systems
the same version aiconfigurator-core 0.12.0 itself queries as ``current``
(``systems/query_versions.yaml``). Every other table comes from that version's directory; a
table absent there is taken from the nearest *older* version of the same framework that has it
(backward fill, never a newer version — the rule ``query_versions.yaml`` states for its own
lookups), and MANIFEST.yaml says so for that table; with no older one it is missing, and
MANIFEST.yaml lists it. Tables are never mixed across frameworks.
"""

from __future__ import annotations

import datetime
import importlib.metadata
from functools import partial
from pathlib import Path

from perfcast.db import aic_comm as C
from perfcast.db import aic_tables as T
from perfcast.db.write import Kernel, write_csv, write_manifest, write_mapping
from perfcast.ir import UserError
from perfcast.perf.databases import TABLE_SUFFIXES, version_key

PACKAGE = "aiconfigurator-core"
LICENCE = "Apache-2.0"
ATTRIBUTION = ("Kernel latencies measured by NVIDIA and published in aiconfigurator "
               "(https://github.com/ai-dynamo/aiconfigurator), Copyright (c) NVIDIA CORPORATION & "
               "AFFILIATES, licensed under the Apache License 2.0. Converted to perfcast's "
               "profiling-database format (units, column names, row selection); no code reused.")

MATMUL_OPS = ("aten.mm.default", "aten.addmm.default", "aten.bmm.default")
# aiconfigurator NCCL op names → table names; perfcast collective leaf kinds → table names
COLLECTIVES = {"all_gather": "AllGather", "all_reduce": "AllReduce", "alltoall": "AllToAll",
               "reduce_scatter": "ReduceScatter"}
COLLECTIVE_TABLES = {"all_gather": "AllGather", "all_reduce": "AllReduce", "all_to_all": "AllToAll",
                     "reduce_scatter": "ReduceScatter"}

#: (op directory, parquet file, converter) for a framework's tables, in mapping order. The
#: first three define a framework version (:func:`framework_versions`).
SOURCES = (
    ("gemm", "gemm_perf.parquet", T.gemm),
    ("attention", "context_attention_perf.parquet", partial(T.attention, decode=False)),
    ("attention", "generation_attention_perf.parquet", partial(T.attention, decode=True)),
    ("moe", "moe_perf.parquet", T.moe),
    ("mla", "context_mla_perf.parquet", partial(T.mla, decode=False)),
    ("mla", "generation_mla_perf.parquet", partial(T.mla, decode=True)),
    ("comm", "custom_allreduce_perf.parquet", C.custom_allreduce),
    ("quantize", "scale_matrix_perf.parquet", partial(T.quantize, op="scale_matrix")),
    ("quantize", "computescale_perf.parquet", partial(T.quantize, op="compute_scale")),
    ("linear_attention", "gdn_perf.parquet", T.gdn),
    ("sparse_attention", "glm5_dsa_attn_module_perf.parquet", T.sparse_mla),
    ("comm", "wideep_deepep_ll_perf.parquet", C.deepep_low_latency),
    ("moe", "wideep_generation_moe_perf.parquet", C.moe_deepep),
)
ANCHORS = SOURCES[:3]

#: op → (category, kernel types in lookup order); alternates a database lacks are left out, and
#: an op whose primary (first) kernel type it lacks is not mapped. ``custom_all_reduce`` is the
#: collective leaf an engine profile emits for the engine's own all-reduce (NCCL's where the
#: engine's table does not reach: more devices than one node, for instance).
OPS = {
    **{op: ("compute", ["MatMul"]) for op in MATMUL_OPS},
    "perfcast.attention.default": ("attention_special", ["GenerationAttention", "ContextAttention",
                                                         "GenerationMLA", "ContextMLA"]),
    "perfcast.moe_experts.default": ("moe_fused", ["GroupedMatMul"]),
    "perfcast.gated_delta_rule.default": ("compute", ["GatedDeltaRule", "GatedDeltaRuleDecode"]),
    "custom_all_reduce": ("communication", ["CustomAllReduce", "AllReduce"]),
    "custom_all_reduce_eager": ("communication", ["CustomAllReduceEager", "AllReduce"]),
    **{kind: ("communication", [name]) for kind, name in COLLECTIVE_TABLES.items()},
}


def default_root() -> Path | None:
    """The installed ``aiconfigurator_core`` package directory, or None."""
    import importlib.util

    spec = importlib.util.find_spec("aiconfigurator_core")
    return Path(next(iter(spec.submodule_search_locations))) if spec and spec.submodule_search_locations else None


def _package_version(aic_root: Path) -> str:
    for info in sorted(aic_root.parent.glob("aiconfigurator_core-*.dist-info")):
        return info.name.removeprefix("aiconfigurator_core-").removesuffix(".dist-info")
    try:
        return importlib.metadata.version(PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def framework_versions(sysdir: Path, backend: str) -> list[str]:
    """Versions of ``backend`` whose directories hold the GEMM and both attention tables, oldest
    first."""
    found = [{p.parent.name for p in sysdir.glob(f"{op}/{backend}/*/{fname}")} for op, fname, _ in ANCHORS]
    return sorted(set.intersection(*found), key=version_key)


def table_version(sysdir: Path, op: str, backend: str, fname: str, version: str) -> str | None:
    """``version`` if its directory has the table, else the nearest older version that has it."""
    have = sorted((p.parent.name for p in sysdir.glob(f"{op}/{backend}/*/{fname}")), key=version_key)
    older = [v for v in have if version_key(v) <= version_key(version)]
    return older[-1] if older else None


def _read(path: Path, converter, backend: str, dtypes, rel: str) -> list[tuple[Kernel, object]]:
    import pandas as pd

    raw = pd.read_parquet(path)
    out = []
    for kernel, df in converter(raw, backend):
        kernel.source, kernel.counts = f"aiconfigurator_core/systems/data/{rel}", {"rows_read": len(raw), **kernel.counts}
        out.append((kernel, T.convert(kernel, df, backend, dtypes)))
    return out


def _framework_tables(data: Path, sysdir: Path, backend: str, version: str, dtypes):
    """Every source table of one framework version (backward-filled where absent), converted."""
    tables, missing = [], {}
    for op, fname, converter in SOURCES:
        used = table_version(sysdir, op, backend, fname, version)
        if used is None:
            newer = sorted({p.parent.name for p in sysdir.glob(f"{op}/{backend}/*/{fname}")}, key=version_key)
            missing[fname] = (f"no {op}/{backend}/<version>/{fname} at {version} or older"
                              + (f" (only newer: {', '.join(newer)}; never filled forward)" if newer else ""))
            continue
        path = sysdir / op / backend / used / fname
        for kernel, df in _read(path, converter, backend, dtypes, str(path.relative_to(data))):
            kernel.provenance.update(framework=backend, version=used)
            if used != version:
                kernel.provenance["version_note"] = (
                    f"no {fname} under {version}: taken from {used}, the nearest older {backend} version "
                    "that has it (backward fill, as aiconfigurator-core's systems/query_versions.yaml)")
            tables.append((kernel, df))
    T.with_fp8_static(tables, backend)
    return tables, missing


def _collectives(sysdir: Path, version: str | None, data: Path, suffix: str):
    """NCCL tables: bytes = message_size (elements) × dtype size; newest version by default."""
    import pandas as pd

    base = sysdir / "comm" / "nccl"
    found = sorted((p.parent.name for p in base.glob("*/nccl_perf.parquet")), key=version_key)
    if version is None and not found:
        return None, []
    version = version or found[-1]
    path = base / version / "nccl_perf.parquet"
    if not path.exists():
        raise UserError(f"{path}: missing (NCCL versions here: {', '.join(found) or 'none'})")
    raw = pd.read_parquet(path)
    rel, out = f"aiconfigurator_core/systems/data/{path.relative_to(data)}", []
    for op, name in COLLECTIVES.items():
        k, df = T.nccl(raw, op, name, rel)
        k.suffix = suffix
        k.provenance.update(framework="nccl", version=version)
        out.append((k, T.convert(k, df, "nccl", None)))  # tiny: every known dtype kept
    return version, out


def _clear(directory: Path) -> None:
    """Remove the tables, mapping and manifest a previous import wrote (the directory is the
    importer's: ``<out>/<device>/<backend>/<version>``), so no stale ``.csv`` shadows a new
    ``.csv.gz``."""
    for suffix in TABLE_SUFFIXES:
        for path in directory.glob(f"*{suffix}"):
            path.unlink()
    for name in ("op_mapping.yaml", "MANIFEST.yaml"):
        (directory / name).unlink(missing_ok=True)


def _ops(names: set[str]) -> dict[str, dict]:
    """The ops whose primary kernel type was written, with the alternates that were."""
    out = {}
    for op, (category, kinds) in OPS.items():
        present = [k for k in kinds if k in names]
        if kinds[0] in names:
            out[op] = {"category": category, "kernel_type": present[0],
                       **({"alternate_kernel_types": present[1:]} if present[1:] else {})}
    return out


def import_aiconfigurator(aic_root: Path, system: str, backend: str, version: str | None, out: Path,
                          device: str, dtypes=None, nccl_version: str | None = None,
                          compress: bool = True) -> dict:
    """Write ``out/<device>/<backend>/<version>/`` (op_mapping.yaml, MANIFEST.yaml, one table per
    kernel) and ``out/<device>/nccl/<nccl version>/`` from aiconfigurator's tables for one
    system and framework; ``version`` None picks the newest (see the module docstring).
    ``dtypes`` keeps only compute rows in those perfcast dtypes (collectives keep every known
    dtype: their dtype only sets the bytes per element). Tables are ``.csv.gz`` unless
    ``compress`` is False. Returns the written directories, the version and row counts."""
    data = Path(aic_root) / "systems" / "data"
    sysdir = data / system
    if not sysdir.is_dir():
        have = sorted(p.name for p in data.glob("*") if p.is_dir())
        raise UserError(f"{sysdir}: no such system (have: {', '.join(have) or 'none'})")
    versions = framework_versions(sysdir, backend)
    chosen = version or (versions[-1] if versions else None)
    if chosen not in versions:
        what = f"{backend} {version}" if version else backend
        raise UserError(f"{sysdir}: no {what} tables with GEMM and attention (versions: {', '.join(versions) or 'none'})")
    suffix = ".csv.gz" if compress else ".csv"
    tables, missing = _framework_tables(data, sysdir, backend, chosen, set(dtypes) if dtypes else None)
    nccl, comm = _collectives(sysdir, nccl_version, data, suffix)
    if not any(len(df) for _, df in comm):
        nccl, comm = None, []

    root = Path(out) / device / backend / chosen
    comm_root = Path(out) / device / "nccl" / nccl if nccl else None
    for directory, written in ((root, tables), (comm_root, comm)):
        if directory is None:
            continue
        directory.mkdir(parents=True, exist_ok=True)
        _clear(directory)
        for k, df in written:  # a table left with no rows is counted, not written
            k.suffix, k.written = suffix, len(df) > 0
            if k.written:
                write_csv(df, directory / k.file)
    kernels = [k for k, _ in tables if k.written]
    names = {k.name for k in kernels} | {k.name for k, _ in comm if k.written}
    ops = _ops(names)
    pkg = f"{PACKAGE} {_package_version(Path(aic_root))}"
    header = (f"perfcast profiling database for {device}, {backend} {chosen}.\n"
              f"Converted from {pkg} ({LICENCE}), system {system}: see MANIFEST.yaml.")
    meta = {"schema": 1, "device": device, "framework": backend, "version": chosen,
            "communication": f"../../nccl/{nccl}" if nccl else None}
    mapped = {k for e in ops.values() for k in (e["kernel_type"], *e.get("alternate_kernel_types", []))}
    unmapped = [k.name for k in kernels if k.name not in mapped]
    write_mapping(root / "op_mapping.yaml", header, meta, kernels, ops,
                  f"not mapped: {', '.join(unmapped)} (measured for calibration and engine profiles)"
                  if unmapped else "")
    how = ("given" if version else f"the newest {backend} version with GEMM and attention tables "
           f"(of {', '.join(versions)})")
    write_manifest(root / "MANIFEST.yaml", _manifest(pkg, system, backend, chosen, device, dtypes,
                                                     [k for k, _ in tables], how, missing))
    if comm_root:
        write_manifest(comm_root / "MANIFEST.yaml", _manifest(pkg, system, "nccl", nccl, device, None,
                                                              [k for k, _ in comm], "given" if nccl_version
                                                              else "the newest NCCL version", {}))
    return {"root": root, "communication": comm_root, "version": chosen,
            "tables": {k.name: k.counts["rows"] for k, _ in tables},
            "collectives": {k.name: k.counts["rows"] for k, _ in comm}, "missing": missing}


def _manifest(pkg: str, system: str, backend: str, version: str, device: str, dtypes, kernels,
              how: str, missing: dict) -> dict:
    name, _, pver = pkg.partition(" ")
    out = {"source": {"package": name, "package_version": pver, "licence": LICENCE,
                      "attribution": ATTRIBUTION, "system": system, "backend": backend,
                      "version": version, "version_choice": how},
           "device": device, "imported": datetime.date.today().isoformat(),
           "units": {"latency_us": "microseconds (source column 'latency' in ms x 1000)"}}
    if dtypes:
        out["dtype_filter"] = (f"only rows whose dtypes are in [{', '.join(sorted(dtypes))}] are "
                               "kept (to keep the database small)")
    out["tables"] = {k.name: {"file": k.file, "source": k.source, **k.provenance, "selection": k.selection,
                              **k.counts, **({} if k.written else {"written": False}),
                              **({"unknown_dtypes_dropped": k.unknown_dtypes} if k.unknown_dtypes else {})}
                     for k in kernels}
    if missing:
        out["missing"] = missing
    return out
