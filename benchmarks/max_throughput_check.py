"""Held-out check: saturated throughput against TensorRT-LLM's published trtllm-bench tables.

Every row of ``perfcast/data/validation/max_throughput.yaml`` (output tokens/s of a whole
deployment, every request queued at t = 0) is served by ``perfcast serve --max-load --tier
simulation`` in-process, once with the analytic step model and once with the datasheet roofline
step (the baseline), and compared with the measurement. Nothing is fitted to these numbers.

How a row becomes a serve spec, and what that leaves approximate:

- the page's CUDA graphs for every row (its ``llm_options.yml``: padded, batch sizes up to 8,192;
  a batch between two sizes is priced at its own size, not padded up);
- the engine's own defaults (max batch 2048, max num tokens 8192, chunked prefill off, 0.9 of the
  free memory for the KV cache): the page states neither a batch nor a token budget, in which
  case trtllm-bench estimates its own from the KV cache and the lengths, and it raised the KV
  fraction to 0.95 "in many cases" without saying which;
- the KV cache in FP8, as NVIDIA's ModelOpt checkpoints the page lists store it;
- MoE rows with ``ep = tp`` (the page passes ``--ep $ep_size`` without a value) and without
  attention data parallelism (the page's option sits under ``cuda_graph_config``);
- at most ``--cap`` requests per row (default 1,000; the page ran 1,000–30,000): fewer waves of
  the batch, the same steady state where the batch is bounded by the KV cache or the batch limit.

A row perfcast refuses (a prompt longer than the token budget with chunked prefill off, a model
that does not fit) is counted with its reason.

    python benchmarks/max_throughput_check.py            # every row, analytic and roofline (~3 min on 2 cores)
    python benchmarks/max_throughput_check.py --quick    # four rows
    python benchmarks/max_throughput_check.py --cap 30000  # the page's request counts
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from perfcast.capture.parallel import Layout
from perfcast.inputs import load_yaml
from perfcast.ir import UserError
from perfcast.serving.serve import ServeSpec, serve
from perfcast.serving.step import Deployment
from perfcast.serving.workload import Lengths, Workload

DATA = Path(__file__).resolve().parents[1] / "src" / "perfcast" / "data" / "validation" / "max_throughput.yaml"
MODELS = ("analytic", "roofline")
#: Requests simulated per row at most (the page's counts run to 30,000).
CAP = 1000
#: The KV cache dtype of NVIDIA's ModelOpt FP8 and FP4 checkpoints (hf_quant_config.json
#: ``kv_cache_quant_algo: FP8``).
KV_DTYPE = "fp8"
#: The page's ``llm_options.yml`` for every row: ``cuda_graph_config`` with ``enable_padding: true``
#: and ``batch_sizes`` 1, 2, 4, …, 256, 384, 512, 1024, 2048, 4096, 8192 — every decode batch up to
#: 8,192 replays a CUDA graph (the engine's default captures up to 128 and runs larger ones eagerly).
CUDA_GRAPH_MAX = 8192
QUICK = (("llama-3.1-8b", "h200-sxm", 1000, 1000), ("llama-3.1-8b", "h100-sxm", 2048, 128),
         ("llama-3.1-70b", "h200-sxm", 128, 2048), ("qwen3-30b-a3b", "b200-sxm", 1000, 1000))


@dataclass(frozen=True)
class Prediction:
    output_tokens_per_s: float | None   # of the whole deployment; None: refused
    reason: str | None = None


def read_rows(path: Path | str = DATA) -> tuple[list[dict], dict]:
    """The rows and the sources of the max-throughput file."""
    data = load_yaml(path)
    return data["rows"], data["sources"]


def deployment(row: dict, performance_model: str = "analytic") -> Deployment:
    tp = int(row["tp"])
    # MoE rows carry ep; where the page leaves it unstated (null) the experts spread over the TP group.
    ep = 1 if "ep" not in row else int(row["ep"] or tp)
    return Deployment(row["model"], row["device"], "trtllm", Layout(tp=tp, ep=ep),
                      quantize=row["precision"], kv_dtype=KV_DTYPE, performance_model=performance_model,
                      cuda_graph_max=CUDA_GRAPH_MAX)


def predict(row: dict, performance_model: str = "analytic", cap: int = CAP) -> Prediction:
    """perfcast's saturated output tokens/s of one row (every request queued at t = 0)."""
    n = min(int(row["num_requests"]), cap)
    spec = ServeSpec(deployment(row, performance_model),
                     Workload(Lengths("fixed", row["isl"]), Lengths("fixed", row["osl"]), num_requests=n,
                              concurrency=n),
                     max_load=True, tier="simulation")
    try:
        r = serve(spec).results["simulation"]
    except UserError as e:
        return Prediction(None, str(e).splitlines()[0])
    return Prediction(r.output_tokens_per_s)


def _group(args: tuple[list[dict], str, int]) -> list[Prediction]:
    rows, pm, cap = args
    return [predict(r, pm, cap) for r in rows]


def run(rows: list[dict], cap: int, jobs: int) -> dict[str, list[Prediction]]:
    """Each performance model's predictions, in row order; rows of one deployment share a worker
    (its step model is compiled once per process)."""
    groups: dict[tuple, list[int]] = {}
    for i, r in enumerate(rows):
        groups.setdefault((r["model"], r["device"], r["tp"], r["precision"]), []).append(i)
    work = [(idx, pm) for pm in MODELS for idx in groups.values()]
    args = [([rows[i] for i in idx], pm, cap) for idx, pm in work]
    if jobs > 1:
        with ProcessPoolExecutor(jobs) as pool:
            outs = list(pool.map(_group, args))
    else:
        outs = [_group(a) for a in args]
    out: dict[str, list[Prediction | None]] = {pm: [None] * len(rows) for pm in MODELS}
    for (idx, pm), preds in zip(work, outs):
        for i, p in zip(idx, preds):
            out[pm][i] = p
    return out


def summary(rows: list[dict], preds: list[Prediction]) -> dict:
    """Median and p90 of |error|, the signed median, and the share of rows predicted."""
    err = np.array([p.output_tokens_per_s / r["output_tokens_per_s"] - 1 for r, p in zip(rows, preds)
                    if p.output_tokens_per_s is not None])
    refused: dict[str, int] = {}
    for p in preds:
        if p.output_tokens_per_s is None:
            refused[p.reason] = refused.get(p.reason, 0) + 1
    if not len(err):
        return {"predicted": 0, "rows": len(rows), "refused": refused}
    return {"predicted": len(err), "rows": len(rows), "median_abs": float(np.median(abs(err))),
            "p90_abs": float(np.percentile(abs(err), 90)), "median_signed": float(np.median(err)),
            "refused": refused}


def _fmt(x: float | None) -> str:
    return "refused" if x is None else f"{x:,.0f}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="four rows only")
    ap.add_argument("--cap", type=int, default=CAP, help=f"requests per row at most (default {CAP})")
    ap.add_argument("--jobs", type=int, default=2, help="worker processes (default 2)")
    a = ap.parse_args(argv)
    rows, sources = read_rows()
    if a.quick:
        rows = [r for r in rows if (r["model"], r["device"], r["isl"], r["osl"]) in QUICK]
    t0 = time.perf_counter()
    out = run(rows, a.cap, a.jobs)
    print(f"{'model':16} {'device':9} {'tp':>2} {'prec':4} {'isl/osl':>11} {'measured':>9} {'analytic':>9} "
          f"{'err':>7} {'roofline':>9} {'err':>7}")
    for i, r in enumerate(rows):
        cells = []
        for pm in MODELS:
            p = out[pm][i].output_tokens_per_s
            cells += [_fmt(p), "" if p is None else f"{p / r['output_tokens_per_s'] - 1:+.0%}"]
        print(f"{r['model']:16} {r['device']:9} {r['tp']:>2} {r['precision']:4} {r['isl']:>5}/{r['osl']:<5} "
              f"{r['output_tokens_per_s']:>9,} {cells[0]:>9} {cells[1]:>7} {cells[2]:>9} {cells[3]:>7}")
    print()
    src = sources["trtllm-perf-overview"]
    print(f"source: {src['url']}")
    print(f"requests per row: min(the page's, {a.cap}); output tokens/s of the whole deployment")
    for pm in MODELS:
        s = summary(rows, out[pm])
        line = f"{pm:9}: {s['predicted']}/{s['rows']} rows predicted"
        if s["predicted"]:
            line += (f"; |error| median {s['median_abs']:.1%}, p90 {s['p90_abs']:.1%}; "
                     f"signed median {s['median_signed']:+.1%}")
        print(line)
        for reason, n in sorted(s["refused"].items(), key=lambda kv: -kv[1]):
            print(f"    refused {n}: {reason}")
    print(f"({time.perf_counter() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
