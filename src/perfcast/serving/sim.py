"""The discrete-event serving simulation, one engine step at a time.

Each step the engine's scheduler (:mod:`.policies`) picks the requests to run and their token
counts; they form a :class:`~.types.Mix`; time advances by ``step.step_s(mix)`` (plus the draft
model's cost under speculative decoding); tokens are emitted at the step's end. A request's first
token comes at the end of the step that completes its prefill (vLLM and TRT-LLM sample a token at
the end of the last prefill chunk). Runs of pure-decode steps in which nothing can change — no
request waiting, none finishing, no arrival, the KV blocks at hand — are advanced without
revisiting the scheduler, with one step price per step (memoised by batch and context).

Open-loop overload: when the offered rate exceeds what the deployment sustains the waiting queue
grows without bound; the run is then reported ``stable=False`` with no latencies and
``sustainable_rate`` the completion rate measured at saturation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from perfcast.ir.errors import UserError

from .fastforward import _fast_forward, _finish
from .intake import _Inbox, _Sent
from .kvcache import BlockPool
from .metrics import goodput, per_user_tokens_per_s, request_metrics, summarize, weighted_summary
from .policies import SCHEDULERS, Engine
from .scheduler import SchedulerConfig
from .simtrace import SimTrace
from .types import SLO, Chunk, KVCache, Mix, Samples, ServingResult, StepCost, expected_tokens_per_step
from .workload import Requests, Workload, generate

#: an open-loop run is overloaded when requests still wait at the last arrival (at least this
#: share of the counted ones, and at least 16) and the queueing delay of the last quarter of requests is more
#: than twice that of the first quarter (the queue kept growing over the run)
OVERLOAD_QUEUE_SHARE = 0.05
OVERLOAD_MIN_QUEUE = 16
OVERLOAD_GROWTH = 2.0


@dataclass(frozen=True)
class Speculative:
    """Speculative decoding: ``k`` draft tokens verified per decode step; ``acceptance[i]`` the
    probability that draft position ``i`` is accepted given positions ``0..i−1`` were. The draft
    cost per step is ``k`` sequential ``draft_step`` decode steps, or (MTP, ``draft_step`` None)
    ``k`` extra passes each costing ``draft_fraction`` of the target's decode-only step."""

    k: int
    acceptance: tuple[float, ...]
    draft_step: StepCost | None = None
    draft_fraction: float = 0.0

    def __post_init__(self):
        if not (isinstance(self.k, int) and self.k >= 1):
            raise UserError(f"--speculative-k: expected a positive integer, got {self.k!r}")
        if len(self.acceptance) != self.k or not all(0.0 <= a <= 1.0 for a in self.acceptance):
            raise UserError(f"--acceptance: expected {self.k} probabilities in 0..1 (one per draft position)")
        if self.draft_step is None and not 0.0 <= self.draft_fraction <= 1.0:
            raise UserError("--draft-fraction: expected a share of the target step in 0..1")

    @property
    def expected_tokens_per_step(self) -> float:
        """1 + Σ_i Π_{j≤i} a_j: the bonus token plus each accepted draft."""
        return expected_tokens_per_step(self.acceptance)


class _Run:
    """Bookkeeping of one simulation: clocks per request, ITL gaps, step statistics."""

    def __init__(self, reqs: Requests, trace: bool):
        n = len(reqs.input_length)
        self.n = n
        self.send = np.array(reqs.arrival_s, float)
        self.first_sched = np.full(n, np.nan)
        self.first = np.full(n, np.nan)
        self.finish = np.full(n, np.nan)
        self.last = [0.0] * n
        self.counted = [i >= reqs.warmup for i in range(n)]
        self.itl_v: list = []
        self.itl_w: list = []
        self.steps = 0
        self.seq_steps = 0
        self.decode_emits = 0
        self.decode_slots = 0
        self.done = 0
        self.trace = SimTrace() if trace else None
        self.handed: list | None = None   # an outer loop (disagg) takes each step's finished requests here
        self.ranks = 1                    # engine instances stepped together (coupled attention-DP ranks)
        self.left: list = []              # a fast-forward's completions: (its step in the run, clock, how many)


def simulate(step: StepCost, kv: KVCache, sched: SchedulerConfig, workload: Workload, *, devices: int = 1,
             speculative: Speculative | None = None, slo: SLO | None = None,
             trace: bool = False) -> tuple[ServingResult, SimTrace | None]:
    """Serve ``workload`` on one engine instance priced by ``step``; the result counts the
    non-warm-up requests. Deterministic for the workload's seed."""
    reqs = generate(workload)
    eng = _engine(reqs, kv, sched, workload, speculative)
    run = _Run(reqs, trace)
    rng = np.random.default_rng([workload.seed, 1])
    queue_at_last = _loop(eng, run, step, reqs, workload, speculative, rng)
    return _result(eng, run, reqs, workload, kv, devices, slo, queue_at_last), run.trace


def _engine(reqs: Requests, kv: KVCache, sched: SchedulerConfig, workload: Workload,
            speculative: Speculative | None) -> Engine:
    """One engine instance's state for ``reqs`` (checked to fit its KV cache), with its own blocks."""
    k = speculative.k if speculative else 0
    _check_fits(reqs, kv, sched, k)
    hb = 1
    if reqs.hash_ids is not None:
        if workload.hash_block_tokens % kv.block_size:
            raise UserError(f"--hash-block-tokens: {workload.hash_block_tokens} is not a multiple of the KV block "
                            f"size {kv.block_size}")
        hb = workload.hash_block_tokens // kv.block_size
    return Engine(sched, BlockPool(kv, hb), reqs.input_length, reqs.output_length, reqs.hash_ids,
                  workload.prefix_hit_rate, k, workload.hash_block_tokens)


def _check_fits(reqs: Requests, kv: KVCache, sched: SchedulerConfig, k: int) -> None:
    need = reqs.input_length + reqs.output_length + k
    worst = int(np.argmax(need))
    if kv.blocks_for(int(need[worst])) > kv.blocks:
        raise UserError(f"workload: request {worst} (input_length {reqs.input_length[worst]} + output_length "
                        f"{reqs.output_length[worst]} tokens) can never fit the KV cache of {kv.capacity_tokens} "
                        f"tokens (--kv-capacity)")
    if not sched.chunked_prefill and int(reqs.input_length.max()) > sched.max_num_tokens:
        i = int(np.argmax(reqs.input_length))
        raise UserError(f"--max-num-tokens: {sched.max_num_tokens} is less than request {i}'s input_length "
                        f"{reqs.input_length[i]} and chunked prefill is off")


def _loop(eng: Engine, run: _Run, step: StepCost, reqs: Requests, w: Workload, spec, rng) -> int:
    """Step until every request has finished; returns the waiting queue's length at the last
    arrival (open loop)."""
    schedule = SCHEDULERS[eng.cfg.policy]
    price = _Pricer(step, spec)
    inbox = _Inbox(eng.cfg.recv_interval) if eng.cfg.recv_interval > 1 else None
    queue = eng.waiting if inbox is None else inbox.held
    sent = _Sent(queue, eng.cfg.take_in_lag)
    t, n = 0.0, run.n
    closed = w.closed_loop
    nxt = 0
    queue_at_last = 0
    if closed:
        for i in range(min(w.concurrency, n)):
            run.send[i] = 0.0
            queue.append(i)
        nxt = min(w.concurrency, n)
    arrivals = run.send
    while run.done < n:
        if not closed:
            while nxt < n and arrivals[nxt] <= t:
                sent.arrived(nxt, run.steps)
                nxt += 1
                if nxt == n:
                    queue_at_last = len(eng.waiting) + (len(inbox.held) if inbox else 0) + len(sent.due)
        sent.release(run.steps, idle=not eng.busy)
        if inbox is not None and (inbox.due() or not eng.busy):
            inbox.take(eng)
        if not closed and not eng.running and not eng.waiting:
            t = float(arrivals[nxt])
            continue
        horizon = float(arrivals[nxt]) if not closed and nxt < n else math.inf
        before, t2, steps = run.done, None, run.steps
        if spec is None and not eng.waiting and eng.chunked is None:
            limits = [x for x in (inbox.left() if inbox is not None and inbox.held else None,
                                  sent.left(run.steps)) if x is not None]
            t2 = _fast_forward(eng, run, price, t, horizon, finishes=not closed,
                               max_steps=min(limits) if limits else None, first=closed, lag=sent.lag)
            if t2 is not None:
                t = t2
                if inbox is not None:
                    inbox.decoded(run.steps - steps)
        if t2 is None:
            planned = schedule(eng)
            if not planned:
                raise RuntimeError(f"serving simulation stalled at t={t:.6g}s with {len(eng.waiting)} waiting and "
                                   f"{len(eng.running)} running requests")
            t = _execute(eng, run, planned, price, spec, rng, t)
            if inbox is not None:
                inbox.stepped(planned)
        if closed:  # each finished request's client sends its next one on the output of its last step
            for at, when, k in (run.left if t2 is not None else ((run.steps - steps, t, run.done - before),)):
                for _ in range(k):
                    if nxt < n:
                        run.send[nxt] = when
                        sent.sent_on_output(nxt, steps + at)
                        nxt += 1
    return queue_at_last


class _Pricer:
    """Step prices memoised by mix (the step cost is pure); the draft cost added per decode step."""

    def __init__(self, step: StepCost, spec: Speculative | None):
        self.step, self.spec = step, spec
        self.memo: dict = {}
        self._decode_s = getattr(step, "decode_s", None)   # a decode-only price without a Mix, where the step has one
        self.row = getattr(step, "decode_row", None) if spec is None else None   # (StepModel.decode_row)

    def __call__(self, mix: Mix) -> float:
        s = self.memo.get(mix)
        if s is None:
            s = self.step.step_s(mix) + self._draft(mix)
            if len(self.memo) > 1_000_000:
                self.memo.clear()
            self.memo[mix] = s
        return s

    def decode(self, decodes: int, context: int) -> float:
        key = (decodes, context)
        s = self.memo.get(key)
        if s is None:
            s = self._decode_s(decodes, context) if self._decode_s else self.step.step_s(Mix(decodes, context))
            if len(self.memo) > 1_000_000:
                self.memo.clear()
            self.memo[key] = s
        return s

    def _draft(self, mix: Mix) -> float:
        sp = self.spec
        if sp is None or not mix.decodes:
            return 0.0
        plain = Mix(mix.decodes, mix.decode_context)
        if sp.draft_step is not None:
            return sp.k * sp.draft_step.step_s(plain)
        return sp.k * sp.draft_fraction * self.step.step_s(plain)


def _execute(eng: Engine, run: _Run, planned, price: _Pricer, spec, rng, t: float) -> float:
    """Run one planned step; returns the clock at its end."""
    mix = _mix(eng, planned)
    end = t + price(mix)
    run.steps += 1
    _apply(eng, run, planned, t, end, _accepted(spec, mix.decodes, rng))
    return end


def _mix(eng: Engine, planned) -> Mix:
    """The batch mix of a planned step (decodes and their context, prefill chunks)."""
    comp = eng.comp
    decodes = context = 0
    chunks = []
    for i, n, d in planned:   # (one pass: a scheduled step visits every running request)
        if d:
            decodes += 1
            context += comp[i]
        else:
            chunks.append(Chunk(n, comp[i]))
    return Mix(decodes, context, tuple(chunks), eng.k if decodes else 0)


def _apply(eng: Engine, run: _Run, planned, start: float, t: float, accepted) -> None:
    """The planned step's effect, run from ``start`` to ``t``: tokens computed and emitted (the
    decodes' accepted drafts in ``accepted``; None: no drafts), first tokens, ITL gaps, completions."""
    comp, gen, isl, osl = eng.comp, eng.gen, eng.isl, eng.osl
    first_sched, first, last, counted, itl_v = run.first_sched, run.first, run.last, run.counted, run.itl_v
    acc = accepted.tolist() if accepted is not None else None
    isnan = math.isnan
    gap = itl_v.append
    tr = run.trace
    run.seq_steps += len(planned)
    finished = []
    j = emits = gaps = 0
    # a decoding request has been scheduled and has its first token unless its prompt's KV came from
    # a prefill instance (``prefilled``: its first step and, in the decode clock, token may be this one)
    pre = eng.prefilled
    for i, n, dec in planned:
        g = gen[i]
        if dec:
            j += 1
            if acc is None and not pre[i]:   # (the common case: one token, not the first)
                comp[i] += 1
                emits += 1
                if counted[i]:
                    gap(t - last[i])
                    gaps += 1
                last[i] = t
                g += 1
                gen[i] = g
                if g >= osl[i]:
                    finished.append(i)
                continue
            if pre[i] and isnan(first_sched[i]):
                first_sched[i] = start
            emit = min((acc[j - 1] if acc is not None else 0) + 1, osl[i] - g)
            comp[i] += emit
            emits += emit
            fresh = g == 0 or (pre[i] and isnan(first[i]))
        else:
            if isnan(first_sched[i]):
                first_sched[i] = start
            comp[i] += n
            if comp[i] < isl[i] + g:
                continue
            emit = 1
            if g == 0:
                eng.publish(i)
            fresh = g == 0 or isnan(first[i])
        if fresh:  # (a disaggregated request's first token: from decode)
            first[i] = t
        elif counted[i]:
            gap(t - last[i])
            gaps += 1
        last[i] = t
        g += emit
        gen[i] = g
        if g >= osl[i]:
            finished.append(i)
    run.itl_w.extend([1] * gaps)
    run.decode_emits += emits
    run.decode_slots += j
    if finished:
        _finish(eng, run, finished, t)
    if tr is not None and run.ranks == 1:
        tr.counter(t, len(planned), eng.pool.used * eng.bs, sum(1 for _, _, d in planned if not d), start)


def _accepted(spec: Speculative | None, decodes: int, rng) -> np.ndarray | None:
    """Accepted drafts per decoding sequence: position i counts only if 0..i−1 were accepted; None
    without speculative decoding."""
    if spec is None:
        return None
    if decodes == 0:
        return np.zeros(decodes, np.int64)
    ok = rng.random((decodes, spec.k)) < np.asarray(spec.acceptance)
    return np.cumprod(ok, axis=1).sum(axis=1)


def _result(eng: Engine, run: _Run, reqs: Requests, w: Workload, kv: KVCache, devices: int, slo: SLO | None,
            queue_at_last: int) -> ServingResult:
    sel = np.array(run.counted)
    m = request_metrics(run.send[sel], run.first[sel], run.finish[sel], reqs.output_length[sel])
    dur = m.duration_s
    out_tps = float(m.output_tokens.sum() / dur) if dur > 0 else 0.0
    rps = float(sel.sum() / dur) if dur > 0 else 0.0
    stable, sustainable = True, None
    if not w.closed_loop:
        stable = not _overloaded(run, sel, queue_at_last)
        if not stable:
            fin = np.sort(run.finish[sel])
            sustainable = float((fin.size - 1) / (fin[-1] - fin[0])) if fin[-1] > fin[0] else None
    lat = stable
    tpot = m.tpot[~np.isnan(m.tpot)]
    notes = ["duration: first send to last completion of the counted requests"]
    if not stable:
        notes.append("overloaded: the waiting queue grew over the run; latencies not reported")
    return ServingResult(
        tier="simulation",
        ttft_s=summarize(m.ttft) if lat else None,
        tpot_s=summarize(tpot) if lat else None,
        itl_s=weighted_summary(np.array(run.itl_v), np.array(run.itl_w)) if lat else None,
        e2e_s=summarize(m.e2e) if lat else None,
        output_tokens_per_s=out_tps,
        output_tokens_per_s_per_device=out_tps / devices,
        output_tokens_per_s_per_user=per_user_tokens_per_s(m),   # the decode rate as run (overloaded too)
        requests_per_s=rps,
        devices=devices,
        kv_capacity_tokens=kv.capacity_tokens,
        kv_peak_tokens=eng.pool.peak_used * kv.block_size,
        preemptions=eng.preemptions,
        requests=int(sel.sum()),
        goodput_requests_per_s=goodput(m, slo) if slo is not None and lat else None,
        stable=stable,
        sustainable_rate=sustainable,
        mean_batch=run.seq_steps / run.steps if run.steps else None,
        notes=tuple(notes),
        steps=run.steps,
        decode_tokens_per_step=run.decode_emits / run.decode_slots if run.decode_slots else None,
        samples=Samples(tuple(m.ttft.tolist()), tuple(tpot.tolist())) if lat else None,
    )


def _overloaded(run: _Run, sel: np.ndarray, queue_at_last: int) -> bool:
    """The queue kept growing: requests still waiting at the last arrival and the queueing
    delay (send to first scheduled) rising from the first quarter of the run to the last."""
    counted = int(sel.sum())
    if queue_at_last < max(OVERLOAD_MIN_QUEUE, OVERLOAD_QUEUE_SHARE * counted):
        return False
    wait = (run.first_sched - run.send)[sel]
    q = max(1, wait.size // 4)
    return float(wait[-q:].mean()) > OVERLOAD_GROWTH * float(wait[:q].mean()) + 1e-12
