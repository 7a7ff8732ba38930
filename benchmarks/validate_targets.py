"""Benchmark: the step-fidelity targets against ``perfcast validate``'s figures, with the
naive datasheet roofline of the same steps from the same run as the baseline.

The measured data are aiconfigurator-core 0.12.0's ``silicon_sample.csv`` (the copy shipped with
perfcast; validation only, nothing is fitted to it). TPOT is mapped two ways
(docs/design/validation.md): **decode step** — one decode step of the batch at context
isl + osl/2 — and **steady state** — the decode step plus the batch / osl prefills of one prompt
that continuous batching interleaves per output token (aggregated runs).

Targets (the issue words them for the decode-step TPOT, until the serving simulator exists):

- Llama-3.1-8B / H100 / TRT-LLM rows: median |error| ≤ 15 %, and no systematic over-prediction
  at concurrency ≤ 16 (signed median ≤ 0: a decode step is part of the measured interval, so it
  cannot be slower than it);
- stratified sample (seed 0, ≤ 6 rows per system, model, backend, mode): median |error| ≤ 25 %
  on the rows perfcast predicts (coverage is printed beside it).

Each target is judged under both mappings. A measured TPOT of an aggregated run holds the
prefills that continuous batching interleaves, so even an exact decode step misses it by the
prefills' share (a check with the measured kernel tables themselves: 36.7 % median on the
Llama-3.1-8B / H100 / TRT-LLM rows); the steady-state mapping is the one that describes what was
measured, and is the one to read.

Run: ``.venv/bin/python benchmarks/validate_targets.py [--performance-model profiling] [--json]``
(the whole file: a few minutes on two CPU cores; ``--population NAME`` for one population).
"""

from __future__ import annotations

import argparse
import json
import time

from perfcast.inference.validation import LOW_CONCURRENCY, MAPPINGS, ValidationRequest, run

TARGETS = (
    # (population key, mapping, statistic, split, bound, description)
    ("llama-3.1-8b-h100-trtllm", "decode-step", "median_abs", "", 0.15, "median |error| ≤ 15 %"),
    ("llama-3.1-8b-h100-trtllm", "decode-step", "signed_median", f" concurrency<={LOW_CONCURRENCY}", 0.0,
     f"signed median ≤ 0 at concurrency ≤ {LOW_CONCURRENCY} (no systematic over-prediction)"),
    ("stratified", "decode-step", "median_abs", "", 0.25, "median |error| ≤ 25 % on the predicted rows"),
)


def _pct(x, signed: bool = False) -> str:
    return "—" if x is None else f"{x * 100:+.1f} %" if signed else f"{x * 100:.1f} %"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--performance-model", action="append", default=None)
    ap.add_argument("--population", help="restrict the run to one named population")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    models = tuple(args.performance_model or ("analytic",))
    t0 = time.perf_counter()
    doc = run(ValidationRequest(performance_models=models, population=args.population, seed=args.seed))
    wall = time.perf_counter() - t0
    pops = {p["key"]: p for p in doc["populations"] if p["named"]}
    rows = []
    for key, literal, stat, split, bound, text in TARGETS:
        p = pops.get(key)
        if p is None:
            continue
        for mapping, m in ((mp, m) for mp in (literal, "steady-state") for m in (*models, doc["baseline"])):
            s = p["models"][m].get(f"{mapping}{split}")
            value = s[stat] if s else None
            rows.append({"population": p["population"], "target": text, "model": m, "mapping": mapping, "stat": stat,
                         "split": split.strip() or "all", "value": value, "n": s["n"] if s else 0,
                         "bound": bound, "met": value is not None and value <= bound,
                         "coverage": f"{p['models'][m]['predicted']} of {p['rows']} rows"})
    if args.json:
        print(json.dumps({"targets": rows, "wall_s": wall, "points": doc["points"]}, indent=2))
        return 0
    print(f"perfcast validate targets · {doc['sources']['silicon_sample']} · seed {doc['seed']}")
    print(f"baseline: {doc['baseline']} (naive datasheet roofline of the same steps, same run)")
    for r in rows:
        mark = "MET" if r["met"] else "missed"
        print(f"  {r['population']:<30} {r['model']:<9} {r['mapping']:<12} {r['target']:<68} "
              f"{_pct(r['value'], r['stat'] == 'signed_median'):>9}  "
              f"(n {r['n']}, {r['coverage']})  {mark if r['model'] != doc['baseline'] else 'baseline'}")
    print("both TPOT mappings, every named population (median · p90 · signed median):")
    for p in pops.values():
        for m in (*models, doc["baseline"]):
            cells = []
            for mapping in MAPPINGS:
                s = p["models"][m].get(mapping)
                cells.append(f"{mapping} {_pct(s['median_abs'])} · {_pct(s['p90_abs'])} · "
                             f"{_pct(s['signed_median'], True)}" if s else f"{mapping} —")
            print(f"  {p['population']:<30} {m:<9} " + "   ".join(cells))
    print(f"run time {wall:.1f} s ({doc['points'].get('closed-form points', 0):,} decode points from closed "
          f"forms, {doc['points'].get('simulated points', 0):,} simulated)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
