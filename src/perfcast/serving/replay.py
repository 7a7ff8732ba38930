"""A measured serving run replayed through ``perfcast serve``: its deployment, its benchmark
client's workload, the TTFT and TPOT the event simulation predicts — and the closed form's at the
same deployment and load, the tier ``perfcast optimize`` screens with.

The workload is the client's, as far as the row says who measured it
(:func:`perfcast.inference.silicon.benchmark_of`):

- **InferenceX** rows: vLLM's ``benchmark_serving.py`` as InferenceMAX runs it — ``--dataset-name
  random --random-range-ratio 0.8 --num-prompts CONC*10 --max-concurrency CONC --request-rate inf
  --ignore-eos`` (InferenceMAX ``benchmarks/*_slurm.sh``); its random dataset draws each input
  and output length uniformly from ``[int(L·0.8), L]`` (``sample_random_requests``:
  ``np.random.randint(int(input_len * range_ratio), input_len + 1)``), every request counted
  (no warm-up), the mean TTFT and TPOT reported.
- **gap-analysis** rows (aiconfigurator's own collections): the client is not stated; perfcast
  assumes the same client with fixed lengths (the row's ``isl`` / ``osl``) and says so.

The engine is the row's backend with its documented defaults, but for the settings its
campaign's launch script states (:mod:`perfcast.inference.recipes`: KV-cache dtype, step token
budget, TensorRT-LLM batch waiting); the row's batch size is the engine's maximum batch
(InferenceMAX launches ``--max-num-seqs $CONC``) unless it is below the row's concurrency
(:func:`perfcast.inference.recipes.with_batch_limit`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from perfcast.hardware.spec import SpecError
from perfcast.inference.silicon import ONE_DECODE_WORKER, Case
from perfcast.ir import UserError
from perfcast.serving.scheduler import deployment_scheduler
from perfcast.serving.serve import Disagg, ServeSpec, serve
from perfcast.serving.step import Deployment
from perfcast.serving.workload import Lengths, Workload

#: InferenceMAX's ``RANDOM_RANGE_RATIO``.
RANGE_RATIO = 0.8
#: ``--num-prompts $(( $CONC * 10 ))``.
PROMPTS_PER_CLIENT = 10
#: The most output tokens one row's replay simulates: about 50 s of the event simulation at its
#: target of ≥ 1 M simulated tokens/s on one core. The disaggregated rows reach 8,192 clients × 8,192
#: output tokens, 671 M tokens a row (the stratified sample's replayable ones 2.2 billion together:
#: its replay processes were killed, most likely out of memory); a row over the budget gets no
#: serving figure and says why.
REPLAY_TOKEN_BUDGET = 50_000_000
INFERENCEX_CLIENT = ("InferenceMAX's benchmark_serving: input and output lengths uniform in [0.8 L, L], "
                     "10 × concurrency requests, none excluded")
ASSUMED_CLIENT = ("gap-analysis row: the benchmark client is not stated; replayed as benchmark_serving with "
                  "fixed lengths, 10 × concurrency requests, none excluded")


def client_of(case: Case) -> str:
    """The client a row is replayed with, as the rows file says it (``serving_client``)."""
    return INFERENCEX_CLIENT if case.benchmark == "inferencex" else ASSUMED_CLIENT


@dataclass(frozen=True)
class Replay:
    """One row's serving prediction (ms) by the event simulation, or why there is none; and the
    closed form's (the tier the deployment search screens with) at the same deployment and load,
    or why it has none."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None
    reason: str | None = None
    closed_form_ttft_ms: float | None = None
    closed_form_tpot_ms: float | None = None
    closed_form_reason: str | None = None


def workload_of(case: Case, seed: int = 0) -> Workload:
    """The row's client (:func:`client_of`) as a closed-loop workload."""
    c = case.concurrency
    if case.benchmark == "inferencex":
        isl = Lengths("uniform", int(case.isl * RANGE_RATIO), case.isl)
        osl = Lengths("uniform", max(2, int(case.osl * RANGE_RATIO)), case.osl)
    else:
        isl, osl = Lengths("fixed", case.isl), Lengths("fixed", case.osl)
    return Workload(isl, osl, num_requests=PROMPTS_PER_CLIENT * c, concurrency=c, warmup=0, seed=seed)


def deployment_of(case: Case, performance_model: str = "analytic") -> Deployment:
    return Deployment(model=case.model, device=case.device, engine=case.engine, layout=case.layout,
                      dtype=case.dtype, quantize=case.quantize, kv_dtype=case.kv_dtype,
                      performance_model=performance_model, engine_options=case.engine_options,
                      cuda_graph_max=case.cuda_graph_max)


def _max_batch(case: Case) -> int:
    """The row's batch; where it is not the engine's limit (:func:`perfcast.inference.recipes.
    with_batch_limit`), the engine's default limit on the row's device (vLLM's depends on it)
    capped at the concurrency — the same schedule (a closed loop of C clients never has more than
    C requests in flight), and a step model compiled for C sequences, not for the engine's
    default of up to thousands."""
    if case.batch_limits:
        return case.batch
    default = deployment_scheduler(deployment_of(case)).max_num_seqs
    return min(default, case.concurrency) if default else case.concurrency


def _refused(reason: str) -> Replay:
    """A row neither tier can replay."""
    return Replay(reason=reason, closed_form_reason=reason)


def replay(case: Case, performance_model: str = "analytic", seed: int = 0) -> Replay:
    """The row ``case`` served by the event simulation and by the closed form."""
    if not case.predictable:
        return _refused(case.reason)
    if case.mode not in ("agg", "disagg"):
        return _refused(f"{case.mode}: the serving replay takes aggregated and disaggregated rows")
    if not case.concurrency:
        return _refused("no concurrency stated: the client's load is unknown")
    disagg = None
    if case.mode == "disagg":
        if case.prefill_layout is None or not case.prefill_workers or not case.decode_workers:
            return _refused("disagg: the prefill layout or the worker counts are not stated")
        if ONE_DECODE_WORKER in case.approximate:
            return _refused("disagg: the decode batch is not stated")
        disagg = Disagg(replace(deployment_of(case, performance_model), layout=case.prefill_layout),
                        case.prefill_workers, case.decode_workers)
    workload = workload_of(case, seed)
    tokens = workload.num_requests * workload.output_len.mean
    if tokens > REPLAY_TOKEN_BUDGET:
        return _refused(f"{workload.num_requests:,} requests × {workload.output_len.mean:,.0f} output tokens = "
                        f"{tokens:,.0f} simulated tokens, over the validation replay's budget of "
                        f"{REPLAY_TOKEN_BUDGET:,} a row (perfcast serve replays such a load on its own)")
    try:
        rep = serve(ServeSpec(deployment_of(case, performance_model), workload,
                              max_batch_size=_max_batch(case),
                              max_num_tokens=case.max_num_tokens, tier="both",
                              disagg=disagg, batch_wait=case.batch_wait, memory_fraction=case.memory_fraction,
                              recv_interval=None if disagg else case.recv_interval,
                              overlap=None if disagg else case.overlap,
                              adp_balance=None if disagg else case.adp_balance,
                              max_prefill_tokens=case.max_prefill_tokens))
    except (UserError, SpecError) as e:
        return _refused(f"refused by perfcast serve: {e}")
    cf = ((None, None, "disagg: the disaggregated closed form takes a request rate; the row's client is a closed "
                       "loop") if disagg is not None else _means(rep.results.get("closed form"), "the closed form"))
    return Replay(*_means(rep.results["simulation"], "the simulation"), *cf)


def _means(r, tier: str) -> tuple[float | None, float | None, str | None]:
    """A tier's mean TTFT and TPOT (ms), or why it has none."""
    if r is None:
        return None, None, f"{tier} did not run"
    if r.ttft_s is None or r.tpot_s is None:
        return None, None, f"{tier} found the load unstable"
    return r.ttft_s.mean * 1e3, r.tpot_s.mean * 1e3, None
