"""What the page of each command (``--html FILE``, :mod:`perfcast.report.html`) shows, read from
the command's JSON document only: the headline figures, the inputs, the tables, the provenance
shares, the missing data and the notes. Formatting only: a figure the document does not hold is
not shown, and a figure it holds as ``null`` is a dash."""

from __future__ import annotations

import re
from dataclasses import dataclass

from perfcast.perf import BOUNDS
from perfcast.report.format import percent, seconds, si

#: figure name → what it shows (docs/design/plots.md has the long form)
CAPTIONS = {
    "roofline": "every op of the step on the device's roofline, coloured by provenance; the step as a star",
    "step-time": "the step's time by op and by layer, stacked by bound",
    "memory": "one device's weights, KV cache, activations and reserve against its capacity",
    "serve-timeline": "sequences per step (decoding, prefilling) and the KV-cache tokens in use over the run",
    "serve-latency": "the simulated TTFT and TPOT of every counted request, with the SLOs",
    "pareto": "tokens/s per device against tokens/s per user: every candidate, the front, the chosen deployment",
    "validate": "each predicted row against its measurement, with the ±10 % and ±25 % bands",
    "kernel-roofline": "the kernel's leaves on the device's roofline, and the whole kernel",
    "kernel-sweep": "the kernel's time over the swept symbols",
}
#: a note that says a figure is approximate, assumed or missing (listed again under missing data)
APPROXIMATE = re.compile(r"approximat|no calibration|datasheet peak|taken from|fallback|not priced|unknown|"
                         r"not modelled|cannot be priced|no data|miss", re.IGNORECASE)


@dataclass(frozen=True)
class Table:
    """A sortable table: ``kinds`` says how each column's values are written (:func:`cell`)."""

    id: str
    title: str
    columns: tuple[str, ...]
    kinds: tuple[str, ...]
    rows: tuple[tuple, ...]


@dataclass(frozen=True)
class View:
    title: str
    headline: tuple[tuple[str, str], ...]
    inputs: tuple[tuple[str, str], ...]
    tables: tuple[Table, ...] = ()
    notes: tuple[str, ...] = ()
    missing: tuple[str, ...] = ()
    missing_tables: tuple[Table, ...] = ()
    alert: str | None = None
    provenance: tuple[tuple[str, dict], ...] = ()


def cell(value, kind: str) -> str:
    """``value`` written as a column of ``kind`` holds it: s (seconds), B (bytes), B/s, FLOP,
    share, rate (per second), int, num or text."""
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if not isinstance(value, (int, float)) or kind == "text":
        return str(value)
    if kind == "s":
        return seconds(value) if value else "0 s"
    if kind in ("B", "FLOP", "B/s"):
        return si(value, kind)
    if kind == "share":
        return percent(value)
    if kind == "rate":
        return f"{value:,.1f}"
    if kind == "int":
        return f"{int(value):,}" if float(value).is_integer() else f"{value:,.4g}"
    return f"{value:.4g}"


def flat(d: dict | None, prefix: str = "") -> list[tuple[str, str]]:
    """A nested dict as ``(a.b, value)`` pairs, each value written by its key's unit."""
    out = []
    for k, v in (d or {}).items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out += flat(v, key + ".")
        elif isinstance(v, list):
            out.append((key, ", ".join(str(x) for x in v) if all(not isinstance(x, (dict, list)) for x in v)
                        else f"{len(v)} entries (see the JSON)"))
        else:
            out.append((key, cell(v, _kind(key))))
    return out


def _kind(key: str) -> str:
    """How a value is written, by its (dotted) key's unit: ``flops.total``, ``bytes.hbm``,
    ``memory.weights_bytes``, ``slo.ttft_s``, ``output_tokens_per_s``, ``prefix_hit_rate``."""
    first, last = key.split(".")[0], key.split(".")[-1]
    if "flops" in (first, last) or last.startswith("flops"):
        return "FLOP"
    if "bytes_per_s" in last:
        return "B/s"
    if "bytes" in (first, last) or last.endswith("_bytes") or last.startswith("bytes"):
        return "B"
    if "per_s" in last:
        return "rate"
    if last.endswith("_s"):
        return "s"
    if "share" in last or last in ("memory_fraction", "prefix_hit_rate"):
        return "share"
    return "int"


def _pick(doc: dict, *keys: str) -> dict:
    return {k: doc[k] for k in keys if k in doc}


def _shares(doc: dict, path: str = "") -> list[tuple[str, dict]]:
    """Every provenance-share dict in the document, by where it stands."""
    out = []
    if isinstance(doc, dict):
        for k, v in doc.items():
            where = f"{path}.{k}" if path else k
            shares = isinstance(v, dict) and all(isinstance(x, (int, float)) for x in v.values())
            if k.startswith("provenance") and shares:
                out.append((where, v))
            elif k != "sweep":  # each sweep point repeats the design point's labels
                out += _shares(v, where)
    return out


def _approximate(notes) -> tuple[str, ...]:
    return tuple(n for n in notes if APPROXIMATE.search(n))


def _table(id_: str, title: str, rows: list[dict], columns: list[tuple[str, str, str]]) -> Table:
    """``columns``: (header, key, kind); ``a|b`` steps into a nested dict (keys such as ``bytes.hbm``
    hold dots)."""
    def get(row, key):
        for part in key.split("|"):
            row = row.get(part) if isinstance(row, dict) else None
        return row
    return Table(id_, title, tuple(c[0] for c in columns), tuple(c[2] for c in columns),
                 tuple(tuple(get(r, c[1]) for c in columns) for r in rows))


# --- text-generate -----------------------------------------------------------------------------------

def text_generate(doc: dict) -> View:
    models = list(doc["performance_models"])
    mem = doc["memory"]
    head = []
    for name, m in doc["performance_models"].items():
        head += [(f"step ({name})", cell(m["total_time_s"], "s")),
                 (f"tokens/s per device ({name})", cell(m["tokens_per_s_per_device"], "rate"))]
    head += [("kernels per step", cell(doc["engine"]["kernels_per_step"], "int")),
             ("weights per device", cell(mem["weights_bytes"], "B")), ("KV cache", cell(mem["kv_cache_bytes"], "B")),
             ("free of the capacity", f"{cell(mem['free_bytes'], 'B')} of {cell(mem['capacity_bytes'], 'B')}"
              if mem["fits"] else f"DOES NOT FIT (short by {cell(mem['shortfall_bytes'], 'B')})")]
    eng = doc["engine"]
    inputs = flat(_pick(doc, "model", "model_type", "device", "phase", "num_queries", "query_length", "context_length",
                        "dtype", "quantize", "kv_cache_dtype", "moe_routing", "parallel", "capture"))
    inputs += [("engine", f"{eng['name']} ({eng['framework']} {eng['version']}), {eng['launch']['mode']}")]
    inputs += [(f"quantization {g['group']}", f"{g['detail']} — {g['path']}")
               for g in doc.get("quantization", {}).get("groups", [])]
    inputs += flat({"memory": mem, "flops": doc["flops"]})
    tables = [_table("ops", "Ops (every op, by time)", doc["ops"],
                     [("op", "name", "text"), ("calls", "calls", "int"),
                      *((f"time ({n})", f"time_s|{n}", "s") for n in models),
                      ("FLOPs", "flops", "FLOP"), ("HBM bytes", "bytes_hbm", "B"), ("bound", "bound", "text")]),
              _table("kernels", f"{eng['name']} kernels", eng["kernels"],
                     [("part", "segment", "text"), ("kernel", "kernel", "text"), ("fuses", "fuses", "text"),
                      ("calls", "calls", "int"), *((f"time ({n})", f"time_s|{n}", "s") for n in models),
                      ("share", "share", "share")]),
              _table("bounds", "Bound shares", [{"model": n, **m["bound_shares"]}
                                               for n, m in doc["performance_models"].items()],
                     [("model", "model", "text"), *((b, b, "share") for b in BOUNDS)])]
    missing_tables = [_table("unknown-ops", "Ops with no cost rule (NOT priced)", doc["unknown_ops"],
                             [("op", "op", "text"), ("count", "count", "int"), ("input shapes", "shapes", "text")])]
    for name, m in doc["performance_models"].items():
        if m["missed_ops"]:
            missing_tables.append(_table(f"missed-{name}", f"Missed by {name} (priced by the analytic fallback)",
                                         m["missed_ops"], [("op", "op", "text"), ("calls", "calls", "int"),
                                                           ("time", "time_s", "s"), ("reason", "reason", "text")]))
    alert = None if mem["fits"] else (f"DOES NOT FIT: short by {cell(mem['shortfall_bytes'], 'B')} of "
                                      f"{cell(mem['capacity_bytes'], 'B')}. The times are NOT deployable.")
    phase = f"{doc['phase']}, {doc['num_queries']:,} × {doc['query_length']:,} new tokens" + \
        (f" after {doc['context_length']:,}" if doc["context_length"] else "")
    return View(f"{doc['model']} on {doc['device']} — {phase}", tuple(head), tuple(inputs), tuple(tables),
                tuple(doc["notes"]), _approximate(doc["notes"]), tuple(t for t in missing_tables if t.rows),
                alert, tuple(_shares(doc)))


# --- serve -----------------------------------------------------------------------------------------------

_LATENCIES = (("TTFT", "ttft_s"), ("TPOT", "tpot_s"), ("ITL", "itl_s"), ("E2E", "e2e_s"))


def serve(doc: dict) -> View:
    th, kv = doc["throughput"], doc["kv_cache"]
    head = [(f"{label} mean / p90", f"{cell((doc[k] or {}).get('mean'), 's')} / {cell((doc[k] or {}).get('p90'), 's')}")
            for label, k in _LATENCIES[:2]]
    head += [("E2E mean", cell((doc["e2e_s"] or {}).get("mean"), "s")),
             ("output tokens/s per device", cell(th["output_tokens_per_s_per_device"], "rate")),
             ("output tokens/s per user", cell(th["output_tokens_per_s_per_user"], "rate")),
             ("requests/s", cell(th["requests_per_s"], "rate")),
             ("goodput (requests/s)", cell(doc["goodput_requests_per_s"], "rate")),
             ("KV cache peak / capacity (tokens)",
              f"{cell(kv['peak_tokens'], 'int')} / {cell(kv['capacity_tokens'], 'int')}"),
             ("tier", doc["tier"]), ("devices", cell(doc["devices"], "int"))]
    inputs = flat(_pick(doc, "model", "device", "engine", "layout", "workload", "scheduler", "speculative",
                        "disaggregated"))
    inputs += [("step", doc["step"])]
    tiers = [{"tier": name, **t} for name, t in doc["tiers"].items()]
    per = [(f"{label} {stat}", f"{k}|{stat}", "s") for label, k in _LATENCIES for stat in ("mean", "p90")]
    tables = [_table("tiers", "Tiers (simulation and closed form)", tiers,
                     [("tier", "tier", "text"), ("stable", "stable", "text"), *per,
                      ("tokens/s per device", "throughput|output_tokens_per_s_per_device", "rate"),
                      ("tokens/s per user", "throughput|output_tokens_per_s_per_user", "rate"),
                      ("requests/s", "throughput|requests_per_s", "rate"),
                      ("goodput", "goodput_requests_per_s", "rate"), ("mean batch", "mean_batch", "num"),
                      ("requests", "requests", "int")]),
              _table("latencies", f"Latencies ({doc['tier']})", [{"metric": label, **(doc[k] or {})}
                                                                 for label, k in _LATENCIES],
                     [("metric", "metric", "text"), *((s, s, "s") for s in ("mean", "p50", "p90", "p99"))])]
    if doc.get("agreement"):
        tables.append(_table("agreement", "Simulation ÷ closed form (the means)", [{"metric": k, "ratio": v}
                                                                      for k, v in doc["agreement"].items()],
                             [("metric", "metric", "text"), ("ratio", "ratio", "num")]))
    notes = [*doc["notes"], *(f"{name}: {n}" for name, t in doc["tiers"].items() for n in t.get("notes", ())),
             *(f"{k}: {v}" for k, v in doc["definitions"].items())]
    alert = None
    if not doc["stable"]:
        alert = (f"OVERLOADED: the load exceeds what the deployment sustains "
                 f"({cell(doc['sustainable_requests_per_s'], 'rate')} requests/s); latencies are not reported")
    return View(f"serve {doc['model']} on {doc['device']} ({doc['engine']})", tuple(head), tuple(inputs),
                tuple(tables), tuple(notes), _approximate(notes), (), alert, tuple(_shares(doc)))


# --- optimize --------------------------------------------------------------------------------------------

def _figures(c: dict) -> dict:
    return c.get("simulation") or c.get("closed_form") or {}


def optimize(doc: dict) -> View:
    best = doc.get("best")
    head = [("best deployment", best["deployment"]["description"] if best else "none under the SLOs")]
    if best:
        f = _figures(best)
        where = "simulation" if best.get("simulation") else "closed form"
        head += [(f"tokens/s per device ({where})", cell(f.get("output_tokens_per_s_per_device"), "rate")),
                 (f"tokens/s per user ({where})", cell(f.get("output_tokens_per_s_per_user"), "rate")),
                 (f"TTFT ({where})", cell(f.get("ttft_s"), "s")), (f"TPOT ({where})", cell(f.get("tpot_s"), "s"))]
    head += [("candidates evaluated", cell(doc["candidates_evaluated"], "int")),
             ("confirmed by simulation", cell(doc["confirmed_by_simulation"], "int")),
             ("rejected", cell(sum(doc["rejected"].values()), "int"))]
    inputs = flat(_pick(doc, "model", "devices", "total_devices", "engine", "serving_modes", "workload", "slo",
                        "space", "executor"))
    rows = ([{"role": "best", **best}] if best else []) + [{"role": "front", **c} for c in doc["pareto"]] + \
        [{"role": "runner-up", **c} for c in doc["runners_up"]]
    cols = [("role", "role", "text"), ("deployment", "deployment|description", "text"),
            ("mode", "deployment|mode", "text"), ("device", "deployment|device", "text"),
            ("quantize", "deployment|quantize", "text"), ("devices", "deployment|devices", "int"),
            ("batch", "deployment|max_batch_size", "int"), ("concurrency", "deployment|concurrency", "int"),
            ("status", "status", "text")]
    for where, key in (("closed form", "closed_form"), ("simulation", "simulation")):
        cols += [(f"TTFT ({where})", f"{key}|ttft_s", "s"), (f"TPOT ({where})", f"{key}|tpot_s", "s"),
                 (f"tokens/s per device ({where})", f"{key}|output_tokens_per_s_per_device", "rate"),
                 (f"tokens/s per user ({where})", f"{key}|output_tokens_per_s_per_user", "rate")]
    rejected = [{"reason": doc["rejected_reasons"].get(k, k), "candidates": n} for k, n in doc["rejected"].items()]
    tables = [_table("candidates", "The chosen deployment, the Pareto front and the runners-up", rows, cols),
              _table("rejected", "Rejected candidates, by reason", rejected,
                     [("reason", "reason", "text"), ("candidates", "candidates", "int")])]
    missing = [f"{n:,} candidates rejected: {doc['rejected_reasons'].get(k, k)}"
               for k, n in doc["rejected"].items() if n and k in ("no_data", "not_modelled")]
    return View(f"optimize {doc['model']} on {doc['total_devices']} × {', '.join(doc['devices'])}", tuple(head),
                tuple(inputs), tuple(tables), tuple(doc["notes"]), (*missing, *_approximate(doc["notes"])),
                (), None, tuple(_shares(doc)))


# --- validate --------------------------------------------------------------------------------------------

def validate(doc: dict) -> View:
    rows = doc["rows"]
    head = [("rows selected / read", f"{rows['selected']:,} / {rows['read']:,}"),
            ("mapped to a perfcast step", f"{rows['mappable']:,} ({rows['approximate']:,} approximately)"),
            ("refused", f"{rows['selected'] - rows['mappable']:,}")]
    metrics = []
    for p in doc["populations"]:
        for m, e in p["models"].items():
            for mapping, s in e.items():
                if isinstance(s, dict) and "median_abs" in s:
                    metrics.append({"population": p["population"], "model": m, "mapping": mapping, **s})
    pop = next((p for p in doc["populations"] if any(r["population"] == p["population"] for r in metrics)), None)
    if pop is not None:
        for m in pop["models"]:
            s = next((r for r in metrics if r["population"] == pop["population"] and r["model"] == m), None)
            if s is not None:
                head.append((f"median |error| ({m}, {s['mapping']}, {pop['population']})",
                             cell(s["median_abs"], "share")))
    inputs = flat(_pick(doc, "sources", "seed", "performance_models", "baseline"))
    tables = [_table("errors", "Errors per population, model and mapping (of the measured time)", metrics,
                     [("population", "population", "text"), ("model", "model", "text"), ("mapping", "mapping", "text"),
                      ("n", "n", "int"), ("median |error|", "median_abs", "share"), ("p90 |error|", "p90_abs", "share"),
                      ("signed median", "signed_median", "share")]),
              _table("populations", "Populations", doc["populations"],
                     [("population", "population", "text"), ("rows", "rows", "int"), ("mapped", "mappable", "int"),
                      ("approximate", "approximate", "int"), ("description", "description", "text")])]
    refused = [{"reason": k, "rows": n} for k, n in doc["refused"].items()]
    not_priced = {}
    for p in doc["populations"][:1]:  # the whole selection
        for m, e in p["models"].items():
            not_priced.update({(m, k): n for k, n in e["not_priced"].items()})
    missing_tables = [_table("refused", "Refused rows, by reason", refused,
                             [("reason", "reason", "text"), ("rows", "rows", "int")]),
                      _table("not-priced", "Rows not priced, by model and reason",
                             [{"model": m, "reason": k, "rows": n} for (m, k), n in not_priced.items()],
                             [("model", "model", "text"), ("reason", "reason", "text"), ("rows", "rows", "int")])]
    missing = [f"{rows['approximate']:,} rows priced approximately (their quantization)"] if rows["approximate"] else []
    missing += [f"{m}: {e['unpriced_op_rows']:,} predicted rows have ops with no cost rule (NOT priced)"
                for p in doc["populations"][:1] for m, e in p["models"].items() if e["unpriced_op_rows"]]
    notes = tuple(f"{k}: {v}" for k, v in doc["mapping"].items())  # how a row becomes a step, and what is assumed
    title = f"validate: {rows['selected']:,} rows, {', '.join(doc['performance_models'])} against the measurements"
    return View(title, tuple(head), tuple(inputs), tuple(tables), notes, tuple(missing),
                tuple(t for t in missing_tables if t.rows), None, tuple(_shares(doc)))


# --- kernel ---------------------------------------------------------------------------------------------

def kernel(doc: dict) -> View:
    tot = doc["totals"]
    head = [("time", cell(tot["time_s"], "s")), ("launch", cell(doc["launch_time_s"], "s"))]
    head += [(k, cell(v, _kind(k))) for k, v in tot.items() if k != "time_s"]
    head += [(f"{b}-bound", cell(v, "share")) for b, v in doc["bound_shares"].items()]
    inputs = flat(_pick(doc, "kernel", "device", "performance_model", "rollup", "point"))
    inputs += flat(doc["symbolic"], "symbolic ")
    leaves = [{"leaf": name, **v} for name, v in doc["leaves"].items()]
    costs = sorted({k for v in doc["leaves"].values() for k in v if k.startswith(("flops", "bytes"))})
    tables = [_table("leaves", "Leaves at the design point", leaves,
                     [("leaf", "leaf", "text"), ("time", "time_s", "s"), ("launch", "launch_s", "s"),
                      *((k, k, _kind(k)) for k in costs), ("bound", "bound", "text"), ("limiter", "limiter", "text"),
                      ("source", "source", "text")])]
    if doc.get("sweep"):
        swept = [k for k in doc["sweep"][0]["point"] if len({s["point"][k] for s in doc["sweep"]}) > 1]
        rows = [{**s["point"], **s["totals"]} for s in doc["sweep"]]
        tables.append(_table("sweep", "Sweep", rows, [*((k, k, "int") for k in swept), ("time", "time_s", "s"),
                                                      *((k, k, _kind(k)) for k in tot if k != "time_s")]))
    return View(f"kernel {doc['kernel']} on {doc['device']}", tuple(head), tuple(inputs), tuple(tables),
                tuple(doc["notes"]), _approximate(doc["notes"]), (), None, tuple(_shares(doc)))


VIEWS = {"text-generate": text_generate, "serve": serve, "optimize": optimize, "validate": validate, "kernel": kernel}
