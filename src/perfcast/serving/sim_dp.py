"""Attention-data-parallel ranks of one MoE engine, simulated together.

With attention DP an MoE model's data-parallel ranks are not independent engine instances: every
forward pass runs the expert layers over all the ranks' tokens, so the ranks step together.
vLLM: "Forward passes must be aligned, and expert layers across all ranks are required to
synchronize during every forward pass ... empty 'dummy' forward passes are performed in all ranks
that don't currently have any requests scheduled" (docs/serving/data_parallel_deployment.md), and
``GPUModelRunner.get_dp_padding`` pads every rank's step to the most tokens any rank runs. SGLang:
``Scheduler.prepare_mlp_sync_batch`` gathers every rank's token count each step and an idle rank
runs an idle batch. TensorRT-LLM: ``PyExecutor`` with ``enable_attention_dp`` gathers the ranks'
states every iteration and the MoE exchanges every rank's tokens.

So one step of the engine is one step of every rank, and it lasts as long as the slowest: a rank
whose step carries a prefill chunk holds up the decodes of all the others. Each rank keeps its own
scheduler, KV cache and waiting queue (:mod:`.policies`); the step's price is the highest of the
ranks' own prices, each rank's mix priced as if every rank ran it (:class:`~.types.StepCost` prices
a symmetric step). That is vLLM's padding exactly; for SGLang and TensorRT-LLM, which exchange the
ranks' real token counts, it over-counts the expert layers' share of a step in which the ranks'
counts differ.

Requests go to ranks by the engine's data-parallel balancer (``SchedulerConfig.dp_balance``, from
the profile): ``round_robin`` in turn, ``least_loaded`` to the rank with the fewest unfinished
requests (first on ties). Runs of steps in which every busy rank only decodes — nothing waiting on
any rank, no arrival before the run's horizon — are fast-forwarded together
(:meth:`_Coupled._fast_forward`): each rank's run is planned and priced as one engine's
(:class:`~.fastforward._Decoding`), each step lasts its slowest rank's price, and a run stops at the
first rank's limit (the step of a completion in a closed loop, its KV blocks, a take-in), a rank
whose batch empties (an open loop) dropping out. Equal, figure for figure, to stepping every rank
through its scheduler (``tests/test_serving_dp_fastforward.py``); a traced run is stepped (its
counters are per step).

TensorRT-LLM's ``attention_dp_config.enable_balance`` (``SchedulerConfig.adp_balance``: off by
default, on in InferenceX's attention-DP scripts) holds the context requests of a step back on every
rank unless every rank has some and a free slot (``PyExecutor._balance_adp_requests``,
tensorrt_llm/_torch/pyexecutor/py_executor.py): a step in which they are not all ready counts
towards ``timeout_iters``, after which (or when some rank has no generation request) they go; when
they are all ready and every rank also has generation requests, they wait ``batching_wait_iters``
steps more. The prompts of the ranks then run in the same steps, so one rank's prefill holds the
others up only while they prefill too.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from .fastforward import _Decoding
from .intake import _Inbox, _Sent
from .policies import SCHEDULERS, Engine
from .scheduler import SchedulerConfig
from .sim import Speculative, _accepted, _apply, _engine, _mix, _Pricer, _result, _Run
from .types import SLO, KVCache, ServingResult, StepCost
from .workload import Workload, generate


def simulate_coupled(step: StepCost, kv: KVCache, sched: SchedulerConfig, workload: Workload, ranks: int, *,
                     devices: int = 1, speculative: Speculative | None = None, slo: SLO | None = None,
                     trace: bool = False) -> tuple[ServingResult, object]:
    """Serve ``workload`` (the whole deployment's) on ``ranks`` coupled attention-DP ranks, each with
    the KV cache ``kv``; ``devices`` per rank. The result is the deployment's: throughput over all
    ranks, KV figures and the mean batch per rank. Deterministic for the workload's seed."""
    reqs = generate(workload)
    engs = [_engine(reqs, kv, sched, workload, speculative) for _ in range(ranks)]
    run = _Run(reqs, trace)
    run.ranks = ranks
    rng = np.random.default_rng([workload.seed, 1])
    queue_at_last = _Coupled(engs, run, step, workload, speculative, rng).loop()
    r = _result(engs[0], run, reqs, workload, kv, devices * ranks, slo, queue_at_last)
    notes = r.notes + (f"{ranks} attention-DP ranks stepped together: each step lasts as long as the slowest "
                       f"rank's; requests given to ranks {sched.dp_balance.replace('_', ' ')}",)
    return replace(r, kv_peak_tokens=max(e.pool.peak_used for e in engs) * kv.block_size,
                   preemptions=sum(e.preemptions for e in engs),
                   mean_batch=None if r.mean_batch is None else r.mean_batch / ranks, notes=notes), run.trace


class _Coupled:
    """The coupled ranks' loop: route, take in, schedule every rank, price, apply."""

    def __init__(self, engs: list[Engine], run: _Run, step: StepCost, w: Workload, spec, rng):
        self.engs, self.run, self.w, self.spec, self.rng = engs, run, w, spec, rng
        cfg = engs[0].cfg
        self.price = _Pricer(step, spec)
        self.schedule = SCHEDULERS[cfg.policy]
        self.inboxes = [_Inbox(cfg.recv_interval) if cfg.recv_interval > 1 else None for _ in engs]
        self.sent = [_Sent(e.waiting if b is None else b.held, cfg.take_in_lag) for e, b in zip(engs, self.inboxes)]
        self.active = [0] * len(engs)          # unfinished requests given to each rank
        self.turn = 0
        self.least = cfg.dp_balance == "least_loaded"
        self.balance = cfg.adp_balance
        self.ctx_waiting = self.ctx_batching = 0   # TensorRT-LLM's adp_ctx_{waiting,batching_wait}_iters_count
        self.forwards = spec is None and run.trace is None
        self.left: list = []   # a closed loop's fast-forward: its completions, (step in the run, clock, [(rank, how many)])

    def _route(self, i: int) -> int:
        """The rank request ``i`` goes to (the engine's balancer)."""
        if self.least:
            r = min(range(len(self.engs)), key=self.active.__getitem__)
        else:
            r = self.turn
            self.turn = (r + 1) % len(self.engs)
        self.active[r] += 1
        return r

    def loop(self) -> int:
        """Step until every request has finished; the waiting requests at the last arrival (open loop)."""
        run, w, engs = self.run, self.w, self.engs
        n, t, nxt, queue_at_last = run.n, 0.0, 0, 0
        closed = w.closed_loop
        if closed:
            nxt = min(w.concurrency, n)
            for i in range(nxt):
                run.send[i] = 0.0
                self.sent[self._route(i)].queue.append(i)
        while run.done < n:
            if not closed:
                while nxt < n and run.send[nxt] <= t:
                    self.sent[self._route(nxt)].arrived(nxt, run.steps)
                    nxt += 1
                    if nxt == n:
                        queue_at_last = sum(len(e.waiting) + len(s.due) for e, s in zip(engs, self.sent)) + sum(
                            len(b.held) for b in self.inboxes if b is not None)
            for e, s, b in zip(engs, self.sent, self.inboxes):
                s.release(run.steps, idle=not e.busy)
                if b is not None and (b.due() or not e.busy):
                    b.take(e)
            if not closed and not any(e.busy for e in engs):
                t = float(run.send[nxt])
                continue
            before, t2, steps = run.done, None, run.steps
            if self.forwards and not any(e.waiting or e.chunked is not None for e in engs):
                t2 = self._fast_forward(t, float(run.send[nxt]) if not closed and nxt < n else math.inf, not closed)
            t = self._step(t) if t2 is None else t2
            if closed:   # each finished request's client sends its next one on the output of its last step
                for at, when, left in (self.left if t2 is not None else ((run.steps - steps, t, ()),)):
                    for r, k in left:   # (a fast-forward's: step by step, each step's leavers counted off first)
                        self.active[r] -= k
                    for _ in range(sum(k for _, k in left) if t2 is not None else run.done - before):
                        if nxt < n:
                            run.send[nxt] = when
                            self.sent[self._route(nxt)].sent_on_output(nxt, steps + at)
                            nxt += 1
        return queue_at_last

    def _step(self, t: float) -> float:
        run, engs = self.run, self.engs
        planned = [self.schedule(e) if e.busy else [] for e in engs]
        if self.balance is not None:
            planned = self._balanced(planned)
        if not any(planned):
            raise RuntimeError(f"serving simulation stalled at t={t:.6g}s with "
                               f"{sum(len(e.waiting) for e in engs)} waiting and "
                               f"{sum(len(e.running) for e in engs)} running requests")
        mixes = [_mix(e, p) if p else None for e, p in zip(engs, planned)]
        end = t + max(self.price(m) for m in mixes if m is not None)
        run.steps += 1
        for r, (e, p, m) in enumerate(zip(engs, planned, mixes)):
            if not p:
                continue
            before = run.done
            _apply(e, run, p, t, end, _accepted(self.spec, m.decodes, self.rng))
            self.active[r] -= run.done - before
            if self.inboxes[r] is not None:
                self.inboxes[r].stepped(p)
        tr = run.trace
        if tr is not None:
            tr.counter(end, sum(map(len, planned)), sum(e.pool.used * e.bs for e in engs),
                       sum(1 for p in planned for _, _, d in p if not d), t)
        return end

    def _fast_forward(self, t: float, horizon: float, finishes: bool) -> float | None:
        """Every busy rank's run of pure-decode steps, stepped together (the module's docstring);
        None where some busy rank has none. In a closed loop (not ``finishes``) it stops the take-in
        lag after the step of the first completion (its client's next request joins no earlier);
        :attr:`left` then holds the run's completions by step, for the clients to send on."""
        run, engs = self.run, self.engs
        limits = [x for s in self.sent if (x := s.left(run.steps)) is not None]
        limits += [b.left() for b in self.inboxes if b is not None and b.held]
        cap = min(limits) if limits else None
        plans = []
        # past the first completion only while every rank runs: a request sent to an idle rank joins at once
        lag = not finishes and all(e.running for e in engs)
        for r, e in enumerate(engs):
            if e.running:
                d = _Decoding.plan(e, run, self.price, finishes, max_steps=cap, first=not finishes,
                                   lag=self.sent[r].lag if lag else 0)
                if d is None:
                    return None
                plans.append((r, d))
        # the run's length: the first limit any rank reaches; a rank whose batch empties drops out
        m = min((d.m for _, d in plans if not d.empties), default=max(d.m for _, d in plans))
        t0, times = t, []
        while len(times) < m:
            prices = [p for _, d in plans if (p := d.next_price()) is not None]
            t += max(prices)
            times.append(t)
            if t >= horizon:
                break
        left: dict = {}
        for r, d in plans:
            before = run.done
            d.apply(times[:len(d.batches)], t0)
            if finishes:
                self.active[r] -= run.done - before
            for at, when, k in run.left:   # (a closed loop's: counted off as the clients send, by step)
                left.setdefault((at, when), []).append((r, k))
            b = self.inboxes[r]
            if b is not None:
                b.decoded(len(d.batches))
        run.steps += len(times)
        self.left = [(at, when, ks) for (at, when), ks in sorted(left.items())]
        if self.balance is not None:   # _balanced's counter: every step without a prompt counts
            timeout = self.balance[1]
            full = min(len(d.batches) for _, d in plans) if len(plans) == len(engs) else 0
            w = (self.ctx_waiting + full) % timeout if timeout > 0 else 0
            self.ctx_waiting = w if full == len(times) else 0
        return t

    def _balanced(self, planned: list) -> list:
        """``PyExecutor._balance_adp_requests``: every rank's context requests, or none of them."""
        wait, timeout = self.balance
        ctx = [any(not d for _, _, d in p) for p in planned]
        gen = [sum(1 for _, _, d in p if d) for p in planned]
        cap = self.engs[0].cfg.max_num_seqs
        hold = False
        if all(ctx) and (cap is None or all(g < cap for g in gen)):
            self.ctx_waiting = 0
            if all(gen):
                if self.ctx_batching < wait:
                    self.ctx_batching += 1
                    hold = True
                else:
                    self.ctx_batching = 0
        else:
            self.ctx_waiting += 1
            hold = True
            if self.ctx_waiting >= timeout or not all(gen):
                self.ctx_waiting = 0
                hold = False
        return [[x for x in p if x[2]] for p in planned] if hold else planned

