"""aiconfigurator's own estimate of measured rows — run by ``benchmarks/aic_baseline.py`` with the
Python of a separate environment holding ``aiconfigurator`` (never perfcast's: the two are
independent tools and neither imports the other).

Input (JSON): ``{"rows": [{"id": ..., "args": {...}, "config_dir": ...}, ...]}`` where ``args``
are keyword arguments of aiconfigurator's public ``aiconfigurator.cli.api.cli_estimate`` (the
row's model, system, backend and version, lengths, quantization, batch and layout) and
``config_dir`` a directory holding the model's ``config.json``, used where aiconfigurator ships no
config of the row's model path (it would download one from the Hugging Face hub, which this
machine cannot reach).

Output (JSON): ``{"aiconfigurator": version, "results": {id: {"ttft_ms", "tpot_ms", "note",
"error"}}}``. A row whose backend version aiconfigurator cannot query is estimated again on
aiconfigurator's default database of that system and backend, and its note says so — what
aiconfigurator's own accuracy-regression tool does with such rows.

Run: ``<aic venv>/bin/python benchmarks/aic_worker.py IN.json OUT.json``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import sys


def estimate(args: dict, config_dir: str | None, known_models) -> tuple[float, float, str]:
    """(TTFT ms, TPOT ms, note) of one row by ``cli_estimate``."""
    from aiconfigurator.cli.api import cli_estimate

    args, notes = dict(args), []
    if args["model_path"] not in known_models and config_dir:
        notes.append(f"config.json from {config_dir} (aiconfigurator ships none for {args['model_path']})")
        args["model_path"] = config_dir
    try:
        with contextlib.redirect_stdout(sys.stderr):
            r = cli_estimate(**args)
    except Exception as first:  # noqa: BLE001 — aiconfigurator raises plain exceptions
        if not args.get("backend_version"):
            raise
        version, args["backend_version"] = args["backend_version"], None
        with contextlib.redirect_stdout(sys.stderr):
            r = cli_estimate(**args)
        notes.append(f"version {version} not queryable ({str(first).splitlines()[0][:120]}): "
                     f"aiconfigurator's default database")
    return float(r.ttft), float(r.tpot), "; ".join(notes)


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: aic_worker.py IN.json OUT.json", file=sys.stderr)
        return 2
    logging.disable(logging.WARNING)  # aiconfigurator logs every fallback; the notes keep what matters
    import aiconfigurator
    from aiconfigurator_core.sdk.utils import DefaultHFModels

    rows = json.load(open(argv[0]))["rows"]
    seen: dict[str, dict] = {}
    results = {}
    for row in rows:
        key = json.dumps([row["args"], row.get("config_dir")], sort_keys=True)
        if key not in seen:
            try:
                ttft, tpot, note = estimate(row["args"], row.get("config_dir"), DefaultHFModels)
                seen[key] = {"ttft_ms": ttft, "tpot_ms": tpot, "note": note, "error": ""}
            except Exception as e:  # noqa: BLE001
                seen[key] = {"ttft_ms": None, "tpot_ms": None, "note": "", "error": str(e).splitlines()[0][:300]}
        results[row["id"]] = seen[key]
    with open(argv[1], "w") as f:
        json.dump({"aiconfigurator": getattr(aiconfigurator, "__version__", "unknown"), "results": results}, f)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
