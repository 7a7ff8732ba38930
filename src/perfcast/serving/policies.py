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

from .engine_state import INF, Engine
from .scheduler import SGLANG_CLIP_MAX_NEW_TOKENS

Planned = list[tuple[int, int, bool]]  # (request, tokens, is a decode)


def schedule_vllm(e: Engine) -> Planned:
    budget, out, run = e.cfg.step_tokens, [], e.running
    preempted = False
    # (Engine.decoding, decode_tokens and the blocks grow needs, inlined: this loop visits every
    # running request every step; without hash blocks no request shares any)
    gen, isl, comp, own, shared, bs, hb = e.gen, e.isl, e.comp, e.own, e.shared, e.bs, e.pool.hash_blocks
    hashing, one, most, add = e.hashes is not None, e.decode_tokens(0), e.cfg.max_num_tokens, out.append
    for i in run:   # (a preemption pops the list's tail: the iteration ends there)
        if budget <= 0:
            break
        g, c = gen[i], comp[i]
        dec = g > 0 and isl[i] + g - c == 1
        n = one if dec else min(isl[i] + g - c, budget, most)
        if n > budget:
            break
        if c + n > (own[i] + len(shared[i]) * hb if hashing else own[i]) * bs:
            while not e.grow(i, c + n):
                victim = run.pop()
                e.preempt(victim)
                preempted = True
                if victim == i:
                    n = 0
                    break
            if n == 0:
                break
        add((i, n, dec))
        budget -= n
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
    osl, gen, clip = e.osl, e.gen, SGLANG_CLIP_MAX_NEW_TOKENS
    reserved = sum([min(osl[i] - gen[i], clip) for i in e.running if gen[i] > 0]) * e.ratio
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
    """SGLang's next prefill batch (``PrefillAdder``, python/sglang/srt/managers/schedule_policy.py):
    a chunked request's next chunk first, then waiting prompts in order while the KV room, the chunk
    (``--chunked-prefill-size``) and the input room (``--max-prefill-tokens``) last; a prompt over the
    input room left waits unless the batch is empty, one over the chunk left is cut to it."""
    cfg, run, out = e.cfg, e.running, []
    chunk = cfg.step_tokens if cfg.chunked_prefill else INF
    per = cfg.max_num_tokens if cfg.chunked_prefill else INF   # one request's chunk: one batch's budget
    inputs = cfg.max_prefill_tokens * cfg.micro_batches if cfg.max_prefill_tokens else INF   # per batch in flight
    rem_total = _sglang_room(e) if e.waiting else 0.0   # (read only to admit a waiting request)
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
        if total > rem_total or (need > inputs and out):   # (a prompt over the input room waits, whole,
            e.undo_prefix(i)                              # for a batch of its own: PrefillAdder.add_one_req)
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
    # (Engine.decoding, decode_tokens and held inlined: this visits every running request every step)
    gen, isl, comp, own, shared, bs, hb = e.gen, e.isl, e.comp, e.own, e.shared, e.bs, e.pool.hash_blocks
    one, hashing = e.decode_tokens(0), e.hashes is not None
    decs, needs, total = [i for i in e.running if gen[i] > 0 and isl[i] + gen[i] - comp[i] == 1], [], 0
    while decs:   # the decodes that need new blocks, and how many, until they fit
        needs = [(i, k) for i in decs
                 if (k := -(-(comp[i] + one) // bs) - own[i] - (len(shared[i]) * hb if hashing else 0)) > 0]
        total = sum([k for _, k in needs])
        if total <= e.pool.available:
            break
        victim = min(decs, key=lambda i: (gen[i], -isl[i]))
        decs.remove(victim)
        e.running.remove(victim)
        e.preempt(victim)
        e.ratio = e.cfg.new_token_ratio[0]
    if not decs:
        needs, total = [], 0   # (every decode retracted: none grows)
    else:
        decay_new_token_ratio(e)
    e.pool.alloc(total)   # (as grow, one request at a time, would: they fit)
    for i, k in needs:
        own[i] += k
    return [(i, one, True) for i in decs]


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
    run, cfg, gen, isl, comp = e.running, e.cfg, e.gen, e.isl, e.comp
    decoding = [gen[i] > 0 and isl[i] + gen[i] - comp[i] == 1 for i in run]   # (Engine.decoding inlined)
    one = e.decode_tokens(0)
    decs = [i for i, dec in zip(run, decoding) if dec][: cfg.step_tokens // one]   # each while the budget holds it
    out = [(i, one, True) for i in decs]
    budget = cfg.step_tokens - one * len(decs)
    for i in [i for i, dec in zip(run, decoding) if not dec]:
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
