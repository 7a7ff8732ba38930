"""``perfcast serve``'s report: the figures of :class:`perfcast.serving.serve.ServeReport` as
tables and as the ``serve`` JSON document (schema ``serve.schema.json``). Formatting only."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from perfcast.serving.types import ServingResult, Summary

LATENCIES = ("ttft_s", "tpot_s", "itl_s", "e2e_s")
LABELS = {"ttft_s": "TTFT", "tpot_s": "TPOT", "itl_s": "ITL", "e2e_s": "E2E"}
#: The metric definitions the figures follow (docs/design/serving.md, :mod:`perfcast.serving.metrics`).
DEFINITIONS = {
    "ttft_s": "time to first token: the request's send to its first token (vLLM benchmark_serving, AIPerf)",
    "tpot_s": "time per output token of a request: (e2e − ttft) / (output tokens − 1), summarised over requests",
    "itl_s": "inter-token latency: every gap between successive streamed chunks, over all requests",
    "e2e_s": "end-to-end latency: the request's send to its last token",
}


def _summary(s: Summary | None) -> dict | None:
    return None if s is None else s.as_dict()


def result_json(r: ServingResult) -> dict:
    return {
        "tier": r.tier, "stable": r.stable,
        **{k: _summary(getattr(r, k)) for k in LATENCIES},
        "throughput": {"output_tokens_per_s": r.output_tokens_per_s,
                       "output_tokens_per_s_per_device": r.output_tokens_per_s_per_device,
                       "output_tokens_per_s_per_user": r.output_tokens_per_s_per_user,
                       "requests_per_s": r.requests_per_s},
        "goodput_requests_per_s": r.goodput_requests_per_s,
        "sustainable_requests_per_s": r.sustainable_rate,
        "devices": r.devices, "requests": r.requests, "mean_batch": r.mean_batch,
        "kv_cache": {"capacity_tokens": r.kv_capacity_tokens, "peak_tokens": r.kv_peak_tokens,
                     "preemptions": r.preemptions},
        "notes": list(r.notes),
    }


def _primary(report) -> ServingResult:
    return report.results.get("simulation") or next(iter(report.results.values()))


def to_json(report) -> dict:
    """The ``serve`` document: the primary tier's figures at the top (the simulation when it ran),
    every tier under ``tiers``."""
    spec, dep, sched = report.spec, report.spec.deployment, report.scheduler
    main = result_json(_primary(report))
    w = spec.workload
    doc = {
        "command": "serve", "model": dep.model, "device": dep.device, "engine": sched.engine,
        "layout": {"tp": dep.layout.tp, "ep": dep.layout.ep, "dp": dep.layout.dp, "pp": dep.layout.pp,
                   "attention_dp": dep.layout.attention_dp},
        "workload": {"input_length": _lengths(w.input_len), "output_length": _lengths(w.output_len),
                     "load": report.load, "num_requests": w.num_requests, "warmup": w.warmup_count(),
                     "seed": w.seed, "prefix_hit_rate": w.prefix_hit_rate},
        "scheduler": {"policy": sched.policy, "max_batch_size": sched.max_num_seqs,
                      "max_num_tokens": sched.max_num_tokens, "chunked_prefill": sched.chunked_prefill,
                      "block_size_tokens": sched.block_size, "memory_fraction": sched.memory_fraction,
                      "recv_interval": sched.recv_interval, "max_prefill_tokens": sched.max_prefill_tokens,
                      "overlap_scheduling": sched.overlap,
                      "take_in_lag_steps": sched.take_in_lag, "dp_balance": sched.dp_balance,
                      "attention_dp_balance": None if sched.adp_balance is None else {
                          "batching_wait_iters": sched.adp_balance[0], "timeout_iters": sched.adp_balance[1]}},
        "speculative": None if spec.speculative is None else {
            "k": spec.speculative.k, "acceptance": list(spec.speculative.acceptance),
            "expected_tokens_per_step": spec.speculative.expected_tokens_per_step},
        "tier": main["tier"], "stable": main["stable"],
        **{k: main[k] for k in LATENCIES},
        "throughput": main["throughput"], "goodput_requests_per_s": main["goodput_requests_per_s"],
        "sustainable_requests_per_s": main["sustainable_requests_per_s"],
        "kv_cache": {**main["kv_cache"], "bytes_per_token_per_device": report.kv.bytes_per_token,
                     "block_size_tokens": report.kv.block_size},
        "devices": main["devices"],
        "tiers": {name: result_json(r) for name, r in report.results.items()},
        "agreement": report.agreement(),
        "step": report.step_source,
        "definitions": dict(DEFINITIONS),
        "notes": list(report.notes),
    }
    if report.disagg is not None:
        doc["disaggregated"] = report.disagg
    return doc


def _lengths(length) -> dict:
    return {"distribution": length.kind, "mean": length.mean,
            **({"low": int(length.a), "high": int(length.b)} if length.kind == "uniform" else {})}


def _ms(s: Summary | None, key: str) -> str:
    return "—" if s is None else f"{getattr(s, key) * 1e3:,.2f}"


def render(console: Console, report, doc: dict) -> None:
    """The tables of ``report``; ``doc`` is its :func:`to_json` document (already checked)."""
    dep = report.spec.deployment
    console.print(f"[bold]perfcast serve[/bold] {dep.model} on {dep.device} ({dep.layout.describe()}), "
                  f"engine {doc['engine']}; load: {report.load_text()}")
    t = Table(title="latency (ms)", title_justify="left")
    t.add_column("tier")
    t.add_column("metric")
    for col in ("mean", "p50", "p90", "p99"):
        t.add_column(col, justify="right")
    for name, r in report.results.items():
        for k in LATENCIES:
            s = getattr(r, k)
            t.add_row(name, LABELS[k], *(_ms(s, c) for c in ("mean", "p50", "p90", "p99")))
    console.print(t)
    th = Table(title="throughput", title_justify="left")
    for col in ("tier", "output tok/s", "per device", "per user", "requests/s", "stable", "mean batch"):
        th.add_column(col, justify="right" if col != "tier" else "left")
    for name, r in report.results.items():
        th.add_row(name, f"{r.output_tokens_per_s:,.1f}", f"{r.output_tokens_per_s_per_device:,.1f}",
                   f"{r.output_tokens_per_s_per_user:,.1f}", f"{r.requests_per_s:,.3f}",
                   "yes" if r.stable else f"NO — sustains {r.sustainable_rate or 0:,.3f} req/s",
                   "—" if r.mean_batch is None else f"{r.mean_batch:,.1f}")
    console.print(th)
    kv = doc["kv_cache"]
    console.print(f"KV cache: {kv['capacity_tokens']:,} tokens per instance, peak {kv['peak_tokens']:,}, "
                  f"{kv['preemptions']} preemptions")
    if doc["agreement"]:
        console.print("simulation ÷ closed form: " + ", ".join(f"{k} {v:.3f}" for k, v in doc["agreement"].items()))
    for n in doc["notes"] + [n for r in report.results.values() for n in r.notes]:
        console.print(f"note: {n}")
