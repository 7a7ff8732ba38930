"""Reports of ``perfcast validate``: the terminal tables, the JSON document, the per-row file.
Formatting only: every number comes from :func:`perfcast.inference.validation.run`."""

from __future__ import annotations

import csv
import math
from collections import Counter

from rich.console import Console
from rich.table import Table

from perfcast.inference.recipes import BATCH_NOTE, RECIPE_NOTE
from perfcast.inference.silicon import LAYOUT_NOTE
from perfcast.inference.validation import LOW_CONCURRENCY, MAPPINGS, command
from perfcast.report.document import check, write


def _pct(x: float | None, signed: bool = False) -> str:
    if x is None or not math.isfinite(x):
        return "—"
    return f"{x * 100:+.1f}" if signed else f"{x * 100:.1f}"


def _cell(s: dict | None) -> str:
    if not s:
        return "—"
    return f"{_pct(s['median_abs'])} · {_pct(s['p90_abs'])} · {_pct(s['signed_median'], True)}"


def _n(s: dict | None) -> str:
    return f"{s['n']:,}" if s else "0"


def _columns(doc: dict) -> list[str]:
    return [*doc["performance_models"], *([doc["baseline"]] if doc["baseline"] else [])]


def _table(title: str, doc: dict, pops: list[dict], split: bool) -> Table:
    t = Table(title=title, title_justify="left", show_lines=False)
    t.add_column("population")
    t.add_column("rows", justify="right")
    t.add_column("mapped", justify="right")
    t.add_column("approx.", justify="right")
    models = _columns(doc)
    for m in models:
        t.add_column(f"{m}\nn", justify="right")
        for mapping in MAPPINGS:
            t.add_column(f"{m}\n{mapping}", justify="right", no_wrap=True)

    def cells(p: dict, suffix: str = "") -> list[str]:
        out = []
        for m in models:
            e = p["models"][m]
            out.append(_n(e.get(f"{MAPPINGS[0]}{suffix}")))
            out.extend(_cell(e.get(f"{mapping}{suffix}")) for mapping in MAPPINGS)
        return out

    for p in pops:
        t.add_row(p["population"], f"{p['rows']:,}", f"{p['mappable']:,}", f"{p['approximate']:,}", *cells(p))
        if split:
            for label in (f"concurrency<={LOW_CONCURRENCY}", f"concurrency>{LOW_CONCURRENCY}"):
                t.add_row(f"  {label.replace('<=', ' ≤ ').replace('>', ' > ')}", "", "", "", *cells(p, f" {label}"))
    return t


def render(console: Console, doc: dict, top_reasons: int = 12) -> None:
    src = doc["sources"]
    rows = doc["rows"]
    console.print(f"[bold]perfcast validate[/] · {src['silicon_sample']} + published tables ({src['published']})")
    console.print(f"selected {rows['selected']:,} of {rows['read']:,} rows: {rows['mappable']:,} mapped to a perfcast "
                  f"step ({rows['approximate']:,} approximately), {rows['selected'] - rows['mappable']:,} refused")
    base = f"; baseline: {doc['baseline']} (naive datasheet roofline of the same steps)" if doc["baseline"] else ""
    console.print(f"performance models: {', '.join(doc['performance_models'])}{base}")
    for k, text in doc["mapping"].items():
        console.print(f"[dim]{k}:[/] {text}", highlight=False)
    console.print("cells: median |error| · p90 |error| · signed median, in % of the measured TPOT "
                  "(signed > 0: perfcast is slower than measured); n: rows predicted; approx.: rows whose "
                  "quantization is priced approximately")
    named = [p for p in doc["populations"] if p.get("named")]
    keyed = [p for p in doc["populations"] if not p.get("named")]
    if named:
        console.print(_table("named populations", doc, named, split=True))
        for p in named:
            if p["description"]:
                console.print(f"[dim]{p['population']}: {p['description']}[/]", highlight=False)
    if keyed:
        console.print(_table("by system / model family / backend / mode", doc, keyed, split=False))
    if doc["refused"]:
        t = Table(title="refused rows, by reason", title_justify="left")
        t.add_column("rows", justify="right")
        t.add_column("reason")
        items = list(doc["refused"].items())
        for reason, n in items[:top_reasons]:
            t.add_row(f"{n:,}", reason)
        if len(items) > top_reasons:
            t.add_row(f"{sum(n for _, n in items[top_reasons:]):,}", f"{len(items) - top_reasons} other reasons")
        console.print(t)
    not_priced = {}
    for p in doc["populations"]:
        for m, e in p["models"].items():
            for reason, n in e["not_priced"].items():
                not_priced[(m, reason)] = max(not_priced.get((m, reason), 0), n)
    for (m, reason), n in sorted(not_priced.items(), key=lambda kv: -kv[1])[:top_reasons]:
        console.print(f"[yellow]{m}: not priced[/] ({n:,} rows in one population): {reason}", highlight=False)
    for what, attr in (("serving", "serving_reason"), ("closed-form", "closed_form_reason")):
        replayed = Counter((m, getattr(p, attr)) for m, preds in doc.get("predictions", {}).items() for p in preds
                           if getattr(p, attr) and (attr == "serving_reason" or getattr(p, attr) != p.serving_reason))
        for (m, reason), n in replayed.most_common(top_reasons):
            console.print(f"[yellow]{m}: no {what} figure[/] ({n:,} rows): {reason}", highlight=False)
    for p in doc["populations"][:1]:
        for m, e in p["models"].items():
            if e["unpriced_op_rows"]:
                console.print(f"[red]{m}: {e['unpriced_op_rows']:,} predicted rows have ops with no cost rule, NOT "
                              f"priced[/] (see `perfcast text-generate` on the row's command)", highlight=False)
            if "median_measured_share_decode" in e:
                console.print(f"{m}: median share of the decode step priced from measured or interpolated kernel "
                              f"tables {e['median_measured_share_decode'] * 100:.0f} % (the rest: analytic fallback)",
                              highlight=False)
    if doc.get("decisions"):
        _decisions(console, doc["decisions"])
    tm = doc["timings_s"]
    pts = doc["points"]
    console.print(f"run time {tm['read_and_map'] + tm['price']:.1f} s (read and map {tm['read_and_map']:.1f} s, "
                  f"price {tm['price']:.1f} s: {pts.get('closed-form points', 0):,} decode points from closed forms, "
                  f"{pts.get('simulated points', 0):,} points simulated)"
                  + (f"; serving replay {tm['serving']:.1f} s" if "serving" in tm else ""))


def _decisions(console: Console, d: dict) -> None:
    t = Table(title="decisions: predicted vs measured output tokens/s per device, per group of "
                    f"{' / '.join(d['group_keys'])} (≥ {d['min_group_rows']} rows)", title_justify="left")
    for col in ("population", "model", "groups", "rows", "median ρ", "best = measured best", "median regret",
                "p90 regret", "TPOT-bound: best", "broken", "regret"):
        t.add_column(col, justify="left" if col in ("population", "model") else "right")
    for pop in d["populations"]:
        for m, s in pop["models"].items():
            if s is None:
                t.add_row(pop["population"], m, "0", *["—"] * 8)
                continue
            slo = ([f"{s['slo_top1_share'] * 100:.0f} %", f"{s['slo_broken_share'] * 100:.0f} %",
                    f"{s['slo_median_regret'] * 100:.1f} %"] if "slo_top1_share" in s else ["—"] * 3)
            t.add_row(pop["population"], m, str(s["groups"]), str(s["rows"]),
                      "—" if s["median_rho"] is None else f"{s['median_rho']:.3f}", f"{s['top1_share'] * 100:.0f} %",
                      f"{s['median_regret'] * 100:.1f} %", f"{s['p90_regret'] * 100:.1f} %", *slo)
    console.print(t)


def to_json(doc: dict) -> dict:
    """The document without the per-row objects (those go to :func:`write_rows`)."""
    return {k: v for k, v in doc.items() if k not in ("predictions", "cases", "named")}


def _measured(ms: float) -> float | None:
    """A measured time, None where the row has none (a first-token-only row's TPOT is NaN)."""
    return ms if math.isfinite(ms) else None


def row_records(doc: dict) -> list[dict]:
    """One record per selected row: the mapping, the measured and predicted TPOT per model and
    mapping, the reason where there is none."""
    by_case = {}
    for m, preds in doc["predictions"].items():
        for p in preds:
            by_case.setdefault(p.case.id, {})[m] = p
    serving = "decisions" in doc
    if serving:
        from perfcast.serving.replay import client_of
    out = []
    for c in doc["cases"]:
        rec = {"id": c.id, "system": c.system, "model_path": c.model_path, "family": c.family,
               "backend": c.backend, "backend_version": c.backend_version, "mode": c.mode, "isl": c.isl,
               "osl": c.osl, "concurrency": c.concurrency, "batch_per_rank": c.batch,
               "measured_tpot_ms": _measured(c.tpot_ms), "measured_ttft_ms": _measured(c.ttft_ms),
               "engine": c.engine or "", "quantize": c.quantize or "", "layout": c.layout.describe() if c.layout else "",
               "approximate": " | ".join(c.approximate), "refused": c.reason or "",
               "engine_settings": " | ".join(n for n in c.notes if n.startswith((RECIPE_NOTE, BATCH_NOTE, LAYOUT_NOTE))),
               "command": command(c)}
        if serving:  # the client the replay took (--serving)
            rec["serving_client"] = client_of(c) if c.mode in ("agg", "disagg") else ""
        for m, p in by_case.get(c.id, {}).items():
            for mapping in MAPPINGS:
                rec[f"{m} {mapping} tpot_ms"] = p.tpot_ms.get(mapping)
            rec[f"{m} ttft_ms"] = p.ttft_ms
            rec[f"{m} serving ttft_ms"] = p.ttft_serving_ms
            rec[f"{m} closed-form ttft_ms"] = p.ttft_closed_form_ms
            rec[f"{m} not priced"] = p.reason or ""
            if serving:
                rec[f"{m} serving not priced"] = p.serving_reason or ""
                rec[f"{m} closed-form not priced"] = p.closed_form_reason or ""
        out.append(rec)
    return out


def write_rows(doc: dict, path: str) -> None:
    """The records as a JSON document (``rows``, with the version fields) or a CSV file (a
    missing figure is an empty cell); both checked at the report boundary before writing."""
    records = check(row_records(doc))
    if path.endswith(".json"):
        write(records, path, key="rows", indent=1)
        return
    with open(path, "w", newline="") as f:
        keys = list(dict.fromkeys(k for r in records for k in r))
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        w.writerows(records)
