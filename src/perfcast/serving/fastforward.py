"""The event simulation's fast-forward: runs of pure-decode steps advanced without the scheduler
(docs/design/serving.md, "Fast-forward"), and the completion bookkeeping both share. Equal, figure
for figure, to stepping through the scheduler (``tests/test_serving_fastforward.py``)."""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections import deque
from itertools import repeat
from operator import itemgetter
from typing import TYPE_CHECKING

import numpy as np

from .policies import Engine, decay_new_token_ratio
from .step_grid import on_row

if TYPE_CHECKING:
    from .sim import _Pricer, _Run


def _finish(eng: Engine, run: _Run, finished: list[int], t: float) -> None:
    done = set(finished)
    eng.running[:] = [i for i in eng.running if i not in done]
    for i in finished:
        eng.release(i)
        run.finish[i] = t
        run.done += 1
        if run.trace is not None and run.handed is None:
            run.trace.request(i, run.send[i], run.first_sched[i], run.first[i], t)
    if run.handed is not None:
        run.handed.extend(finished)


def _fast_forward(eng: Engine, run: _Run, price: _Pricer, t: float, horizon: float,
                  finishes: bool = False, min_steps: int = 2, max_steps: int | None = None,
                  first: bool = False, lag: int = 0) -> float | None:
    """Advance a run of pure-decode steps, every running request decoding one token each, while
    nothing can join the batch (no request waiting, none before ``horizon``) and the KV blocks
    at hand suffice; None if there is no such run of at least ``min_steps`` steps. A request
    admitted to a disaggregated decode instance but not yet stepped (its first token, in the
    default clock, comes with its first decode step) joins the run's first step. With ``finishes`` the
    run goes on through completions (the batch shrinking), which the caller allows when a
    completion changes nothing outside the engine (an open loop: no client sends on it);
    otherwise it stops before the first — or, with ``first``, ``lag`` steps after the step of the
    first (a closed loop: the requests its clients then send join no earlier, ``_Sent``), the caller
    then acting on the run's completions (``run.left``: each one's step in the run and clock). Equal to stepping through the scheduler (a test runs
    both): the same mixes, clocks, blocks (and their peak) and, for SGLang, the same decay of
    ``new_token_ratio`` per decode step. ``max_steps``: at most that many steps (SGLang's next
    take-in of held requests, :class:`perfcast.serving.intake._Inbox`)."""
    run_ = _Decoding.plan(eng, run, price, finishes, min_steps, max_steps, first, lag)
    if run_ is None:
        return None
    t0, times = t, []
    while (d := run_.next_price()) is not None:
        t += d
        times.append(t)
        if t >= horizon:
            break
    run_.apply(times, t0)
    run.steps += len(times)
    return t


class _Decoding:
    """One engine's run of pure-decode steps (:func:`_fast_forward`): planned (:meth:`plan`: how
    many steps at most), priced a step at a time (:meth:`next_price`, the batch shrinking as
    requests leave) and then applied for the steps actually taken (:meth:`apply`), whose clocks
    the caller fixes — its own prices' running sum, or, for coupled attention-DP ranks
    (:mod:`.sim_dp`), the slowest rank's step each step. Its per-request state is plain lists, by
    position in the batch: a run lasts a few steps of tens of requests, where NumPy's per-call cost
    outweighs its loops."""

    @classmethod
    def plan(cls, eng: Engine, run: _Run, price: _Pricer, finishes: bool = False, min_steps: int = 2,
             max_steps: int | None = None, first: bool = False, lag: int = 0) -> _Decoding | None:
        r = eng.running
        if not r or eng.chunked is not None or (max_steps is not None and max_steps < min_steps):
            return None
        b = len(r)
        if eng.cfg.policy != "sglang" and b > eng.cfg.step_tokens:
            return None
        idx = list(r)                          # (the running list shrinks as requests leave)
        at = _getter(idx)
        g, c = at(eng.gen), at(eng.comp)
        for gi, pi, ci in zip(g, at(eng.isl), c):
            if gi <= 0 or pi + gi - ci != 1:
                return None   # not every request decoding
        rem = [o - gi for o, gi in zip(at(eng.osl), g)]   # tokens each has still to emit (≥ 1)
        if first:   # through the first completion's step and ``lag`` more (the batch may shrink in them)
            m = min(min(rem) + lag, max(rem))
        else:
            m = max(rem) if finishes else min(rem) - 1
        if max_steps is not None:
            m = min(m, max_steps)
        if m < min_steps:
            return None
        # TensorRT-LLM (GUARANTEED_NO_EVICT) reserved each request's whole sequence at admission and
        # never preempts: its blocks suffice and do not change
        own0 = held = None
        if eng.cfg.policy != "trtllm":
            own0 = at(eng.own)
            held = list(own0)
            if eng.hashes is not None:
                hb = eng.pool.hash_blocks
                held = [o + len(x) * hb for o, x in zip(own0, at(eng.shared))]
            m = _steps_that_fit(c, held, rem, eng.bs, eng.pool.available, m)
            if m < min_steps:
                return None
        return cls(eng, run, price, idx, at, g, c, rem, m, own0, held, finishes)

    def __init__(self, eng, run, price, idx, at, g, c, rem, m, own0, held, finishes):
        self.eng, self.run, self.price, self.idx, self.at = eng, run, price, idx, at
        self.g, self.c, self.rem, self.m, self.own0, self.held = g, c, rem, m, own0, held
        #: the run ends with its batch empty (every request leaves within it), not at a limit
        self.empties = finishes and m == max(rem)
        order = sorted(range(len(idx)), key=rem.__getitem__)   # (stable)
        self.ends_l = [rem[k] for k in order]                   # each request's last step, ascending
        self.ctx_end = [c[k] + rem[k] for k in order]           # and its context when it leaves
        self.k, self.bb, self.ctx = 0, len(idx), sum(c)
        self.batches: list[int] = []
        # a step's price: StepModel.decode_s from its batch's row (as decode_s computes it), else the pricer
        self.reach, self.table = max(c) + m, None

    def next_price(self) -> float | None:
        """The next step's price, the step counted as taken; None once the run's steps are spent or
        its batch is empty."""
        bb, price = self.bb, self.price
        if bb == 0 or len(self.batches) >= self.m:
            return None
        while True:
            if price.row is None:
                d = price.decode(bb, self.ctx)
                break
            if self.table is None:
                self.table = price.row(bb, self.reach * bb)
                if self.table is None:
                    price.row = None
                    continue
            dense, row, host = self.table
            d = max(dense + on_row(row, self.ctx / bb), host)
            break
        self.batches.append(bb)
        self.ctx += bb
        step, ends_l, b = len(self.batches), self.ends_l, len(self.idx)
        while self.k < b and ends_l[self.k] == step:
            self.ctx -= self.ctx_end[self.k]
            self.bb -= 1
            self.k += 1
            self.table = None
        return d

    def apply(self, times: list[float], t0: float) -> None:
        """The first ``len(times)`` steps taken (``times``: each one's end, from ``t0``): tokens, clocks,
        ITL gaps, blocks, completions (``run.left``: each step's, in order). ``run.steps`` is the
        caller's to count."""
        eng, run, at, c, rem, held = self.eng, self.run, self.at, self.c, self.rem, self.held
        reserved, batches = held is None, self.batches
        m, t = len(times), times[-1]
        done = bisect_right(self.ends_l, m)   # requests that left within the run
        if eng.cfg.policy == "sglang":   # (its ratio decays per decode step, as _sglang_decode does)
            decay_new_token_ratio(eng, m)
        # clocks and gaps: every request's first gap from its last token; then one gap per later step
        # for each counted request still in the batch
        counted = at(run.counted)
        t1 = times[0]                          # the run's first step ends
        where = np.array(self.idx)
        # a request's first step on a disaggregated decode instance: scheduled now; and, when the
        # client's first token comes from the decode instance, that token (no gap)
        unset = np.isnan(run.first_sched[where])
        if unset.any():
            run.first_sched[where[unset]] = t0
        fresh = np.isnan(run.first[where])
        if fresh.any():
            run.first[where[fresh]] = t1
        itl_v, itl_w = run.itl_v, run.itl_w
        gaps = [t1 - x for x, k, f in zip(at(run.last), counted, fresh.tolist()) if k and not f]
        itl_v.extend(gaps)
        itl_w.extend([1] * len(gaps))
        if m > 1:
            cnt_rem = sorted(r for r, k in zip(rem, counted) if k)
            for s in range(1, m):   # counted in step s + 1: those with at least s + 1 tokens to go
                w = len(cnt_rem) - bisect_left(cnt_rem, s + 1)
                if w:
                    itl_v.append(times[s] - times[s - 1])
                    itl_w.append(w)
        # blocks: each segment's growth (steps between departures) taken at its end — growth within a
        # segment only rises, so the pool's peak is the step-by-step one — and the leavers' blocks
        # freed after their last step
        bs, pool = eng.bs, eng.pool
        tr = run.trace if run.ranks == 1 else None
        prev = held
        grows = not reserved and any(-(-(x + (r if r < m else m)) // bs) > h for x, r, h in zip(c, rem, held))
        first_step = 1
        run.left = []
        for seg_end in sorted(set(self.ends_l[:done]) | {m}):
            now = prev
            if grows:
                now = [(h if h >= (n := -(-(x + seg_end) // bs)) else n) if r >= seg_end else p
                       for h, x, r, p in zip(held, c, rem, prev)]
                if not pool.alloc(sum(now) - sum(prev)):
                    raise RuntimeError("fast-forward: the KV blocks counted on were not there")
                prev = now
            if tr is not None:
                start = times[first_step - 2] if first_step > 1 else t0
                tr.counter(times[first_step - 1], batches[first_step - 1], pool.used * bs, 0, start)
                if seg_end > first_step:
                    tr.counter(times[seg_end - 1], batches[first_step - 1], pool.used * bs, 0, times[first_step - 1])
            first_step = seg_end + 1
            leaving = [k for k, r in enumerate(rem) if r == seg_end]
            if not leaving:
                continue
            t_end = times[seg_end - 1]
            run.left.append((seg_end, t_end, len(leaving)))
            _finish(eng, run, self._store(leaving, seg_end, now, t_end), t_end)
        self._store([k for k, r in enumerate(rem) if r > m], m, prev, t)
        slots = sum([r if r < m else m for r in rem])
        run.seq_steps += slots
        run.decode_emits += slots
        run.decode_slots += slots

    def _store(self, sel: list[int], steps: int, blocks: list[int] | None, t: float) -> list[int]:
        """The requests at positions ``sel`` after ``steps`` steps of the run, holding ``blocks`` (with
        their shared ones; None: reserved, unchanged), their last token at ``t``; their indices."""
        eng, idx, c, g = self.eng, self.idx, self.c, self.g
        ids = [idx[k] for k in sel]
        _put(eng.comp, ids, [c[k] + steps for k in sel])
        _put(eng.gen, ids, [g[k] + steps for k in sel])
        if blocks is not None:
            own0, held = self.own0, self.held
            _put(eng.own, ids, [own0[k] + blocks[k] - held[k] for k in sel])
        _put(self.run.last, ids, repeat(t))
        return ids


def _put(seq: list, ids, values) -> None:
    """``seq[i] = v`` for each pair (a C-level loop: ``map`` over ``list.__setitem__``)."""
    deque(map(seq.__setitem__, ids, values), maxlen=0)


def _getter(idx: list[int]):
    """``at(seq)``: the items of ``seq`` at ``idx``, as a tuple (``operator.itemgetter``, which
    returns a bare item for one index)."""
    if len(idx) == 1:
        i = idx[0]
        return lambda seq: (seq[i],)
    return itemgetter(*idx)


def _steps_that_fit(c, held: list[int], rem: list[int], bs: int, available: int, m: int) -> int:
    """The most decode steps (≤ m) whose new blocks the pool can give (a request grows until its
    last step; the blocks leavers free on the way are not counted on)."""
    def need(steps: int) -> int:
        return sum([n - h for x, h, r in zip(c, held, rem) if (n := -(-(x + (r if r < steps else steps)) // bs)) > h])

    # a request holds its computed tokens' blocks, so s steps take at most ⌈s / bs⌉ more each
    if len(c) * -(-m // bs) <= available or need(m) <= available:
        return m
    lo, hi = 0, m
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if need(mid) <= available:
            lo = mid
        else:
            hi = mid - 1
    return lo
