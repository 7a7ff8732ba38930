"""Reports of a priced kernel: a JSON-ready dict and a terminal rendering (rich)."""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console
from rich.table import Table

from perfcast.ir import RESOURCES
from perfcast.report.format import integer, percent, seconds, si
from perfcast.rollup import Evaluation, FastRollup

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


def to_json(kernel: str, device, r: FastRollup, ev: Evaluation, sweep: Sequence[Evaluation],
            notes: Sequence[str]) -> dict:
    doc = {
        "kernel": kernel,
        "device": device.name,
        "performance_model": r.model.name,
        "rollup": "fast",
        **evaluation_dict(ev),
        "symbolic": symbolic(r),
        "free_symbols": [s.name for s in r.free_symbols],
        "notes": list(notes),
    }
    if sweep:
        doc["sweep"] = [evaluation_dict(e) for e in sweep]
    return doc


def render(console: Console, kernel: str, device, r: FastRollup, ev: Evaluation,
           sweep: Sequence[Evaluation], swept: Sequence[str], notes: Sequence[str]) -> None:
    console.print(f"[bold]{kernel}[/] on [bold]{device.name}[/] ({device.spec.description}) — "
                  f"{r.model.name} pricing, fast roll-up")
    console.print("point: " + "  ".join(f"{k}={integer(v)}" for k, v in ev.point.items()))

    sym = Table(title="Closed form", title_justify="left", show_header=True, expand=False)
    sym.add_column("quantity")
    sym.add_column("expression", overflow="fold")
    for k, v in symbolic(r).items():
        sym.add_row(k, v)
    console.print(sym)

    tot = Table(title="At the point", title_justify="left")
    for col in ("quantity", "value", "exact"):
        tot.add_column(col, justify="right" if col != "quantity" else "left")
    for k in RESOURCES:
        if k in ev.totals:
            tot.add_row(k, si(ev.totals[k], _UNITS[k]), integer(ev.totals[k]))
    tot.add_row("time", seconds(ev.time_s), f"{ev.time_s:.6g} s")
    if "flops.matrix" in ev.totals and ev.time_s:
        tot.add_row("achieved matrix rate", si(ev.totals["flops.matrix"] / ev.time_s, "FLOP/s"), "")
    if "bytes.hbm" in ev.totals and ev.time_s:
        tot.add_row("achieved HBM bandwidth", si(ev.totals["bytes.hbm"] / ev.time_s, "B/s"), "")
    console.print(tot)
    console.print("bound: " + ", ".join(f"{k} {percent(v)}" for k, v in
                                        sorted(ev.bound_shares().items(), key=lambda kv: -kv[1])))
    console.print("provenance: " + ", ".join(f"{k} {percent(v)}" for k, v in ev.provenance_shares().items()))

    leaves = Table(title="Leaves (rolled up)", title_justify="left")
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

    if sweep:
        table = Table(title="Sweep", title_justify="left")
        for col in (*swept, "time", "FLOPs", "HBM bytes", "bound"):
            table.add_column(col, justify="right")
        for e in sweep:
            shares = e.bound_shares()
            table.add_row(*(integer(e.point[s]) for s in swept), seconds(e.time_s),
                          si(e.totals.get("flops.matrix", 0.0) + e.totals.get("flops.vector", 0.0), "FLOP"),
                          si(e.totals.get("bytes.hbm", 0.0), "B"), max(shares, key=shares.get))
        console.print(table)
    for n in notes:
        console.print(f"[yellow]note:[/] {n}")
