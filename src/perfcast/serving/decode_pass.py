"""A decode instance of a split disaggregated run, stepped in one loop.

In a split run (:attr:`perfcast.serving.disagg._Loop.split`) a decode instance's second pass sees
only its own transfer arrivals, all known in advance. With a batch limit within the token budget,
and — for vLLM and SGLang — a KV cache that can never run out (:func:`applies`), its steps are
simple: at each step start every request whose KV has arrived (at or before that time) is admitted
first come first served while a slot is free (TensorRT-LLM reserving blocks for its whole sequence,
:func:`perfcast.serving.policies.admit_trtllm`; SGLang within its reserved room); every running
request then decodes one token; a request leaves after its last. This loop runs exactly that, one step at a time, without the
event heap, the scheduler or the fast-forward's array bookkeeping — the figures of the joint
loop (``tests/test_serving_fastforward.py`` compares them).
"""

from __future__ import annotations

import math
from collections import deque
from typing import TYPE_CHECKING

from .policies import decay_new_token_ratio
from .scheduler import SGLANG_CLIP_MAX_NEW_TOKENS
from .step_grid import GRID, on_row

if TYPE_CHECKING:
    from .disagg import _Instance, _Loop


def applies(loop: _Loop, y: _Instance) -> bool:
    """The loop below is the instance's: no speculative decoding, no trace, a batch limit within
    the token budget (a decode step never leaves a request out), and TensorRT-LLM — or vLLM or
    SGLang when the KV cache holds a full batch of its longest requests at full length (their
    blocks, taken as the tokens come, never run out: nothing is preempted or retracted; SGLang's
    outputs within its clip of reserved new tokens)."""
    e = y.eng
    cfg = e.cfg
    if loop.spec is not None or y.trace is not None or cfg.max_num_seqs is None \
            or cfg.max_num_seqs > cfg.step_tokens:
        return False
    if cfg.policy == "trtllm":
        return True
    longest = max((e.isl[j[3]] + e.osl[j[3]] - 1 for j in y.joins), default=0)
    clipped = cfg.policy == "sglang" and any(e.osl[j[3]] - 1 > SGLANG_CLIP_MAX_NEW_TOKENS for j in y.joins)
    return cfg.policy in ("vllm", "sglang") and not clipped \
        and cfg.max_num_seqs * -(-longest // e.bs) <= e.pool.available


def run(loop: _Loop, y: _Instance) -> None:
    """Serve ``y.joins`` (transfer arrivals ``(time, _, _, request, y)`` in time order) on ``y``.
    TensorRT-LLM reserves a request's whole sequence at admission; vLLM and SGLang take the blocks
    of its prompt and first token at admission, then one more each time a decode step crosses into
    a new block (``schedule_vllm``, ``_sglang_decode``); SGLang admits while ``PrefillAdder``'s room
    — free tokens less the running requests' outstanding output × ``new_token_ratio``, taken before
    the step's growth — holds the prompt and its output (``_sglang_admit_prefilled``), and its ratio
    decays once per step."""
    eng, run_, price = y.eng, y.run, y.price
    isl, osl, own, comp, gen = eng.isl, eng.osl, eng.own, eng.comp, eng.gen
    bs, pool, cap = eng.bs, eng.pool, eng.cfg.max_num_seqs
    first, first_sched, last, counted = run_.first, run_.first_sched, run_.last, run_.counted
    itl_v, itl_w = run_.itl_v, run_.itl_w
    joins, last_arrival = y.joins, loop.last_arrival
    waiting: deque[int] = deque()
    leave: dict[int, list[int]] = {}       # step number -> requests leaving after it
    grow: dict[int, list[int]] = {}        # step number -> requests taking a block at its start (vLLM)
    whole, sglang = eng.cfg.policy == "trtllm", eng.cfg.policy == "sglang"
    reserved = 0                           # SGLang: the running requests' outstanding output tokens
    tables: dict[int, tuple] = {}          # batch -> StepModel.decode_row
    rows = price.row
    leave_at: dict[int, int] = {}
    t, j, step, bb, ctx, alive, slots, before = -math.inf, 0, 0, 0, 0, 0, 0, 0
    while True:
        while j < len(joins) and joins[j][0] <= t:   # (arrived by the step start: queued before it)
            i = joins[j][3]
            comp[i], gen[i], eng.prefilled[i] = isl[i], 1, True
            waiting.append(i)
            j += 1
        if not bb and not waiting:
            if j == len(joins):
                break
            t = joins[j][0]                        # idle until the next arrival
            continue
        s = step + 1                               # this step's number
        if sglang:
            room = pool.available * bs - reserved * eng.ratio
        if grow:
            more = grow.pop(s, ())
            for i in more:
                own[i] += 1
                if s + bs <= leave_at[i]:
                    grow.setdefault(s + bs, []).append(i)
            if not pool.alloc(len(more)):
                raise RuntimeError(f"{y.name}: the KV blocks counted on were not there")
        new = []
        while waiting and bb + len(new) < cap:     # admitted first come first served
            i = waiting[0]
            if sglang and isl[i] + osl[i] - 1 > room:
                break
            need = -(-(isl[i] + (osl[i] - 1 if whole else 1)) // bs)
            if not pool.alloc(need):
                break
            own[i] = need
            new.append(waiting.popleft())
            if sglang:
                room -= isl[i] + osl[i] - 1
                reserved += osl[i] - 1
            if not whole:                          # (its first new block: when isl + j − 1 ≡ 0 mod bs)
                leave_at[i] = s + osl[i] - 2
                g = s + ((-isl[i]) % bs or bs)
                if g <= leave_at[i]:
                    grow.setdefault(g, []).append(i)
        if not bb and not new:
            raise RuntimeError(f"{y.name} stalled at t={t:.6g}s with {len(waiting)} waiting and 0 running requests")
        if t < last_arrival:
            before += len(new)
        for i in new:
            first_sched[i] = t
            ctx += isl[i]
        bb += len(new)
        # the step: priced as StepModel.decode_s prices it (from the batch's row), else by the pricer
        if rows is None:
            d = price.decode(bb, ctx)
        else:
            x = ctx / bb
            k = int(x // GRID)
            tab = tables.get(bb)
            if tab is None or k + 1 >= len(tab[1]):
                tab = tables[bb] = rows(bb, ctx)
                if tab is None:
                    rows = None
                    d = price.decode(bb, ctx)
            if rows is not None:
                d = max(tab[0] + on_row(tab[1], x), tab[2])
        start, t = t, t + d
        step += 1
        slots += bb
        if sglang:
            decay_new_token_ratio(eng)
            reserved -= bb
        if alive:                                   # the requests stepped before: one gap each
            itl_v.append(t - start)
            itl_w.append(alive)
        for i in new:
            if math.isnan(first[i]):                # (its first token comes with this step)
                first[i] = t
            elif counted[i]:
                itl_v.append(t - last[i])
                itl_w.append(1)
            alive += counted[i]
            leave.setdefault(step + osl[i] - 2, []).append(i)
        ctx += bb
        for i in leave.pop(step, ()):
            ctx -= isl[i] + osl[i] - 1
            bb -= 1
            alive -= counted[i]
            comp[i], gen[i], last[i] = isl[i] + osl[i] - 1, osl[i], t
            pool.release(own[i])
            own[i] = 0
            run_.done += 1
            loop._complete(i, t)
    run_.steps += step
    run_.seq_steps += slots
    run_.decode_emits += slots
    run_.decode_slots += slots
    y.joined, y.inbound, y.joins = len(joins), 0, []
    y.queue_at_last = y.sent_by_last - before
