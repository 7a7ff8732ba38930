"""``perfcast serve``: one deployment at one load, by the event simulation and the closed form.

The application in one place (the CLI only parses flags, the report only formats): the engine's
scheduler from its profile and the user's limits (:mod:`.scheduler`), the step model compiled once
(:mod:`.step`), the KV cache sized from the memory model as the engine sizes it, then the
workload served by each tier asked for. A deployment of ``dp`` data-parallel ranks (plain replicas
or attention-DP ranks) runs one engine instance per rank; the load is split evenly over them
(vLLM's and TensorRT-LLM's DP load balancing send each rank its share) and the figures of one
rank are scaled to the deployment: throughput × ranks, latencies as one rank's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from perfcast.ir import UserError
from perfcast.serving import meanfield
from perfcast.serving.meanfield_inputs import UNBOUNDED_BATCH
from perfcast.serving.meanfield_burst import counting_the_first_wave
from perfcast.serving.memory import Memory, kv_capacity_tokens, memory_of
from perfcast.serving.scheduler import SchedulerConfig, deployment_scheduler
from perfcast.serving.sim import Speculative, simulate
from perfcast.serving.sim_dp import simulate_coupled
from perfcast.serving.step import Deployment, StepModel, compile_step
from perfcast.serving.types import SLO, KVCache, ServingResult
from perfcast.serving.workload import Workload

TIERS = ("simulation", "closed-form", "both")
#: How each engine's memory fraction sizes the KV cache (:func:`perfcast.serving.step.kv_capacity_tokens`).
KV_BASIS = {"vllm": "total", "sglang": "static", "trtllm": "free"}


@dataclass(frozen=True)
class ServeSpec:
    """Everything ``perfcast serve`` needs, plain and hashable."""

    deployment: Deployment
    workload: Workload
    max_batch_size: int | None = None
    max_num_tokens: int | None = None
    chunked_prefill: bool | None = None
    kv_capacity_tokens: int | None = None   # per engine instance; None: from the memory model
    speculative: Speculative | None = None
    slo: SLO | None = None
    tier: str = "both"
    trace: bool = False
    max_load: bool = False                  # every request queued at t = 0 (trtllm-bench, vLLM's throughput run)
    disagg: "Disagg | None" = None
    batch_wait: tuple[int, float] | None = None  # TensorRT-LLM (batch_wait_timeout_iters, batch_wait_max_tokens_ratio)
    memory_fraction: float | None = None    # the engine's share of memory for the KV cache (None: the engine's own)
    recv_interval: int | None = None        # SGLang --scheduler-recv-interval (None: the engine's own, 1)
    overlap: bool | None = None             # overlap (async) scheduling on/off (None: the engine's own)
    adp_balance: tuple[int, int] | None = None  # TensorRT-LLM attention_dp_config (batching_wait_iters, timeout_iters)
    max_prefill_tokens: int | None = None   # SGLang --max-prefill-tokens (None: the engine's own, 16384)


@dataclass(frozen=True)
class Disagg:
    """Disaggregated serving: ``prefill_instances`` engines of ``prefill`` (a deployment of
    its own layout) hand their requests' KV caches to ``decode_instances`` engines of the
    serve spec's deployment; ``auto_instances``: choose the split of that many instances by the
    closed form (the best output tokens/s per device under the SLOs), then simulate it."""

    prefill: Deployment
    prefill_instances: int = 1
    decode_instances: int = 1
    auto_instances: int | None = None
    router: str = "round_robin"
    prefill_max_batch_size: int | None = None


@dataclass(frozen=True)
class ServeReport:
    """What ``serve`` found: the scheduler, the KV cache and memory of one rank, each tier's result."""

    spec: ServeSpec
    scheduler: SchedulerConfig
    kv: KVCache
    memory: Memory | None
    ranks: int
    step_source: str
    results: dict[str, ServingResult]
    trace: object = None                  # SimTrace, or SimTraces for disaggregated serving
    notes: tuple[str, ...] = field(default_factory=tuple)
    disagg: dict | None = None

    @property
    def load(self) -> dict:
        w = self.spec.workload
        if self.spec.max_load:
            return {"kind": "max-load", "requests_queued_at_start": w.num_requests}
        if w.trace is not None:
            return {"kind": "trace", "file": w.trace.source}
        if w.concurrency is not None:
            return {"kind": "closed-loop", "concurrency": w.concurrency}
        return {"kind": "open-loop", "requests_per_s": w.rate, "cv": w.cv}

    def load_text(self) -> str:
        d = self.load
        return {"max-load": lambda: f"max load ({d.get('requests_queued_at_start')} requests queued at t = 0)",
                "trace": lambda: f"trace {d.get('file')}",
                "closed-loop": lambda: f"{d.get('concurrency')} concurrent clients (closed loop)",
                "open-loop": lambda: f"{d.get('requests_per_s')} requests/s (cv {d.get('cv')})"}[d["kind"]]()

    def agreement(self) -> dict | None:
        """Simulation ÷ closed form of the mean figures, where both tiers ran and are stable."""
        a, b = self.results.get("simulation"), self.results.get("closed form")
        if a is None or b is None or not (a.stable and b.stable):
            return None
        out = {k: getattr(a, k).mean / getattr(b, k).mean for k in ("ttft_s", "tpot_s", "e2e_s")
               if getattr(a, k) is not None and getattr(b, k) is not None and getattr(b, k).mean > 0}
        if b.output_tokens_per_s > 0:
            out["output_tokens_per_s"] = a.output_tokens_per_s / b.output_tokens_per_s
        return out


def serve(spec: ServeSpec) -> ServeReport:
    if spec.tier not in TIERS:
        raise UserError(f"--tier {spec.tier!r}: expected one of {', '.join(TIERS)}")
    if spec.max_load:
        spec = replace(spec, workload=replace(spec.workload, concurrency=spec.workload.num_requests, rate=None,
                                              warmup=0))
    if spec.workload.trace is not None and spec.tier == "both":
        spec = replace(spec, tier="simulation")  # the closed form takes lengths and a load, not a trace
    if spec.disagg is not None:
        if spec.batch_wait is not None and any(spec.batch_wait):
            raise UserError("--batch-wait-iters / --batch-wait-max-tokens-ratio: batch waiting holds prompts out of "
                            "steps with decodes; a disaggregated pool runs only one of the two (drop --disagg or the "
                            "batch wait)")
        if spec.recv_interval not in (None, 1):
            raise UserError("--scheduler-recv-interval: modelled for an aggregated SGLang engine only; a "
                            "disaggregated pool takes in its requests every step here (drop --disagg or the interval)")
        if spec.adp_balance is not None:
            raise UserError("--attention-dp-balance: modelled for an aggregated engine's coupled attention-DP ranks "
                            "only; a disaggregated pool's ranks are simulated apart (drop --disagg or the flag)")
        if spec.overlap is not None:
            raise UserError("--overlap-scheduling / --no-overlap-scheduling: modelled for an aggregated engine only; a "
                            "disaggregated pool takes a request in at the next step here (drop --disagg or the flag)")
        from perfcast.serving.serve_disagg import serve_disagg

        return serve_disagg(spec)
    dep = spec.deployment
    sched = deployment_scheduler(dep, max_batch_size=spec.max_batch_size, max_num_tokens=spec.max_num_tokens,
                                 chunked_prefill=spec.chunked_prefill, batch_wait=spec.batch_wait,
                                 memory_fraction=spec.memory_fraction, recv_interval=spec.recv_interval,
                                 overlap=spec.overlap, micro_batches=dep.layout.pp, adp_balance=spec.adp_balance,
                                 max_prefill_tokens=spec.max_prefill_tokens)
    if sched.waits and dep.layout.attention_dp:
        raise UserError("--batch-wait-iters / --batch-wait-max-tokens-ratio: TensorRT-LLM waits for batches only "
                        "without attention DP (PyExecutor._schedule); drop --attention-dp or the batch wait")
    ranks = dep.layout.dp
    coupled = ranks > 1 and dep.layout.attention_dp   # MoE ranks that step together (.sim_dp)
    if sched.adp_balance is not None and not coupled:
        raise UserError("--attention-dp-balance: balances the prompts of attention-DP ranks; give --attention-dp "
                        "with --dp-size above 1")
    # the closed form (and independent ranks' simulation) takes one rank's share of the load; coupled
    # ranks are simulated on the whole of it, a rank holding as many of its clients as the balancer gives it
    rank_load = None if coupled and spec.tier == "simulation" else _rank_load(spec.workload, ranks)
    sim_load = spec.workload if coupled else rank_load
    k = spec.speculative.k if spec.speculative else 0
    step = compile_step(dep, max_tokens=_max_tokens(sched, rank_load if spec.tier == "closed-form" else sim_load, k))
    mem, kv = _kv_cache(spec, sched, step)
    notes = list(_notes(dep, sched, kv, mem, ranks))
    notes += [n for n in (launch_note(step), unpriced_note(step)) if n]
    results, trace = {}, None
    if spec.tier in ("simulation", "both"):
        kw = dict(devices=_rank_devices(dep), speculative=spec.speculative, slo=spec.slo, trace=spec.trace)
        r, trace = (simulate_coupled(step, kv, sched, sim_load, ranks, **kw) if coupled else
                    simulate(step, kv, sched, sim_load, **kw))
        if not r.stable:
            r = _with_saturation(r, step, kv, sched, sim_load, dep, spec, ranks if coupled else 0)
        results["simulation"] = r if coupled else _scaled(r, ranks)
    if spec.tier in ("closed-form", "both"):
        together = ranks if coupled else 1
        results["closed form"] = _scaled(_closed_form(spec, sched, kv, step, rank_load, together), ranks)
    if spec.max_load:
        notes.append("max load: every request queued at t = 0, as trtllm-bench and vLLM's throughput benchmark run")
    return ServeReport(spec, sched, kv, mem, ranks, step.source, results, trace, tuple(notes))


def _with_saturation(r: ServingResult, step, kv, sched, load: Workload, dep: Deployment,
                     spec: ServeSpec, coupled: int = 0) -> ServingResult:
    """An overloaded run's sustainable rate: the same requests all queued at t = 0 (max load);
    ``coupled``: that many attention-DP ranks stepped together."""
    full = replace(load, concurrency=load.num_requests, rate=None, warmup=0)
    sat, _ = (simulate_coupled(step, kv, sched, full, coupled, devices=_rank_devices(dep),
                               speculative=spec.speculative) if coupled else
              simulate(step, kv, sched, full, devices=_rank_devices(dep), speculative=spec.speculative))
    return replace(r, sustainable_rate=sat.requests_per_s,
                   notes=r.notes + (f"sustainable rate: the requests/s of the same requests at max load "
                                    f"({sat.requests_per_s:.4g}/s)",))


def _rank_load(w: Workload, ranks: int) -> Workload:
    """One rank's share of the load (concurrency, rate and requests split evenly)."""
    if ranks == 1:
        return w
    if w.trace is not None:
        raise UserError("--trace with data parallelism: a trace is replayed on one engine instance; "
                        "give --dp-size 1")
    if w.concurrency is not None and w.concurrency % ranks:
        raise UserError(f"--concurrency {w.concurrency} does not split evenly over {ranks} data-parallel ranks")
    return replace(w, concurrency=w.concurrency // ranks if w.concurrency else None,
                   rate=w.rate / ranks if w.rate else None,
                   num_requests=max(1, math.ceil(w.num_requests / ranks)),
                   warmup=None if w.warmup is None else w.warmup // ranks)


def _rank_devices(dep: Deployment) -> int:
    return dep.layout.tp * dep.layout.pp


def _max_tokens(sched: SchedulerConfig, w: Workload, k: int) -> int:
    """The largest step the scheduler can build (a pipeline's: the largest micro-batch of one): its
    token budget, or a decode batch of its sequence limit (each verifying ``1 + k`` tokens)."""
    seqs = sched.max_num_seqs or min(UNBOUNDED_BATCH, w.concurrency or UNBOUNDED_BATCH)
    if w.concurrency:
        seqs = min(seqs, w.concurrency)
    # a pipeline prices micro-batches: at most two batches' prompt tokens each (step_pipeline.micro_batches)
    budget = sched.max_num_tokens * min(sched.micro_batches, 2)
    return max(budget, seqs * (1 + k) + budget)


class DoesNotFit(UserError):
    """The deployment leaves no KV cache on its devices (a search counts it as "does not fit")."""


def _kv_cache(spec: ServeSpec, sched: SchedulerConfig, step: StepModel) -> tuple[Memory | None, KVCache]:
    if spec.kv_capacity_tokens is not None:
        return None, sched.kv_cache(spec.kv_capacity_tokens)
    mem = memory_of(spec.deployment, sched.max_num_tokens)
    tokens = kv_capacity_tokens(mem, sched.memory_fraction, KV_BASIS[sched.policy], sched.block_size)
    if tokens < sched.block_size:
        gb = 1e9
        raise DoesNotFit(
            f"{spec.deployment.model} does not fit {spec.deployment.device} for serving: weights "
            f"{mem.weights_bytes / gb:.1f} GB + activations {mem.activation_bytes / gb:.1f} GB leave no KV cache "
            f"within {sched.memory_fraction:g} of {mem.capacity_bytes / gb:.0f} GB per device; use more devices "
            f"(--tp-size) or --quantize")
    return mem, sched.kv_cache(tokens, mem.kv_bytes_per_token)


def engine_config(spec: ServeSpec, sched: SchedulerConfig, kv: KVCache, dep: Deployment) -> meanfield.EngineConfig:
    """The closed form's view of one engine instance."""
    sp = spec.speculative
    return meanfield.EngineConfig.of(sched, kv.capacity_tokens, devices=_rank_devices(dep), spec_k=sp.k if sp else 0,
                                     acceptance=sp.acceptance if sp else ())


def mean_load(w: Workload, *, max_load: bool = False) -> meanfield.Workload:
    """The closed form's workload: the length distributions' means, the load."""
    if w.trace is not None:
        raise UserError("--tier closed-form: the closed form takes --isl/--osl and a load, not a trace")
    isl, osl = round(w.input_len.mean), round(w.output_len.mean)
    return meanfield.Workload(isl=isl, osl=max(2, osl), concurrency=None if max_load else w.concurrency,
                              rate_per_s=None if max_load else w.rate, prefix_hit_rate=w.prefix_hit_rate)


def _closed_form(spec: ServeSpec, sched: SchedulerConfig, kv: KVCache, step: StepModel,
                 w: Workload, coupled_ranks: int = 1) -> ServingResult:
    sp = spec.speculative
    engine = replace(engine_config(spec, sched, kv, spec.deployment), coupled_ranks=coupled_ranks)
    load = mean_load(w, max_load=spec.max_load)
    isl, osl = load.isl, load.osl
    r = meanfield.solve(step, engine, load, draft=sp.draft_step if sp else None, slo=spec.slo)
    if load.concurrency is not None and w.warmup is not None and w.warmup < load.concurrency:
        # (a warm-up given below C counts part of the first wave; by default it is the warm-up, and a run of
        # N ≤ C requests that counts its last one — the search's closed-form points — is the steady state)
        r = counting_the_first_wave(r, step, engine, load, warmup=w.warmup, num_requests=w.num_requests,
                                    draft=sp.draft_step if sp else None)
    if sched.adp_balance is not None:
        r = replace(r, notes=r.notes + ("attention-DP balance (--attention-dp-balance): the ranks' prompts in the same "
                                        "steps, each held until every rank has one (at most timeout_iters steps, then "
                                        "batching_wait_iters more), the mean hold in TTFT",))
    elif engine.coupled_ranks > 1:
        r = replace(r, notes=r.notes + (f"{engine.coupled_ranks} attention-DP ranks stepping together: the mean step "
                                        f"carries every rank's prompts (independent steps)",))
    if w.input_len.kind != "fixed" or w.output_len.kind != "fixed":
        r = replace(r, notes=r.notes + (f"lengths drawn from distributions: the closed form takes their means "
                                        f"(isl {isl}, osl {osl})",))
    return r


def _scaled(r: ServingResult, ranks: int) -> ServingResult:
    """One rank's result as the deployment's: throughput × ranks, latencies and per-device and
    per-user figures unchanged."""
    if ranks == 1:
        return r
    return replace(r, output_tokens_per_s=r.output_tokens_per_s * ranks, requests_per_s=r.requests_per_s * ranks,
                   devices=r.devices * ranks, requests=r.requests * ranks,
                   goodput_requests_per_s=None if r.goodput_requests_per_s is None else r.goodput_requests_per_s * ranks,
                   sustainable_rate=None if r.sustainable_rate is None else r.sustainable_rate * ranks,
                   notes=r.notes + (f"one of {ranks} data-parallel ranks {_RUN[r.tier]}, each with 1/{ranks} of the "
                                    f"load; throughput × {ranks}",))


_RUN = {"simulation": "simulated", "closed form": "priced"}


def unpriced_note(step: StepModel, role: str = "") -> str | None:
    """One line naming the ops ``step`` has no cost rule for (priced at zero), or None."""
    if not step.unpriced:
        return None
    ops = ", ".join(f"{op} ({shapes}) ×{n}" for (op, shapes), n in step.unpriced.most_common(4))
    more = f" and {len(step.unpriced) - 4} more" if len(step.unpriced) > 4 else ""
    return f"{role}step: {sum(step.unpriced.values())} op call(s) with no cost rule, priced at ZERO: {ops}{more}"


def launch_note(step: StepModel, role: str = "", prefill: bool = True, decode: bool = True) -> str | None:
    """One line on the steps the host launches eagerly (an eager step takes at least the host's
    issue time of its kernels) and, for decode steps, the idle the engine's loop adds to each (or
    that none is modelled); None where prefill steps alone are asked and replay a CUDA graph."""
    floor = step.host_floor_s(False, 1) if prefill else 0.0
    loop = step.iteration_gap
    gap = loop.value_s if loop else 0.0
    eager = next((t for t in range(1, step.max_tokens + 1) if step.host_floor_s(True, t)), None) if decode else None
    parts = [f"prefill steps are launched eagerly, the host issuing their kernels in {floor * 1e3:.2f} ms "
             f"(the engine's host interval per kernel), the least such a step takes"] if floor else []
    if eager is not None:
        parts.append("decode steps are launched eagerly" if eager == 1 else
                     f"decode steps replay CUDA graphs up to {eager - 1} sequences, eager beyond (the host issuing "
                     f"their kernels in {step.host_floor_s(True, eager) * 1e3:.2f} ms)")
    if decode:
        parts.append(f"each decode step adds {gap * 1e6:.0f} µs of GPU idle left by the engine's loop ({loop.source})"
                     if gap else "no GPU idle between decode steps modelled (no measured figure for this loop)")
    return f"{role}launches: " + "; ".join(parts) if parts else None


def _notes(dep: Deployment, sched: SchedulerConfig, kv: KVCache, mem: Memory | None, ranks: int) -> list[str]:
    wait = (f", batch waiting up to {sched.batch_wait[0]} steps or {sched.batch_wait[1]:g} × max num tokens "
            f"(the closed form does not model it)" if sched.waits else "")
    recv = (f", new requests taken in every {sched.recv_interval} decode steps and after each prefill"
            if sched.recv_interval > 1 else "")
    loop = "overlap scheduling" if sched.overlap else "synchronous loop"
    cap = f", max prefill tokens {sched.max_prefill_tokens}" if sched.max_prefill_tokens else ""
    out = [f"scheduler: {sched.policy} (max batch {sched.max_num_seqs or 'KV-bound'}, max num tokens "
           f"{sched.max_num_tokens}{cap}, chunked prefill {'on' if sched.chunked_prefill else 'off'}, "
           f"{sched.block_size}-token blocks{wait}{recv}, {loop}: a request sent on a step's outputs "
           f"waits {sched.take_in_lag} more step{'s' if sched.take_in_lag > 1 else ''})"]
    if mem is None:
        out.append(f"KV cache: {kv.capacity_tokens:,} tokens per instance, as given (--kv-capacity)")
    else:
        basis = {"total": "of device memory, less weights and activations",
                 "static": "of device memory for weights and KV",
                 "free": "of the memory left after weights and activations"}[KV_BASIS[sched.policy]]
        out.append(f"KV cache: {kv.capacity_tokens:,} tokens per instance ({sched.memory_fraction:g} {basis}; "
                   f"{mem.kv_bytes_per_token:,} B per token per device)")
    if ranks > 1:
        out.append(f"{ranks} data-parallel engine instances of {_rank_devices(dep)} device(s) each")
    return out + [n for n in (pipeline_note(sched),) if n]


def pipeline_note(sched: SchedulerConfig, role: str = "") -> str | None:
    """One line on how a pipeline-parallel instance's step is priced, or None without stages."""
    if sched.micro_batches == 1:
        return None
    return (f"{role}pipeline: {sched.micro_batches} stages with {sched.micro_batches} batches in flight, each within "
            f"max num tokens {sched.max_num_tokens}; a step here is one cycle of them (the busiest stage's work, or "
            f"one batch's pass through every stage, whichever is longer: docs/design/serving.md, \"Pipeline "
            f"parallelism\"), its budget {sched.step_tokens} tokens; the batches are taken as even shares of the "
            f"cycle's requests")
