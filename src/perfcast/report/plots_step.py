"""Figures of one priced step (``perfcast text-generate --plot``) and of a DSL kernel
(``perfcast kernel --plot``): the roofline with every op placed, the step's time by op and by layer
stacked by bound, the memory against capacity, a kernel's sweep. Formatting only (shared style:
:mod:`perfcast.report.plots`)."""

from __future__ import annotations

from collections import defaultdict

import numpy as np
from matplotlib.colors import LogNorm

from perfcast.ir import BYTES_HBM, FLOPS_MATRIX, FLOPS_VECTOR
from perfcast.report.format import integer, si
from perfcast.report.plots import BOUND_COLOURS, Skipped, figure, plain_log, provenance_colour, styled
from perfcast.report.textgen import op_name, provenance_by_time, provenance_label

#: Ops shown by name in the step's time by op; the rest are summed as one bar.
TOP_OPS = 15
_GB = 1e9


def _flops(row: dict) -> float:
    return row.get(FLOPS_MATRIX, 0.0) + row.get(FLOPS_VECTOR, 0.0)


def describe_step(result) -> str:
    """``llama-3.1-8b on 2 × h100-sxm (tp2) · decode, 8 × 1 after 1,024``: what a title says."""
    req = result.request
    where = f"{req.devices} × {req.device.name} ({req.layout.describe()})" if req.devices > 1 else req.device.name
    phase = (f"decode, {req.num_queries} seq × 1 token after {req.context_length:,}" if req.decode else
             f"prefill, {req.num_queries} seq × {req.query_length:,} tokens")
    return f"{req.model.name} on {where} · {phase}"


# --- the roofline ---------------------------------------------------------------------------------

def _roofline(ax, device, points: list[tuple[float, float, str]], matrix_dtypes, vector_dtype: str,
              unplaced: list[str], whole: tuple[float, float, str] | None = None, whole_name: str = "") -> None:
    """The device's roofs (HBM bandwidth, each matrix rate, the vector rate) and ``points``
    (arithmetic intensity in FLOP/B, achieved FLOP/s, provenance label) coloured by provenance;
    ``unplaced`` says which ops have no place on it (no FLOPs or no HBM bytes); ``whole``: the
    point of them all together (``whole_name``), drawn apart."""
    bw = float(device.hbm_bandwidth_bytes_per_s)
    rates = {f"matrix {dt}": float(device.matrix_flops_per_s(dt)) for dt in matrix_dtypes
             if dt in device.spec.datasheet.matrix_flops_per_s}
    rates[f"vector {device.vector_dtype(vector_dtype)}"] = float(device.vector_flops_per_s(vector_dtype))
    xs = [p[0] for p in points + ([whole] if whole else [])] or [1.0]
    lo = min(min(xs), min(rates.values()) / bw) / 4
    hi = max(max(xs), max(rates.values()) / bw) * 4
    x = np.geomspace(lo, hi, 256)
    ax.plot(x, bw * x, color="black", linewidth=1, label=f"HBM {si(bw, 'B/s')}")
    for (label, rate), dash in zip(sorted(rates.items(), key=lambda kv: -kv[1]), ("-", "--", ":", "-.") * 4):
        ax.plot(x, np.minimum(rate, bw * x), color="black", linestyle=dash, linewidth=0.8, alpha=0.7)
        ax.annotate(f"{label} {si(rate, 'FLOP/s')}", (hi, rate), ha="right", va="bottom", fontsize="x-small")
    by_label: dict[str, list] = defaultdict(list)
    for xi, yi, label in points:
        by_label[label].append((xi, yi))
    for label in sorted(by_label):
        arr = np.array(by_label[label])
        ax.scatter(arr[:, 0], arr[:, 1], s=22, color=provenance_colour(label), label=label, zorder=3,
                   edgecolors="white", linewidths=0.4)
    if whole is not None:
        ax.scatter([whole[0]], [whole[1]], s=200, marker="*", color=provenance_colour(whole[2]), zorder=4,
                   edgecolors="black", label=f"{whole_name} (mostly {whole[2]})")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP / HBM byte)")
    ax.set_ylabel("achieved rate (FLOP/s per device)")
    ax.legend(loc="lower right", title="provenance")
    if unplaced:
        shown = ", ".join(unplaced[:4]) + (f" and {len(unplaced) - 4} more" if len(unplaced) > 4 else "")
        ax.text(0.01, 0.99, f"not placed (no FLOPs or no HBM bytes): {shown}", transform=ax.transAxes,
                va="top", fontsize="x-small", wrap=True)


def _placed(rows) -> tuple[list[tuple[float, float, str]], list[str]]:
    """(intensity, achieved rate, label) of every (label, row) with FLOPs, HBM bytes and a time;
    the names of the others."""
    points, unplaced = [], []
    for name, label, row in rows:
        f, b, t = _flops(row), row.get(BYTES_HBM, 0.0), row["time_s"]
        if f > 0 and b > 0 and t > 0:
            points.append((f / b, f / t, label))
        elif name not in unplaced:
            unplaced.append(name)
    return points, unplaced


@styled
def step_roofline(result):
    """Every op of the step on the device's roofline, and the whole step (one pass: its FLOPs
    over its HBM bytes, at its time), one panel per performance model."""
    names = list(result.rollups)
    fig, axes = figure(1, len(names), sharey=True)
    axes = np.atleast_1d(axes).ravel()
    req = result.request
    for ax, name in zip(axes, names):
        r, ev = result.rollups[name], result.evaluations[name]
        rows = [(op_name(lt.leaf), provenance_label(result, name, row["source"]), row)
                for lt, row in zip(r.leaves, ev.leaves.values())]
        dtypes = sorted({lt.leaf.dtype for lt in r.leaves if FLOPS_MATRIX in lt.leaf.cost})
        points, unplaced = _placed(rows)
        whole, _ = _placed([("step", _dominant(provenance_by_time(result, name)),
                             {**ev.totals, "time_s": ev.time_s})])
        _roofline(ax, req.device, points, dtypes, req.dtype, unplaced, whole[0] if whole else None, "the whole step")
        ax.set_title(f"{name} pricing")
    fig.suptitle(f"Roofline, per op: {describe_step(result)}", wrap=True)
    return fig


def _dominant(shares: dict[str, float]) -> str:
    """The provenance with the largest share of the time."""
    return max(shares, key=shares.get) if shares else "unknown"


@styled
def kernel_roofline(kernel: str, device, rollup, evaluation):
    """The kernel's leaves at the design point on the device's roofline, and the whole kernel
    (its total FLOPs over its HBM bytes, at its time; coloured by the provenance of most of it).
    A tile's leaves move on-chip bytes only and have no place on an HBM roofline."""
    fig, ax = figure()
    rows = [(lt.name, row["source"], row) for lt, row in zip(rollup.leaves, evaluation.leaves.values())]
    points, unplaced = _placed(rows)
    dtypes = sorted({lt.leaf.dtype for lt in rollup.leaves if FLOPS_MATRIX in lt.leaf.cost})
    whole, _ = _placed([(kernel, _dominant(evaluation.provenance_shares()),
                         {**evaluation.totals, "time_s": evaluation.time_s})])
    _roofline(ax, device, points, dtypes, "fp32", unplaced, whole[0] if whole else None, "the whole kernel")
    point = ", ".join(f"{k}={integer(v)}" for k, v in evaluation.point.items())
    ax.set_title(f"Roofline, per leaf: {kernel} on {device.name} ({rollup.model.name} pricing) at {point}",
                 wrap=True)
    return fig


# --- the step's time by op and by layer --------------------------------------------------------------

def _segment(path: tuple[str, ...]) -> str | None:
    """The layer loop (``layers[0]×32``) or layer (``layer5``) a leaf's path runs through, if any."""
    return next((p for p in path[1:] if "×" in p or p.startswith("layer")), None)


def _part_label(segment: str) -> tuple[str, int]:
    """``layers[3]×58`` → (``layer 3 (×58)``, 58); ``layer5`` → (``layer 5``, 1)."""
    if "×" in segment:
        head, _, n = segment.partition("×")
        return f"layer {head.removeprefix('layers[').rstrip(']')} (×{n})", int(n)
    return f"layer {segment.removeprefix('layer')}", 1


def step_parts(result, name: str) -> tuple[dict[str, dict[str, float]], dict[str, dict[str, float]]]:
    """(time by op name, time of one layer by part of the step), each split by bound, in
    seconds: a part is the prologue, one layer of each layer structure, or the epilogue; a
    kernel's launch cost is its op's ``latency`` (by op: one bar of its own, as the report)."""
    r, ev = result.rollups[name], result.evaluations[name]
    by_op: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    by_part: dict[str, dict[str, float]] = {}
    seen_layer = False
    for lt, row in zip(r.leaves, ev.leaves.values()):
        seg = _segment(lt.path)
        seen_layer = seen_layer or seg is not None
        label, n = _part_label(seg) if seg else ("epilogue" if seen_layer else "prologue", 1)
        part = by_part.setdefault(label, defaultdict(float))
        part[row["bound"]] += row["time_s"] / n
        part["latency"] += row.get("launch_s", 0.0) / n
        by_op[op_name(lt.leaf)][row["bound"]] += row["time_s"]
    if ev.launch_time_s:
        by_op["(kernel launches)"]["latency"] += ev.launch_time_s
    return ({k: dict(v) for k, v in by_op.items()}, {k: dict(v) for k, v in by_part.items()})


def _stacked(ax, rows: dict[str, dict[str, float]], scale: float) -> None:
    """Horizontal bars, one per row (top to bottom in the order given), stacked by bound."""
    labels = list(rows)
    y = np.arange(len(labels))[::-1]
    left = np.zeros(len(labels))
    bounds = [b for b in BOUND_COLOURS if any(rows[k].get(b, 0.0) > 0 for k in labels)]
    for b in bounds:
        w = np.array([rows[k].get(b, 0.0) * scale for k in labels])
        ax.barh(y, w, left=left, color=BOUND_COLOURS[b], label=b)
        left += w
    ax.set_yticks(y, labels, fontsize="x-small")
    ax.legend(loc="lower right", title="bound")


@styled
def step_time(result):
    """The step's time by op (the largest :data:`TOP_OPS`, the rest summed) and one layer's time by
    part of the step, each stacked by bound (the first performance model's prices)."""
    name = next(iter(result.rollups))
    by_op, by_part = step_parts(result, name)
    order = sorted(by_op, key=lambda k: -sum(by_op[k].values()))
    top = {k: by_op[k] for k in order[:TOP_OPS]}
    if len(order) > TOP_OPS:
        rest: dict[str, float] = defaultdict(float)
        for k in order[TOP_OPS:]:
            for b, t in by_op[k].items():
                rest[b] += t
        top[f"({len(order) - TOP_OPS} other ops)"] = dict(rest)
    fig, (a, b) = figure(1, 2)
    _stacked(a, top, 1e3)
    a.set_xlabel("time in the step (ms, every call)")
    a.set_title("by op")
    _stacked(b, by_part, 1e3)
    b.set_xlabel("time once (ms; ×N: one of N layers)")
    b.set_title("by layer")
    total = result.evaluations[name].time_s
    fig.suptitle(f"Step time {total * 1e3:.4g} ms ({name} pricing, one pass): {describe_step(result)}", wrap=True)
    return fig


# --- memory ------------------------------------------------------------------------------------------

MEMORY_PARTS = (("weights", "weights_bytes", "#332288"), ("KV cache", "kv_cache_bytes", "#44AA99"),
                ("peak activations", "activation_peak_bytes", "#DDCC77"), ("reserved", "reserved_bytes", "#AA4499"))


@styled
def step_memory(result):
    """One device's memory: weights, KV cache, peak activations and the engine's reserve stacked
    against its capacity; what is free, or the shortfall."""
    mem = result.memory
    fig, ax = figure()
    left = 0.0
    for label, key, colour in MEMORY_PARTS:
        v = getattr(mem, key) / _GB
        ax.barh([0], [v], left=left, height=0.5, color=colour, label=f"{label} {v:,.2f} GB")
        left += v
    cap = mem.capacity_bytes / _GB
    if mem.fits:
        ax.barh([0], [cap - left], left=left, height=0.5, color="white", edgecolor="#999999", hatch="//",
                label=f"free {mem.free_bytes / _GB:,.2f} GB")
    ax.axvline(cap, color="#CC3311", linewidth=2, label=f"capacity {cap:,.2f} GB")
    ax.set_yticks([])
    ax.set_ylim(-1, 1)
    ax.set_xlabel("memory per device (GB, 10⁹ bytes)")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.15), ncols=3)
    verdict = "fits" if mem.fits else f"DOES NOT FIT: short by {mem.shortfall_bytes / _GB:,.2f} GB"
    pp = " (the fullest pipeline stage)" if result.request.layout.pp > 1 else ""
    ax.set_title(f"Memory per device{pp}: {describe_step(result)} — {verdict}", wrap=True,
                 color="black" if mem.fits else "#CC3311")
    return fig


def text_generate(result) -> dict:
    """The figures of ``perfcast text-generate --plot``."""
    return {"roofline": step_roofline(result), "step-time": step_time(result), "memory": step_memory(result)}


# --- a DSL kernel --------------------------------------------------------------------------------------

@styled
def kernel_sweep(kernel: str, device, sweep, swept: list[str], sweep_overlap=()):
    """The kernel's time over a sweep: a line over one swept symbol, a heat map over two."""
    times = np.array([o.after_s if o is not None else e.time_s
                      for e, o in zip(sweep, list(sweep_overlap) or [None] * len(sweep))])
    fig, ax = figure()
    title = f"{kernel} on {device.name}: time over the sweep"
    if len(swept) == 1:
        xs = np.array([e.point[swept[0]] for e in sweep])
        ax.plot(xs, times * 1e3, marker="o", color="#0072B2")
        if xs.min() > 0 and xs.max() / xs.min() >= 16:
            ax.set_xscale("log")
            plain_log(ax.xaxis)
        ax.set_xlabel(swept[0])
        ax.set_ylabel("time (ms)")
    else:
        a, b = swept
        xs, ys = sorted({e.point[a] for e in sweep}), sorted({e.point[b] for e in sweep})
        grid = np.full((len(ys), len(xs)), np.nan)
        for e, t in zip(sweep, times):
            grid[ys.index(e.point[b]), xs.index(e.point[a])] = t * 1e3
        spread = np.nanmax(grid) / np.nanmin(grid) if np.nanmin(grid) > 0 else 1.0
        norm = LogNorm() if spread >= 20 else None  # times over decades: each decade its own shades
        im = ax.imshow(grid, origin="lower", aspect="auto", cmap="viridis", norm=norm)
        ax.set_xticks(range(len(xs)), [integer(v) for v in xs])
        ax.set_yticks(range(len(ys)), [integer(v) for v in ys])
        ax.set_xlabel(a)
        ax.set_ylabel(b)
        ax.grid(False)
        for (i, j), v in np.ndenumerate(grid):
            light = im.norm(v) > 0.6  # viridis turns yellow: dark text on it
            ax.text(j, i, f"{v:.3g}", ha="center", va="center", fontsize="small",
                    color="black" if light else "white")
        fig.colorbar(im, ax=ax, label="time (ms)")
    ax.set_title(title)
    return fig


def kernel(name: str, device, rollup, evaluation, sweep, swept: list[str], sweep_overlap=()) -> dict:
    """The figures of ``perfcast kernel --plot``."""
    figs = {"kernel-roofline": kernel_roofline(name, device, rollup, evaluation)}
    if not swept:
        figs["kernel-sweep"] = Skipped("kernel-sweep", "no --sweep given")
    elif len(swept) > 2:
        figs["kernel-sweep"] = Skipped("kernel-sweep", f"{len(swept)} swept symbols; a line takes one, a heat "
                                                       f"map two")
    else:
        figs["kernel-sweep"] = kernel_sweep(name, device, sweep, swept, sweep_overlap)
    return figs
