"""The benchmark clients' metrics, defined as they compute them.

vLLM ``benchmarks/benchmark_serving.py`` (``vllm bench serve``, ``calculate_metrics``), per request
sent at ``s`` whose first streamed token arrives at ``f`` and last at ``e``, with ``n`` output
tokens:

- TTFT = f − s;
- TPOT = (e − f) / (n − 1), for requests with n > 1 only (``if output_len > 1``);
- ITL: every gap between successive streamed chunks, pooled over all requests. Under
  speculative decoding one chunk carries several tokens, so ITL ≠ TPOT;
- E2E latency = e − s;
- output throughput = Σ n / benchmark duration; request throughput = requests / duration;
- goodput (``--goodput ttft:… tpot:… e2el:…``) = requests meeting every stated SLO / duration.

AIPerf (NVIDIA's successor of GenAI-Perf) names them differently: its ``inter_token_latency`` is
per request (e − f) / (n − 1), i.e. vLLM's TPOT; its ``inter_chunk_latency`` is vLLM's ITL.
Per-user output speed is the mean over requests of 1 / TPOT.

Here the duration is measured over the counted (non-warm-up) requests only: from the first send
among them to the last completion among them. Summaries are mean and the 50th/90th/99th
percentiles with numpy's default linear interpolation (``np.percentile``, as vLLM reports them).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .types import SLO, Summary

PERCENTILES = (50.0, 90.0, 99.0)


def summarize(values: np.ndarray) -> Summary | None:
    """Mean and linear-interpolated percentiles of ``values`` (None when there are none)."""
    v = np.asarray(values, float)
    if v.size == 0:
        return None
    p50, p90, p99 = np.percentile(v, PERCENTILES)
    return Summary(float(v.mean()), float(p50), float(p90), float(p99))


def weighted_summary(values: np.ndarray, weights: np.ndarray) -> Summary | None:
    """:func:`summarize` of ``values`` each repeated ``weights`` times, without repeating them: the
    same numbers ``np.percentile`` gives on the expanded array (linear interpolation between the
    order statistics at ranks ⌊p(N−1)⌋ and ⌈p(N−1)⌉)."""
    v, w = np.asarray(values, float), np.asarray(weights, np.int64)
    keep = w > 0
    v, w = v[keep], w[keep]
    if v.size == 0:
        return None
    order = np.argsort(v, kind="stable")
    v, w = v[order], w[order]
    ends = np.cumsum(w)          # rank (0-based) of the last copy of each value is ends − 1
    total = int(ends[-1])

    def at(rank: int) -> float:
        return float(v[np.searchsorted(ends, rank, side="right")])

    out = []
    for p in PERCENTILES:
        pos = p / 100.0 * (total - 1)
        lo = int(np.floor(pos))
        hi = min(lo + 1, total - 1)
        out.append(at(lo) + (pos - lo) * (at(hi) - at(lo)))
    return Summary(float(np.dot(v, w) / total), *out)


@dataclass(frozen=True)
class RequestMetrics:
    """Per counted request, seconds: TTFT, E2E, TPOT (NaN where one output token)."""

    ttft: np.ndarray
    e2e: np.ndarray
    tpot: np.ndarray
    output_tokens: np.ndarray
    duration_s: float


def request_metrics(send: np.ndarray, first: np.ndarray, last: np.ndarray, output_tokens: np.ndarray) -> RequestMetrics:
    """vLLM's per-request definitions over the counted requests (arrays in the same order)."""
    ttft = first - send
    e2e = last - send
    n = output_tokens.astype(float)
    with np.errstate(divide="ignore", invalid="ignore"):
        tpot = np.where(n > 1, (last - first) / (n - 1), np.nan)
    duration = float(last.max() - send.min()) if send.size else 0.0
    return RequestMetrics(ttft, e2e, tpot, output_tokens, duration)


def goodput(m: RequestMetrics, slo: SLO) -> float:
    """Requests/s meeting every stated SLO (vLLM ``--goodput``; a request without a TPOT, one
    output token, meets a TPOT bound)."""
    ok = np.ones(m.ttft.size, bool)
    if slo.ttft_s is not None:
        ok &= m.ttft <= slo.ttft_s
    if slo.tpot_s is not None:
        ok &= ~(m.tpot > slo.tpot_s)
    if slo.e2e_s is not None:
        ok &= m.e2e <= slo.e2e_s
    return float(ok.sum() / m.duration_s) if m.duration_s > 0 else 0.0


def per_user_tokens_per_s(m: RequestMetrics) -> float:
    """Mean over requests of 1 / TPOT (requests with one output token have none)."""
    tpot = m.tpot[~np.isnan(m.tpot)]
    tpot = tpot[tpot > 0]
    return float(np.mean(1.0 / tpot)) if tpot.size else 0.0
