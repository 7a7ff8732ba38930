"""GPU closed loop: catalog models run for real (random weights) against perfcast's eager price.

For each model (built from its shipped config with random weights, ``perfcast.profiler.steps``)
and each point (``prefill:BxS``, ``decode:B@C``) this script

1. times the model's kernels at that step with ``perfcast profile``'s collector into the run's
   own profiling database (``--out DIR/kernel-db``; skip with ``--no-kernel-db``);
2. predicts the step with ``perfcast.inference.textgen.simulate`` — the eager engine of the
   step's transformers cache (``perfcast.profiler.closed_loop.ENGINES``), the analytic model,
   the datasheet roofline (the same-run baseline) and the profiling model over the run's
   database — for the perfcast device of this GPU (``--perfcast-device``);
3. runs the step for real: eager (median of ``--repeats`` after warm-up), as a CUDA-graph replay
   of the whole step with static inputs and cache, and once under torch.profiler for the list
   of kernels it launches;
4. prints and writes measured against predicted per step and per kernel family, and per kernel
   key in ``kernels.csv``.

Usage::

    python benchmarks/gpu_closed_loop.py --out DIR            # on a CUDA GPU: the default run
    python benchmarks/gpu_closed_loop.py --device cpu --tiny  # anywhere: same code, tiny models

A run stops starting new work when ``--budget-s`` would be exceeded and writes what it has
(results are rewritten after every point). The device-tool recipe and what each number means:
docs/design/validation.md, section "GPU closed loop".
"""

from __future__ import annotations

import argparse
import csv
import datetime
import gc
import json
import re
import signal
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from perfcast.cli.args import Parser
from perfcast.ir import UserError
from perfcast.profiler import closed_loop as cl

MODELS = "llama-3.1-8b,qwen3-8b,qwen3-30b-a3b"
#: ``--tiny``: a 2-layer, hidden-256 model of the same architecture (MoE: 8 experts, top 2).
TINY = {"num_hidden_layers": 2, "hidden_size": 256, "intermediate_size": 512, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 64, "vocab_size": 1024}
TINY_MOE = {"num_experts": 8, "num_local_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 128}
TINY_IDS = {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0}


def parse_args(argv):
    p = Parser(prog="gpu_closed_loop", description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda", help="torch device: cuda, cuda:N or cpu (default cuda)")
    p.add_argument("--models", default=MODELS, help=f"comma-separated catalog names or config paths (default {MODELS})")
    p.add_argument("--points", default=cl.DEFAULT_POINTS, help=f"comma-separated prefill:BxS and decode:B@C "
                   f"(default {cl.DEFAULT_POINTS})")
    p.add_argument("--tiny", action="store_true", help="2 layers, hidden 256 (MoE: 8 experts, top 2): runs on a CPU")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key (JSON value), e.g. --set num_hidden_layers=4; repeatable")
    p.add_argument("--dtype", choices=("bf16", "fp16", "fp32"), help="default bf16 on CUDA, fp32 on a CPU")
    p.add_argument("--perfcast-device", metavar="NAME", help="device perfcast predicts for (default: from "
                   "the GPU's name — H100 80GB HBM3 → h100-sxm, H200 → h200-sxm, B200 → b200-sxm; cpu-local on a CPU)")
    p.add_argument("--profiling-database", metavar="DIR", help="price with this database instead of the "
                   "run's own kernels (which are then not collected)")
    p.add_argument("--no-kernel-db", action="store_true", help="neither collect the run's kernels nor price with them")
    p.add_argument("--decode-cache", default="static", choices=("static", "dynamic"),
                   help="transformers cache of the decode step (default static; dynamic cannot be graph-replayed)")
    p.add_argument("--no-dynamic", action="store_true", help="with the static cache, do not also time each "
                   "decode eagerly with generate()'s default DynamicCache")
    p.add_argument("--repeats", type=int, default=10, help="timed steps per mode, and kernel samples (default 10)")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first (default 3)")
    p.add_argument("--budget-s", type=float, default=360.0, help="start no work past this many seconds (default 360)")
    p.add_argument("--out", metavar="DIR", help="write results.json, steps.csv, kernels.csv (and kernel-db/) here")
    p.add_argument("--json", action="store_true", help="print results.json instead of the tables")
    p.add_argument("--top", type=int, default=3, metavar="N", help="print each step's N largest kernel keys, "
                   "measured against predicted (default 3; all of them are in kernels.csv)")
    p.add_argument("--seed", type=int, default=0, help="random weights and inputs (default 0)")
    p.add_argument("--repredict", metavar="DIR", help="no measuring: price the steps of an earlier run's "
                   "DIR/results.json again with this perfcast (and --profiling-database, if given) and write "
                   "the comparison to --out; runs anywhere")
    p.add_argument("--threads", type=int, help="torch CPU threads (default: torch's own; 1 is steadier on a "
                   "shared machine)")
    args = p.parse_args(argv)
    if args.repeats < 1 or args.warmup < 0:
        raise UserError("--repeats must be at least 1 and --warmup non-negative")
    if args.top < 0:
        raise UserError(f"--top must be non-negative (got {args.top})")
    if args.threads is not None and args.threads < 1:
        raise UserError(f"--threads must be at least 1 (got {args.threads})")
    if args.budget_s <= 0:
        raise UserError(f"--budget-s must be positive (got {args.budget_s})")
    if args.repredict and (args.tiny or args.set or args.threads or args.no_dynamic):
        raise UserError("--repredict prices the models and points of the earlier run: --tiny, --set, "
                        "--threads and --no-dynamic do not apply")
    if args.no_dynamic and args.decode_cache == "dynamic":
        raise UserError("--no-dynamic: with --decode-cache dynamic the decodes are the DynamicCache steps already")
    if args.no_kernel_db and args.profiling_database:
        raise UserError("--profiling-database and --no-kernel-db exclude each other")
    return args


def model_configs(args) -> list:
    from perfcast.models import load_model_config

    sets = {}
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UserError(f"--set {item!r}: expected KEY=VALUE")
        try:
            sets[key.strip()] = json.loads(value)
        except json.JSONDecodeError:
            raise UserError(f"--set {item!r}: {value!r} is not a JSON value (strings need quotes)") from None
    out = []
    for name in (n.strip() for n in args.models.split(",") if n.strip()):
        m = load_model_config(name)
        data = dict(m.data)
        if args.tiny:
            data.update(TINY)
            data.update({k: v for k, v in (*TINY_MOE.items(), *TINY_IDS.items()) if k in data})
            if "max_window_layers" in data:
                data["max_window_layers"] = TINY["num_hidden_layers"]
            if isinstance(data.get("layer_types"), list):
                data["layer_types"] = data["layer_types"][:TINY["num_hidden_layers"]]
        data.update(sets)
        out.append(replace(m, name=m.name + ("-tiny" if args.tiny else "") + ("-set" if sets else ""), data=data))
    if not out:
        raise UserError("--models: no model given")
    return out


class Log:
    def __init__(self, budget: cl.Budget):
        self.budget = budget

    def __call__(self, msg: str) -> None:
        now = datetime.datetime.now().strftime("%H:%M:%S")
        print(f"[{now} +{self.budget.elapsed():6.1f} s] {msg}", file=sys.stderr, flush=True)


def _why(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:300] if text else ''}"


def run_point(ctx, built, model, point) -> dict:
    """Collect, predict, measure and compare one step; a failing phase is recorded, not raised."""
    import statistics

    from perfcast.perf.profiling import load_database
    from perfcast.profiler import profile_model, steps
    from perfcast.profiler.timing import GraphUnavailable

    bk, args = ctx["backend"], ctx["args"]
    rec = {"model": model.name, "point": point.label, "phase": point.phase, "batch": point.batch,
           "tokens": point.tokens, "context": point.context, "errors": []}
    database = args.profiling_database
    if ctx["kernel_db"] is not None:
        try:
            database = str(profile_model(model, ctx["kernel_db"], ctx["db_name"], num_queries=point.batch,
                                         query_length=point.tokens, context_length=point.context,
                                         decode=point.decode, dtype=ctx["dtype"],
                                         engine=cl.engine_options(point, args.decode_cache)[0]["engine"],
                                         repeats=args.repeats, device=bk.device))
            load_database.cache_clear()  # the database just grew: reload it
        except Exception as e:
            rec["errors"].append(f"kernel profile: {_why(e)}")
            database = None
    preds, dynamic = _predictions(rec, model, ctx["device"], point, ctx["dtype"], database, args.decode_cache,
                                  _times_dynamic(point, args))
    meas: dict = {}
    rec["measured"] = meas
    try:
        step = (steps.DecodeStep(built.model, point.batch, point.context, args.decode_cache, args.seed)
                if point.decode else steps.PrefillStep(built.model, point.batch, point.tokens, args.seed))
        meas["step"] = step.description
        eager = bk.time(step, before=step.reset, warmup=args.warmup, repeats=args.repeats)
        meas.update(eager_s=statistics.median(eager), eager_samples_s=eager)
        reads = steps.host_reads(step)
        meas["host_reads"] = dict(reads)
        graph = None
        if not bk.graphs:
            meas["graph"] = f"{bk.kind}: no graphs"
        elif point.decode and args.decode_cache == "dynamic":
            meas["graph"] = "not captured: a DynamicCache concatenates, so its tensors move every step"
        elif reads:
            meas["graph"] = "not captured: the step exchanges data with the host (" + \
                            ", ".join(f"{k} x{v}" for k, v in reads.items()) + ")"
        else:
            try:
                graph = bk.capture(step, before=step.reset, warmup=args.warmup)
                g = bk.time(graph, before=step.reset, warmup=1, repeats=args.repeats)
                meas.update(graph="replayed", graph_s=statistics.median(g), graph_samples_s=g)
            except GraphUnavailable as e:
                meas["graph"] = f"not captured: {e}"
        records = bk.trace(step, before=step.reset)
        meas.update(_traced(records))
        if graph is not None:
            replayed = bk.trace(graph, before=step.reset)
            meas.update(graph_kernels=len(replayed), graph_kernels_us=sum(r.duration_us for r in replayed))
        del graph, step
        if _times_dynamic(point, args):
            gc.collect()
            meas["dynamic"] = _dynamic(bk, built, point, args)
    except Exception as e:
        rec["errors"].append(f"measurement: {_why(e)}")
    finally:
        gc.collect()
        if bk.kind == "cuda":
            bk.torch.cuda.empty_cache()
    return cl.compare(rec, preds, dynamic)


def _predictions(rec, model, device, point, dtype, database, cache, dynamic: bool):
    """The step's predictions over ``cache`` and, with ``dynamic``, over a DynamicCache too (None
    otherwise); their notes go to ``rec``, a failure to its errors (what was priced before it stays)."""
    preds, dyn = {}, None
    try:
        preds, rec["notes"], _ = cl.predict(model, device, point, dtype, database, cache)
        if dynamic:
            dyn, more, _ = cl.predict(model, device, point, dtype, database, "dynamic")
            rec["notes"] = list(dict.fromkeys([*rec["notes"], *more]))
    except Exception as e:
        rec["errors"].append(f"prediction: {_why(e)}")
    return preds, dyn


def _times_dynamic(point, args) -> bool:
    """Whether a static-cache decode is also timed with a DynamicCache (``--no-dynamic`` not given)."""
    return point.decode and args.decode_cache == "static" and not args.no_dynamic


def _dynamic(bk, built, point, args) -> dict:
    """The same decode with ``generate()``'s default cache, eager (a DynamicCache concatenates
    each layer's keys and values every step: ``transformers.cache_utils.DynamicLayer.update``):
    the step perfcast's eager engine stands for, beside the static one that can be replayed."""
    import statistics

    from perfcast.profiler import steps

    step = steps.DecodeStep(built.model, point.batch, point.context, "dynamic", args.seed)
    eager = bk.time(step, before=step.reset, warmup=args.warmup, repeats=args.repeats)
    return {"step": step.description, "eager_s": statistics.median(eager), "eager_samples_s": eager,
            **_traced(bk.trace(step, before=step.reset))}


def _traced(records) -> dict:
    """A traced step's kernels: how many, their device time, and per kernel key (kept always, so
    that ``--repredict`` can compare them with any later prediction)."""
    return {"kernels": len(records), "kernels_us": sum(r.duration_us for r in records),
            "kernel_keys": cl.keys_to_json(cl.measured_kernels(records))}


def run(args, clock=time.monotonic) -> dict:
    """The whole loop; returns the results document (written to ``--out`` after every point)."""
    from perfcast.hardware import get_device
    from perfcast.profiler.timing import backend

    budget = cl.Budget(args.budget_s, clock)
    log = Log(budget)
    bk = backend(args.device)
    if args.threads:
        bk.torch.set_num_threads(args.threads)
    points = cl.parse_points(args.points)
    models = model_configs(args)
    name = "cpu-local" if bk.kind == "cpu" and not args.perfcast_device else \
        cl.perfcast_device_for(bk.name, args.perfcast_device)
    device = get_device(name)
    dtype = args.dtype or ("bf16" if bk.kind == "cuda" else "fp32")
    engine = cl.engines_label(args.decode_cache)
    out = Path(args.out) if args.out else None
    scratch = None if out else tempfile.TemporaryDirectory(prefix="perfcast-loop-")
    collect = not (args.no_kernel_db or args.profiling_database)
    import transformers

    doc = {"device": bk.describe(), "perfcast_device": name, "dtype": dtype, "engine": engine,
           "transformers": transformers.__version__, "decode_cache": args.decode_cache,
           "budget_s": args.budget_s, "repeats": args.repeats, "warmup": args.warmup,
           "kernel_db": str(out / "kernel-db") if collect and out else None,
           "profiling_database": args.profiling_database, "models": {}, "steps": [], "skipped": [],
           "status": "running"}
    ctx = {"backend": bk, "args": args, "device": device, "dtype": dtype,
           "kernel_db": (out or Path(scratch.name)) / "kernel-db" if collect else None,
           "db_name": name}  # a profiling database prices only the device it is named for
    log(f"{bk.name}: {len(models)} model(s) x {len(points)} point(s), perfcast device {name}, {dtype}, "
        f"engine {engine}, budget {args.budget_s:.0f} s")
    builds, durations = [], []
    try:
        for mi, model in enumerate(models):
            need = max(builds, default=0.0) + max(durations, default=0.0) * 1.25  # a build and one point
            if not budget.allows(need):
                doc["skipped"] += [f"{m.name} {p.label}: time budget" for m in models[mi:] for p in points]
                log(f"stopping: {budget.left():.0f} s left < {need:.0f} s expected for the next model's build and point")
                break
            log(f"{model.name}: building with random weights on {bk.device}")
            try:
                built = _build(model, dtype, bk, args.seed)
            except Exception as e:
                doc["models"][model.name] = {"error": _why(e)}
                log(f"{model.name}: build failed: {_why(e)}")
                continue
            builds.append(built.build_s)
            doc["models"][model.name] = {"parameters": built.parameters, "weight_bytes": built.weight_bytes,
                                         "build_s": built.build_s, "attention": built.attention,
                                         "experts": built.experts, "weight_std": built.weight_std,
                                         "config": model.data}
            log(f"{model.name}: {built.parameters / 1e9:.3g} B parameters in {built.build_s:.1f} s "
                f"(attention {built.attention}{', experts ' + built.experts if built.experts else ''})")
            for pi, point in enumerate(points):
                need = max(durations[-len(points):], default=0.0) * 1.25
                if not budget.allows(need):
                    doc["skipped"] += [f"{model.name} {p.label}: time budget" for p in points[pi:]]
                    log(f"{model.name}: stopping, {budget.left():.0f} s left < {need:.0f} s expected per point")
                    break
                t0 = clock()
                rec = run_point(ctx, built, model, point)
                rec["duration_s"] = clock() - t0
                durations.append(rec["duration_s"])
                doc["steps"].append(rec)
                log(summary(rec))
                write(out, doc)
            del built
            gc.collect()
            if bk.kind == "cuda":
                bk.torch.cuda.empty_cache()
        doc["status"] = "partial (time budget)" if doc["skipped"] else "complete"
    except KeyboardInterrupt:
        doc["status"] = "interrupted"
    finally:
        doc["elapsed_s"] = budget.elapsed()
        write(out, doc)
        if scratch:
            scratch.cleanup()
    return doc


def repredict(args) -> dict:
    """``--repredict DIR``: the measurements of an earlier run priced again by this perfcast — no
    device work, so a run measured on a lent GPU is compared on any machine, with the same code
    as :func:`run_point`. Predictions, family and kernel rows are replaced; the measurements and
    the kernel profile's errors stay as they were."""
    from perfcast.hardware import get_device
    from perfcast.models.catalog import ModelConfig

    path = Path(args.repredict) / "results.json"
    try:
        doc = json.loads(path.read_text())
        steps, infos = doc["steps"], doc["models"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise UserError(f"--repredict {args.repredict}: {path} is not a closed-loop results file ({e})") from None
    name = args.perfcast_device or doc["perfcast_device"]
    device = get_device(name)
    dtype = args.dtype or doc["dtype"]
    for rec in steps:
        config = infos.get(rec["model"], {}).get("config")
        rec["errors"] = [e for e in rec["errors"] if not e.startswith("prediction:")]
        preds, dynamic = {}, None
        if config is None:
            rec["errors"].append("prediction: the model's config is not in results.json")
        else:
            model = ModelConfig(rec["model"], config, path, {"source": f"the config the run built ({path})"})
            preds, dynamic = _predictions(rec, model, device, cl.parse_points(rec["point"])[0], dtype,
                                          args.profiling_database, doc.get("decode_cache", "static"),
                                          bool(rec.get("measured", {}).get("dynamic")))
        cl.compare(rec, preds, dynamic)
    import torch

    doc["repredicted"] = {"from": str(path), "measured_perfcast_device": doc["perfcast_device"],
                          "measured_dtype": doc["dtype"], "torch": str(torch.__version__)}
    # the run's kernel database is where the run wrote it; this pricing writes none
    doc.update(perfcast_device=name, dtype=dtype, profiling_database=args.profiling_database, kernel_db=None,
               engine=cl.engines_label(doc.get("decode_cache", "static")))
    write(Path(args.out) if args.out else None, doc)
    return doc


def _build(model, dtype, bk, seed):
    from perfcast.profiler import steps

    return steps.build(model, dtype, bk.device, seed)


def summary(rec: dict) -> str:
    m = rec.get("measured", {})
    parts = [f"{rec['model']} {rec['point']}:"]
    if "eager_s" in m:
        parts.append(f"eager {m['eager_s'] * 1e3:.3f} ms")
    parts.append(f"graph {m['graph_s'] * 1e3:.3f} ms" if "graph_s" in m else f"graph: {m.get('graph', '-')}")
    for name, s in rec.get("step", {}).items():
        err = f" ({s['error_eager']:+.1%})" if s["error_eager"] is not None else ""
        parts.append(f"{name} {s['predicted_s'] * 1e3:.3f} ms{err}")
    if "dynamic" in m:
        parts.append(f"| DynamicCache: eager {m['dynamic']['eager_s'] * 1e3:.3f} ms")
        for name, d in rec.get("dynamic", {}).items():
            err = f" ({d['error_eager']:+.1%})" if d["error_eager"] is not None else ""
            parts.append(f"{name} {d['predicted_s'] * 1e3:.3f} ms{err}")
    if rec["errors"]:
        parts.append("ERRORS: " + "; ".join(rec["errors"]))
    return " ".join(parts)


STEP_COLUMNS = ["model", "point", "phase", "batch", "tokens", "context", "status", "performance_model",
                "measured_eager_s", "measured_graph_s", "predicted_s", "predicted_kernels_s", "predicted_launch_s",
                "error_eager", "error_graph", "measured_kernels", "measured_kernels_us", "predicted_launches",
                "measured_eager_dynamic_s", "measured_kernels_dynamic_us", "predicted_dynamic_s",
                "predicted_dynamic_kernels_s", "error_dynamic_eager", "error_dynamic_kernels"]
KERNEL_COLUMNS = ["model", "point", "performance_model", "family", "op", "shape", "measured_count", "measured_us",
                  "predicted_count", "predicted_us", "error"]


def _dynamic_columns(row: dict | None) -> dict:
    if not row:
        return {}
    return {"predicted_dynamic_s": row["predicted_s"], "predicted_dynamic_kernels_s": row["predicted_kernels_s"],
            "error_dynamic_eager": row["error_eager"], "error_dynamic_kernels": row["error_kernels"]}


def write(out: Path | None, doc: dict) -> None:
    """results.json, steps.csv and kernels.csv under ``out`` (each replaced whole)."""
    if out is None:
        return
    out.mkdir(parents=True, exist_ok=True)
    steps, kernels = [], []
    for rec in doc["steps"]:
        base = {k: rec[k] for k in ("model", "point", "phase", "batch", "tokens", "context", "status")}
        m = rec.get("measured", {})
        for name, s in (rec.get("step") or {"": {}}).items():
            steps.append({**base, "performance_model": name, **s, "measured_kernels": m.get("kernels"),
                          "measured_kernels_us": m.get("kernels_us"),
                          "predicted_launches": rec.get("predicted", {}).get(name, {}).get("launches"),
                          "measured_eager_s": m.get("eager_s"), "measured_graph_s": m.get("graph_s"),
                          "measured_eager_dynamic_s": m.get("dynamic", {}).get("eager_s"),
                          "measured_kernels_dynamic_us": m.get("dynamic", {}).get("kernels_us"),
                          **_dynamic_columns(rec.get("dynamic", {}).get(name))})
        for name, rows in rec.get("kernels", {}).items():
            kernels += [{"model": rec["model"], "point": rec["point"], "performance_model": name, **r} for r in rows]
    doc["accuracy"] = cl.accuracy(doc)
    _replace(out / "results.json", json.dumps(doc, indent=1, default=str))
    for path, columns, rows in ((out / "steps.csv", STEP_COLUMNS, steps), (out / "kernels.csv", KERNEL_COLUMNS, kernels)):
        tmp = path.with_suffix(".tmp")
        with tmp.open("w", newline="") as f:
            w = csv.DictWriter(f, columns, extrasaction="ignore")
            w.writeheader()
            w.writerows(rows)
        tmp.replace(path)


def _replace(path: Path, text: str) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def _ms(s) -> str:
    return "—" if s is None else f"{s * 1e3:,.3f}"


def _pct(e) -> str:
    return "—" if e is None else f"{e:+.1%}"


def render(doc: dict, out: str | None, top: int = 3) -> None:
    """The step table, the kernel-family and largest-kernel tables (first performance model)
    and what went wrong."""
    from rich.console import Console
    from rich.table import Table

    console = Console(width=None if sys.stdout.isatty() else 200)
    d = doc["device"]
    cuda = f", CUDA {d['cuda']}" if d.get("cuda") else ""
    console.print(f"[bold]GPU closed loop[/] on [bold]{d['name']}[/] (torch {d['torch']}{cuda}, transformers "
                  f"{doc['transformers']}): predicted for perfcast device {doc['perfcast_device']}, {doc['dtype']}, "
                  f"engine {doc['engine']}; status {doc['status']} after {doc['elapsed_s']:.0f} s")
    if doc.get("repredicted"):
        r = doc["repredicted"]
        console.print(f"re-priced from {r['from']} by this perfcast (torch {r['torch']}): the measurements are "
                      f"that run's, the predictions this machine's")
    models = list(dict.fromkeys(m for r in doc["steps"] for m in r.get("step", {})))
    t = Table(title="Steps: measured eager and CUDA-graph replay against the prediction (ms); "
                    "graph compared with the prediction less its host launches")
    for c in ("model", "point", "eager", "graph"):
        t.add_column(c, justify="right" if c in ("eager", "graph") else "left")
    for m in models:
        for c in (m, "err", f"{m} w/o launch", "err vs graph"):
            t.add_column(c, justify="right")
    t.add_column("kernels meas/pred", justify="right")
    t.add_column("graph / errors")
    for r in doc["steps"]:
        meas = r.get("measured", {})
        cells = [r["model"], r["point"], _ms(meas.get("eager_s")), _ms(meas.get("graph_s"))]
        for m in models:
            s = r.get("step", {}).get(m)
            cells += [_ms(s["predicted_s"]), _pct(s["error_eager"]), _ms(s["predicted_kernels_s"]),
                      _pct(s["error_graph"])] if s else ["—"] * 4
        first = r.get("predicted", {}).get(models[0], {}) if models else {}
        cells.append(f"{meas.get('kernels', '—')}/{first.get('launches', '—')}")
        cells.append("; ".join(r["errors"]) or ("" if "graph_s" in meas else str(meas.get("graph", ""))))
        t.add_row(*cells)
    console.print(t)
    if models:
        f = Table(title=f"Kernel families ({models[0]}): device time of the traced eager step against the "
                        f"predicted kernels (µs, launches excluded), and kernel counts")
        f.add_column("model")
        f.add_column("point")
        for fam in (*cl.FAMILIES, "total"):
            f.add_column(f"{fam} meas/pred", justify="right")
            f.add_column("err", justify="right")
            f.add_column("n", justify="right")
        for r in doc["steps"]:
            rows = r.get("families", {}).get(models[0])
            if not rows:
                continue
            cells = [r["model"], r["point"]]
            for row in rows:
                cells += [f"{row['measured_us']:,.0f}/{row['predicted_us']:,.0f}", _pct(row["error"]),
                          f"{row['measured_count']}/{row['predicted_count']}"]
            f.add_row(*cells)
        console.print(f)
    if models and top:
        k = Table(title=f"Largest kernel keys per step ({models[0]}): measured calls and µs against predicted")
        for c in ("model", "point", "family", "op", "shape"):
            k.add_column(c)
        for c in ("measured", "predicted", "err"):
            k.add_column(c, justify="right")
        for r in doc["steps"]:
            for row in r.get("kernels", {}).get(models[0], [])[:top]:
                k.add_row(r["model"], r["point"], row["family"], row["op"], row["shape"],
                          f"{row['measured_count']} / {row['measured_us']:,.1f}",
                          f"{row['predicted_count']} / {row['predicted_us']:,.1f}", _pct(row["error"]))
        console.print(k)
    acc = cl.accuracy(doc)
    if acc:
        a = Table(title="Accuracy over the measured steps: |predicted / measured − 1| (graph: the prediction "
                        "less its host launches against the CUDA-graph replay)")
        for c in ("performance model", "against", "steps", "median", "p90", "signed median"):
            a.add_column(c, justify="left" if c in ("performance model", "against") else "right")
        for row in acc:
            a.add_row(row["performance_model"], row["against"], f"{row['steps']}/{row['of']}",
                      f"{row['median']:.1%}", f"{row['p90']:.1%}", _pct(row["signed_median"]))
        console.print(a)
    for s in doc["skipped"]:
        console.print(f"skipped: {s}")
    for name, info in doc["models"].items():
        if "error" in info:
            console.print(f"[bold red]{name}: not built[/]: {info['error']}")
    notes = dict.fromkeys(n for r in doc["steps"] for n in r.get("notes", []))
    exact = [n for n in notes if re.search(r": exact \(\d+ calls?\)$", n)]
    for n in notes:
        if n not in exact:
            console.print(f"note: {n}")
    if exact:
        console.print("note: profiling: the tables it answered exactly from are listed per step in results.json")
    if out:
        console.print(f"written: {out}/results.json, {out}/steps.csv, {out}/kernels.csv"
                      + (f", {doc['kernel_db']}/" if doc.get("kernel_db") else ""))


def main(argv=None) -> int:
    try:
        args = parse_args(sys.argv[1:] if argv is None else argv)
        signal.signal(signal.SIGTERM, _interrupt)
        doc = repredict(args) if args.repredict else run(args)
    except UserError as e:
        sys.stderr.write(f"gpu_closed_loop: error: {e}\n")
        return 2
    if args.json:
        print(json.dumps(doc, indent=1, default=str))
    else:
        render(doc, args.out, args.top)
    return 0 if doc["status"] == "complete" and all(r["status"] == "ok" for r in doc["steps"]) else 1


def _interrupt(signum, frame):
    raise KeyboardInterrupt


if __name__ == "__main__":
    raise SystemExit(main())
