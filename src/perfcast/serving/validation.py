"""``perfcast validate --serving``: every predictable aggregated row replayed by ``perfcast serve``
(:mod:`perfcast.serving.replay`), the event simulation's mean TPOT as the mapping ``serving`` and
its mean TTFT as ``ttft-serving``, the closed form's as ``closed-form`` and ``ttft-closed-form`` —
for the analytic step model and, as the same-run baseline, the datasheet roofline's. Nothing here
is fitted to the rows: the replay takes the deployment, the engine's documented defaults and the
benchmark client's workload, and reports what each tier gives.
"""

from __future__ import annotations

from concurrent.futures.process import BrokenProcessPool
from dataclasses import replace

import numpy as np

from perfcast.inference.steps import BASELINE
from perfcast.inference.validation import Prediction, ValidationRequest, serving_ttft_ms
from perfcast.inference.validation import run as run_steps
from perfcast.ir import UserError
from perfcast.serving.forked import forked_map
from perfcast.serving.replay import Replay, replay

#: The step model each validation column replays with.
STEP_MODEL = {"analytic": "analytic", BASELINE: "roofline"}


def augment(predictions: dict[str, list[Prediction]], seed: int = 0, progress=None,
            jobs: int | None = None) -> dict[str, list[Prediction]]:
    """``progress(done, total)``: called as replays finish (a progress bar's hook). The replays
    run in ``jobs`` forked processes (default: every core this process may use), one task per
    model and device — every row that could share a compiled step model replayed in one process,
    in file order, as one process would replay them, and that process gone when they are done —
    so the figures do not depend on ``jobs`` (a test compares one process with two)."""
    todo: dict[tuple, list[tuple[str, int]]] = {}
    for model, preds in predictions.items():
        step_model = STEP_MODEL.get(model)
        if step_model is None:  # the profiling model has no closed form to compile a step model from
            continue
        for i, p in enumerate(preds):
            if p.reason is None and p.case.mode in ("agg", "disagg"):
                todo.setdefault((step_model, p.case.model, p.case.device), []).append((model, i))
    total = sum(len(v) for v in predictions.values())
    done = total - sum(len(v) for v in todo.values())
    groups = list(todo.items())
    tasks = [([predictions[m][i].case for m, i in rows], step_model, seed) for (step_model, *_), rows in groups]
    replayed: dict[tuple[str, int], Replay] = {}
    finished: set[int] = set()
    try:
        for g, reps in forked_map(_replayed, tasks, jobs, size=lambda g: len(groups[g][1]), fresh=True):
            rows = groups[g][1]
            replayed.update(zip(rows, reps))
            finished.add(g)
            done += len(rows)
            if progress is not None:
                progress(done, total)
    except BrokenProcessPool:
        left = ", ".join(dict.fromkeys(f"{model} on {device}" for g, ((_, model, device), _) in enumerate(groups)
                                       if g not in finished))  # a model and device once, whatever step models
        raise UserError(f"--jobs {jobs or 'all CPUs'}: a replay process was killed before it finished (most "
                        f"likely out of memory: each (model, device) group's step models live in its process; "
                        f"not finished: {left}); rerun with --jobs 1 (one group at a time), or fewer rows "
                        f"(--system, --model)") from None
    out = {}
    for model, preds in predictions.items():
        mine = []
        for i, p in enumerate(preds):
            r = replayed.get((model, i))
            if r is not None:
                tpot = {**p.tpot_ms, **({"serving": r.tpot_ms} if r.tpot_ms is not None else {}),
                        **({"closed-form": r.closed_form_tpot_ms} if r.closed_form_tpot_ms is not None else {})}
                p = replace(p, tpot_ms=tpot, ttft_serving_ms=r.ttft_ms, serving_reason=r.reason,
                            ttft_closed_form_ms=r.closed_form_ttft_ms, closed_form_reason=r.closed_form_reason)
            mine.append(p)
        out[model] = mine
    return out


def _replayed(args) -> list[Replay]:
    cases, step_model, seed = args
    return [replay(c, step_model, seed) for c in cases]


def run(req: ValidationRequest, *, serving: bool = True, progress=None, jobs: int | None = None) -> dict:
    """The validation document, with the serving replay and its decisions when ``serving``
    (replayed in ``jobs`` processes: :func:`augment`)."""
    if not serving:
        return run_steps(req)
    doc = run_steps(req, augment=lambda preds: augment(preds, req.seed, progress, jobs))
    doc["decisions"] = decisions(doc)
    return doc


# --- the decisions: does the replay order deployments as the measurements do? ---------------

#: A decision group: the rows of one model on one system, engine and workload (ISL, OSL) — the
#: deployments (layouts, precisions, loads) a user chooses among for that workload.
GROUP_KEYS = ("model_path", "system", "backend", "isl", "osl")
#: Groups with fewer rows rank nothing worth a correlation.
MIN_GROUP = 3
#: The same-run baseline of the decisions: a group's rows ranked by clients per device alone.
LOAD_ONLY = "load only"
#: A ranking by the closed form's figures is named ``<model> closed form``.
CLOSED_FORM_LABEL = "closed form"


def tokens_per_s_per_device(case, ttft_ms: float, tpot_ms: float) -> float:
    """A closed-loop run's output tokens/s per device from its mean TTFT and TPOT: the closed-loop
    identity ``X = C / (TTFT + (osl − 1) · TPOT)`` requests/s, × osl tokens, over the row's devices
    (docs/design/serving.md) — the same formula for the measured and the predicted figures."""
    e2e_s = (ttft_ms + (case.osl - 1) * tpot_ms) / 1e3
    return case.concurrency * case.osl / e2e_s / case.layout.num_devices


def _group_stats(rows: list[tuple[float, float, float | None, float]]) -> dict:
    """(predicted, measured tokens/s per device, predicted, measured TPOT) of one group's rows:

    - unconstrained: Spearman's ρ, whether the predicted best is the measured best, and the
      regret of taking it (1 − its measured ÷ the measured best);
    - under a TPOT bound at the group's median measured TPOT (about half the rows meet it): the
      row with the most predicted tokens/s per device among those predicted to meet the bound
      against the measured best among those that do — whether it is the measured best, whether
      it breaks the bound in the measurements, and its regret (a pick that breaks it: regret 1).
      Rankings without a TPOT (``predicted TPOT`` None) take no constrained pick."""
    from scipy.stats import spearmanr

    pred, meas = np.array([r[0] for r in rows]), np.array([r[1] for r in rows])
    pick = int(np.argmax(pred))
    rho = spearmanr(pred, meas).statistic if np.ptp(pred) > 0 and np.ptp(meas) > 0 else float("nan")
    out = {"rho": float(rho), "top1": bool(meas[pick] == meas.max()), "regret": float(1 - meas[pick] / meas.max())}
    if rows[0][2] is None:
        return out
    ptpot, mtpot = np.array([r[2] for r in rows]), np.array([r[3] for r in rows])
    bound = float(np.median(mtpot))
    ok_m, ok_p = mtpot <= bound, ptpot <= bound
    best = meas[ok_m].max()
    if not ok_p.any():
        out.update(slo_top1=False, slo_broken=False, slo_regret=1.0)
        return out
    pick = int(np.flatnonzero(ok_p)[np.argmax(pred[ok_p])])
    broken = not ok_m[pick]
    out.update(slo_top1=bool(not broken and meas[pick] == best), slo_broken=bool(broken),
               slo_regret=1.0 if broken else float(1 - meas[pick] / best))
    return out


def decisions(doc: dict) -> dict:
    """Per named population, per model and tier — the event simulation's figures under the
    model's name, the closed form's under ``<model> closed form`` — and the load-only ranking (a
    same-run baseline that orders a group's rows by clients per device alone): the decision
    groups' median Spearman ρ of predicted against measured output tokens/s per device, the share
    of groups whose predicted best deployment is the measured best, the median and p90 regret of
    taking the predicted best, and the same decision under a TPOT bound (:func:`_group_stats`).
    Every ranking takes the same rows: those both tiers replayed."""
    out = {"group_keys": list(GROUP_KEYS), "min_group_rows": MIN_GROUP, "populations": []}
    for pop in doc["named"]:
        if pop.key not in ("llama-3.1-8b-h100-trtllm", "stratified"):
            continue
        row = {"population": pop.name, "key": pop.key, "models": {}}
        first = next(iter(doc["predictions"].values()))
        rankings = [(m, preds, "serving") for m, preds in doc["predictions"].items()]
        rankings += [(f"{m} {CLOSED_FORM_LABEL}", preds, "closed-form") for m, preds in doc["predictions"].items()]
        for model, preds, mapping in [*rankings, (LOAD_ONLY, None, "serving")]:
            groups: dict[tuple, list[tuple[float, float]]] = {}
            source = preds if preds is not None else first   # the load-only ranking: the first model's rows
            for p in source:
                c = p.case
                # every ranking over the same rows: those both tiers replayed
                if (c.id not in pop.ids or c.mode != "agg" or p.ttft_serving_ms is None or "serving" not in p.tpot_ms
                        or p.ttft_closed_form_ms is None or "closed-form" not in p.tpot_ms):
                    continue
                ttft = serving_ttft_ms(p, mapping)
                measured = tokens_per_s_per_device(c, c.ttft_ms, c.tpot_ms)
                predicted = (c.concurrency / c.layout.num_devices if preds is None
                             else tokens_per_s_per_device(c, ttft, p.tpot_ms[mapping]))
                groups.setdefault(tuple(getattr(c, k) for k in GROUP_KEYS), []).append(
                    (predicted, measured, None if preds is None else p.tpot_ms[mapping], c.tpot_ms))
            stats = [_group_stats(g) for g in groups.values() if len(g) >= MIN_GROUP]
            rhos = [s["rho"] for s in stats if np.isfinite(s["rho"])]
            regrets = [s["regret"] for s in stats]
            row["models"][model] = None if not stats else {
                "groups": len(stats), "rows": sum(len(g) for g in groups.values() if len(g) >= MIN_GROUP),
                "median_rho": float(np.median(rhos)) if rhos else None,
                "top1_share": sum(s["top1"] for s in stats) / len(stats),
                "median_regret": float(np.median(regrets)), "p90_regret": float(np.quantile(regrets, 0.9))}
            if stats and preds is not None:
                row["models"][model].update({
                    "slo_top1_share": sum(s["slo_top1"] for s in stats) / len(stats),
                    "slo_broken_share": sum(s["slo_broken"] for s in stats) / len(stats),
                    "slo_median_regret": float(np.median([s["slo_regret"] for s in stats]))})
        out["populations"].append(row)
    return out
