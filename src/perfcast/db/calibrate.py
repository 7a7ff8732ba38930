"""Fit the calibrated kernel forms (:mod:`perfcast.perf.kernel_fit`) on a profiling database's
measured kernels, and measure how well they hold out of sample.

Per kernel class and variant (``gemm/bf16``, ``attention.generation/bf16+fp8kv`` …) the fit
minimises the robust (soft-L1) sum of squared log-ratios of fitted to measured latency — relative
error, so a 3 µs kernel weighs as much as a 3 ms one — with SciPy's bounded trust-region
least squares; then the residual grid takes the median log-ratio left in each cell of two log₂
shape axes. Out of sample: k-fold by shape — every distinct shape (all key columns) is in
exactly one fold, and each fold is predicted by a fit on the others.

Only per-kernel measurements are used, never end-to-end data.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from perfcast.hardware.device import Device
from perfcast.perf.kernel_classes import CELL_LOG2, CLASSES, KernelClass
from perfcast.perf.kernel_fit import KernelFit, KernelWork, Ramp, Residual

#: database kernel type → kernel class
TABLE_CLASSES = {"MatMul": "gemm", "ContextAttention": "attention.context",
                 "GenerationAttention": "attention.generation", "GroupedMatMul": "moe",
                 "GroupedMatMulMinLatency": "moe.trtllm_gen",
                 "ContextMLA": "mla.context", "GenerationMLA": "mla.generation",
                 "CustomAllReduce": "allreduce", "ScaleMatrix": "vector",
                 "GatedDeltaRule": "gdn.chunked", "GatedDeltaRuleDecode": "gdn.recurrent",
                 "SparseMLAPrefill": "dsa.sparse_prefill", "DeepEPLowLatency": "moe_a2a",
                 "GroupedMatMulDeepEP": "moe.deepep"}
#: HBM bytes per element of the memory-bound table's kernel: FP8 quantization of a bf16 operand
#: with a static scale reads 2 B and writes 1 B per element (ComputeScale is not a kernel but a
#: difference of two measurements, dynamic minus static: left out)
VECTOR_BYTES = {"ScaleMatrix": 3}
FOLDS = 5
MIN_ROWS = 40  # fewer measured shapes than this: no fit (too few to hold anything out)
MIN_CELL = 3


@dataclass(frozen=True)
class Sample:
    """Measured rows of one kernel class and variant: shapes (column → array), latency in s."""

    cls: KernelClass
    variant: str
    shapes: dict[str, np.ndarray]
    latency_s: np.ndarray
    table: str

    def __len__(self) -> int:
        return len(self.latency_s)

    def subset(self, mask: np.ndarray) -> "Sample":
        return Sample(self.cls, self.variant,
                      {k: v[mask] if isinstance(v, np.ndarray) else v for k, v in self.shapes.items()},
                      self.latency_s[mask], self.table)

    def groups(self) -> np.ndarray:
        """One id per distinct shape."""
        cols = [v.astype(str) for v in self.shapes.values() if isinstance(v, np.ndarray)]
        key = cols[0]
        for c in cols[1:]:
            key = np.char.add(np.char.add(key, "|"), c)
        return np.unique(key, return_inverse=True)[1]


def frame(table):
    """A loaded (checked) kernel table as a DataFrame: its key columns and ``latency_us``."""
    import pandas as pd

    df = pd.DataFrame(list(table.rows), columns=list(table.keys))
    df["latency_us"] = list(table.rows.values())
    return df


def needed(cls_name: str) -> tuple[str, ...]:
    """The key columns a class's fit reads from a table (:func:`_rows`): its keys (a vector
    kernel's bytes come from ``shape``), and the attention kernels' ``window`` and ``q_len``."""
    keys = ("shape",) if cls_name == "vector" else CLASSES[cls_name].keys
    return (*keys, *(("window", "q_len") if cls_name.startswith(("attention", "mla")) else ()))


def samples(root: Path) -> list[Sample]:
    """The database's tables that a kernel class covers, one sample per variant."""
    from perfcast.hardware.spec import SpecError
    from perfcast.perf.profiling import load_database

    db = load_database(Path(root))
    frames: dict[str, list] = {}
    for name, spec in sorted(db.mapping.kernels.items()):
        cls_name = TABLE_CLASSES.get(name)
        if cls_name is None:
            continue
        missing = [c for c in needed(cls_name) if c not in spec.keys]
        if missing:
            raise SpecError(f"{Path(root) / 'op_mapping.yaml'}: kernel {name} is fitted as {cls_name}, which needs "
                            f"key column {missing[0]!r} (its keys: {', '.join(spec.keys)})")
        df = _rows(frame(db.tables[name]), name, cls_name)
        if df is not None and len(df):
            frames.setdefault(cls_name, []).append((name, df))
    out = []
    for cls_name, parts in frames.items():
        import pandas as pd

        cls = CLASSES[cls_name]
        df = pd.concat([d for _, d in parts], ignore_index=True)
        table = "+".join(n for n, _ in parts)
        variants = np.array([cls.variant(dict(r)) for r in df[list(cls.keys)].to_dict("records")])
        for v in sorted(set(variants)):
            part = df[variants == v]
            # string keys are one value per variant; sizes are columns
            shapes = {k: (str(part[k].iloc[0]) if k in ("dtype", "kv_dtype") else part[k].to_numpy(dtype=float))
                      for k in cls.keys}
            out.append(Sample(cls, v, shapes, part["latency_us"].to_numpy(dtype=float) * 1e-6, table))
    return out


def _rows(df, table: str, cls_name: str):
    """The rows of one table that its class's fit describes, with the class's key columns."""
    if cls_name.startswith(("attention", "mla")):
        df = df[df["window"] == 0]  # sliding-window kernels are a family of their own
        df = df[(df["q_len"] == 1) == cls_name.endswith("generation")]
    if cls_name.startswith("moe") and "routing" in df.columns:
        df = df[df["routing"] == "balanced"]  # what a perfcast grouped-GEMM leaf assumes
    if cls_name == "vector":
        numel = df["shape"].map(lambda s: float(np.prod([int(x) for x in str(s).split("x")])))
        df = df.assign(bytes=numel * VECTOR_BYTES[table])
    return df


def peaks(device: Device, cls: KernelClass, variant: str) -> tuple[float, float] | None:
    """(matrix rate, bandwidth) the fit is relative to; None when the device lacks the rate."""
    dtype = cls.rate_dtype(variant)
    rates = device.spec.datasheet.matrix_flops_per_s
    if dtype is not None and dtype not in rates:
        return None
    rate = float(rates[dtype]) if dtype is not None else 1.0
    bw = cls.bandwidth_of(device)
    return (rate, bw) if bw else None


def work_of(sample: Sample, units: int) -> KernelWork:
    return sample.cls.work(sample.shapes, units)


# Parameters: static (µs), p, the memory ramp (log f, log x₀, a), the compute ramp if the class
# has one, then τ (ns) per item. Starting points and bounds in those units.
_START = {"static": (2.5, 0, 50), "p": (3.0, 1, 20), "lf": (math.log(0.85), -4, 0.5), "a": (1.0, 0.2, 4)}


def _unpack(x: np.ndarray, items: list[str], compute: bool) -> KernelFit:
    static_us, p, lfm, lxm, am = x[:5]
    rest = list(x[5:])
    comp = None
    if compute:
        lfc, lxc, ac = rest[:3]
        rest = rest[3:]
        comp = Ramp(math.exp(lfc), math.exp(lxc), float(ac))
    return KernelFit(static_s=static_us * 1e-6, overlap=float(p), compute=comp,
                     memory=Ramp(math.exp(lfm), math.exp(lxm), float(am)),
                     item_s={name: float(tau) * 1e-9 for name, tau in zip(items, rest)})


def fit_core(work: KernelWork, latency_s: np.ndarray, rate: float, bandwidth: float,
             compute: bool = True) -> KernelFit:
    """The smooth form (no residual) by robust least squares on log latency."""
    from scipy.optimize import least_squares

    items = sorted(work.items)
    s, p, lf, a = (_START[k] for k in ("static", "p", "lf", "a"))
    half = (math.log(3e-6), math.log(1e-9), math.log(1e-2))  # the ramp's half time, s
    spec = [s, p, lf, half, a] + ([lf, (math.log(1e-5), math.log(1e-9), math.log(1e-1)), a] if compute else []) \
        + [(1.0, 0, 1e5)] * len(items)
    x0, lo, hi = (list(col) for col in zip(*spec))
    log_t = np.log(latency_s)

    def residual(x):
        return np.log(_unpack(x, items, compute).time(work, rate, bandwidth)) - log_t

    r = least_squares(residual, x0, bounds=(lo, hi), loss="soft_l1", f_scale=0.1, x_scale="jac")
    return _unpack(r.x, items, compute)


def fit_residual(fit: KernelFit, work: KernelWork, axes: tuple[str, str], latency_s: np.ndarray,
                 rate: float, bandwidth: float, min_cell: int = MIN_CELL,
                 cells: tuple = ((CELL_LOG2, 0.0), (CELL_LOG2, 0.0))) -> Residual | None:
    """Median log-ratio of the measured to the smooth form per cell of the two axes (log₂);
    ``cells``: each axis's cell width and where the first cell starts below the smallest value."""
    log_r = np.log(latency_s / fit.time(work, rate, bandwidth))
    xs = [np.log2(np.maximum(np.asarray(work.axes[a], dtype=float), 1e-300)) for a in axes]
    edges = [np.arange(math.floor(x.min()) - off, math.ceil(x.max()) + width, width)
             for x, (width, off) in zip(xs, cells)]
    if any(len(e) < 3 for e in edges):
        return None
    idx = [np.clip(np.digitize(x, e) - 1, 0, len(e) - 2) for x, e in zip(xs, edges)]
    grid = np.zeros((len(edges[0]) - 1, len(edges[1]) - 1))
    for i in range(grid.shape[0]):
        for j in range(grid.shape[1]):
            cell = (idx[0] == i) & (idx[1] == j)
            if cell.sum() >= min_cell:
                grid[i, j] = float(np.median(log_r[cell]))
    centres = tuple(tuple(float(c) for c in (e[:-1] + e[1:]) / 2) for e in edges)
    return Residual(axes, centres, tuple(tuple(round(float(v), 4) for v in row) for row in grid))


def fit_sample(sample: Sample, device: Device, units: int | None = None) -> KernelFit | None:
    pk = peaks(device, sample.cls, sample.variant)
    if pk is None or len(sample) < MIN_ROWS:
        return None
    units = units or device.spec.datasheet.compute_units
    work = work_of(sample, units)
    core = fit_core(work, sample.latency_s, *pk, compute=sample.cls.rate_dtype(sample.variant) is not None)
    axes = sample.cls.residual_axes
    res = fit_residual(core, work, axes, sample.latency_s, *pk, min_cell=sample.cls.min_cell,
                       cells=sample.cls.cells) if axes else None
    return KernelFit(core.static_s, core.overlap, core.compute, core.memory, core.item_s, res)


def predict(fit: KernelFit, sample: Sample, device: Device, units: int | None = None) -> np.ndarray:
    units = units or device.spec.datasheet.compute_units
    return fit.time(work_of(sample, units), *peaks(device, sample.cls, sample.variant))


def kfold(sample: Sample, device: Device, folds: int = FOLDS, seed: int = 0) -> np.ndarray | None:
    """Each row predicted by a fit on the folds that do not hold its shape; None when no fold can
    be fitted with its fifth held out (too few shapes: no out-of-sample figure, so no fit either)."""
    group = sample.groups()
    fold_of = np.random.default_rng(seed).integers(0, folds, group.max() + 1)[group]
    pred = np.full(len(sample), np.nan)
    for f in range(folds):
        held = fold_of == f
        fit = fit_sample(sample.subset(~held), device)
        if fit is not None and held.any():
            pred[held] = predict(fit, sample.subset(held), device)
    return pred if np.isfinite(pred).any() else None


def spec_of(fit: KernelFit, sample: Sample, pred: np.ndarray, database: str) -> dict:
    """The calibration-file entry of one fit, with its provenance and out-of-sample error."""
    err = np.abs(pred / sample.latency_s - 1)
    err = err[np.isfinite(err)]
    entry = {"static_s": _g(fit.static_s), "overlap": _g(fit.overlap)}
    for name, r in (("compute", fit.compute), ("memory", fit.memory)):
        if r is not None:
            entry[name] = {"peak_fraction": _g(r.peak_fraction), "half_time_s": _g(r.half_time_s), "slope": _g(r.slope)}
    entry["item_s"] = {k: _g(v) for k, v in fit.item_s.items()}
    if fit.residual is not None:
        r = fit.residual
        entry["residual"] = {"axes": list(r.axes), "centres": [list(c) for c in r.centres],
                             "log_ratio": [list(row) for row in r.log_ratio]}
    entry["rows"] = int(len(sample))
    entry["out_of_sample"] = {"folds": FOLDS, "median": _g(float(np.median(err))),
                              "p90": _g(float(np.percentile(err, 90)))}
    entry["source"] = (f"fitted by `perfcast db calibrate` on {database}/{sample.table} ({len(sample):,} "
                       f"measured kernels of variant {sample.variant}): robust least squares on log latency; "
                       + (f"residual on {_cells(sample.cls.cells)} cells of log2 "
                          f"{' x '.join(sample.cls.residual_axes)}; " if fit.residual is not None else "")
                       + f"{FOLDS}-fold by shape: median {np.median(err):.1%}, p90 {np.percentile(err, 90):.1%}")
    return entry


def _cells(cells) -> str:
    widths = {w for w, _ in cells}
    return f"{widths.pop():g}-octave" if len(widths) == 1 and not any(o for _, o in cells) else \
        " x ".join(f"{w:g}-octave" for w, _ in cells)


#: a memory-bound kernel table stands for the engine's elementwise kernels only if its largest
#: kernels stream at least this share of HBM bandwidth (a native kernel reaches 80-90 %; a
#: composition of framework ops that round-trips memory several times does not)
NATIVE = 0.5


def native(sample: Sample, device: Device) -> bool:
    nbytes = np.asarray(sample.shapes["bytes"], dtype=float)
    top = nbytes >= np.quantile(nbytes, 0.9)
    achieved = np.median(nbytes[top] / sample.latency_s[top])
    return achieved >= NATIVE * float(device.spec.datasheet.hbm_bandwidth_bytes_per_s)


#: a quantized GEMM (or MoE layer) reads at most the bytes of the bf16 one of the same shape, at no
#: lower matrix rate; a table whose quantized kernels take more than this many times the same
#: table's bf16 ones (median over the shapes both measure) timed something besides the kernel and
#: does not stand for the engine's kernel of that format. Over aiconfigurator-core 0.12.0's tables
#: the median ratio is 0.6-2.1 for every engine and GEMM format (MoE: at most 2.5) but vLLM
#: 0.24.0's block-scaled FP8 GEMMs (4.3x on H100, 4.9x on H200, 18-35x on B200/B300/GB200/GB300:
#: 60 us, and 150-300 us on Blackwell, for a 4096 x 4096 GEMM that SGLang's and TensorRT-LLM's
#: tables of the same devices time at 9-21 us) and SGLang 0.5.6's int8 weight-only on H100 (4.4x)
QUANTIZED_SLOWDOWN = 3.0


def slowdown(sample: Sample, reference: Sample) -> tuple[float, int]:
    """(median latency ratio of ``sample`` to ``reference`` over the shapes both measure, how
    many shapes that is); (nan, 0) when they share none."""
    import pandas as pd

    def medians(s: Sample):
        cols = {k: v for k, v in s.shapes.items() if isinstance(v, np.ndarray)}
        return pd.DataFrame({**cols, "t": s.latency_s}).groupby(list(cols))["t"].median()

    ratio = (medians(sample) / medians(reference)).dropna()
    return (float(ratio.median()), len(ratio)) if len(ratio) else (math.nan, 0)


def rejection(sample: Sample, reference: Sample | None) -> str | None:
    """Why a quantized GEMM or MoE table is not the engine's kernel of that format (None: it is)."""
    if sample.cls.name not in ("gemm", "moe") or reference is None or sample.variant == reference.variant:
        return None
    ratio, shared = slowdown(sample, reference)
    if not ratio > QUANTIZED_SLOWDOWN:
        return None
    one, what = ("GEMM", "GEMMs") if sample.cls.name == "gemm" else ("MoE layer", "MoE layers")
    return (f"its {sample.variant} {what} take a median {ratio:.1f}x its bf16 {what} of the same {shared:,} shapes "
            f"(more than {QUANTIZED_SLOWDOWN:g}x: a quantized {one} reads fewer bytes at no lower matrix rate), "
            f"so they are not timings of the engine's {sample.variant} kernel")


def _g(x: float) -> float:
    return float(f"{x:.5g}")


def calibrate(root: Path, device: Device, database: str, progress=None, only=None) -> dict:
    """The calibration document of one database: every class and variant it can fit (of the
    classes ``only``, where given)."""
    from perfcast.perf.profiling import load_database

    mapping = load_database(Path(root)).mapping
    fits, rejected = {}, {}
    found = [s for s in samples(root) if only is None or s.cls.name in only]
    bf16 = {s.cls.name: s for s in found if s.variant == "bf16"}
    for sample in found:
        if sample.cls.name == "vector" and not native(sample, device):
            if progress:
                progress(f"vector: {sample.table} skipped: it never reaches {NATIVE:.0%} of HBM bandwidth, so it is "
                         f"not a native memory-bound kernel and does not stand for the engine's fused ones")
            continue
        why = rejection(sample, bf16.get(sample.cls.name))
        if why is not None:
            rejected[f"{sample.cls.name}/{sample.variant}"] = f"{sample.table}: {why}"
            if progress:
                progress(f"{sample.cls.name}/{sample.variant}: {sample.table} rejected: {why}")
            continue
        fit = fit_sample(sample, device)
        if fit is None:
            continue
        pred = kfold(sample, device)
        if pred is None:
            if progress:
                progress(f"{sample.cls.name}/{sample.variant}: {len(sample):,} rows, too few to fit with a fold held out")
            continue
        fits[f"{sample.cls.name}/{sample.variant}"] = spec_of(fit, sample, pred, database)
        if progress:
            progress(f"{sample.cls.name}/{sample.variant}: {len(sample):,} rows, "
                     f"{fits[f'{sample.cls.name}/{sample.variant}']['out_of_sample']['median']:.1%} median")
    doc = {"schema": 1, "device": device.name, "framework": mapping.framework, "version": mapping.version,
           "database": database, "fits": fits}
    return {**doc, "rejected": rejected} if rejected else doc
