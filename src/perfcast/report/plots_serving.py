"""Figures of a serving run (``perfcast serve --plot``) and of a deployment search (``perfcast
optimize --plot``): the batch composition and KV-cache use over the simulated time, the TTFT and
TPOT distributions over requests, the Pareto front. Formatting only (shared style:
:mod:`perfcast.report.plots`)."""

from __future__ import annotations

import numpy as np

from perfcast.report.plots import Skipped, figure, styled

#: Decode and prefill sequences in a step; agg and disagg deployments in a search.
DECODE, PREFILL = "#0072B2", "#E69F00"
MODES = {"agg": ("#332288", "o", "aggregated"), "disagg": ("#CC6677", "s", "disaggregated")}


def describe_serve(report) -> str:
    dep = report.spec.deployment
    where = f"{dep.device} ({dep.layout.describe()})"
    if report.disagg is not None:
        d = report.disagg
        where += f", disaggregated {d['prefill_instances']}P{d['decode_instances']}D"
    return f"{dep.model} on {where}, {report.scheduler.engine}; {report.load_text()}"


def _traces(report) -> list:
    """The simulation's engine instances (one, or a disaggregated deployment's pools)."""
    tr = report.trace
    return list(getattr(tr, "traces", None) or [tr])


def _steps(counters) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """A trace's steps as stairs: (edges, decoding, prefilling) with the idle gaps between steps
    as zero-height stairs, and (step end, KV tokens in use after it)."""
    c = np.array(counters, dtype=float)  # (t_s, batch, kv_tokens, prefills, start_s)
    end, batch, kv, pre, start = c.T
    edges = np.empty(2 * len(c))
    edges[0::2], edges[1::2] = start, end
    dec, pf = np.zeros(2 * len(c) - 1), np.zeros(2 * len(c) - 1)
    dec[0::2], pf[0::2] = batch - pre, pre  # odd stairs: the gap before the next step (often empty)
    return edges, dec, pf, end, kv


@styled
def serve_timeline(report):
    """Over the simulated time, per engine instance: the sequences of each step, decoding and
    prefilling (zero while the instance is idle), and the KV-cache tokens in use against the
    capacity."""
    fig, (top, bottom) = figure(2, 1, sharex=True)
    traces = [tr for tr in _traces(report) if tr.counters]
    peak = 0
    for tr in traces:
        edges, dec, pf, end, kv = _steps(tr.counters)
        peak = max(peak, int(kv.max()))
        name = tr.name or "engine"
        if len(traces) == 1:
            top.stairs(dec, edges, fill=True, color=DECODE, alpha=0.8, label="decoding")
            top.stairs(dec + pf, edges, baseline=dec, fill=True, color=PREFILL, alpha=0.8, label="prefilling")
            bottom.step(end, kv, where="post", color=DECODE, linewidth=0.9, label="in use")
            continue
        line, = bottom.step(end, kv, where="post", linewidth=0.9, label=name)
        for what, n, dash in (("decoding", dec, "-"), ("prefilling", pf, "--")):
            if n.any():
                top.stairs(n, edges, linewidth=0.8, linestyle=dash, color=line.get_color(), label=f"{name}: {what}")
    cap = report.kv.capacity_tokens
    bottom.axhline(cap, color="#CC3311", linewidth=1.5,
                   label=f"capacity {cap:,} tokens" + (" (a decode instance)" if len(traces) > 1 else ""))
    bottom.text(0.01, 0.5, f"peak {peak:,} tokens ({peak / cap:.1%} of the capacity)", transform=bottom.transAxes,
                fontsize="small")
    top.set_ylabel("sequences in the step")
    top.set_title("batch composition")
    top.legend(loc="upper right", ncols=2)
    bottom.set_ylabel("KV cache in use (tokens)")
    bottom.set_xlabel("simulated time (s)")
    bottom.set_title("KV-cache use" + (", per instance" if len(traces) > 1 else ""))
    bottom.legend(loc="upper right", ncols=2)
    ranks = f" (one of {report.ranks} data-parallel ranks)" if report.ranks > 1 else ""
    fig.suptitle(f"Simulation over time{ranks}: {describe_serve(report)}", wrap=True)
    return fig


@styled
def serve_latency(report):
    """The simulated TTFT and TPOT over requests (the share of requests at or below each
    value), their mean and percentiles, the closed form's mean where it ran, the SLOs where given."""
    sim = report.results["simulation"]
    closed = report.results.get("closed form")
    slo = report.spec.slo
    fig, axes = figure(1, 2)
    for ax, key, values, bound, what in ((axes[0], "ttft_s", sim.samples.ttft_s, slo and slo.ttft_s, "TTFT"),
                                         (axes[1], "tpot_s", sim.samples.tpot_s, slo and slo.tpot_s, "TPOT")):
        v = np.asarray(values) * 1e3
        if v.size:
            ax.ecdf(v, color="#88CCEE", linewidth=2, label="simulated requests")
        s = getattr(sim, key)
        if s is not None:
            for stat, dash in (("mean", "-"), ("p50", "--"), ("p90", "-."), ("p99", ":")):
                x = getattr(s, stat) * 1e3
                ax.axvline(x, color="#332288", linestyle=dash, linewidth=1, label=f"{stat} {x:,.4g} ms")
        cs = getattr(closed, key) if closed is not None and closed.stable else None
        if cs is not None:
            ax.axvline(cs.mean * 1e3, color="#117733", linewidth=1.5, label=f"closed form mean {cs.mean * 1e3:,.4g} ms")
        if bound:
            ax.axvline(bound * 1e3, color="#CC3311", linewidth=2, label=f"SLO {bound * 1e3:,.4g} ms")
        ax.set_xlabel(f"{what} (ms)")
        ax.set_ylabel("share of requests at or below")
        ax.set_title(f"{what} over {v.size:,} requests")
        ax.legend(loc="lower right")
    fig.suptitle(f"Latency distributions (simulation): {describe_serve(report)}", wrap=True)
    return fig


def serve(report) -> dict:
    """The figures of ``perfcast serve --plot``; the ones a run cannot draw, skipped with why."""
    sim = report.results.get("simulation")
    if sim is None:
        why = "--tier closed-form runs no simulation"
        return {"serve-timeline": Skipped("serve-timeline", why), "serve-latency": Skipped("serve-latency", why)}
    figs = {"serve-timeline": serve_timeline(report) if report.trace is not None
            else Skipped("serve-timeline", "the simulation kept no timeline")}
    figs["serve-latency"] = (serve_latency(report) if sim.samples is not None else
                             Skipped("serve-latency", "the run is overloaded: its latencies are not reported"))
    return figs


# --- the search -------------------------------------------------------------------------------------

def _xy(points, tier: str = "closed form") -> np.ndarray:
    """(tokens/s per user, tokens/s per device) of each point under ``tier``, shape (n, 2)."""
    figs = [p.figures(tier) for p in points]
    return np.array([(f["output_tokens_per_s_per_user"], f["output_tokens_per_s_per_device"]) for f in figs],
                    dtype=float).reshape(-1, 2)


@styled
def pareto(result):
    """Every priced candidate (closed form) by tokens/s per device against tokens/s per user,
    aggregated and disaggregated apart; the Pareto front, the simulated figures of the confirmed
    candidates, the chosen deployment and the TPOT objective as a per-user rate. The front is
    the line with gid ``front``; its points are the front's closed-form figures."""
    spec = result.spec
    fig, ax = figure()
    priced = [p for p in result.points if p.figures() is not None]
    for mode, (colour, marker, label) in MODES.items():
        pts = [p for p in priced if p.candidate.mode == mode]
        if not pts:
            continue
        ok = [p for p in pts if p.status == "ok"]
        miss = [p for p in pts if p.status != "ok"]
        if ok:
            xy = _xy(ok)
            ax.scatter(xy[:, 0], xy[:, 1], s=30, color=colour, marker=marker, alpha=0.7, zorder=3,
                       label=f"{label}: meets the SLOs (closed form)")
        if miss:
            xy = _xy(miss)
            ax.scatter(xy[:, 0], xy[:, 1], s=30, facecolors="none", edgecolors=colour, marker=marker, zorder=3,
                       label=f"{label}: misses the SLOs (closed form)")
    if result.front:
        xy = _xy(sorted(result.front, key=lambda p: p.figures()["output_tokens_per_s_per_user"]))
        ax.plot(xy[:, 0], xy[:, 1], color="black", linewidth=1, label="Pareto front (closed form)", gid="front",
                zorder=2)
    confirmed = [p for p in result.confirmed if p.figures("simulation") is not None]
    if confirmed:
        xy = _xy(confirmed, "simulation")
        for a, b in zip(_xy(confirmed), xy):  # each confirmed candidate: closed form → simulation
            ax.plot([a[0], b[0]], [a[1], b[1]], color="#117733", linewidth=0.6, alpha=0.6, zorder=2)
        ax.scatter(xy[:, 0], xy[:, 1], s=30, marker="x", color="#117733", zorder=5,
                   label="simulated (confirmed; a line from its closed form)")
    if result.best is not None:
        xy = _xy([result.best], "simulation")
        ax.scatter(xy[:, 0], xy[:, 1], s=220, marker="*", color="#DDCC77", edgecolors="black", zorder=6,
                   label=f"chosen: {result.best.candidate.describe()}")
    if spec.slo.tpot_s:
        x = 1 / spec.slo.tpot_s
        ax.axvline(x, color="#CC3311", linewidth=1.5, linestyle="--",
                   label=f"TPOT objective {spec.slo.tpot_s * 1e3:g} ms = {x:,.4g} tokens/s per user")
    ax.set_xlabel("output tokens/s per user (1 / TPOT)")
    ax.set_ylabel("output tokens/s per device")
    ax.legend(loc="upper right", fontsize="x-small")
    slo = ", ".join(f"{k} ≤ {v:g} s" for k, v in (("TTFT", spec.slo.ttft_s), ("TPOT", spec.slo.tpot_s)) if v)
    ax.set_title(f"{spec.model} on {spec.total_devices} × {', '.join(spec.devices)}: ISL {spec.isl:,}, "
                 f"OSL {spec.osl:,}; {slo}; {len(priced):,} of {result.candidates_evaluated:,} candidates priced",
                 wrap=True)
    return fig


def optimize(result) -> dict:
    """The figures of ``perfcast optimize --plot``."""
    if not any(p.figures() is not None for p in result.points):
        return {"pareto": Skipped("pareto", "no candidate could be priced")}
    return {"pareto": pareto(result)}
