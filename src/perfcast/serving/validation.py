"""``perfcast validate --serving``: every predictable aggregated row replayed by ``perfcast serve``
(:mod:`perfcast.serving.replay`), its mean TPOT as the mapping ``serving`` and its mean TTFT as
``ttft-serving`` — for the analytic step model and, as the same-run baseline, the datasheet
roofline's. Nothing here is fitted to the rows: the replay takes the deployment, the engine's
documented defaults and the benchmark client's workload, and reports what the simulation gives.
"""

from __future__ import annotations

from dataclasses import replace

from perfcast.inference.steps import BASELINE
from perfcast.inference.validation import Prediction, ValidationRequest
from perfcast.inference.validation import run as run_steps
from perfcast.serving.replay import replay

#: The step model each validation column replays with.
STEP_MODEL = {"analytic": "analytic", BASELINE: "roofline"}


def augment(predictions: dict[str, list[Prediction]], seed: int = 0, progress=None) -> dict[str, list[Prediction]]:
    """``progress(done, total)``: called after each prediction (a progress bar's hook)."""
    out = {}
    total, done = sum(len(v) for v in predictions.values()), 0
    for model, preds in predictions.items():
        step_model = STEP_MODEL.get(model)
        if step_model is None:  # the profiling model has no closed form to compile a step model from
            out[model] = preds
            continue
        mine = []
        for p in preds:
            if p.reason is None and p.case.mode in ("agg", "disagg"):
                r = replay(p.case, step_model, seed)
                if r.reason is None:
                    p = replace(p, tpot_ms={**p.tpot_ms, "serving": r.tpot_ms}, ttft_serving_ms=r.ttft_ms)
            done += 1
            if progress is not None:
                progress(done, total)
            mine.append(p)
        out[model] = mine
    return out


def run(req: ValidationRequest, *, serving: bool = True, progress=None) -> dict:
    """The validation document, with the serving replay when ``serving``."""
    if not serving:
        return run_steps(req)
    return run_steps(req, augment=lambda preds: augment(preds, req.seed, progress))
