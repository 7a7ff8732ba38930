"""The figure of ``perfcast validate --plot``: every predicted row against its measurement, per
TPOT mapping and for TTFT, with the error bands the validation targets are stated in.
Formatting only: the figures come from :func:`perfcast.serving.validation.run`'s document."""

from __future__ import annotations

import math

import numpy as np

from perfcast.inference.validation import MAPPINGS
from perfcast.report.plots import Skipped, figure, plain_log, styled

#: Relative error bands around "predicted = measured", the narrower drawn darker.
BANDS = (0.25, 0.10)
#: Colour and marker of each performance model; the baseline's grey.
SERIES = {"analytic": ("#0072B2", "o"), "profiling": ("#009E73", "^")}
BASELINE = ("#999999", "x")


def _pairs(doc: dict) -> dict[str, dict[str, list[tuple[float, float]]]]:
    """Panel (a TPOT mapping, or TTFT) → model → (measured, predicted) ms of every predicted row
    whose measurement is a positive finite number."""
    out: dict[str, dict[str, list]] = {}
    for model, preds in doc["predictions"].items():
        for p in preds:
            c = p.case
            rows = [(f"TPOT, {m}", c.tpot_ms, p.tpot_ms.get(m)) for m in MAPPINGS]
            rows += [("TTFT, one prefill", c.ttft_ms, p.ttft_ms), ("TTFT, serving", c.ttft_ms, p.ttft_serving_ms),
                     ("TTFT, closed-form", c.ttft_ms, p.ttft_closed_form_ms)]
            for panel, measured, predicted in rows:
                if predicted is not None and math.isfinite(measured) and measured > 0 and predicted > 0:
                    out.setdefault(panel, {}).setdefault(model, []).append((measured, predicted))
    return out


@styled
def predicted_vs_measured(doc: dict):
    """A panel per TPOT mapping and for TTFT: each row's prediction against its measurement
    (ms, log-log), one series per performance model and the baseline, the line of no error and
    the ±10 % and ±25 % bands."""
    pairs = _pairs(doc)
    panels = [k for k in (*(f"TPOT, {m}" for m in MAPPINGS), "TTFT, one prefill", "TTFT, serving",
                          "TTFT, closed-form") if k in pairs]
    cols = min(len(panels), 2)
    rows = -(-len(panels) // cols)
    fig, axes = figure(rows, cols)
    axes = np.atleast_1d(axes).ravel()
    for ax in axes[len(panels):]:
        ax.set_visible(False)
    for ax, panel in zip(axes, panels):
        values = [v for series in pairs[panel].values() for pair in series for v in pair]
        lo, hi = min(values) / 1.5, max(values) * 1.5
        x = np.geomspace(lo, hi, 64)
        for band, alpha in zip(BANDS, (0.12, 0.22)):
            ax.fill_between(x, x * (1 - band), x * (1 + band), color="#44AA99", alpha=alpha, linewidth=0,
                            label=f"±{band:.0%}")
        ax.plot(x, x, color="black", linewidth=0.8, label="predicted = measured")
        for model, series in pairs[panel].items():
            colour, marker = SERIES.get(model, BASELINE)
            arr = np.array(series)
            ax.scatter(arr[:, 0], arr[:, 1], s=14, color=colour, marker=marker, alpha=0.7, zorder=3,
                       label=f"{model} ({len(series):,} rows)")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlim(lo, hi)
        ax.set_ylim(lo, hi)
        plain_log(ax.xaxis, ax.yaxis)
        ax.set_xlabel("measured (ms)")
        ax.set_ylabel("predicted (ms)")
        ax.set_title(panel)
        ax.legend(loc="upper left", fontsize="x-small")
    rows_doc = doc["rows"]
    fig.suptitle(f"perfcast validate: predicted against measured, {rows_doc['mappable']:,} of "
                 f"{rows_doc['selected']:,} selected rows mapped", wrap=True)
    return fig


def validate(doc: dict) -> dict:
    """The figures of ``perfcast validate --plot``."""
    if not _pairs(doc):
        return {"validate": Skipped("validate", "no selected row has both a prediction and a measurement")}
    return {"validate": predicted_vs_measured(doc)}
