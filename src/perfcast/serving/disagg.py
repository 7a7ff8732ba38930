"""Disaggregated serving in the event simulation: x prefill instances, y decode instances.

The flow of TensorRT-LLM's disaggregated server (``tensorrt_llm/serve/openai_disagg_service.py``
``_send_disagg_request_ctx_first``), Dynamo's and SGLang PD's:

1. the request is routed to a prefill instance — round robin by default (TRT-LLM
   ``tensorrt_llm/serve/router.py`` ``RoundRobinRouter``), or the least loaded one (its
   ``LoadBalancingRouter``: fewest requests in flight);
2. it is prefilled there as a context-only request of one output token: the prefill instance
   samples the FIRST token (TRT-LLM ``context_only`` requests return it; the server forwards it as
   ``first_gen_tokens``); the prefill instance then frees its blocks;
3. its KV cache moves to a decode instance chosen when the prefill ends (round robin or least
   loaded) in ``transfer_s(input_length)`` seconds (the caller prices it with
   :func:`.transfer.kv_transfer`). A decode instance's inbound transfers are serialised — one
   link, first come first served: a transfer starts when both the prefill has ended and the
   previous transfer into that instance has arrived;
4. it queues at the decode instance, which admits it per its scheduler when its KV cache has
   room (blocks for the prompt, no prefill compute: ``Engine.prefilled``), and decodes the
   remaining ``osl − 1`` tokens there. A request of one output token ends at step 2.

Clocks (``vllm bench serve`` definitions, :mod:`.metrics`): by default (``first_token="decode"``,
:data:`FIRST_TOKEN`) the client receives the first token with the decode instance's first step,
so TTFT = prefill + transfer + the decode queue + that step; with ``first_token="prefill"`` TTFT
is the prefill step's end and the transfer and the decode queue delay the SECOND token (they add to
E2E, to the first ITL gap and to TPOT by ``transfer / (osl − 1)``). One global event loop advances all
instances: a heap of arrivals, transfer arrivals, step ends and scheduling points; each instance
runs :mod:`.sim`'s step machinery unchanged.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, replace
from typing import Callable

import numpy as np

from perfcast.ir.errors import UserError

from . import decode_pass
from .fastforward import _fast_forward
from .kvcache import BlockPool
from .policies import SCHEDULERS, Engine, admit_trtllm
from .queueing import check_router
from .scheduler import SchedulerConfig
from .sim import Speculative, _execute, _Pricer, _result, _Run
from .simtrace import SimTrace, SimTraces
from .types import SLO, KVCache, ServingResult, StepCost
from .workload import Requests, Workload, generate

#: Where the client's first token comes from: ``decode`` — the decode instance streams it with its
#: first decode step's token (TensorRT-LLM's disaggregated server sends the context request with
#: ``stream: False`` and streams the generation server's response,
#: ``tensorrt_llm/serve/openai_disagg_service.py``; Dynamo's and vLLM's P/D proxies stream from the
#: decode worker too); ``prefill`` — at the prefill step's end (a server that streams it at once).
FIRST_TOKEN = ("decode", "prefill")

#: run the prefill pool first and each decode instance after it where that is exact (``_Loop.split``)
SPLIT = True
_ARRIVE, _KV, _END, _READY = 0, 1, 2, 3   # event kinds; same-time order: arrivals, step ends, steps


@dataclass(frozen=True)
class PoolSpec:
    """One pool: ``instances`` engine instances, each priced by ``step`` with its own KV cache
    ``kv`` and scheduler ``sched``, each spanning ``devices_per_instance`` devices."""

    step: StepCost
    kv: KVCache
    sched: SchedulerConfig
    instances: int = 1
    devices_per_instance: int = 1

    def __post_init__(self):
        for name in ("instances", "devices_per_instance"):
            v = getattr(self, name)
            if not (isinstance(v, int) and v >= 1):
                raise UserError(f"pool {name}: expected a positive integer, got {v!r}")


class _Instance:
    """One engine instance in the outer loop: its engine, its pool's bookkeeping, its link."""

    def __init__(self, name: str, eng: Engine, run: _Run, price: _Pricer, decode: bool, trace: bool):
        self.name, self.eng, self.run, self.price, self.decode = name, eng, run, price, decode
        self.busy = False          # a step in progress or a scheduling point queued
        self.handed: list[int] = []
        self.trace = SimTrace(name=name) if trace else None
        self.link_free = 0.0       # when the last inbound transfer arrives (decode instances)
        self.inbound = 0           # transfers under way into this instance
        self.joins: list = []      # a split run's transfer arrivals, kept for its second pass
        self.joined = 0            # transfers arrived
        self.sent_by_last = 0      # transfers started before the last arrival
        self.queue_at_last: int | None = None   # a split run's queue at the last arrival

    def queued(self) -> int:
        """Requests handed to this decode instance before the last arrival and not yet admitted
        (a split run's second pass, between its events)."""
        return len(self.eng.waiting) + self.sent_by_last - self.joined

    def load(self) -> int:
        """Requests routed here and not yet answered (TensorRT-LLM's ``LoadBalancingRouter``),
        ``handed`` included: a step's finished requests leave at its end, not when it is planned."""
        return len(self.eng.waiting) + len(self.eng.running) + len(self.handed) + self.inbound


def simulate_disagg(prefill: PoolSpec, decode: PoolSpec, workload: Workload, *,
                    transfer_s: Callable[[int], float], speculative: Speculative | None = None,
                    slo: SLO | None = None, trace: bool = False,
                    router: str = "round_robin", first_token: str = "decode"
                    ) -> tuple[ServingResult, SimTraces | None]:
    """Serve ``workload`` on the two pools; ``transfer_s(input_length)`` prices one request's KV
    transfer. Speculative decoding runs on the decode pool. Deterministic for the seed."""
    if first_token not in FIRST_TOKEN:
        raise UserError(f"first token: expected one of {', '.join(FIRST_TOKEN)}, got {first_token!r}")
    check_router(router)
    reqs = generate(workload)
    _check(reqs, prefill, decode, speculative.k if speculative else 0)
    loop = _Loop(prefill, decode, workload, reqs, transfer_s, speculative, router, trace)
    loop.first_from_decode = first_token == "decode"
    loop.run()
    traces = SimTraces(tuple(x.trace for x in loop.pre + loop.dec)) if trace else None
    if traces is not None:
        loop.draw_spans()
    return loop.result(slo), traces


def _check(reqs: Requests, prefill: PoolSpec, decode: PoolSpec, k: int) -> None:
    isl, osl = reqs.input_length, reqs.output_length
    i = int(np.argmax(isl))
    if prefill.kv.blocks_for(int(isl[i]) + 1) > prefill.kv.blocks:
        raise UserError(f"workload: request {i} (input_length {isl[i]}) can never fit a prefill instance's KV cache "
                        f"of {prefill.kv.capacity_tokens} tokens (the prefill pool's --kv-capacity)")
    if not prefill.sched.chunked_prefill and int(isl[i]) > prefill.sched.max_num_tokens:
        raise UserError(f"--max-num-tokens: the prefill pool's {prefill.sched.max_num_tokens} is less than request "
                        f"{i}'s input_length {isl[i]} and chunked prefill is off")
    need = isl + osl + k
    j = int(np.argmax(need))
    if decode.kv.blocks_for(int(need[j])) > decode.kv.blocks:
        raise UserError(f"workload: request {j} (input_length {isl[j]} + output_length {osl[j]} tokens) can never "
                        f"fit a decode instance's KV cache of {decode.kv.capacity_tokens} tokens (the decode pool's "
                        f"--kv-capacity)")


class _Loop:
    """The global event loop over both pools' instances."""

    def __init__(self, prefill: PoolSpec, decode: PoolSpec, w: Workload, reqs: Requests, transfer_s, spec,
                 router: str, trace: bool):
        self.w, self.reqs, self.transfer_s, self.spec, self.router = w, reqs, transfer_s, spec, router
        self.pools = (prefill, decode)
        n = self.n = len(reqs.input_length)
        self.isl, self.osl = [int(x) for x in reqs.input_length], [int(x) for x in reqs.output_length]
        self.pre_run, self.dec_run = _Run(reqs, False), _Run(reqs, False)
        self.dec_run.send = self.pre_run.send           # one client: the same send times
        self.pre = [self._prefill_instance(prefill, j, trace) for j in range(prefill.instances)]
        dprice = _Pricer(decode.step, spec)
        k = spec.k if spec else 0
        self.dec = [_Instance(f"decode {j}", Engine(decode.sched, BlockPool(decode.kv), self.isl, self.osl, None,
                                                      0.0, k, w.hash_block_tokens), self.dec_run, dprice, True, trace)
                    for j in range(decode.instances)]
        self.rng = np.random.default_rng([w.seed, 1])
        self.heap, self.seq, self.rr = [], 0, [0, 0]   # events; their order at equal times; round robin
        self.nxt = self.done = self.queue_at_last = 0
        # a decode instance may run on through its completions when they change nothing elsewhere
        # meanwhile: no client sends on them (open loop) and no router reads the instance's load
        self.through_finishes = not w.closed_loop and (router == "round_robin" or decode.instances == 1)
        # then no decode instance acts on another or the prefill pool (nor shares a random stream)
        self.split = SPLIT and self.through_finishes and (spec is None or decode.instances == 1)
        self.last_arrival = math.inf if w.closed_loop else float(reqs.arrival_s[-1])
        self._tx: dict[int, float] = {}                  # transfer seconds by prompt length
        self.tmin = max(0.0, min(self._transfer(v) for v in set(self.isl)))   # the shortest transfer any request can have
        self.where = np.zeros((n, 2), np.int64)         # prefill and decode instance of each request
        self.xfer = np.full((n, 2), np.nan)             # transfer start and arrival

    def _prefill_instance(self, pool: PoolSpec, j: int, trace: bool) -> _Instance:
        w, hb = self.w, 1
        if self.reqs.hash_ids is not None:
            if w.hash_block_tokens % pool.kv.block_size:
                raise UserError(f"--hash-block-tokens: {w.hash_block_tokens} is not a multiple of the prefill "
                                f"pool's KV block size {pool.kv.block_size}")
            hb = w.hash_block_tokens // pool.kv.block_size
        eng = Engine(pool.sched, BlockPool(pool.kv, hb), self.isl, [1] * self.n, self.reqs.hash_ids,
                     w.prefix_hit_rate, 0, w.hash_block_tokens)
        return _Instance(f"prefill {j}", eng, self.pre_run, _Pricer(pool.step, None), False, trace)

    # -- events ------------------------------------------------------------------------------------

    def _push(self, t: float, kind: int, a, b=None) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, kind, self.seq, a, b))

    def _wake(self, x: _Instance, t: float) -> None:
        if not x.busy:
            x.busy = True
            self._push(t, _READY, x)

    def run(self) -> None:
        """Every event in time order; split (:attr:`split`): the prefill pool first, then each
        decode instance alone over its known arrivals (:mod:`.decode_pass` where it applies)."""
        w, n = self.w, self.n
        if w.closed_loop:
            for _ in range(min(w.concurrency, n)):
                self._send(0.0)
        else:
            self._push(float(self.pre_run.send[0]), _ARRIVE, 0)
        self._drain()
        if self.split:
            for y in self.dec:
                if decode_pass.applies(self, y):
                    decode_pass.run(self, y)
                else:
                    self.heap, y.joins = y.joins, []   # (pushed in time order: already a heap)
                    self._drain(y)
                self.queue_at_last += y.queue_at_last if y.queue_at_last is not None else y.queued()
        if self.done < n:
            raise RuntimeError(f"disaggregated simulation stalled with {n - self.done} requests unfinished")

    def _drain(self, y: _Instance | None = None) -> None:
        """The heap's events; ``y``: a split run's decode instance (its queue at the last arrival
        taken before its first event at or after it)."""
        n, last = self.n, self.last_arrival
        while self.heap:
            t, kind, _, a, b = heapq.heappop(self.heap)
            if y is not None and y.queue_at_last is None and t >= last:
                y.queue_at_last = y.queued()
            if kind == _ARRIVE:
                self._send(t)
                if self.nxt < n:
                    self._push(float(self.pre_run.send[self.nxt]), _ARRIVE, self.nxt)
                else:
                    self.queue_at_last = sum(len(x.eng.waiting) + x.inbound
                                             for x in self.pre + ([] if self.split else self.dec))
                    for x in self.dec:            # (a split run counts the decode queues in its second pass)
                        x.sent_by_last = x.inbound
            elif kind == _KV:
                self._join(a, b, t)
            elif kind == _END:
                self._end(a, t)
            else:
                self._step(a, t)

    def _horizon(self, y: _Instance) -> float:
        """The earliest time a request can join decode instance ``y``'s queue: a transfer into
        ``y`` already under way, or one a pending event can still cause — a prefill step (running or
        to come, after an arrival or a closed-loop client's next send) ends no earlier than its
        event, and its transfer starts no earlier than ``y``'s link is free and lasts at least the
        shortest prompt's. A transfer into another instance never reaches ``y``; in an open loop,
        neither does another decode instance's step (its completions send nothing). In a split
        run's second pass the heap holds ``y``'s own arrivals only: the next one is the horizon."""
        if self.split:
            return self.heap[0][0] if self.heap else math.inf
        h, free, tmin = math.inf, y.link_free, self.tmin
        closed = self.w.closed_loop
        for te, kind, _, a, b in self.heap:
            if kind == _KV:
                if b is y and te < h:
                    h = te
            elif kind == _ARRIVE or closed or not a.decode:
                h = min(h, max(te, free) + tmin)
        return h

    def _transfer(self, isl: int) -> float:
        s = self._tx.get(isl)
        if s is None:
            s = self._tx[isl] = float(self.transfer_s(isl))
        return s

    def _pick(self, pool: list[_Instance], side: int) -> _Instance:
        if self.router == "least_loaded":
            return min(pool, key=_Instance.load)
        x = pool[self.rr[side] % len(pool)]
        self.rr[side] += 1
        return x

    def _send(self, t: float) -> None:
        """The client sends request ``nxt`` now; it is routed to a prefill instance."""
        i = self.nxt
        self.nxt += 1
        self.pre_run.send[i] = t
        x = self._pick(self.pre, 0)
        self.where[i, 0] = self.pre.index(x)
        x.eng.waiting.append(i)
        self._wake(x, t)

    def _step(self, x: _Instance, t: float) -> None:
        """A scheduling point of instance ``x``: plan and run its next step, or go idle."""
        eng, run = x.eng, x.run
        if not eng.running and not eng.waiting:
            x.busy = False
            return
        run.trace, run.handed = x.trace, x.handed
        if x.decode and self.spec is None and eng.chunked is None:
            t2 = None
            if not eng.waiting:
                t2 = _fast_forward(eng, run, x.price, t, self._horizon(x), finishes=self.through_finishes)
            elif eng.cfg.policy == "trtllm":
                # TRT-LLM admits before it plans, and a decode instance's requests all decode:
                # after admission the step is a pure decode step, the first of a run that stops
                # before a completion frees a slot while requests still wait
                admit_trtllm(eng)
                t2 = _fast_forward(eng, run, x.price, t, self._horizon(x),
                                   finishes=self.through_finishes and not eng.waiting, min_steps=1)
            if t2 is not None:
                self._push(t2, _END, x)
                return
        planned = SCHEDULERS[eng.cfg.policy](eng)
        if not planned:
            raise RuntimeError(f"{x.name} stalled at t={t:.6g}s with {len(eng.waiting)} waiting and "
                               f"{len(eng.running)} running requests")
        self._push(_execute(eng, run, planned, x.price, self.spec if x.decode else None, self.rng, t), _END, x)

    def _end(self, x: _Instance, t: float) -> None:
        """Instance ``x``'s step ended at ``t``: hand its finished requests on, then step again."""
        fin = x.handed[:]
        x.handed.clear()
        for i in fin:
            if x.decode:   # (a fast-forward's completions ended before its last step)
                self._complete(i, float(x.run.finish[i]))
            else:
                self._handoff(i, t)
        self._push(t, _READY, x)

    def _handoff(self, i: int, t: float) -> None:
        """Request ``i``'s prefill (and first token) ended at ``t``: its KV moves to a decode
        instance over that instance's link, after the transfers queued before it."""
        d = self.dec_run
        d.last[i] = t
        if not self.first_from_decode or self.osl[i] == 1:
            d.first[i] = t
        if self.osl[i] == 1:
            d.first_sched[i] = t
            self._complete(i, t)
            return
        y = self._pick(self.dec, 1)
        self.where[i, 1] = self.dec.index(y)
        start = max(t, y.link_free)
        y.link_free = start + self._transfer(self.isl[i])
        y.inbound += 1
        self.xfer[i] = (start, y.link_free)
        if self.split:
            self.seq += 1
            y.joins.append((y.link_free, _KV, self.seq, i, y))
        else:
            self._push(y.link_free, _KV, i, y)

    def _join(self, i: int, y: _Instance, t: float) -> None:
        """Request ``i``'s KV arrived at decode instance ``y``: its prompt is computed, its first
        token emitted; it queues for admission."""
        e = y.eng
        e.comp[i], e.gen[i], e.prefilled[i] = self.isl[i], 1, True
        y.inbound -= 1
        y.joined += 1
        e.waiting.append(i)
        self._wake(y, t)

    def _complete(self, i: int, t: float) -> None:
        self.dec_run.finish[i] = t
        self.done += 1
        if self.w.closed_loop and self.nxt < self.n:   # its client sends the next request now
            self._send(t)

    # -- report ------------------------------------------------------------------------------------

    def result(self, slo: SLO | None) -> ServingResult:
        prefill, decode = self.pools
        devices = prefill.instances * prefill.devices_per_instance + decode.instances * decode.devices_per_instance
        d, p = self.dec_run, self.pre_run
        res = _result(self.dec[0].eng, d, self.reqs, self.w, decode.kv, devices, slo, self.queue_at_last)
        clock = ("TTFT: the first token streamed with the decode instance's first step (after the prefill, the KV "
                 "transfer and the decode queue)" if self.first_from_decode else
                 "TTFT ends with the prefill step; the KV transfer and the decode queue delay the second token "
                 "(E2E, TPOT, ITL)")
        notes = (f"disaggregated {prefill.instances}P{decode.instances}D, {self.router} routing; {clock}",
                 "kv_capacity_tokens, kv_peak_tokens: one decode instance's (the peak over the decode instances); "
                 "mean_batch: sequences per decode step; steps: both pools'",
                 f"prefill pool: {p.steps} steps, {p.seq_steps / p.steps if p.steps else 0:.4g} prompts per step")
        return replace(res, kv_peak_tokens=max(x.eng.pool.peak_used for x in self.dec) * decode.kv.block_size,
                       preemptions=sum(x.eng.preemptions for x in self.pre + self.dec), steps=p.steps + d.steps,
                       notes=res.notes + notes)

    def draw_spans(self) -> None:
        """Each request's phases on the instances that ran them: queued and prefill on its prefill
        instance; transfer queued (behind earlier transfers on the link), transfer, queued and
        decode on its decode instance."""
        p, d = self.pre_run, self.dec_run
        for i in range(self.n):
            x = self.pre[self.where[i, 0]]
            for phase, a, b in (("queued", p.send[i], p.first_sched[i]), ("prefill", p.first_sched[i], p.first[i])):
                x.trace.spans.append((i, phase, float(a), float(b)))
            if self.osl[i] == 1:
                continue
            y = self.dec[self.where[i, 1]]
            start, arrive = self.xfer[i]
            for phase, a, b in (("transfer queued", p.first[i], start), ("transfer", start, arrive),
                                ("queued", arrive, d.first_sched[i]), ("decode", d.first_sched[i], d.finish[i])):
                if b > a or phase in ("transfer", "decode"):
                    y.trace.spans.append((i, phase, float(a), float(b)))
