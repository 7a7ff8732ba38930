"""Import aiconfigurator's measured kernel tables as a perfcast profiling database.

Data source (data only; none of its code is used): the per-kernel latency tables shipped in the
PyPI package ``aiconfigurator-core`` (NVIDIA, Apache-2.0), under
``aiconfigurator_core/systems/data/<system>/<op>/<backend>/<version>/<table>.parquet`` and
``.../<system>/comm/nccl/<nccl version>/nccl_perf.parquet``. Their ``latency`` column is in
milliseconds (see tools/derive_efficiency.py for the physical check); NCCL ``message_size`` is
an element count (the same byte volume takes about the same time in ``half`` and ``int8``).

Rows become perfcast features (:mod:`perfcast.perf.features`) so that a leaf's features select
them: GEMM → ``MatMul``; context/generation attention → ``ContextAttention`` /
``GenerationAttention`` (decode rows carry ``q_len`` 1, so a prefill leaf never matches them);
MoE → ``GroupedMatMul`` (balanced routing, gated MLP — what a perfcast ``grouped_matmul`` leaf
describes — at every expert-tensor and expert-parallel split measured; :func:`_moe` says what
such a row times). MLA tables are keyed on aiconfigurator's own parameters and left unmapped (a
perfcast MLA leaf is an ordinary attention leaf whose per-head widths the source tables do not
record). Collectives go to
``<device>/nccl/<version>/``, keyed on devices, dtype and bytes.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import re
from pathlib import Path

from perfcast.db.write import Kernel, finish, write_csv, write_manifest, write_mapping
from perfcast.ir import UserError, itemsize

PACKAGE = "aiconfigurator-core"
LICENCE = "Apache-2.0"
ATTRIBUTION = ("Kernel latencies measured by NVIDIA and published in aiconfigurator "
               "(https://github.com/ai-dynamo/aiconfigurator), Copyright (c) NVIDIA CORPORATION & "
               "AFFILIATES, licensed under the Apache License 2.0. Converted to perfcast's "
               "profiling-database format (units, column names, row selection); no code reused.")

#: aiconfigurator dtype names → perfcast's. Not mapped (rows dropped): ``fp8_block``
#: (block-scaled FP8; would collide with per-tensor ``fp8``), ``w4a16_mxfp4`` and other
#: weight-only or mixed formats perfcast's dtype pair cannot express.
DTYPES = {"bfloat16": "bf16", "float16": "fp16", "half": "fp16", "fp8": "fp8", "int8": "int8",
          "nvfp4": "fp4", "float32": "fp32", "float": "fp32"}

MATMUL_OPS = ("aten.mm.default", "aten.addmm.default", "aten.bmm.default")
ATTENTION = ("batch", "heads", "kv_heads", "q_len", "kv_len", "head_dim", "v_head_dim", "window",
             "dtype", "kv_dtype")
MLA = ("batch", "num_heads", "tp_size", "q_len", "kv_len", "dtype", "kv_dtype")
COLLECTIVES = {"all_gather": "AllGather", "all_reduce": "AllReduce", "alltoall": "AllToAll",
               "reduce_scatter": "ReduceScatter"}
# perfcast collective leaf kinds → table names
COLLECTIVE_KINDS = {"all_gather": "AllGather", "all_reduce": "AllReduce", "all_to_all": "AllToAll",
                    "reduce_scatter": "ReduceScatter"}


def _us(ms):
    return ms.astype(float) * 1000.0


def _gemm(df):
    k = Kernel("MatMul", ("M", "K", "N", "dtype"), ("M", "N", "K"),
               selection="m, n, k -> M, N, K (output M x N, reduction K); gemm_dtype -> dtype")
    return k, df.assign(M=df.m, N=df.n, K=df.k, dtype=df.gemm_dtype)


def _attention(df, decode: bool):
    name = "GenerationAttention" if decode else "ContextAttention"
    df = df[df.beam_width == 1]
    q_len = 1 if decode else df.isl
    how = ("q_len = 1 (one new token per sequence), kv_len = isl + step" if decode else
           "q_len = isl, kv_len = isl + step (step is 0: no cached prefix)")
    if decode:
        k = Kernel(name, ATTENTION, ("batch", "kv_len"), {"kv_len": "sqrt"},
                   comment="decode: q_len is always 1, so a prefill leaf (q_len > 1) never matches")
    else:
        k = Kernel(name, ATTENTION, ("batch",), comment=(
            "prefill: q_len == kv_len in every row, so lengths are exact-match only (1-D\n"
            "interpolation along one length would need rows with the other length fixed)"))
    k.selection = (f"beam_width 1; {how}; num_heads -> heads, num_key_value_heads -> kv_heads, "
                   "v_head_dim = head_dim, window_size -> window (0 = full), attn_dtype -> dtype, "
                   "kv_cache_dtype -> kv_dtype")
    return k, df.assign(batch=df.batch_size, heads=df.num_heads, kv_heads=df.num_key_value_heads,
                        q_len=q_len, kv_len=df.isl + df.step, v_head_dim=df.head_dim,
                        window=df.window_size, dtype=df.attn_dtype, kv_dtype=df.kv_cache_dtype)


def _mla(df, decode: bool):
    name = "GenerationMLA" if decode else "ContextMLA"
    axes, transform = (("batch", "kv_len"), {"kv_len": "sqrt"}) if decode else (("batch",), {})
    k = Kernel(name, MLA, axes, transform, comment=(
        "unmapped: keyed on aiconfigurator's MLA parameters (num_heads, tp_size), which are\n"
        "not perfcast leaf features; a perfcast MLA leaf is priced as ordinary attention"))
    k.selection = ("q_len = " + ("1" if decode else "isl") + ", kv_len = isl + step; mla_dtype -> "
                   "dtype, kv_cache_dtype -> kv_dtype; num_heads and tp_size as in the source")
    return k, df.assign(batch=df.batch_size, q_len=1 if decode else df.isl, kv_len=df.isl + df.step,
                        dtype=df.mla_dtype, kv_dtype=df.kv_cache_dtype)


def _moe(df):
    """Balanced, gated MoE rows at every ``moe_tp_size`` × ``moe_ep_size`` measured.

    What a row times — aiconfigurator's TensorRT-LLM collector (``collector/trtllm/collect_moe.py``,
    ``run_moe_torch``; routing from ``balanced_logits`` in ``collector/helper.py``): one GPU builds
    the fused MoE module with ``create_moe(num_experts=E, intermediate_size=inter_size, ...)``
    under a ``Mapping`` with ``moe_tp_size`` and ``moe_ep_size`` set, i.e. as rank 0 of that
    split — experts ``[0, E/moe_ep)``, ``inter_size/moe_tp`` of each one's intermediate
    (``inter_size`` is the model's full per-expert width, split inside; the autotuner cache is
    named ``{hidden}_{inter_size // moe_tp_size}_{num_experts // moe_ep_size}``). The timed
    forward gets ``num_tokens`` tokens, each routed to ``topk`` of all E experts (token t →
    ``(t + i·⌈E/topk⌉) mod E``), and does no communication (``reduce_results=False``): the rank
    computes the token-expert pairs that land on its experts, ``num_tokens·topk/moe_ep`` under
    balanced routing. ``num_tokens`` is thus the MoE input on one rank — every token of the MoE
    group, not a per-rank share: aiconfigurator's own MoE op (``src/aiconfigurator/sdk/operations/
    moe.py``: ``MoE.query`` asks for ``x · attention_dp_size`` tokens, ``x`` per attention rank;
    the speed of light in ``MoE._query_moe_table`` counts ``num_tokens·topk/moe_ep`` pairs at
    ``inter_size/moe_tp``). The rows agree: latency falls about as ``1/moe_ep`` at many tokens.

    perfcast's keys describe the device's work: ``tokens`` = num_tokens; ``inter`` =
    ``inter_size / moe_tp`` (the width its GEMMs run at, which a leaf's per-device weights give);
    ``experts`` = E (global); ``moe_tp``, ``moe_ep`` as measured."""
    df = df[(df.distribution == "balanced") & ~df.kernel_source.str.contains("nongated")
            & (df.inter_size % df.moe_tp_size == 0)]
    k = Kernel("GroupedMatMul", ("tokens", "hidden", "inter", "experts", "top_k", "moe_tp", "moe_ep", "dtype"),
               ("tokens",), selection=(
                   "distribution balanced, gated kernels only (kernel_source without 'nongated'), every "
                   "moe_tp_size and moe_ep_size; num_tokens -> tokens (the MoE input on one rank: every "
                   "token of the group, routed over all experts), hidden_size -> hidden, inter_size / "
                   "moe_tp_size -> inter (per expert, per device), num_experts -> experts (global), topk "
                   "-> top_k, moe_tp_size -> moe_tp, moe_ep_size -> moe_ep, moe_dtype -> dtype. A row "
                   "times rank 0 of the split: experts [0, E/moe_ep), inter_size/moe_tp of each, and "
                   "the num_tokens*topk/moe_ep token-expert pairs balanced routing sends them "
                   "(aiconfigurator collector/trtllm/collect_moe.py, run_moe_torch; "
                   "src/aiconfigurator/sdk/operations/moe.py, MoE.query)"))
    return k, df.assign(tokens=df.num_tokens, hidden=df.hidden_size, inter=df.inter_size // df.moe_tp_size,
                        experts=df.num_experts, top_k=df.topk, moe_tp=df.moe_tp_size, moe_ep=df.moe_ep_size,
                        dtype=df.moe_dtype)


#: (op directory, parquet file, converter) for the compute tables, in mapping order.
COMPUTE = (
    ("gemm", "gemm_perf.parquet", _gemm),
    ("attention", "context_attention_perf.parquet", lambda df: _attention(df, False)),
    ("attention", "generation_attention_perf.parquet", lambda df: _attention(df, True)),
    ("moe", "moe_perf.parquet", _moe),
    ("mla", "context_mla_perf.parquet", lambda df: _mla(df, False)),
    ("mla", "generation_mla_perf.parquet", lambda df: _mla(df, True)),
)

OPS = {
    **{op: {"category": "compute", "kernel_type": "MatMul"} for op in MATMUL_OPS},
    "perfcast.attention.default": {"category": "attention_special", "kernel_type": "GenerationAttention",
                                   "alternate_kernel_types": ["ContextAttention"]},
    "perfcast.moe_experts.default": {"category": "moe_fused", "kernel_type": "GroupedMatMul"},
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


def _vkey(v: str):
    return tuple(int(x) for x in re.findall(r"\d+", v))


def _convert(kernel: Kernel, df, dtypes: set[str] | None):
    """Map dtypes (dropping unknown ones and, if given, those outside ``dtypes``), ms → µs."""
    kernel.counts["rows_selected"] = len(df)
    dcols = [c for c in ("dtype", "kv_dtype") if c in kernel.keys]
    source, df = df, df.assign(**{c: df[c].map(DTYPES) for c in dcols}, latency_us=_us(df.latency))
    known = df[dcols].notna().all(axis=1)
    kernel.counts["dropped_unknown_dtype"] = int((~known).sum())
    kernel.unknown_dtypes = sorted({str(v) for c in dcols for v in source[c][~known] if v not in DTYPES})
    df = df[known]
    if dtypes is not None:
        keep = df[dcols].isin(dtypes).all(axis=1)
        kernel.counts["dropped_dtype_filter"] = int((~keep).sum())
        df = df[keep]
    return finish(df, kernel)


def _read(path: Path, kernel_of, dtypes, rel: str):
    import pandas as pd

    raw = pd.read_parquet(path)
    kernel, df = kernel_of(raw)
    kernel.source, kernel.counts["rows_read"] = f"aiconfigurator_core/systems/data/{rel}", len(raw)
    return kernel, _convert(kernel, df, dtypes)


def _collectives(sysdir: Path, version: str | None, dtypes, data: Path):
    """NCCL tables: bytes = message_size (elements) × dtype size; newest version by default."""
    base = sysdir / "comm" / "nccl"
    found = sorted((p.parent.name for p in base.glob("*/nccl_perf.parquet")), key=_vkey)
    if version is None and not found:
        return None, []
    version = version or found[-1]
    path = base / version / "nccl_perf.parquet"
    if not path.exists():
        raise UserError(f"{path}: missing (NCCL versions here: {', '.join(found) or 'none'})")
    import pandas as pd

    raw = pd.read_parquet(path)
    rel, out = f"aiconfigurator_core/systems/data/{path.relative_to(data)}", []
    for op, name in COLLECTIVES.items():
        k = Kernel(name, ("devices", "dtype", "bytes"), ("bytes",), source=rel,
                   selection=f"op_name {op}; num_gpus -> devices, nccl_dtype -> dtype, "
                             "bytes = message_size (an element count) x dtype size")
        rows = raw[raw.op_name == op]
        k.counts["rows_read"] = len(rows)
        size = rows.nccl_dtype.map(DTYPES).map(lambda d: float(itemsize(d)) if isinstance(d, str) else 0.0)
        nbytes = (rows.message_size * size).round().astype("int64")  # unknown dtypes drop later
        df = rows.assign(devices=rows.num_gpus, dtype=rows.nccl_dtype, bytes=nbytes)
        out.append((k, _convert(k, df, dtypes)))
    return version, out


def import_aiconfigurator(aic_root: Path, system: str, backend: str, version: str, out: Path,
                          device: str, dtypes=None, nccl_version: str | None = None) -> dict:
    """Write ``out/<device>/<backend>/<version>/`` (op_mapping.yaml, MANIFEST.yaml, one CSV per
    kernel) and ``out/<device>/nccl/<nccl version>/`` from aiconfigurator's tables for one
    system, backend and version. ``dtypes`` keeps only compute rows in those perfcast dtypes
    (collectives keep every known dtype: their dtype only sets the bytes per element).
    Returns the written directories and row counts per table."""
    data = Path(aic_root) / "systems" / "data"
    sysdir = data / system
    if not sysdir.is_dir():
        have = sorted(p.name for p in data.glob("*") if p.is_dir())
        raise UserError(f"{sysdir}: no such system (have: {', '.join(have) or 'none'})")
    dtypes = set(dtypes) if dtypes else None
    tables = []
    for op, fname, kernel_of in COMPUTE:
        path = sysdir / op / backend / version / fname
        if path.exists():
            tables.append(_read(path, kernel_of, dtypes, str(path.relative_to(data))))
    if not tables:
        have = sorted({p.parent.name for p in sysdir.glob(f"*/{backend}/*/*.parquet")}, key=_vkey)
        raise UserError(f"{sysdir}: no {backend} {version} tables (versions: {', '.join(have) or 'none'})")
    nccl, comm = _collectives(sysdir, nccl_version, None, data)  # tiny: every known dtype kept
    if not any(len(df) for _, df in comm):
        nccl, comm = None, []

    root = Path(out) / device / backend / version
    comm_root = Path(out) / device / "nccl" / nccl if nccl else None
    for k, df in (*tables, *comm):  # a table left with no rows is counted, not written
        k.written = len(df) > 0
    for k, df in tables:
        if k.written:
            write_csv(df, root / f"{k.name}.csv")
    for k, df in comm:
        if k.written:
            write_csv(df, comm_root / f"{k.name}.csv")
    kernels = [k for k, _ in tables if k.written]
    names = {k.name for k in kernels}
    ops = {op: e for op, e in OPS.items()
           if {e["kernel_type"], *e.get("alternate_kernel_types", [])} <= names}
    # Collective leaves (kind = op name) priced from the communication directory's tables.
    ops.update({kind: {"category": "communication", "kernel_type": k.name}
                for kind, k in ((kind, k) for k, _ in comm if k.written
                                for kind, name in COLLECTIVE_KINDS.items() if name == k.name)})
    pkg = f"{PACKAGE} {_package_version(Path(aic_root))}"
    header = (f"perfcast profiling database for {device}, {backend} {version}.\n"
              f"Converted from {pkg} ({LICENCE}), system {system}: see MANIFEST.yaml.")
    meta = {"schema": 1, "device": device, "framework": backend, "version": version,
            "communication": f"../../nccl/{nccl}" if nccl else None}
    unmapped = [k.name for k in kernels if k.name not in {n for e in ops.values()
                for n in (e["kernel_type"], *e.get("alternate_kernel_types", []))}]
    write_mapping(root / "op_mapping.yaml", header, meta, kernels, ops,
                  f"not mapped: {', '.join(unmapped)} (see their comments above)" if unmapped else "")
    manifest = _manifest(pkg, system, backend, version, device, dtypes, [k for k, _ in tables])
    write_manifest(root / "MANIFEST.yaml", manifest)
    if comm_root:
        write_manifest(comm_root / "MANIFEST.yaml",
                       _manifest(pkg, system, "nccl", nccl, device, None, [k for k, _ in comm]))
    return {"root": root, "communication": comm_root,
            "tables": {k.name: k.counts["rows"] for k, _ in tables},
            "collectives": {k.name: k.counts["rows"] for k, _ in comm}}


def _manifest(pkg: str, system: str, backend: str, version: str, device: str, dtypes, kernels) -> dict:
    name, _, pver = pkg.partition(" ")
    out = {"source": {"package": name, "package_version": pver, "licence": LICENCE,
                      "attribution": ATTRIBUTION, "system": system, "backend": backend,
                      "version": version},
           "device": device, "imported": datetime.date.today().isoformat(),
           "units": {"latency_us": "microseconds (source column 'latency' in ms x 1000)"}}
    if dtypes:
        out["dtype_filter"] = (f"only rows whose dtypes are in [{', '.join(sorted(dtypes))}] are "
                               "kept (to keep the shipped database small)")
    out["tables"] = {k.name: {"source": k.source, "selection": k.selection, **k.counts,
                              **({} if k.written else {"written": False}),
                              **({"unknown_dtypes_dropped": k.unknown_dtypes} if k.unknown_dtypes else {})}
                     for k in kernels}
    return out
