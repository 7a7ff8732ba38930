"""Benchmark: aiconfigurator itself as the same-run baseline of the serving replay.

perfcast's serving targets (issue 13) are set against aiconfigurator's figures on the same
measured rows. This runs aiconfigurator — the released package, ``aiconfigurator==0.12.0``, in an
environment of its own — on every aggregated row of a named population of the silicon sample,
in the same run as perfcast's replay of those rows (``perfcast validate --serving``: the event
simulation and the closed form), and prints median / p90 / signed median |error| of TPOT and
TTFT for each, over the rows each one predicts and over the rows all of them predict.

What aiconfigurator is given: each row's own model path, system, backend and version, ISL, OSL,
quantization modes, batch and layout — the row's columns, as aiconfigurator's own
accuracy-regression tool passes them to its public ``cli_estimate`` (``benchmarks/aic_worker.py``
calls it). Where aiconfigurator ships no ``config.json`` of the row's model path, it is given the
one perfcast prices (the catalog entry the row maps to): it would otherwise download it from the
hub, which this machine cannot reach. Where aiconfigurator cannot query the row's backend
version, it estimates the row on its default database of the system and backend, and the row's
note says so (its own tool does the same).

Read the two sides differently: aiconfigurator is developed against this same file — its
accuracy-regression workflow gates every change on its error here, and some of its constants are
fitted to it (``vllm_backend.py``: a per-layer TTFT overhead "recalibrated ... against the full
silicon corpus") — so its figures are in sample; perfcast fits nothing to these rows.

Setup: the first run creates ``.venv-aic`` (``--aic-venv``) and installs ``aiconfigurator==0.12.0``
from PyPI into it (about 100 MB with its dependencies); later runs reuse it.

Run: ``.venv/bin/python benchmarks/aic_baseline.py [--population llama-3.1-8b-h100-trtllm]
[--population stratified] [--json]`` — the Llama population in three minutes on two cores, the
stratified sample in thirty-five (perfcast's replay of its 280 rows 28 minutes, aiconfigurator 6).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
WORKER = ROOT / "benchmarks" / "aic_worker.py"
#: the release compared against: its core wheel is the one the silicon sample and tables ship in
AIC_PACKAGE = "aiconfigurator==0.12.0"
POPULATIONS = ("llama-3.1-8b-h100-trtllm", "stratified")
#: the row columns aiconfigurator's estimate takes as they are (integers), beside the lengths
LAYOUT_COLUMNS = ("batch_size", "tp_size", "pp_size", "attention_dp_size", "moe_tp_size", "moe_ep_size")
#: the predictors compared: (label, TPOT column, TTFT column) of the rows file's records
PREDICTORS = (("aiconfigurator", "aic tpot_ms", "aic ttft_ms"),
              ("perfcast simulation", "analytic serving tpot_ms", "analytic serving ttft_ms"),
              ("perfcast closed form", "analytic closed-form tpot_ms", "analytic closed-form ttft_ms"),
              ("roofline simulation", "roofline serving tpot_ms", "roofline serving ttft_ms"))


def ensure_env(venv: Path) -> Path:
    """The Python of ``venv``, created with ``AIC_PACKAGE`` installed if it is not there yet."""
    python = venv / "bin" / "python"
    if python.exists() and subprocess.run([str(python), "-c", "import aiconfigurator.cli.api"],
                                          capture_output=True).returncode == 0:
        return python
    print(f"setting up {venv} with {AIC_PACKAGE} (once)", file=sys.stderr, flush=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", AIC_PACKAGE],
                   check=True)
    return python


def _text(value) -> str | None:
    """A cell's text, None where the cell is empty (a missing CSV cell reads as NaN or '')."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    return str(value).strip() or None


def _int(value) -> int | None:
    text = _text(value)
    return None if text is None else int(float(text))


def aic_arguments(row: dict) -> dict:
    """``cli_estimate`` keyword arguments of one aggregated silicon row (its own columns)."""
    args = {"model_path": row["model_path"], "system_name": row["system"], "mode": "agg",
            "backend_name": row["backend"], "backend_version": _text(row.get("backend_version")),
            "isl": int(row["isl"]), "osl": int(row["osl"]),
            "gemm_quant_mode": _text(row.get("gemm_quant_mode")), "moe_quant_mode": _text(row.get("moe_quant_mode"))}
    return args | {col: v for col in LAYOUT_COLUMNS if (v := _int(row.get(col))) is not None}


def config_dirs(cases, into: Path) -> dict[str, str]:
    """A directory holding each catalog model's ``config.json`` (perfcast's shipped copy, and its
    ``hf_quant_config.json`` where perfcast ships one), by catalog name."""
    from perfcast.models.catalog import config_folder

    folder, out = Path(str(config_folder())), {}
    for name in sorted({c.model for c in cases if c.model}):
        d = into / name
        d.mkdir(parents=True, exist_ok=True)
        (d / "config.json").write_text((folder / f"{name}.json").read_text())
        quant = folder / "hf_quant_config" / f"{name}.json"
        if quant.exists():
            (d / "hf_quant_config.json").write_text(quant.read_text())
        out[name] = str(d)
    return out


def error_stats(pred, measured) -> dict:
    """n, median / p90 |pred/measured − 1| and signed median over the rows with both."""
    p, m = np.asarray(pred, dtype=float), np.asarray(measured, dtype=float)
    ok = np.isfinite(p) & np.isfinite(m) & (m > 0)
    if not ok.any():
        return {"n": 0}
    e = p[ok] / m[ok] - 1
    return {"n": int(ok.sum()), "median_abs": float(np.median(np.abs(e))),
            "p90_abs": float(np.percentile(np.abs(e), 90)), "signed_median": float(np.median(e))}


def compare(records: list[dict]) -> dict:
    """Per metric (TPOT, TTFT), each predictor's errors over its own rows and over the rows every
    predictor predicts."""
    out = {}
    for metric, col_ix, measured_col in (("tpot", 1, "measured_tpot_ms"), ("ttft", 2, "measured_ttft_ms")):
        measured = np.array([r.get(measured_col) for r in records], dtype=float)   # a missing figure: NaN
        cols = {spec[0]: np.array([r.get(spec[col_ix]) for r in records], dtype=float) for spec in PREDICTORS}
        common = np.isfinite(measured) & np.logical_and.reduce([np.isfinite(v) for v in cols.values()])
        out[metric] = {label: {"own": error_stats(vals, measured),
                               "common": error_stats(np.where(common, vals, np.nan), measured)}
                       for label, vals in cols.items()}
    return out


def run_population(key: str, python: Path, jobs: int | None) -> dict:
    from perfcast.inference import silicon
    from perfcast.inference.validation import ValidationRequest
    from perfcast.report.validation import row_records
    from perfcast.serving import validation as serving

    t0 = time.perf_counter()
    doc = serving.run(ValidationRequest(population=key), jobs=jobs)
    t_perfcast = time.perf_counter() - t0
    cases = [c for c in doc["cases"] if c.mode == "agg"]
    frame, _ = silicon.read(None)
    raw = {r["id"]: r for r in frame.to_dict("records")}
    with tempfile.TemporaryDirectory() as tmp:
        dirs = config_dirs(cases, Path(tmp) / "configs")
        rows = [{"id": c.id, "args": aic_arguments(raw[c.id]), "config_dir": dirs.get(c.model)} for c in cases]
        src, dst = Path(tmp) / "in.json", Path(tmp) / "out.json"
        src.write_text(json.dumps({"rows": rows}))
        t1 = time.perf_counter()
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        subprocess.run([str(python), str(WORKER), str(src), str(dst)], check=True, env=env,
                       stderr=subprocess.DEVNULL)
        t_aic = time.perf_counter() - t1
        aic = json.loads(dst.read_text())
    records = [r for r in row_records(doc) if r["mode"] == "agg"]
    for r in records:
        got = aic["results"].get(r["id"], {})
        r["aic tpot_ms"], r["aic ttft_ms"] = got.get("tpot_ms"), got.get("ttft_ms")
        r["aic note"], r["aic error"] = got.get("note", ""), got.get("error", "")
    return {"population": key, "rows": len(records), "aiconfigurator": aic["aiconfigurator"],
            "aic_default_database": sum(1 for r in records if "default database" in (r["aic note"] or "")),
            "aic_refused": _refusals(r["aic error"] for r in records),
            "seconds": {"perfcast": round(t_perfcast, 1), "aiconfigurator": round(t_aic, 1)},
            "figures": compare(records), "records": records}


def _refusals(errors) -> dict[str, int]:
    """Rows aiconfigurator refused, counted by the first clause of its message (the rest names the
    row's shape or a file path)."""
    out: dict[str, int] = {}
    for e in errors:
        if e:
            head = e.split(" at /")[0].split(" {")[0].split(" should be")[0].split(". ")[0]
            out[head] = out.get(head, 0) + 1
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def _cell(s: dict) -> str:
    if not s.get("n"):
        return "—"
    return f"{s['median_abs'] * 100:5.1f} % (p90 {s['p90_abs'] * 100:5.1f}, signed {s['signed_median'] * 100:+5.1f}) n={s['n']}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--population", choices=POPULATIONS, action="append")
    ap.add_argument("--aic-venv", default=str(ROOT / ".venv-aic"), help="environment holding aiconfigurator")
    ap.add_argument("--jobs", type=int, default=None, help="processes for perfcast's replay")
    ap.add_argument("--rows", help="write every row's measured and predicted figures (.json)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    python = ensure_env(Path(args.aic_venv))
    results = [run_population(key, python, args.jobs) for key in args.population or POPULATIONS]
    if args.rows:
        Path(args.rows).write_text(json.dumps([r for res in results for r in res["records"]], default=str))
    if args.json:
        print(json.dumps([{k: v for k, v in r.items() if k != "records"} for r in results], indent=1))
        return 0
    for res in results:
        print(f"{res['population']}: {res['rows']} aggregated rows; aiconfigurator {res['aiconfigurator']} "
              f"({res['seconds']['aiconfigurator']:.0f} s, {res['aic_default_database']} rows on its default database), "
              f"perfcast ({res['seconds']['perfcast']:.0f} s)")
        for metric in ("tpot", "ttft"):
            for scope in ("own", "common"):
                print(f"  {metric.upper()} — {'rows each predicts' if scope == 'own' else 'rows all predict'}:")
                for label, *_ in PREDICTORS:
                    print(f"    {label:22s} {_cell(res['figures'][metric][label][scope])}")
        for e, n in res["aic_refused"].items():
            print(f"  aiconfigurator refused {n} row{'s' * (n > 1)}: {e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
