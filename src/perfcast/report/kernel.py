"""Reports of a priced kernel: a JSON-ready dict and a terminal rendering (rich)."""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console
from rich.table import Table

from perfcast.ir import RESOURCES
from perfcast.report.format import integer, percent, seconds, si
from perfcast.rollup import Evaluation, FastRollup, OverlapEvaluation, OverlapRollup

_UNITS = {"flops.matrix": "FLOP", "flops.vector": "FLOP", "bytes.hbm": "B", "bytes.onchip": "B"}


def symbolic(r: FastRollup) -> dict[str, str]:
    out = {k: str(v) for k, v in r.cost.items()}
    out["time_s"] = str(r.time_s)
    return out


def evaluation_dict(ev: Evaluation) -> dict:
    return {
        "point": ev.point,
        "totals": {**ev.totals, "time_s": ev.time_s},
        "leaves": ev.leaves,
        "launch_time_s": ev.launch_time_s,
        "bound_shares": ev.bound_shares(),
        "provenance_shares": ev.provenance_shares(),
    }


def overlap_dict(ov: OverlapRollup, oev: OverlapEvaluation) -> dict:
    """The overlap section: transforms applied, time hidden by each (in total and per site),
    the time before and after and the max-over-resources bound, and the closed form."""
    return {**oev.as_dict(), "time_s": str(ov.time_s), "before_time_s": str(ov.before_s),
            "staging_bytes": None if ov.staging_bytes is None else int(ov.staging_bytes)}


def _with_overlap(doc: dict, oev: OverlapEvaluation | None) -> dict:
    """With overlap, the time of an evaluation is the time after it (leaf rows stay serial)."""
    if oev is not None:
        doc["totals"]["time_s"] = oev.after_s
    return doc


def to_json(kernel: str, device, r: FastRollup, ev: Evaluation, sweep: Sequence[Evaluation],
            notes: Sequence[str], ov: OverlapRollup | None = None, oev: OverlapEvaluation | None = None,
            sweep_overlap: Sequence[OverlapEvaluation] = ()) -> dict:
    doc = {
        "kernel": kernel,
        "device": device.name,
        "performance_model": r.model.name,
        "rollup": "fast",
        **_with_overlap(evaluation_dict(ev), oev),
        "symbolic": symbolic(r),
        "free_symbols": [s.name for s in r.free_symbols],
        "notes": list(notes),
    }
    if ov is not None:
        doc["symbolic"]["time_s"] = str(ov.time_s)
        doc["overlap"] = overlap_dict(ov, oev)
    if sweep:
        doc["sweep"] = [_with_overlap(evaluation_dict(e), o) for e, o in
                        zip(sweep, sweep_overlap or [None] * len(sweep))]
        for entry, o in zip(doc["sweep"], sweep_overlap):
            entry["overlap"] = {"before_s": o.before_s, "after_s": o.after_s, "hidden_s": o.hidden_s}
    return doc


def overlap_table(oev: OverlapEvaluation, title: str = "Overlap") -> Table:
    """One row per site a transform rewrote, in the order the transforms apply."""
    t = Table(title=f"{title}: {seconds(oev.before_s)} → {seconds(oev.after_s)} "
                    f"(−{percent(oev.hidden_s / oev.before_s) if oev.before_s else '0'}); "
                    f"max-over-resources bound {seconds(oev.bound_s)}", title_justify="left")
    for col in ("transform", "site", "overlaps", "with", "runs", "before", "after", "hidden"):
        t.add_column(col, justify="right" if col in ("runs", "before", "after", "hidden") else "left",
                     overflow="fold")
    for st in oev.steps:
        if not st.sites:
            t.add_row(st.name, "—", "", "", "", "", "", hidden(st.hidden_s))
        for x in st.sites:
            under = _names(x.under)
            if x.prefetched_bytes is not None:
                under = f"{si(x.prefetched_bytes, 'B')} of {si(x.weight_bytes, 'B')} staged per iteration"
            t.add_row(st.name, x.path.rsplit("/", 1)[-1], _names(x.moved), under, integer(x.executions),
                      seconds(x.before_s), seconds(x.after_s), hidden(x.hidden_s))
    return t


def hidden(t: float) -> str:
    """A time hidden: ``0`` when nothing (or float noise) was."""
    return seconds(t) if abs(t) > 1e-15 else "0"


def print_overlap(console: Console, oev: OverlapEvaluation, title: str = "Overlap") -> None:
    console.print(overlap_table(oev, title))
    for st in oev.steps:
        if st.note:
            console.print(f"  {st.name}: {st.note}", highlight=False)


def _names(names: Sequence[str], most: int = 4) -> str:
    return ", ".join(names[:most]) + (f" (+{len(names) - most})" if len(names) > most else "")


def render(console: Console, kernel: str, device, r: FastRollup, ev: Evaluation,
           sweep: Sequence[Evaluation], swept: Sequence[str], notes: Sequence[str],
           ov: OverlapRollup | None = None, oev: OverlapEvaluation | None = None,
           sweep_overlap: Sequence[OverlapEvaluation] = ()) -> None:
    console.print(f"[bold]{kernel}[/] on [bold]{device.name}[/] ({device.spec.description}) — "
                  f"{r.model.name} pricing, fast roll-up"
                  + (f" with overlap ({', '.join(ov.transforms)})" if ov is not None else ""))
    console.print("point: " + "  ".join(f"{k}={integer(v)}" for k, v in ev.point.items()))

    sym = Table(title="Closed form", title_justify="left", show_header=True, expand=False)
    sym.add_column("quantity")
    sym.add_column("expression", overflow="fold")
    for k, v in symbolic(r).items():
        sym.add_row(k, v)
    if ov is not None:
        sym.add_row("time_s with overlap", str(ov.time_s))
    console.print(sym)

    tot = Table(title="At the point", title_justify="left")
    for col in ("quantity", "value", "exact"):
        tot.add_column(col, justify="right" if col != "quantity" else "left")
    for k in RESOURCES:
        if k in ev.totals:
            tot.add_row(k, si(ev.totals[k], _UNITS[k]), integer(ev.totals[k]))
    time = ev.time_s if oev is None else oev.after_s
    if oev is not None:
        tot.add_row("time without overlap", seconds(ev.time_s), f"{ev.time_s:.6g} s")
    tot.add_row("time" if oev is None else "time with overlap", seconds(time), f"{time:.6g} s")
    if "flops.matrix" in ev.totals and time:
        tot.add_row("achieved matrix rate", si(ev.totals["flops.matrix"] / time, "FLOP/s"), "")
    if "bytes.hbm" in ev.totals and time:
        tot.add_row("achieved HBM bandwidth", si(ev.totals["bytes.hbm"] / time, "B/s"), "")
    console.print(tot)
    console.print("bound: " + ", ".join(f"{k} {percent(v)}" for k, v in
                                        sorted(ev.bound_shares().items(), key=lambda kv: -kv[1])))
    console.print("provenance: " + ", ".join(f"{k} {percent(v)}" for k, v in ev.provenance_shares().items()))

    leaves = Table(title="Leaves (rolled up" + ("; shares of the time without overlap)" if oev else ")"),
                   title_justify="left")
    for col in ("leaf", "kind", "trips", "FLOPs", "HBM bytes", "time", "share", "bound"):
        leaves.add_column(col, justify="left" if col in ("leaf", "kind", "bound") else "right")
    # The bound column names the limiting term (memory.hbm vs memory.onchip, compute).
    for row, lt in zip(ev.leaves.values(), r.leaves):
        flops = row.get("flops.matrix", 0.0) + row.get("flops.vector", 0.0)
        leaves.add_row(lt.name, lt.leaf.kind, str(lt.trips), si(flops, "FLOP") if flops else "",
                       si(row["bytes.hbm"], "B") if "bytes.hbm" in row else "", seconds(row["time_s"]),
                       percent(row["time_s"] / ev.time_s) if ev.time_s else "", row["limiter"])
    if ev.launch_time_s:
        leaves.add_row("(kernel launch)", "latency", str(r.launches), "", "", seconds(ev.launch_time_s),
                       percent(ev.launch_time_s / ev.time_s), "latency")
    console.print(leaves)
    if oev is not None:
        print_overlap(console, oev)

    if sweep:
        table = Table(title="Sweep", title_justify="left")
        for col in (*swept, "time", "FLOPs", "HBM bytes", "bound"):
            table.add_column(col, justify="right")
        for e, o in zip(sweep, sweep_overlap or [None] * len(sweep)):
            shares = e.bound_shares()
            table.add_row(*(integer(e.point[s]) for s in swept), seconds(e.time_s if o is None else o.after_s),
                          si(e.totals.get("flops.matrix", 0.0) + e.totals.get("flops.vector", 0.0), "FLOP"),
                          si(e.totals.get("bytes.hbm", 0.0), "B"), max(shares, key=shares.get))
        console.print(table)
    for n in notes:
        console.print(f"[yellow]note:[/] {n}")


def figures_table(console: Console, defined, rows, swept: Sequence[str]) -> None:
    """A kernel's figures (derived from its time: a rate, a throughput) per roll-up and point:
    ``rows`` are ``(roll-up, time_s, point, figures)``, ``figures`` as ``KernelSpec.figures_at``
    gives them; ``defined`` are the figures, whose definitions follow the table."""
    t = Table(title="Figures", title_justify="left")
    for col in ("roll-up", *swept, "time", *(f"{f.name} ({f.unit})" for f in defined)):
        t.add_column(col, justify="left" if col == "roll-up" else "right")
    for rollup_name, time_s, point, values in rows:
        t.add_row(rollup_name, *(integer(point[s]) for s in swept), seconds(time_s),
                  *(f"{v['value']:.4g}" for v in values))
    console.print(t)
    for f in defined:
        console.print(f"  {f.name} = {f.formula}: {f.definition}", markup=False, highlight=False)
