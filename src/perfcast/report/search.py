"""``perfcast optimize``'s report: :class:`perfcast.search.optimize.SearchResult` as tables, as the
``optimize`` JSON document (schema ``optimize.schema.json``) and as the files of ``--save-dir``.
Formatting only."""

from __future__ import annotations

import csv
from pathlib import Path

from rich.console import Console
from rich.table import Table

from perfcast.search.optimize import REASONS, Point, SearchResult

FIGURES = ("ttft_s", "tpot_s", "e2e_s", "output_tokens_per_s", "output_tokens_per_s_per_device",
           "output_tokens_per_s_per_user", "requests_per_s")


def _layout(lay) -> dict | None:
    if lay is None:
        return None
    return {"tp": lay.tp, "ep": lay.ep, "dp": lay.dp, "pp": lay.pp, "attention_dp": lay.attention_dp}


def deployment_json(p: Point) -> dict:
    c = p.candidate
    out = {"mode": c.mode, "device": c.device, "quantize": c.quantize, "devices": c.devices,
           "layout": _layout(c.layout), "max_batch_size": c.batch, "concurrency": c.concurrency,
           "description": c.describe()}
    if c.max_num_tokens is not None:
        out["max_num_tokens"] = c.max_num_tokens   # searched (else the engine's, in the point's scheduler)
    if c.mode == "agg":
        out["replicas"] = c.replicas
    else:
        out.update({"prefill_layout": _layout(c.prefill_layout), "prefill_instances": c.prefill_instances,
                    "decode_instances": c.decode_instances})
    return out


def point_json(p: Point) -> dict:
    return {"deployment": deployment_json(p), "status": p.status, "reason": p.reason,
            "closed_form": p.figures("closed form"), "simulation": p.figures("simulation"),
            "kv_capacity_tokens": p.kv_capacity_tokens, "scheduler": p.scheduler, "on_front": p.on_front}


def to_json(result: SearchResult) -> dict:
    s = result.spec
    return {
        "command": "optimize", "model": s.model, "devices": list(s.devices), "total_devices": s.total_devices,
        "engine": s.engine, "engine_options": dict(s.engine_options), "serving_modes": list(s.modes),
        "workload": {"input_length": s.isl, "output_length": s.osl, "load": "closed loop, every rank's batch full"},
        "slo": {"ttft_s": s.slo.ttft_s, "tpot_s": s.slo.tpot_s},
        "space": {"batch_sizes": sorted(set(s.batches)), "quantize": [q or "none" for q in s.quantize],
                  "instance_sizes": list(s.sizes) if s.sizes else None},
        "candidates_evaluated": result.candidates_evaluated,
        "rejected": dict(result.rejected),
        "rejected_reasons": dict(REASONS),
        "pareto": [point_json(p) for p in result.front],
        "best": None if result.best is None else point_json(result.best),
        "runners_up": [point_json(p) for p in result.runners_up],
        "confirmed_by_simulation": len(result.confirmed),
        "executor": {"name": result.executor, "workers": result.workers},
        "timings_s": dict(result.timings_s),
        "notes": list(result.notes),
    }


def _ms(x) -> str:
    return "—" if x is None else f"{x * 1e3:,.1f}"


def _rate(x) -> str:
    return "—" if x is None else f"{x:,.1f}"


def _row(p: Point) -> list[str]:
    cf, sim = p.figures("closed form") or {}, p.figures("simulation") or {}
    return [p.candidate.device, p.candidate.short(),
            _ms(cf.get("ttft_s")), _ms(cf.get("tpot_s")),
            _rate(cf.get("output_tokens_per_s_per_device")), _rate(cf.get("output_tokens_per_s_per_user")),
            _ms(sim.get("ttft_s")), _ms(sim.get("tpot_s")),
            _rate(sim.get("output_tokens_per_s_per_device")),
            "yes" if p.status == "ok" else "no"]


def _table(title: str, points: list[Point]) -> Table:
    t = Table(title=title, title_justify="left")
    for col in ("device", "deployment", "TTFT ms", "TPOT ms", "tok/s/dev", "tok/s/user", "sim TTFT", "sim TPOT",
                "sim tok/s/dev", "SLOs"):
        t.add_column(col, justify="left" if col in ("device", "deployment") else "right",
                     no_wrap=col in ("device", "deployment"))
    for p in points:
        t.add_row(*_row(p))
    return t


def render(console: Console, result: SearchResult, doc: dict) -> None:
    """The tables of ``result``; ``doc`` is its :func:`to_json` document (already checked)."""
    s = result.spec
    slo = ", ".join(f"{k} ≤ {v * 1e3:g} ms" for k, v in (("TTFT", s.slo.ttft_s), ("TPOT", s.slo.tpot_s)) if v)
    opts = "".join(f"; engine option {k}={v}" for k, v in s.engine_options)
    console.print(f"[bold]perfcast optimize[/bold] {s.model} on {s.total_devices} × {{{', '.join(s.devices)}}}, "
                  f"isl {s.isl}, osl {s.osl}; SLOs: {slo or 'none'}{opts}")
    if result.best is None:
        console.print("[bold red]no deployment meets the SLOs[/bold red] (confirmed by simulation)")
    else:
        f = result.best.figures("simulation")
        console.print(f"[bold green]best:[/bold green] {result.best.candidate.describe()} — "
                      f"{f['output_tokens_per_s_per_device']:,.1f} tok/s/device, "
                      f"{f['output_tokens_per_s_per_user']:,.1f} tok/s/user, TTFT {_ms(f['ttft_s'])} ms, "
                      f"TPOT {_ms(f['tpot_s'])} ms (simulated)")
    if result.best is not None:
        from perfcast.search.launch import launch_files

        files, notes = launch_files(s, result.best)
        for line in files.get("launch.sh", "").splitlines():
            if not line.startswith("#"):
                console.print(f"  launch: {line}", highlight=False, soft_wrap=True)
        for n in notes:
            console.print(f"  note: {n}", highlight=False)
    console.print(_table("Pareto front (closed form; sim = event simulation)", result.front))
    if result.runners_up:
        console.print(_table("runners-up under the SLOs", result.runners_up))
    console.print(f"{result.candidates_evaluated} candidates evaluated, {len(result.confirmed)} simulated; rejected: "
                  + (", ".join(f"{n} {REASONS[k].split(' (')[0]}" for k, n in result.rejected.items() if n) or "none"))
    console.print("time: " + ", ".join(f"{k} {v:.2f} s" for k, v in result.timings_s.items()))
    for n in doc["notes"]:
        console.print(f"note: {n}")


def save(result: SearchResult, directory: str) -> list[str]:
    """``--save-dir``: every candidate and the front, as CSV and JSON. Returns the paths written."""
    from perfcast.report.document import write

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, points in (("candidates", result.points), ("pareto", result.front)):
        rows = [_flat(p) for p in points]
        path = out / f"{name}.csv"
        with path.open("w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=list(_flat_fields()))
            w.writeheader()
            w.writerows(rows)
        written.append(str(path))
        write({"command": "optimize", "model": result.spec.model, name: [point_json(p) for p in points]},
              str(out / f"{name}.json"))
        written.append(str(out / f"{name}.json"))
    write(to_json(result), str(out / "optimize.json"))
    written.append(str(out / "optimize.json"))
    for i, p in enumerate(([result.best] if result.best else []) + result.runners_up):
        written += _launch(result, p, out / "launch" / f"{i}-{_slug(p)}")
    return written


def _slug(p: Point) -> str:
    return "".join(ch if ch.isalnum() else "-" for ch in p.candidate.short()).strip("-").replace("--", "-")


def _launch(result: SearchResult, p: Point, folder: Path) -> list[str]:
    """One chosen deployment's folder: ``deployment.yaml`` (``perfcast serve --deployment``) and
    the engine's launch script and config files (:mod:`perfcast.search.launch`)."""
    from perfcast.inputs.yamlfile import dump_yaml
    from perfcast.search.launch import deployment_yaml, launch_files

    folder.mkdir(parents=True, exist_ok=True)
    files, notes = launch_files(result.spec, p)
    files = {"deployment.yaml": dump_yaml(deployment_yaml(result.spec, p), sort_keys=False), **files}
    if notes:
        key = "launch.sh" if "launch.sh" in files else "NOTES.txt"
        files[key] = files.get(key, "") + "".join(f"# note: {n}\n" for n in notes)
    for name, text in files.items():
        (folder / name).write_text(text)
    return [str(folder / name) for name in files]


def _flat_fields():
    yield from ("mode", "device", "quantize", "devices", "tp", "ep", "dp", "pp", "attention_dp", "replicas",
                "prefill_tp", "prefill_ep", "prefill_dp", "prefill_instances", "decode_instances", "max_batch_size",
                "concurrency", "status", "reason", "on_front", "kv_capacity_tokens", "engine", "max_num_tokens",
                "chunked_prefill")
    for tier in ("cf", "sim"):
        yield from (f"{tier}_{k}" for k in FIGURES)


def _flat(p: Point) -> dict:
    c = p.candidate
    row = {"mode": c.mode, "device": c.device, "quantize": c.quantize or "", "devices": c.devices,
           "tp": c.layout.tp, "ep": c.layout.ep, "dp": c.layout.dp, "pp": c.layout.pp,
           "attention_dp": c.layout.attention_dp, "replicas": c.replicas if c.mode == "agg" else "",
           "prefill_tp": c.prefill_layout.tp if c.prefill_layout else "",
           "prefill_ep": c.prefill_layout.ep if c.prefill_layout else "",
           "prefill_dp": c.prefill_layout.dp if c.prefill_layout else "",
           "prefill_instances": c.prefill_instances or "", "decode_instances": c.decode_instances or "",
           "max_batch_size": c.batch, "concurrency": c.concurrency, "status": p.status, "reason": p.reason or "",
           "on_front": p.on_front, "kv_capacity_tokens": "" if p.kv_capacity_tokens is None else p.kv_capacity_tokens,
           **{k: (p.scheduler or {}).get(k, "") for k in ("engine", "max_num_tokens", "chunked_prefill")}}
    for tier, name in (("cf", "closed form"), ("sim", "simulation")):
        f = p.figures(name) or {}
        row.update({f"{tier}_{k}": "" if f.get(k) is None else f[k] for k in FIGURES})
    return row


# --- perfcast recommend ----------------------------------------------------------------------------

def _option_json(o) -> dict:
    from perfcast.search.recommend import describe

    sim = o.simulation
    return {"deployment": {**deployment_json(o.point), "instances": o.instances, "devices": o.devices,
                           "description": describe(o)},
            "capacity_per_instance": o.capacity, "devices": o.devices, "cost_per_hour": o.cost_per_hour,
            "cost_per_million_output_tokens": o.cost_per_million_tokens,
            "output_tokens_per_s": o.output_tokens_per_s,
            "closed_form": o.point.figures(),
            "simulation": None if sim is None or sim.ttft_s is None else {
                "ttft_s": sim.ttft_s.mean, "tpot_s": sim.tpot_s.mean, "e2e_s": sim.e2e_s.mean,
                "output_tokens_per_s": sim.output_tokens_per_s,
                "output_tokens_per_s_per_device": sim.output_tokens_per_s_per_device,
                "output_tokens_per_s_per_user": sim.output_tokens_per_s_per_user,
                "requests_per_s": sim.requests_per_s}}


def recommend_json(r) -> dict:
    """The ``recommend`` document (schema ``recommend.schema.json``)."""
    s = r.spec
    return {"command": "recommend", "model": s.model, "devices": list(s.devices), "engine": s.engine,
            "engine_options": dict(s.engine_options),
            "target": {"requests_per_s": r.target.rate, "concurrency": r.target.concurrency},
            "workload": {"input_length": s.isl, "output_length": s.osl},
            "slo": {"ttft_s": s.slo.ttft_s, "tpot_s": s.slo.tpot_s}, "objective": r.objective,
            "prices": {"name": r.prices.name, "currency": r.prices.currency, "source": r.prices.source,
                       "per_device_hour": dict(r.prices.prices)},
            "best": None if r.best is None else _option_json(r.best),
            "options": [_option_json(o) for o in r.options[:20]], "options_sized": len(r.options),
            "rejected": dict(r.rejected), "timings_s": dict(r.timings_s), "notes": list(r.notes)}


def render_recommend(console: Console, r, doc: dict) -> None:
    from perfcast.search.recommend import describe

    s, t = r.spec, r.target
    load = f"{t.rate:g} requests/s" if t.rate is not None else f"{t.concurrency} concurrent clients"
    console.print(f"[bold]perfcast recommend[/bold] {s.model} for {load}, isl {s.isl}, osl {s.osl}; SLOs: TTFT ≤ "
                  f"{s.slo.ttft_s * 1e3:g} ms, TPOT ≤ {s.slo.tpot_s * 1e3:g} ms; objective: {r.objective}")
    cur = r.prices.currency
    if r.best is None:
        console.print("[bold red]no deployment serves this load under the SLOs[/bold red] (confirmed by simulation)")
    else:
        b, sim = r.best, r.best.simulation
        cost = ("" if b.cost_per_hour is None else f", {b.cost_per_hour:,.2f} {cur}/h, "
                f"{b.cost_per_million_tokens:,.3f} {cur} per million output tokens")
        console.print(f"[bold green]best:[/bold green] {describe(b)} — {b.devices} devices{cost}; simulated TTFT "
                      f"{sim.ttft_s.mean * 1e3:,.1f} ms, TPOT {sim.tpot_s.mean * 1e3:,.1f} ms")
    tab = Table(title="options (closed form), best first", title_justify="left")
    for col in ("deployment", "devices", f"{cur}/h", f"{cur}/M tok", "capacity/instance", "sim TTFT", "sim TPOT"):
        tab.add_column(col, justify="left" if col == "deployment" else "right", no_wrap=col == "deployment")
    unit = "req/s" if t.rate is not None else "clients"
    for o in r.options[:10]:
        sim = o.simulation
        tab.add_row(describe(o), str(o.devices), "—" if o.cost_per_hour is None else f"{o.cost_per_hour:,.2f}",
                    "—" if o.cost_per_million_tokens is None else f"{o.cost_per_million_tokens:,.3f}",
                    f"{o.capacity:,.2f} {unit}", _ms(sim.ttft_s.mean if sim and sim.ttft_s else None),
                    _ms(sim.tpot_s.mean if sim and sim.tpot_s else None))
    console.print(tab)
    console.print(f"{len(r.options)} options sized; rejected: "
                  + (", ".join(f"{n} {k.replace('_', ' ')}" for k, n in r.rejected.items() if n) or "none"))
    console.print(f"prices: {r.prices.name} ({r.prices.source})", highlight=False)
    for n in doc["notes"]:
        console.print(f"note: {n}")


# --- perfcast sensitivity --------------------------------------------------------------------------

def sensitivity_json(r) -> dict:
    """The ``sensitivity`` document (schema ``sensitivity.schema.json``)."""
    s, d = r.spec, r.spec.deployment
    return {"command": "sensitivity", "model": d.model, "device": d.device, "engine": d.engine,
            "layout": _layout(d.layout), "workload": {"input_length": s.isl, "output_length": s.osl,
                                                      "concurrency": s.concurrency, "requests_per_s": s.rate},
            "step": STEP_TEXT, "base": dict(r.base), "rows": r.rows, "solution": r.solution, "notes": list(r.notes)}


STEP_TEXT = ("central differences of the closed form at ×(1 ± 0.05) (the datasheet scaled, the step model "
             "compiled again); elasticity = ∂ ln f / ∂ ln x, derivative = ∂f / ∂x in the parameter's unit")


def render_sensitivity(console: Console, r, doc: dict) -> None:
    from perfcast.search.sensitivity import METRICS

    s, d = r.spec, r.spec.deployment
    load = f"{s.concurrency} clients" if s.concurrency else f"{s.rate:g} requests/s"
    b = r.base
    console.print(f"[bold]perfcast sensitivity[/bold] {d.model} on {d.device} ({d.layout.describe()}), {load}, isl "
                  f"{s.isl}, osl {s.osl}: TTFT {b['ttft_s'] * 1e3:,.2f} ms, TPOT {b['tpot_s'] * 1e3:,.3f} ms, "
                  f"{b['output_tokens_per_s_per_device']:,.1f} tok/s/device (closed form)")
    t = Table(title="elasticities ∂ ln f / ∂ ln x (−1: f halves when x doubles)", title_justify="left")
    for col in ("parameter", "value", "TTFT", "TPOT", "tok/s/device"):
        t.add_column(col, justify="left" if col == "parameter" else "right")
    for row in r.rows:
        e = row["elasticity"]
        t.add_row(row["parameter"], f"{row['value']:.4g} {row['unit']}",
                  *("—" if e[m] is None else f"{e[m]:+.3f}" for m in METRICS))
    console.print(t)
    sol = r.solution
    if sol is not None:
        if not sol["found"]:
            console.print(f"[bold red]--solve {sol['parameter']}:[/bold red] {sol['reason']}")
        else:
            mult = f" (× {sol['multiplier']:.4g} the datasheet's)" if sol.get("multiplier") else ""
            sim = sol["simulation"]
            console.print(f"[bold green]--solve {sol['parameter']}:[/bold green] {sol['value']:.4g} {sol['unit']}{mult} "
                          f"gives {sol['metric']} {sol['closed_form'][sol['metric']] * 1e3:,.3f} ms ≤ "
                          f"{sol['bound'] * 1e3:g} ms (closed form); simulated "
                          + ("—" if sim is None else f"{sim[sol['metric']] * 1e3:,.3f} ms"
                             + ("" if sol["simulation_meets"] else " [bold red](misses it)[/bold red]")))
    console.print(f"[dim]{doc['step']}[/dim]")
    for n in doc["notes"]:
        console.print(f"note: {n}")
