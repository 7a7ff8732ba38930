"""The three engines' ``schedule``: which requests run in the next step, and how many tokens each.

A request of ``P`` prompt tokens that has generated ``g`` tokens and has ``c`` tokens in the KV
cache still needs ``P + g − c`` tokens computed before it emits its next token: the whole prompt
at first (in chunks), one token while decoding (``1 + k`` verified under speculative decoding),
the prompt and its output again after a preemption (vLLM recompute, SGLang retract). A step
emits a token for every request whose computed tokens reach ``P + g``.

- :func:`schedule_vllm` — vLLM v1 ``Scheduler.schedule`` (vllm/v1/core/sched/scheduler.py): one
  budget of ``max_num_tokens``; RUNNING requests first in admission order, each allocating the
  blocks its new tokens need, preempting the newest running request (``self.running.pop()``) when
  blocks run out; then WAITING requests FCFS while the budget and ``max_num_seqs`` allow, a prompt
  chunked to the budget left (whole, or not at all, with chunked prefill off); none admitted in a
  step that preempted.
- :func:`schedule_sglang` — SGLang ``get_next_batch_to_run`` (python/sglang/srt/managers/
  scheduler.py): a prefill batch if one can be formed (the continuing chunked request first, then
  waiting requests admitted by ``PrefillAdder`` against free tokens minus the running requests'
  reserved output × ``new_token_ratio``), alone unless ``mixed_chunk``; else one decode step of
  every running request, retracting requests (fewest output tokens first,
  ``ScheduleBatch.retract_decode``) when the pool cannot hold one more token each.
- :func:`schedule_trtllm` — TRT-LLM ``SimpleScheduler``: the GUARANTEED_NO_EVICT capacity
  scheduler admits a request only if blocks for its whole sequence can be reserved; the
  micro-batch scheduler then fills ``max_num_tokens`` with generation requests and whole (or,
  chunked, block-aligned) context requests in one step. Nothing is ever preempted. With batch
  waiting on (``batch_wait_timeout_iters`` / ``batch_wait_max_tokens_ratio``), ``PyExecutor._schedule``
  then holds the context requests out of a step that also carries generation requests until
  enough steps have waited or enough tokens are scheduled (:func:`_batch_wait`).

A request marked ``prefilled`` (on a disaggregated decode instance: its prompt's KV came from a
prefill instance, which emitted its first token) holds blocks for its prompt but computes none of
it: vLLM admits it straight into a decode step (its KV connector's requests resume from
``WAITING_FOR_REMOTE_KVS`` with the prompt computed), SGLang joins it to the running batch,
TRT-LLM reserves its whole sequence and runs it as a generation request (``generation_only``).
A preempted one loses the flag and is recomputed on the decode instance.

Approximations: preempted and retracted requests return to the front of the waiting queue
(SGLang appends them and re-sorts by its policy); SGLang's ``new_token_ratio`` returns to its
initial value after a retraction (SGLang re-estimates it from the retracted requests).
"""

from __future__ import annotations

from collections import deque

from .kvcache import BlockPool
from .scheduler import SGLANG_CLIP_MAX_NEW_TOKENS, SchedulerConfig

INF = float("inf")


class Engine:
    """The mutable state of one engine instance during a simulation (requests by index)."""

    def __init__(self, sched: SchedulerConfig, pool: BlockPool, isl, osl, hashes, hit_rate: float, draft: int,
                 hash_block_tokens: int):
        self.cfg = sched
        self.pool = pool
        self.bs = pool.kv.block_size
        self.isl = [int(x) for x in isl]
        self.osl = [int(x) for x in osl]
        n = len(self.isl)
        self.hashes = hashes
        self.hit_rate = hit_rate
        self.hash_tokens = hash_block_tokens
        self.k = draft
        self.gen = [0] * n
        self.comp = [0] * n
        self.own = [0] * n                       # private blocks held
        self.shared: list[list[int]] = [[] for _ in range(n)]  # hash blocks held
        self.waiting: deque[int] = deque()
        self.running: list[int] = []
        self.preemptions = 0
        self.chunked: int | None = None          # SGLang's request in the middle of a chunked prefill
        self.prefilled = [False] * n             # prompt KV computed elsewhere (a disaggregated decode instance)
        ratio = sched.new_token_ratio
        self.ratio = ratio[0] if ratio else 0.0
        self.waited = 0                          # TRT-LLM's batch_wait_iters_count

    @property
    def busy(self) -> bool:
        """Anything to run: requests running or waiting, or SGLang's chunked prefill under way."""
        return bool(self.running or self.waiting or self.chunked is not None)

    # -- KV blocks ---------------------------------------------------------------------------------

    def held(self, i: int) -> int:
        return self.own[i] + len(self.shared[i]) * self.pool.hash_blocks

    def grow(self, i: int, tokens: int) -> bool:
        """Hold blocks for ``tokens`` tokens of request ``i``; False (nothing taken) if they are
        not to be had."""
        need = -(-tokens // self.bs) - self.held(i)
        if need <= 0:
            return True
        if not self.pool.alloc(need):
            return False
        self.own[i] += need
        return True

    def release(self, i: int) -> None:
        self.pool.release(self.own[i])
        self.pool.unref(self.shared[i])
        self.own[i] = 0
        self.shared[i] = []

    def preempt(self, i: int) -> None:
        """Free ``i``'s blocks and requeue it at the front; its prompt and output are recomputed."""
        self.release(i)
        self.comp[i] = 0
        self.prefilled[i] = False
        self.waiting.appendleft(i)
        self.preemptions += 1
        if self.chunked == i:
            self.chunked = None

    # -- prefix reuse ------------------------------------------------------------------------------

    def start_prefix(self, i: int) -> None:
        """On admission, skip the cached leading blocks of ``i``'s prompt (at least one token is
        always computed, as vLLM recomputes the last token of a fully cached prompt)."""
        if self.comp[i]:
            return
        total = self.isl[i] + self.gen[i]
        if self.hashes is not None:
            full = self.hashes[i][: self.isl[i] // self.hash_tokens]
            hits = self.pool.match(full)
            while hits and hits * self.hash_tokens >= total:
                hits -= 1
            if hits:
                self.pool.acquire(full[:hits])
                self.shared[i] = list(full[:hits])
                self.comp[i] = hits * self.hash_tokens
        elif self.hit_rate:
            cached = int(self.hit_rate * (self.isl[i] // self.bs)) * self.bs
            while cached and cached >= total:
                cached -= self.bs
            self.comp[i] = cached

    def admit(self, i: int, tokens: int) -> bool:
        """Move the head of the waiting queue, ``i``, into the running batch holding blocks for
        ``tokens`` tokens; False (its prefix hits given back, the queue unchanged) if the blocks
        are not to be had."""
        if not self.grow(i, tokens):
            self.undo_prefix(i)
            return False
        self.waiting.popleft()
        self.running.append(i)
        return True

    def undo_prefix(self, i: int) -> None:
        """A request not admitted after all gives its prefix hits back."""
        if self.own[i] == 0 and not self.prefilled[i]:
            self.pool.unref(self.shared[i])
            self.shared[i] = []
            self.comp[i] = 0

    def publish(self, i: int) -> None:
        """After ``i``'s prompt is computed its full hash blocks become shareable."""
        if self.hashes is None:
            return
        hb = self.pool.hash_blocks
        for h in self.hashes[i][len(self.shared[i]): self.isl[i] // self.hash_tokens]:
            if self.own[i] >= hb and self.pool.publish(h):
                self.own[i] -= hb
                self.shared[i].append(h)

    # -- state -------------------------------------------------------------------------------------

    def need(self, i: int) -> int:
        return self.isl[i] + self.gen[i] - self.comp[i]

    def decoding(self, i: int) -> bool:
        return self.gen[i] > 0 and self.isl[i] + self.gen[i] - self.comp[i] == 1

    def decode_tokens(self, i: int) -> int:
        """Tokens a decoding request computes in a step: its last token plus the drafts."""
        return 1 + self.k

    def max_seqs(self) -> float:
        return self.cfg.max_num_seqs or INF


Planned = list[tuple[int, int, bool]]  # (request, tokens, is a decode)


def schedule_vllm(e: Engine) -> Planned:
    budget, out, run = e.cfg.step_tokens, [], e.running
    preempted = False
    idx = 0
    while idx < len(run) and budget > 0:
        i = run[idx]
        dec = e.decoding(i)
        n = e.decode_tokens(i) if dec else min(e.need(i), budget, e.cfg.max_num_tokens)
        if n > budget:
            break
        while not e.grow(i, e.comp[i] + n):
            victim = run.pop()
            e.preempt(victim)
            preempted = True
            if victim == i:
                n = 0
                break
        if n == 0:
            break
        out.append((i, n, dec))
        budget -= n
        idx += 1
    if not preempted:
        _admit_budgeted(e, out, budget)
    return out


def _admit_budgeted(e: Engine, out: Planned, budget: int) -> None:
    """vLLM's WAITING loop: FCFS while the budget, ``max_num_seqs`` and the free blocks allow."""
    run, cap = e.running, e.max_seqs()
    while e.waiting and budget > 0 and len(run) < cap:
        i = e.waiting[0]
        dec = e.prefilled[i]     # its KV arrived from a prefill instance: it decodes at once
        e.start_prefix(i)
        need = e.decode_tokens(i) if dec else e.need(i)
        if need > budget and (dec or not e.cfg.chunked_prefill):
            e.undo_prefix(i)
            break
        n = min(need, budget, e.cfg.max_num_tokens)
        if not e.admit(i, e.comp[i] + n):
            break
        out.append((i, n, dec))
        budget -= n


def schedule_sglang(e: Engine) -> Planned:
    _sglang_admit_prefilled(e)
    prefills = _sglang_prefill(e)
    if prefills:
        if e.cfg.mixed_chunk:
            started = {i for i, _, _ in prefills}
            decs = [i for i in e.running if i not in started and e.decoding(i)]
            if sum(max(0, -(-(e.comp[i] + e.decode_tokens(i)) // e.bs) - e.held(i)) for i in decs) <= e.pool.available:
                for i in decs:
                    e.grow(i, e.comp[i] + e.decode_tokens(i))
                prefills += [(i, e.decode_tokens(i), True) for i in decs]
        return prefills
    return _sglang_decode(e)


def _sglang_room(e: Engine) -> float:
    """``PrefillAdder.rem_total_tokens``: free tokens less the running requests' reserved output."""
    reserved = sum(min(e.osl[i] - e.gen[i], SGLANG_CLIP_MAX_NEW_TOKENS) for i in e.running if e.gen[i] > 0) * e.ratio
    return e.pool.available * e.bs - reserved


def _sglang_admit_prefilled(e: Engine) -> None:
    """SGLang's PD decode server (python/sglang/srt/disaggregation/decode.py): a request whose KV
    arrived joins the running batch (``get_new_prebuilt_batch``) and decodes in the next step.
    Admitted FCFS, as the ``PrefillAdder`` admits, while the room holds its prompt's KV and its
    reserved output (the prealloc queue's own reserve is approximated by this rule)."""
    if not e.waiting or not e.prefilled[e.waiting[0]]:
        return
    room, cap = _sglang_room(e), e.max_seqs()
    while e.waiting and e.prefilled[e.waiting[0]] and len(e.running) < cap:
        i = e.waiting[0]
        total = e.comp[i] + min(e.osl[i] - e.gen[i], SGLANG_CLIP_MAX_NEW_TOKENS)
        if total > room or not e.grow(i, e.comp[i]):
            break
        room -= total
        e.waiting.popleft()
        e.running.append(i)


def _sglang_prefill(e: Engine) -> Planned:
    cfg, run, out = e.cfg, e.running, []
    chunk = cfg.step_tokens if cfg.chunked_prefill else INF
    per = cfg.max_num_tokens if cfg.chunked_prefill else INF   # one request's chunk: one batch's budget
    inputs = cfg.max_prefill_tokens * cfg.micro_batches if cfg.max_prefill_tokens else INF   # per batch in flight
    rem_total = _sglang_room(e)
    c = e.chunked
    if c is not None:
        n = int(min(e.need(c), chunk, per))
        if not e.grow(c, e.comp[c] + n):
            return out
        out.append((c, n, False))
        chunk -= n
        inputs -= n
        if n == e.need(c):
            e.chunked = None
    cap = e.max_seqs()
    while e.waiting and e.chunked is None and chunk > 0 and inputs > 0 and len(run) < cap:
        i = e.waiting[0]
        if e.prefilled[i]:
            break
        e.start_prefix(i)
        need = e.need(i)
        total = need + min(e.osl[i] - e.gen[i], SGLANG_CLIP_MAX_NEW_TOKENS)
        if total > rem_total:
            e.undo_prefix(i)
            break
        n = int(min(need, chunk, per))
        if not e.admit(i, e.comp[i] + n):
            break
        out.append((i, n, False))
        rem_total -= total
        chunk -= n
        inputs -= n
        if n < need:
            e.chunked = i
    return out


def _sglang_decode(e: Engine) -> Planned:
    decs = [i for i in e.running if e.decoding(i)]
    while decs and sum(max(0, -(-(e.comp[i] + e.decode_tokens(i)) // e.bs) - e.held(i)) for i in decs) > e.pool.available:
        victim = min(decs, key=lambda i: (e.gen[i], -e.isl[i]))
        decs.remove(victim)
        e.running.remove(victim)
        e.preempt(victim)
        e.ratio = e.cfg.new_token_ratio[0]
    if decs:
        decay_new_token_ratio(e)
    for i in decs:
        e.grow(i, e.comp[i] + e.decode_tokens(i))
    return [(i, e.decode_tokens(i), True) for i in decs]


def decay_new_token_ratio(e: Engine, steps: int = 1) -> None:
    """SGLang's ``new_token_ratio`` after ``steps`` decode steps: one ``new_token_ratio_decay`` per
    step, floored at ``min_new_token_ratio`` (python/sglang/srt/managers/scheduler.py
    ``update_running_batch``)."""
    if not e.cfg.new_token_ratio:
        return
    init, factor, n = e.cfg.new_token_ratio
    for _ in range(steps):
        e.ratio = max(init * factor, e.ratio - (init - init * factor) / n)


def admit_trtllm(e: Engine) -> None:
    """The GUARANTEED_NO_EVICT capacity scheduler: waiting requests FCFS while a slot is free and
    blocks for the whole sequence can be reserved (the first half of :func:`schedule_trtllm`)."""
    run, cap = e.running, e.max_seqs()
    while e.waiting and len(run) < cap:
        i = e.waiting[0]
        e.start_prefix(i)
        if not e.admit(i, e.isl[i] + e.osl[i] - 1 + e.k):   # the whole sequence, reserved now
            break


def schedule_trtllm(e: Engine) -> Planned:
    admit_trtllm(e)
    run, cfg = e.running, e.cfg
    budget, out = cfg.step_tokens, []
    for i in run:
        if e.decoding(i):
            n = e.decode_tokens(i)
            if n > budget:
                break
            out.append((i, n, True))
            budget -= n
    for i in run:
        if e.decoding(i):
            continue
        need = e.need(i)
        if cfg.chunked_prefill:
            n = min(need, budget, cfg.max_num_tokens)
            if n < need:
                n -= n % e.bs      # context chunks are whole KV blocks but the last
        elif need > budget:
            break
        else:
            n = need
        if n <= 0:
            break
        out.append((i, n, False))
        budget -= n
    return _batch_wait(e, out) if cfg.waits else out


def _batch_wait(e: Engine, out: Planned) -> Planned:
    """TRT-LLM ``PyExecutor._schedule`` / ``_waiting_requests`` (tensorrt_llm/_torch/pyexecutor/
    py_executor.py): a step with both context and generation requests runs its generation requests
    alone — one more step waited — unless ``batch_wait_timeout_iters`` steps have waited or the
    step's tokens (each context request's whole prompt, ``len(get_tokens(0))``; ``1 + draft`` per
    generation request) reach ``batch_wait_max_tokens_ratio × max_num_tokens``; releasing the
    context requests resets the count. A step without generation requests never waits."""
    gen = [x for x in out if x[2]]
    if len(gen) == len(out) or not gen:
        return out
    iters, ratio = e.cfg.batch_wait
    tokens = sum(n for _, n, _ in gen) + sum(e.isl[i] for i, _, d in out if not d)
    if e.waited >= iters or tokens >= ratio * e.cfg.max_num_tokens:
        e.waited = 0
        return out
    e.waited += 1
    return gen


SCHEDULERS = {"vllm": schedule_vllm, "sglang": schedule_sglang, "trtllm": schedule_trtllm}
