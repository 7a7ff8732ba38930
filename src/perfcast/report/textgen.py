"""Reports of a text-generation step: JSON document, terminal tables (its Chrome trace:
:mod:`perfcast.report.trace`)."""

from __future__ import annotations

from collections import defaultdict

from rich.console import Console
from rich.markup import escape
from rich.panel import Panel
from rich.table import Table

from perfcast.capture.parallel import experts_of
from perfcast.ir import FLOPS_MATRIX, FLOPS_VECTOR, Leaf
from perfcast.report.format import percent, seconds, si
from perfcast.report.kernel import hidden, print_overlap
from perfcast.rollup.overlap import SUMMARY

#: The note the step carries when kernels are summed; with --overlap it says where they are not.
_SERIAL_NOTE = "kernels run one after another: no overlap between them is assumed"


def op_name(leaf: Leaf) -> str:
    op = str(leaf.attr("op") or leaf.kind)
    return op.removesuffix(".default")


def op_table(result) -> list[dict]:
    """Per op name: calls (with loop trips), time per performance model, dominant bound, FLOPs."""
    rows: dict[str, dict] = {}
    for name, r in result.rollups.items():
        ev = result.evaluations[name]
        for lt, row in zip(r.leaves, ev.leaves.values()):
            key = op_name(lt.leaf)
            entry = rows.setdefault(key, {"name": key, "calls": 0, "time_s": defaultdict(float),
                                          "flops": 0.0, "bytes_hbm": 0.0, "_bounds": defaultdict(float)})
            entry["time_s"][name] += row["time_s"]
            if name == next(iter(result.rollups)):
                entry["calls"] += int(lt.trips)
                entry["flops"] += row.get(FLOPS_MATRIX, 0.0) + row.get(FLOPS_VECTOR, 0.0)
                entry["bytes_hbm"] += row.get("bytes.hbm", 0.0)
                entry["_bounds"][row["bound"]] += row["time_s"]
    first = next(iter(result.rollups))
    out = []
    for e in sorted(rows.values(), key=lambda e: -e["time_s"][first]):
        bounds = e.pop("_bounds")
        e["bound"] = max(bounds, key=bounds.get) if bounds else "none"
        e["time_s"] = dict(e["time_s"])
        out.append(e)
    return out


def _fuses(leaf: Leaf) -> str:
    """What an engine kernel covers of the captured step: the ops (or GEMMs) it merges."""
    members = leaf.attr("members") or ()
    if not members:
        return op_name(leaf)
    if leaf.kind == "matmul":
        return "+".join(str(m.attr("module")).rsplit(".", 1)[-1] for m in members) + " GEMMs"
    ops = list(dict.fromkeys(str(m.attr("op") or m.kind).split(".")[1 if "." in str(m.attr("op") or "") else 0]
                             for m in members))
    head = f"{op_name(leaf)} + " if leaf.attr("absorbed") else ""
    return f"{head}{'+'.join(ops)} ({len(members)} ops)"


def kernel_table(result) -> list[dict]:
    """The engine's kernels: one row per kernel name within each part of the step (prologue, each
    layer loop, epilogue), in order — what it fuses, its calls per step (loop trips and the kernels
    a multi-kernel op launches counted), its time with its launch cost, per performance model."""
    rows: dict[tuple, dict] = {}
    names = list(result.rollups)
    for name in names:
        r, ev = result.rollups[name], result.evaluations[name]
        seen_layer = False
        for lt, row in zip(r.leaves, ev.leaves.values()):
            loop = next((p for p in lt.path[1:] if "×" in p or p.startswith("layer")), None)
            seen_layer = seen_layer or loop is not None
            segment = loop or ("epilogue" if seen_layer else "prologue")
            key = (segment, str(lt.leaf.attr("kernel") or op_name(lt.leaf)))
            e = rows.setdefault(key, {"segment": segment, "kernel": key[1],
                                      "class": lt.leaf.attr("kernel_class") or lt.leaf.kind,
                                      "fuses": _fuses(lt.leaf), "per_layer": 0, "calls": 0,
                                      "time_s": defaultdict(float)})
            e["time_s"][name] += row["time_s"] + row.get("launch_s", 0.0)
            if name == names[0]:
                n = int(lt.leaf.attr("launches") or 1)
                e["calls"] += int(lt.trips) * n
                e["per_layer"] += n if loop else 0
    total = result.evaluations[names[0]].time_s
    out = []
    for e in rows.values():
        e["time_s"] = dict(e["time_s"])
        e["share"] = e["time_s"][names[0]] / total if total else 0.0
        out.append(e)
    return out


def kernel_sequence(result) -> dict[str, list[str]]:
    """The engine's kernels in launch order, by part of the step (prologue, each layer loop's
    body once, epilogue); a kernel an op launches several of appears as ``name×n``."""
    out: dict[str, list[str]] = {}
    seen_layer = False
    for lt in result.rollups[next(iter(result.rollups))].leaves:
        loop = next((p for p in lt.path[1:] if "×" in p or p.startswith("layer")), None)
        seen_layer = seen_layer or loop is not None
        n = int(lt.leaf.attr("launches") or 1)
        name = str(lt.leaf.attr("kernel") or op_name(lt.leaf)) + (f"×{n}" if n > 1 else "")
        out.setdefault(loop or ("epilogue" if seen_layer else "prologue"), []).append(name)
    return out


def engine_section(result) -> dict:
    eng, launch = result.engine, result.launch
    table = kernel_table(result)
    per_layer = defaultdict(int)
    for row in table:
        if "×" in row["segment"]:
            per_layer[row["segment"]] += row["per_layer"]
    db = eng.database
    return {"name": eng.name, "framework": eng.framework, "version": eng.version, "description": eng.description,
            "database": {"framework": db.framework, "version": db.version} if db else None,
            "launch": {"mode": launch.mode, "description": launch.description,
                       "host_launch_interval_s": float(launch.host_interval_s)},
            "kernels_per_layer": dict(per_layer), "kernels_per_step": sum(row["calls"] for row in table),
            "rules_applied": [f"{i}: {eng.rules[i].rule}" for i in result.rules_applied],
            "rules": len(eng.rules),
            "kernels": table}


def flops_summary(result) -> dict:
    first = next(iter(result.rollups))
    mm = lm = attn = vec = 0.0
    for lt, row in zip(result.rollups[first].leaves, result.evaluations[first].leaves.values()):
        f = row.get(FLOPS_MATRIX, 0.0)
        vec += row.get(FLOPS_VECTOR, 0.0)
        if lt.leaf.kind in ("matmul", "grouped_matmul"):
            if lt.leaf.attr("module") == "lm_head":
                lm += f
            else:
                mm += f
        elif lt.leaf.kind == "attention":
            attn += f
    return {"matmul_excluding_lm_head": mm, "lm_head": lm, "attention": attn, "vector": vec,
            "total": mm + lm + attn + vec}


def _label(result, name: str, shares: dict[str, float]) -> dict[str, float]:
    """In an empirical model, an analytic price is the fallback for a miss: say so."""
    if not result.rollups[name].model.falls_back:
        return shares
    fallback = {"analytic": "fallback", "derived": "fallback (derived)"}
    return {fallback.get(k, k): v for k, v in shares.items()}


def provenance_label(result, name: str, source: str) -> str:
    """A leaf's provenance (``source``) as the report names it under performance model ``name``."""
    return next(iter(_label(result, name, {source: 0.0})))


def provenance_by_time(result, name: str) -> dict[str, float]:
    return _label(result, name, result.evaluations[name].provenance_shares())


def provenance_by_count(result, name: str) -> dict[str, float]:
    """Share of kernel calls (loop trips counted) by provenance."""
    counts: dict[str, int] = {}
    for lt, row in zip(result.rollups[name].leaves, result.evaluations[name].leaves.values()):
        counts[row["source"]] = counts.get(row["source"], 0) + int(lt.trips)
    total = sum(counts.values())
    return _label(result, name, {k: v / total for k, v in counts.items()} if total else {})


def missed_ops(result, name: str) -> list[dict]:
    """Ops the model's data source could not price, by fallback time, with the reason."""
    model = result.rollups[name].model
    by_leaf = {lt.name: (lt, row) for lt, row in zip(result.rollups[name].leaves,
                                                     result.evaluations[name].leaves.values())}
    out: dict[str, dict] = {}
    for m in model.misses:
        lt, row = by_leaf.get(m.leaf, (None, {"time_s": 0.0}))
        e = out.setdefault(m.op, {"op": m.op, "calls": 0, "time_s": 0.0, "reason": m.reason})
        e["calls"] += int(lt.trips) if lt is not None else 1
        e["time_s"] += row["time_s"]
    return sorted(out.values(), key=lambda e: -e["time_s"])


def empirical_metrics(result) -> dict:
    return {name: {"provenance_by_time": provenance_by_time(result, name),
                   "provenance_by_count": provenance_by_count(result, name),
                   "missed_ops": missed_ops(result, name)}
            for name in result.rollups if result.rollups[name].model.falls_back}


def to_json(result) -> dict:
    """The step as JSON; with overlap transforms (``result.overlaps``) times are after overlap and
    an ``overlap`` section accounts for it; a VLM's step has a ``vision`` section, a slow roll-up
    a ``slow`` one."""
    req = result.request
    ov = result.overlaps
    models = {}
    for name, ev in result.evaluations.items():
        models[name] = {"total_time_s": result.step_time_s(name, overlap=True),
                        "stage_times_s": ov[name].stage_times_s if ov and ov[name].stage_times_s
                        else result.stage_times_s.get(name),
                        "tokens_per_s_per_device": result.tokens_per_s_per_device(name, overlap=True),
                        "bound_shares": ev.bound_shares(), "provenance_shares": provenance_by_time(result, name),
                        "provenance_shares_by_count": provenance_by_count(result, name),
                        "missed_ops": missed_ops(result, name)[:10],
                        "kernel_launches": int(result.rollups[name].kernels),
                        "launch_time_s": ev.launch_time_s, "host_launch_time_s": ev.host_launch_s,
                        "stream_overlap_s": ev.stream_overlap_s}
    first = next(iter(models))
    low = result.lowered
    notes = list(result.notes)
    streamed = any(ev.stream_overlap_s for ev in result.evaluations.values())
    if ov:
        transforms = next(iter(ov.values())).rollup.transforms
        notes = [f"kernels run one after another except where --overlap rewrites the sum ({', '.join(transforms)}; "
                 f"see the overlap table)" + (" and the engine's second stream (its note)" if streamed else "")
                 if n == _SERIAL_NOTE else n for n in notes]
        notes += [f"overlap {t}: {SUMMARY[t]}" for t in transforms]
    elif streamed:
        notes = ["kernels run one after another except the engine's second stream (its note): no other overlap "
                 "is assumed" if n == _SERIAL_NOTE else n for n in notes]
    doc = {
        "model": req.model.name, "model_type": req.model.model_type, "device": req.device.name,
        "phase": "decode" if req.decode else "prefill", "num_queries": req.num_queries,
        "query_length": req.new_tokens, "context_length": req.context_length, "dtype": req.dtype,
        "quantize": req.quantize,
        "kv_cache_dtype": result.quantization.get("kv_cache", {}).get("dtype") or req.kv_dtype or req.dtype,
        "moe_routing": req.moe_routing if experts_of(req.model.data) else None,
        "quantization": result.quantization,
        "engine": engine_section(result),
        "parallel": {"num_devices": req.devices, "tp": req.layout.tp, "ep": req.layout.ep, "dp": req.layout.dp,
                     "pp": req.layout.pp, "attention_dp": req.layout.attention_dp,
                     "sequence_parallel": req.layout.sequence_parallel, "micro_batches": req.micro_batches,
                     "sequences_per_micro_batch": req.sequences_per_micro_batch},
        "performance_models": models,
        "tokens_per_s_per_device": models[first]["tokens_per_s_per_device"],
        "deployable": result.memory.fits,
        "memory": result.memory.as_dict(),
        "flops": flops_summary(result),
        "ops": op_table(result),
        "unknown_ops": [{"op": op, "shapes": shapes, "count": n} for (op, shapes), n in low.unknown.most_common()],
        "free_ops": dict(low.free),
        "capture": result.capture_source,
        "timings_s": result.timings_s,
        "notes": notes,
    }
    if ov:
        doc["overlap"] = {"transforms": list(transforms), "performance_models": {
            name: {**o.evaluation.as_dict(), "stage_times_s": o.stage_times_s} for name, o in ov.items()}}
    if result.vision is not None:
        from perfcast.report.vision import to_json as vision_json  # it builds on this module

        doc["vision"] = vision_json(result)
    if result.slow:
        doc["slow"] = {n: result.slow_comparison(n).as_dict() for n in result.slow}
    return doc


def render(console: Console, result, top: int = 15) -> None:
    req, mem = result.request, result.memory
    ov = result.overlaps
    doc = to_json(result)
    seqs = f"{req.num_queries} sequence{'s' if req.num_queries != 1 else ''}"
    phase = (f"decode · {seqs} × 1 new token after {req.context_length:,} cached"
             if req.decode else
             f"prefill · {seqs} × {req.query_length:,} tokens"
             + (f" after {req.context_length:,} cached" if req.context_length else ""))
    q = result.quantization
    quant = f" · {q['method']} ({'--quantize' if req.quantize else 'checkpoint'})" \
        if q.get("method", "none") != "none" else (f" · {req.quantize}" if req.quantize else "")
    where = f"{req.devices} × {req.device.name} ({req.layout.describe()})" if req.devices > 1 else req.device.name
    eng = doc["engine"]
    console.print(f"[bold]{req.model.name}[/] on [bold]{where}[/] · {phase} · {req.dtype}{quant} · engine "
                  f"[bold]{eng['name']}[/] ({eng['framework']} {eng['version']}, {eng['launch']['mode']})")
    if not mem.fits:
        console.print(Panel(f"DOES NOT FIT: needs {si(mem.used_bytes, 'B')} of {si(mem.capacity_bytes, 'B')} "
                            f"(short by {si(mem.shortfall_bytes, 'B')}). The times below are NOT deployable.",
                            style="bold red"))
    for name, m in doc["performance_models"].items():
        stages = (" · stages " + " / ".join(seconds(t) for t in m["stage_times_s"])) if m["stage_times_s"] else ""
        host = f" ({seconds(m['host_launch_time_s'])} of it host-bound)" if m["host_launch_time_s"] else ""
        console.print(f"{name}: step {seconds(m['total_time_s'])}{stages} · "
                      f"{m['tokens_per_s_per_device']:,.1f} tokens/s per device · "
                      f"{eng['kernels_per_step']:,} kernels · launch cost {seconds(m['launch_time_s'])}{host}")
        console.print("  bound: " + ", ".join(f"{k} {percent(v)}" for k, v in
                                              sorted(m["bound_shares"].items(), key=lambda kv: -kv[1]))
                      + " · provenance by time: " + ", ".join(f"{k} {percent(v)}" for k, v in m["provenance_shares"].items())
                      + " · by calls: " + ", ".join(f"{k} {percent(v)}" for k, v in m["provenance_shares_by_count"].items()))
        for miss in m["missed_ops"][:5]:
            console.print(f"  [yellow]missed[/] {escape(miss['op'])} ×{miss['calls']:,} "
                          f"({seconds(miss['time_s'])} by fallback): {escape(miss['reason'])}")
        if ov:
            oev = ov[name].evaluation
            console.print(f"  overlap: one pass {seconds(oev.before_s)} → {seconds(oev.after_s)}"
                          + (" (two micro-batches)" if oev.micro_batches == 2 else "") + " · "
                          + ", ".join(f"{s.name} −{hidden(s.hidden_s)}" for s in oev.steps))
    mt = Table(title="Memory per device" + (" (the fullest pipeline stage)" if req.layout.pp > 1 else ""),
               title_justify="left")
    for col in ("weights", "KV cache", "peak activations", "reserved", "free", "capacity"):
        mt.add_column(col, justify="right")
    mt.add_row(si(mem.weights_bytes, "B"), f"{si(mem.kv_cache_bytes, 'B')} ({mem.kv_cache_bytes_per_token:,} B/token)",
               si(mem.activation_peak_bytes, "B"), si(mem.reserved_bytes, "B"),
               si(mem.free_bytes, "B") if mem.fits else f"[red]0 (short by {si(mem.shortfall_bytes, 'B')})[/]",
               si(mem.capacity_bytes, "B"))
    console.print(mt)
    ops = Table(title=f"Ops (top {top} by time" + (", one micro-batch through every stage)" if req.layout.pp > 1 else ")"),
                title_justify="left")
    ops.add_column("op")
    ops.add_column("calls", justify="right")
    names = list(doc["performance_models"])
    for n in names:
        ops.add_column(f"total ({n})", justify="right")
    ops.add_column("average", justify="right")
    ops.add_column("bound")
    ops.add_column("share", justify="right")
    total = result.evaluations[names[0]].time_s  # shares of one pass of the priced graph
    for row in doc["ops"][:top]:
        t = row["time_s"][names[0]]
        ops.add_row(escape(row["name"]), f"{row['calls']:,}", *(seconds(row["time_s"][n]) for n in names),
                    seconds(t / row["calls"]) if row["calls"] else "", row["bound"], percent(t / total) if total else "")
    launches = {n: result.evaluations[n].launch_time_s for n in names}
    if launches[names[0]]:
        count = max(int(result.rollups[names[0]].launches), 1)  # the launches a fixed cost is charged for
        ops.add_row("(kernel launch latency)", f"{count:,}", *(seconds(launches[n]) for n in names),
                    seconds(launches[names[0]] / count), "latency", percent(launches[names[0]] / total))
    streamed = {n: result.evaluations[n].stream_overlap_s for n in names}
    if any(streamed.values()):
        ops.add_row("(second stream: run alongside)", "", *(f"−{seconds(streamed[n])}" for n in names),
                    "", "", f"−{percent(streamed[names[0]] / total)}")
    console.print(ops)
    _print_kernels(console, doc["engine"], names, top)
    for name, o in ov.items():
        print_overlap(console, o.evaluation, f"Overlap ({name}, one pass)")
    if doc["unknown_ops"]:
        un = Table(title="Ops with no cost rule (NOT priced)", title_justify="left", style="red")
        for col in ("op", "count", "input shapes"):
            un.add_column(col)
        for u in doc["unknown_ops"]:
            un.add_row(escape(u["op"]), str(u["count"]), escape(u["shapes"]))
        console.print(un)
    for n in doc["notes"]:
        console.print(f"[yellow]note:[/] {escape(n)}")


def _print_kernels(console: Console, eng: dict, names: list[str], top: int) -> None:
    per = ", ".join(f"{seg}: {n}" for seg, n in eng["kernels_per_layer"].items())
    kt = Table(title=f"{eng['name']} kernels ({eng['framework']} {eng['version']}; per layer: {per}; "
                     f"{eng['kernels_per_step']:,} per step)", title_justify="left")
    for col in ("part", "kernel", "fuses", "calls"):
        kt.add_column(col, justify="right" if col == "calls" else "left")
    for n in names:
        kt.add_column(f"total ({n})", justify="right")
    kt.add_column("share", justify="right")
    rows = eng["kernels"]
    shown = rows if len(rows) <= 3 * top else sorted(rows, key=lambda r: -r["share"])[: 3 * top]
    for row in shown:
        kt.add_row(escape(row["segment"]), escape(row["kernel"]), escape(row["fuses"]), f"{row['calls']:,}",
                   *(seconds(row["time_s"][n]) for n in names), percent(row["share"]))
    console.print(kt)
