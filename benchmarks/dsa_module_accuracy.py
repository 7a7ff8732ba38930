"""DeepSeek sparse attention, one layer's whole module, priced by perfcast against SGLang's measurements.

aiconfigurator-core 0.12.0 times one layer's DSA attention module (``self_attn``: the q_b and o
projections, the latent norms, RoPE, the indexer's projections and its scoring + top-k, the W_UK /
W_UV products, the sparse or dense attention) under SGLang 0.5.14 on six NVIDIA systems, for
GLM-5-FP8 and DeepSeek-V3.2 — ``src/perfcast/data/validation/dsa_modules.csv``, a seeded sample
(``tools/ship_dsa_modules.py``; MANIFEST.yaml ``dsa_modules``). perfcast prices the same module
from its own lowering of the model: the leaves of one layer's ``self_attn`` under the sglang engine
profile, less what the collector does not run (the fused q_a / kv_a projection, which it replaces by
a random latent, and the tensor-parallel all-reduce: one GPU holds one rank's heads). Nothing is
fitted to these rows; the kernels inside are priced as in any step (calibrated fits where perfcast
has them: the GEMMs, the sparse prefill above ``index_topk`` cached tokens; the rule elsewhere).

The collector replays decode as a CUDA graph within SGLang's captured batch sizes and runs larger
decode batches and prefill (extend) eagerly, so a module is priced as the step model prices those
launches: a CUDA-graph replay as its kernels' time (with their launch latency), an eager module at
least its kernels × the engine's host interval per kernel (docs/design/engines.md,
"Launches"; on GB200 and GB300 × their ``host_issue_scale``, which was measured on these tables'
host-bound prefill rows: those rows are not out of sample there). The same-run baseline is the
naive datasheet roofline of the same leaves.

    python benchmarks/dsa_module_accuracy.py [--device h200-sxm ...] [--json]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections import defaultdict
from dataclasses import replace
from importlib import resources

import numpy as np
import pandas as pd
import sympy

from perfcast import engines
from perfcast.capture import cache, lower
from perfcast.capture import parallel as par
from perfcast.capture.parallel import Layout
from perfcast.inference import quantization
from perfcast.inference.roofline import DatasheetRoofline
from perfcast.inference.steps import decisions
from perfcast.inference.textgen import make_model
from perfcast.ir import dim
from perfcast.rollup import LaunchModel, rollup
from perfcast.serving.step import Deployment

#: what the collector does not run: the fused q_a / kv_a projection (a random latent stands in for
#: it: collect_mla_module.py dummy_qkv_latent_func) and the all-reduce (one GPU, one rank's heads)
STUBBED_KERNELS = frozenset({"fused_qkv_a_proj_with_mqa"})
LAYER = re.compile(r"model\.layers\.(\d+)\.self_attn(\.|$)")
PRICINGS = ("analytic", "roofline")


def shipped() -> pd.DataFrame:
    return pd.read_csv(str(resources.files("perfcast.data") / "validation" / "dsa_modules.csv"))


class Module:
    """One layer's attention module of a deployment, priced by ``pricing``, as functions of (B, S, C):
    ``device_s`` (its kernels' time and launch latency) and ``kernels`` (launches per layer); without the
    kernels in ``stubbed`` (what a collector does not run) and the all-reduce."""

    def __init__(self, model: str, device: str, tp: int, kv_dtype: str, decode: bool, tokens: int, pricing: str,
                 *, engine: str = "sglang", quantize: str | None = None, stubbed: frozenset = STUBBED_KERNELS):
        dep = Deployment(model=model, device=device, engine=engine, layout=Layout(tp=tp), kv_dtype=kv_dtype,
                         quantize=quantize)
        proto = dep.request(decode=True, batch=2, length=2)
        profile = proto.profile()
        rank = replace(proto.model, data=par.rank_config(proto.model.data, dep.layout))
        cap, _ = cache.symbolic_capture(rank, dtype="bf16", decode=decode, context=True, reroll=True)
        cap = par.parallelize(cap, dep.layout, proto.model.data, profile.exchange(proto.device.name))
        applied = engines.apply(profile, cap, decode=decode, device=proto.device.name,
                                hidden_size=int(proto.model.data["hidden_size"]))
        quant = quantization.resolve(proto)
        pm = DatasheetRoofline(proto.device, proto.mesh()) if pricing == "roofline" else \
            make_model(pricing, proto.device, None, proto.mesh(), profile)
        at = {dim("B"): tokens, dim("C"): 2} if decode else {dim("B"): 1, dim("S"): tokens, dim("C"): 2}
        low = lower(applied.capture, quantize=quant.plan, model_dtype="bf16", kv_dtype=quant.kv_override,
                    name=proto.model.name, plan=applied.plan, engine=profile.name, decide_at=at)
        launch = engines.launch_for(profile, decode=decode, tokens=tokens, device=proto.device)
        r = rollup(low.graph, pm, LaunchModel(launch.mode, launch.host_interval_s))
        layers = defaultdict(list)
        for lt in r.leaves:
            m = LAYER.match(str(lt.leaf.attr("module") or ""))
            if m and lt.leaf.attr("kernel") not in stubbed and lt.leaf.kind != "all_reduce":
                layers[int(m.group(1))].append(lt)
        # the layer group the most layers share (GLM-5's and DeepSeek-V3.2's MoE layers); each of its leaves
        # is one kernel of every layer of the group (trips: the layers)
        leaves = max(layers.values(), key=lambda ls: min(lt.trips for lt in ls))
        trips = min(lt.trips for lt in leaves)
        t = sympy.Add(*[(lt.time_s + lt.trips * lt.launch_s) / trips for lt in leaves])
        by = {s.name: s for s in t.free_symbols}
        self.device_s = sympy.lambdify([by.get(n, sympy.Symbol(n)) for n in "BSC"], t,
                                       modules=[pm.numpy_functions(), "numpy"])
        self.kernels = sum(lt.trips for lt in leaves) / trips
        # the host interval per kernel where the engine launches the step eagerly (prefill; decode past its
        # largest CUDA graph, as the collector replays decode only within SGLang's graphs), as a step's (the
        # system's host_issue_scale included); 0 for a CUDA-graph replay
        self.host_s = float(launch.host_interval_s)


def price(rows: pd.DataFrame, pricing: str, *, engine: str = "sglang", stubbed: frozenset = STUBBED_KERNELS,
          graphed: bool = False) -> pd.DataFrame:
    """Each row's module priced (seconds): ``device_s``, ``host_s`` (kernels × the host interval;
    0 for a CUDA-graph replay, and for every row where the collector ``graphed`` them all) and
    ``price_s`` (the larger). A ``quantize`` column, where the rows have one, is each row's
    ``--quantize`` ("" for the checkpoint's own)."""
    out = []
    rows = rows if "quantize" in rows else rows.assign(quantize="")
    keys = ["device", "model", "kv_dtype", "tp", "phase", "quantize"]
    for (device, model, kv, tp, phase, quant), g in rows.groupby(keys, sort=True):
        decode = phase == "decode"
        tokens = (g.batch * g.new_tokens).astype(int)
        proto = Deployment(model=model, device=device, engine=engine, layout=Layout(tp=int(tp)), kv_dtype=kv,
                           quantize=quant or None).request(decode=True, batch=2, length=2)
        profile, modules, by_tokens = proto.profile(), {}, {}
        for tok in sorted(set(tokens)):  # one lowering per size decision of the engine
            key = decisions(profile, proto, int(tok), decode)
            if key not in modules:
                modules[key] = Module(model, device, int(tp), kv, decode, int(tok), pricing, engine=engine,
                                      quantize=quant or None, stubbed=stubbed)
            by_tokens[tok] = modules[key]
        for i, r in g.iterrows():
            mod = by_tokens[int(r.batch * r.new_tokens)]
            dev = float(mod.device_s(float(r.batch), float(r.new_tokens), float(r.past)))
            host = 0.0 if graphed else mod.kernels * mod.host_s
            out.append((i, dev, host, max(dev, host), mod.kernels))
    p = pd.DataFrame(out, columns=["index", "device_s", "host_s", "price_s", "kernels"]).set_index("index")
    return rows.join(p)


def stats(err: np.ndarray) -> dict:
    a = np.abs(err)
    return {"rows": int(len(err)), "median": float(np.median(a)), "p90": float(np.percentile(a, 90)),
            "signed_median": float(np.median(err))}


def figures(priced: pd.DataFrame, groups: tuple) -> dict:
    """The error figures of priced rows (an ``err`` column): all of them, and per (key, columns) of
    ``groups`` one entry per value of the columns (named "a / b")."""
    return {"all": stats(priced.err.values),
            **{k: {" / ".join(map(str, v)): stats(g.err.values) for v, g in priced.groupby(cols, sort=True)}
               for k, cols in groups}}


def summary(rows: pd.DataFrame) -> dict:
    """Figures per pricing by phase, by the kernel path the engine took, by device and by model."""
    doc = {"rows": int(len(rows)), "pricings": {}}
    for pricing in PRICINGS:
        priced = price(rows, pricing)
        err = priced.price_s / (priced.latency_ms * 1e-3) - 1
        bound = priced.phase + np.where(priced.host_s > priced.device_s, ", host-bound as priced",
                                        np.where(priced.host_s > 0, ", device-bound eager", ", CUDA graph"))
        priced = priced.assign(err=err, bound=bound)
        doc["pricings"][pricing] = {
            **figures(priced, (("phase", ["phase"]), ("bound", ["bound"]), ("path", ["phase", "kernel_source"]),
                               ("device", ["phase", "device"]), ("model", ["phase", "model"]),
                               ("kv_dtype", ["phase", "kv_dtype"]))),
            "host_bound_share": float((priced.host_s > priced.device_s)[priced.phase == "prefill"].mean())}
    # (decode rows past the largest CUDA graph are eager too: counted in "bound")
    return doc


def run(argv, description: str, rows: pd.DataFrame, summarize, tables: tuple, title: str, footer) -> int:
    """The command line of a module benchmark: ``--device`` (repeatable) and ``--json``; the figures of
    ``summarize(rows)`` as JSON, or as one table per (key, title) of ``tables`` and the ``footer(doc)`` line."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--device", action="append", help="only these devices (default: the six in the file)")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    a = ap.parse_args(argv)
    if a.device:
        unknown = sorted(set(a.device) - set(rows.device))
        if unknown:
            print(f"--device {unknown[0]}: no rows (the file has {', '.join(sorted(set(rows.device)))})", file=sys.stderr)
            return 2
        rows = rows[rows.device.isin(a.device)]
    t0 = time.perf_counter()
    doc = summarize(rows)
    doc["seconds"] = time.perf_counter() - t0
    if a.json:
        json.dump(doc, sys.stdout, indent=2)
        print()
        return 0
    _render(doc, tables, title, footer(doc))
    return 0


def _render(doc: dict, tables: tuple, title: str, footer: str) -> None:
    from rich.console import Console
    from rich.table import Table

    c = Console(width=150)
    ana, roof = doc["pricings"]["analytic"], doc["pricings"]["roofline"]
    for key, by in tables:
        t = Table(title=f"{title}, by {by}")
        for col in (by, "rows", "median", "p90", "signed", "naive roofline median", "signed"):
            t.add_column(col, justify="left" if col == by else "right")
        for k, s in ana[key].items():
            r = roof[key][k]
            t.add_row(k, f"{s['rows']:,}", f"{s['median']:.1%}", f"{s['p90']:.1%}", f"{s['signed_median']:+.1%}",
                      f"{r['median']:.1%}", f"{r['signed_median']:+.1%}")
        c.print(t)
    c.print(footer)
    c.print(f"{doc['seconds']:.0f} s")


def _all(doc: dict) -> str:
    """The line of every module's figures, the naive roofline's beside."""
    s, r = doc["pricings"]["analytic"]["all"], doc["pricings"]["roofline"]["all"]
    return (f"all {s['rows']:,} modules: median {s['median']:.1%}, p90 {s['p90']:.1%}, signed {s['signed_median']:+.1%}"
            f" (naive roofline {r['median']:.1%}, signed {r['signed_median']:+.1%})")


TABLES = (("phase", "phase"), ("bound", "what bounds perfcast's price"), ("path", "phase / SGLang's kernel path"),
          ("device", "phase / device"), ("model", "phase / model"), ("kv_dtype", "phase / KV-cache dtype"))


def main(argv=None) -> int:
    return run(argv, __doc__.split("\n")[0], shipped(), summary, TABLES,
               "DSA module (one layer) vs SGLang 0.5.14's measurements",
               lambda doc: f"{_all(doc)}; prefill modules host-bound (kernels × host interval > device time): "
                           f"{doc['pricings']['analytic']['host_bound_share']:.0%}")


if __name__ == "__main__":
    sys.exit(main())
