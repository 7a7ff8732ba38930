"""The closed form (mean field) of continuous-batching serving: one steady state per load point.

A continuous-batching engine holds at most ``B_max = min(max_batch, ⌊KV / (isl + osl)⌋)``
sequences (the KV bound reserves each request's final length, as TensorRT-LLM's
GUARANTEED_NO_EVICT scheduler does; tensorrt_llm/_torch/pyexecutor/scheduler.py). In the steady
state every engine step is the same *mean* step: ``d`` decoding sequences and ``r`` prompts'
worth of prefill per step. Little's law over the decode phase gives ``d = r · (osl − 1) / E``
(each request spends ``(osl − 1) / E`` steps decoding, ``E`` tokens per step; Little 1961,
Operations Research 9(3)); over the whole stay in the engine it gives the in-flight count
``B = d + X · TTFT_service`` with ``X = r / τ`` requests/s and ``τ`` the mean step. The policies
differ only in how a prompt's prefill enters the steps (:func:`_state`):

- ``vllm`` (V1 scheduler, vllm/v1/core/sched/scheduler.py ``Scheduler.schedule``) and ``trtllm``
  (in-flight batching: context requests join the generation step): *mixed* steps, the prefill
  chunks ride along the decodes under one token budget; chunk size ``budget − d · (1 + k)`` with
  chunked prefill, the whole prompt without (``trtllm`` default);
- ``sglang`` (python/sglang/srt/managers/scheduler.py ``get_next_batch_to_run``: a prefill batch
  whenever requests wait, else a decode batch): prefill batches run alone and the decoding
  sequences stall for them.

Steps are priced with the caller's :class:`~perfcast.serving.types.StepCost` at the mean cached
context (decode step ``j`` of ``1 … osl − 1`` reads ``isl + j − 1`` cached keys plus its own, so
the attended keys average ``isl + osl/2``). A step cost linear in the batch's summed context —
:class:`~perfcast.serving.types.AffineStep`, a roofline attention term — is priced exactly by the
mean; a cost nonlinear in one sequence's context (a kernel's efficiency at long context, padding
to the longest sequence) is approximated by it. Fractional counts (``d = 7.5`` decodes) are priced
by linear interpolation between the integer neighbours, exact for a step affine in the count.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from functools import cached_property

from perfcast.ir import UserError
from perfcast.serving.brent import brentq
from perfcast.serving.meanfield_inputs import EngineConfig, Workload  # the closed form's inputs (re-exported)
from perfcast.serving.queueing import balance_hold_steps, md1_wait, share_within, wait_tail
from perfcast.serving.types import SLO, Chunk, Mix, ServingResult, StepCost, Summary, expected_tokens_per_step

_XTOL, _RTOL = 1e-14, 1e-15


@dataclass(frozen=True)
class _State:
    """The mean step at ``r`` prompts per step: ``d`` decodes, step ``tau_s``, a prompt's own
    service time ``ttft_s`` (the steps that carry it), ``x`` requests/s, ``inflight`` sequences."""

    r: float
    d: float
    tau_s: float
    ttft_s: float

    @property
    def x(self) -> float:
        return self.r / self.tau_s

    @property
    def inflight(self) -> float:
        return self.d + self.x * self.ttft_s


@dataclass(frozen=True)
class _Model:
    """A step cost, an engine and a workload, with the step prices memoised by mix."""

    step: StepCost
    engine: EngineConfig
    load: Workload
    draft: StepCost | None = None
    memo: dict = field(default_factory=dict, compare=False, repr=False)

    def price(self, cost: StepCost, mix: Mix) -> float:
        key = (id(cost), mix)
        if key not in self.memo:
            self.memo[key] = cost.step_s(mix)
        return self.memo[key]

    def at(self, fn, n: int) -> float:
        """``fn(n)`` memoised by (function, count): a root search revisits the same neighbours."""
        key = (fn.__name__, n)
        if key not in self.memo:
            self.memo[key] = fn(n)
        return self.memo[key]

    @cached_property
    def e(self) -> float:
        return expected_tokens_per_step(self.engine.acceptance)

    @cached_property
    def cap(self) -> int:
        """The most sequences the engine holds: ``min(max_batch, ⌊KV / (isl + osl)⌋)``."""
        per = self.load.isl + self.load.osl
        cap = min(self.engine.max_batch, self.engine.kv_capacity_tokens // per)
        if cap < 1:
            raise UserError(f"KV capacity {self.engine.kv_capacity_tokens} tokens holds no request of {per} tokens")
        return cap

    def context(self, n: int) -> int:
        """The n decodes' summed cached context at the mean: ``n · (isl + (osl − 2) / 2)``."""
        return n * (2 * self.load.isl + self.load.osl - 2) // 2

    def decode_mix(self, n: int, chunks: tuple[Chunk, ...] = ()) -> Mix:
        return Mix(decodes=n, decode_context=self.context(n), chunks=chunks, draft=self.engine.spec_k)

    def decode_s(self, n: int) -> float:
        """A step of n decodes, plus ``k`` draft forwards over them when a draft model is given."""
        s = self.price(self.step, self.decode_mix(n))
        if self.draft is not None and self.engine.spec_k:
            s += self.engine.spec_k * self.price(self.draft, Mix(decodes=n, decode_context=self.context(n)))
        return s

    def chunks(self, budget: int) -> tuple[Chunk, ...]:
        """The prompt's chunks of at most ``budget`` tokens, after the prefix-cache hits."""
        left, past, out = self.load.prefill_tokens, self.load.hit_tokens, []
        while left > 0:
            t = min(left, budget)
            out.append(Chunk(t, past))
            left, past = left - t, past + t
        return tuple(out)

    def refuse_unchunkable(self) -> None:
        """A prompt longer than the token budget is served only with chunked prefill."""
        need, budget = self.load.prefill_tokens, self.engine.max_num_tokens
        if need > budget and not self.engine.chunked_prefill:
            raise UserError(f"a {need}-token prompt exceeds max_num_tokens {budget} without chunked prefill")

    def prompt_chunks(self, n: int) -> tuple[Chunk, ...]:
        """Mixed steps: the leftover budget after n decodes (chunked), else the whole prompt."""
        need = self.load.prefill_tokens
        if not self.engine.chunked_prefill:
            self.refuse_unchunkable()
            return self.chunks(need)
        left = self.engine.step_tokens - n * (1 + self.engine.spec_k)   # a prompt's chunk: within one batch
        return self.chunks(min(self.engine.max_num_tokens, max(1, left)))

    def prompt_steps(self, n: int) -> int:
        return len(self.prompt_chunks(n))

    def prompt_extra_s(self, n: int) -> float:
        """What a prompt adds to the n-decode steps that carry its chunks (the step's own fixed
        cost excluded): ``Σ_chunks step(decodes + chunk) − step(decodes)``."""
        base = self.price(self.step, self.decode_mix(n))
        return sum(self.price(self.step, self.decode_mix(n, (c,))) - base for c in self.prompt_chunks(n))

    def prefill_batch_s(self, n: int) -> float:
        """SGLang: a prefill-only batch of n prompts (or one long prompt's chunk steps)."""
        need, budget = self.load.prefill_tokens, self.engine.max_num_tokens
        self.refuse_unchunkable()
        if need > budget:
            return sum(self.price(self.step, Mix(chunks=(c,))) for c in self.chunks(budget))
        return self.price(self.step, Mix(chunks=self.chunks(need) * n))

    @property
    def prefill_batch_steps(self) -> int:
        """SGLang: the steps one prefill batch takes (one, or a long prompt's chunk steps)."""
        need, budget = self.load.prefill_tokens, self.engine.max_num_tokens
        return len(self.chunks(budget)) if need > budget else 1

    @property
    def prefill_batch_max(self) -> int:
        """The most prompts of one SGLang prefill batch: whole prompts within the step's token budget
        and, where set, ``max_prefill_tokens`` per batch in flight (``PrefillAdder``'s
        ``rem_chunk_tokens`` and ``rem_input_tokens``), at least one."""
        e = self.engine
        cap = e.step_tokens if e.max_prefill_tokens is None else min(e.step_tokens,
                                                                     e.max_prefill_tokens * e.micro_batches)
        return max(1, cap // self.load.prefill_tokens)


def _lerp(fn, x: float) -> float:
    """``fn`` at a fractional count: linear between the integer neighbours."""
    lo = math.floor(x)
    y = fn(lo)
    return y if x == lo else y + (x - lo) * (fn(lo + 1) - y)


def _state(m: _Model, r: float) -> _State:
    """The mean step at ``r`` prompts per step. Mixed: ``τ = step(d) + r · ΔP(d)`` and a prompt's
    ``m`` chunk steps carry ``max(1, m r)`` prompts' prefill; SGLang: prefill batches of
    ``b = clamp(r N, 1, q)`` prompts, ``τ = step(d) + (r / b) · P(b)``, where it takes in new
    requests once every ``N`` decode steps (``--scheduler-recv-interval``, 1 by default): the
    prompts of ``N`` steps form one batch, and a request sent at the end of a decode step waits
    ``(N − 1) / 2`` decode steps on average before it is taken in (uniformly 0 … N − 1 steps
    before the next take-in), counted in its TTFT. A decoding sequence sees at least itself: steps
    are priced at ``max(d, 1)`` decodes.

    ``R = coupled_ranks`` attention-DP ranks stepping together (each with this load; a step lasts
    as long as the slowest rank's, docs/design/serving.md "Attention-DP ranks step together"), the
    ranks' prompts falling in independent steps. Mixed: a rank's chunk rides a share
    ``u = min(1, m r)`` of its steps, some rank's a share ``U = 1 − (1 − u)^R``, so
    ``τ = step(d) + r · ΔP(d) + (U − u) · ΔP(d) / m``. SGLang: a rank prefills in a share
    ``q = a / (1 + a)`` of the steps (``a = (r / b) · s`` prefill steps per decode step, ``s`` the
    steps of one batch), some rank in ``Q = 1 − (1 − q)^R``, and a decode step that another rank's
    prefill step runs beside lasts that step, ``P(b) / s``: ``τ += (Q − q)(1 + a) · max(P(b) / s −
    step(d), 0)``. Both are the one-rank forms at ``R = 1``. With TensorRT-LLM's attention-DP
    balance (``adp_balance``) the ranks' prompts run in the same steps — the one-rank step — and
    each is held ``H`` steps first (:func:`~perfcast.serving.queueing.balance_hold_steps` at ``r``
    prompts per step per rank): its service time grows by ``H · τ``."""
    d = r * (m.load.osl - 1) / m.e
    n = max(d, 1.0)
    f = _lerp(lambda i: m.at(m.decode_s, i), n)
    ranks = m.engine.coupled_ranks
    if m.engine.policy == "sglang":
        k = m.engine.recv_interval
        b = min(max(r * k, 1.0), m.prefill_batch_max)
        p = _lerp(lambda i: m.at(m.prefill_batch_s, i), b)
        tau = f + r / b * p
        if ranks > 1:   # another rank's prefill step stretches this rank's decode step to its length
            a = r / b * m.prefill_batch_steps
            q = a / (1 + a)
            tau += (1 - (1 - q) ** ranks - q) * (1 + a) * max(p / m.prefill_batch_steps - f, 0.0)
        return _State(r, d, tau, p + (k - 1) / 2 * f)
    extra = _lerp(lambda i: m.at(m.prompt_extra_s, i), n)
    steps = _lerp(lambda i: m.at(m.prompt_steps, i), n)
    tau = f + r * extra
    held, bal = 0.0, m.engine.adp_balance
    if bal is not None:   # TensorRT-LLM's balance: the ranks' prompts together, each held first
        held = balance_hold_steps(r, ranks, *bal)
    elif ranks > 1:   # the chunk steps of every rank: a step carries some rank's chunk with 1 − (1 − u)^R
        u = min(1.0, steps * r)
        tau += (1 - (1 - u) ** ranks - u) * extra / steps
    return _State(r, d, tau, steps * f + extra * max(1.0, steps * r) + held * tau)


def _r_budget(m: _Model) -> float:
    """Mixed steps: the prompt rate whose mean step fills the token budget,
    ``d (1 + k) + r · prefill = max_num_tokens`` with ``d = r (osl − 1) / E``."""
    if m.engine.policy == "sglang":
        return math.inf
    per_r = (m.load.osl - 1) / m.e * (1 + m.engine.spec_k) + m.load.prefill_tokens
    return m.engine.step_tokens / per_r


def _engine_state(m: _Model, cap: float) -> _State:
    """The steady state holding ``cap`` sequences in the engine: the root of
    ``inflight(r) = cap`` (Brent's method, :func:`perfcast.serving.brent.brentq`; ``inflight``
    rises with r), or the token-budget-bound state when the budget fills first."""
    r_hi = min(cap * m.e / (m.load.osl - 1), _r_budget(m))
    top = _state(m, r_hi)
    if top.inflight <= cap:
        return top
    r = brentq(lambda x: _state(m, x).inflight - cap, 0.0, r_hi, xtol=_XTOL, rtol=_RTOL)
    return _state(m, r)


def _flat(x: float) -> Summary:
    return Summary(x, x, x, x)


def _result(m: _Model, st: _State, ttft: Summary, x: float, notes: tuple[str, ...],
            goodput: float | None) -> ServingResult:
    tpot = st.tau_s / m.e
    tail = (m.load.osl - 1) * tpot
    e2e = Summary(ttft.mean + tail, ttft.p50 + tail, ttft.p90 + tail, ttft.p99 + tail)
    per = m.load.isl + m.load.osl
    return ServingResult(
        tier="closed form", ttft_s=ttft, tpot_s=_flat(tpot), itl_s=_flat(tpot), e2e_s=e2e,
        output_tokens_per_s=x * m.load.osl, output_tokens_per_s_per_device=x * m.load.osl / m.engine.devices,
        output_tokens_per_s_per_user=1.0 / tpot, requests_per_s=x, devices=m.engine.devices,
        kv_capacity_tokens=m.engine.kv_capacity_tokens,
        kv_peak_tokens=min(m.engine.kv_capacity_tokens, math.ceil(st.inflight * per)),
        preemptions=0, requests=0, goodput_requests_per_s=goodput, mean_batch=st.inflight,
        notes=_NOTES + notes)


_NOTES = (
    "closed form: mean field at fixed lengths; no requests simulated (requests = 0)",
    "TPOT, ITL: every gap priced at the mean step (prefill work spread evenly); p50 = p90 = p99 = mean",
    "ITL: per verify step divided by E under speculative decoding",
)


def _meets(slo: SLO | None, ttft: float, tpot: float, e2e: float) -> bool:
    bounds = ((slo.ttft_s, ttft), (slo.tpot_s, tpot), (slo.e2e_s, e2e)) if slo else ()
    return all(b is None or v <= b for b, v in bounds)


def closed_loop(step: StepCost, engine: EngineConfig, load: Workload, *, draft: StepCost | None = None,
                slo: SLO | None = None, lag: bool = True) -> ServingResult:
    """``C = load.concurrency`` clients, each sending its next request when the last completes.
    A request sent on a completion reaches the engine ``L = take_in_lag`` steps later (``lag``
    False: ``L = 0``, every request queued from the start): ``L · r`` requests are on their way in
    (Little: ``X · L τ``). The engine holds the rest, ``B = C − L r``, up to ``B_max`` (or fewer when
    the token budget fills first): the root of ``in flight(r) + L r = C``, or the full engine's
    state, the other ``C − B − L r`` waiting ``W = (C − B − L r) / X`` by Little's law on the
    queue. TTFT = W + L τ + the prompt's own steps. Throughput is stated by the closed-loop
    identity ``X = C / (TTFT + (osl − 1) · TPOT)``, exact by construction."""
    if load.concurrency is None:
        raise UserError("a closed loop needs a concurrency")
    m = _Model(step, engine, load, draft)
    c, steps = load.concurrency, engine.take_in_lag if lag else 0
    st = _engine_state(m, m.cap)
    if st.inflight + steps * st.r > c:
        r = brentq(lambda x: _state(m, x).inflight + steps * x - c, 0.0, st.r, xtol=_XTOL, rtol=_RTOL)
        st = _state(m, r)
    wait = max(c - st.inflight - steps * st.r, 0.0) / st.x
    ttft, tpot = wait + steps * st.tau_s + st.ttft_s, st.tau_s / m.e
    x = load.concurrency / (ttft + (load.osl - 1) * tpot)
    good = x if _meets(slo, ttft, tpot, ttft + (load.osl - 1) * tpot) else 0.0
    notes = (f"closed loop C = {load.concurrency}: {st.inflight:.4g} in the engine, admission wait {wait:.4g} s",
             "TTFT: deterministic in the closed loop; p50 = p90 = p99 = mean")
    return _result(m, st, _flat(ttft), x, notes, good if slo else None)


def max_load(step: StepCost, engine: EngineConfig, load: Workload, *,
             draft: StepCost | None = None) -> ServingResult:
    """The saturated throughput trtllm-bench and vLLM's offline throughput benchmark measure (all
    requests queued at t = 0): the closed loop at ``C = B_max``, the batch filled to
    ``min(max_batch, KV capacity)``; any larger C gives the same throughput and a longer TTFT."""
    cap = _Model(step, engine, load).cap
    r = closed_loop(step, engine, replace(load, concurrency=cap, rate_per_s=None), draft=draft, lag=False)
    return replace(r, notes=r.notes + ("max load: latencies of the closed loop at C = B_max",))


def open_loop(step: StepCost, engine: EngineConfig, load: Workload, *, draft: StepCost | None = None,
              slo: SLO | None = None) -> ServingResult:
    """Poisson arrivals at ``λ = load.rate_per_s``. Stable only below the saturated throughput
    ``X_sat`` (:func:`max_load`); at or above it the result is ``stable=False`` with no latencies
    and ``sustainable_rate = X_sat``. Below it the mean field solves ``X(r) = λ`` (equivalently
    ``N = λ · E2E``, Little) and TTFT adds to the prompt's own steps half a mean step (an arrival
    joins at the next step boundary; one step more where the loop runs a step ahead,
    ``take_in_lag − 1/2`` steps) and the admission queue's wait, the engine taken as one
    server of capacity ``X_sat`` with deterministic service: Pollaczek–Khinchine for M/D/1,
    ``W = ρ / (2 X_sat (1 − ρ))``, ``ρ = λ / X_sat`` (Kleinrock 1975, Queueing Systems I, §5.6)."""
    if load.rate_per_s is None:
        raise UserError("an open loop needs a rate")
    m = _Model(step, engine, load, draft)
    sat = _engine_state(m, m.cap)
    lam = load.rate_per_s
    if lam >= sat.x:
        return _unstable(m, sat, lam)
    st = _state(m, brentq(lambda r: _state(m, r).x - lam, 0.0, sat.r, xtol=_XTOL, rtol=_RTOL))
    rho = lam / sat.x
    wait, base, tpot = md1_wait(rho, sat.x), st.ttft_s + (engine.take_in_lag - 0.5) * st.tau_s, st.tau_s / m.e
    good = None
    if slo is not None:
        bounds = ((slo.ttft_s, base), (slo.e2e_s, base + (load.osl - 1) * tpot))
        slack = min((b - v for b, v in bounds if b is not None), default=math.inf)
        good = lam * share_within(slack, wait, rho) if _meets(SLO(tpot_s=slo.tpot_s), 0, tpot, 0) else 0.0
    notes = (f"open loop λ = {lam:.6g}/s at utilisation ρ = {rho:.4g} of X_sat = {sat.x:.6g}/s",
             "TTFT: prompt steps + half a step + M/D/1 wait; percentiles from the wait's exponential tail")
    return _result(m, st, wait_tail(base, wait, rho), lam, notes, good)


def _unstable(m: _Model, sat: _State, lam: float) -> ServingResult:
    """An offered rate at or above ``X_sat``: the queue grows without bound, no finite latency."""
    return ServingResult(
        tier="closed form", ttft_s=None, tpot_s=None, itl_s=None, e2e_s=None,
        output_tokens_per_s=sat.x * m.load.osl, output_tokens_per_s_per_device=sat.x * m.load.osl / m.engine.devices,
        output_tokens_per_s_per_user=m.e / sat.tau_s, requests_per_s=sat.x, devices=m.engine.devices,
        kv_capacity_tokens=m.engine.kv_capacity_tokens,
        kv_peak_tokens=min(m.engine.kv_capacity_tokens, math.ceil(sat.inflight * (m.load.isl + m.load.osl))),
        preemptions=0, requests=0, stable=False, sustainable_rate=sat.x, mean_batch=sat.inflight,
        notes=_NOTES + (f"unstable: λ = {lam:.6g}/s ≥ sustainable {sat.x:.6g}/s; throughput is the saturated one",))


def solve(step: StepCost, engine: EngineConfig, load: Workload, *, draft: StepCost | None = None,
          slo: SLO | None = None) -> ServingResult:
    """The load the workload names: a closed loop (concurrency), an open loop (rate) or max load."""
    if load.concurrency is not None:
        return closed_loop(step, engine, load, draft=draft, slo=slo)
    if load.rate_per_s is not None:
        return open_loop(step, engine, load, draft=draft, slo=slo)
    return max_load(step, engine, load, draft=draft)
