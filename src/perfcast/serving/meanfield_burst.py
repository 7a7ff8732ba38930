"""The closed form's first wave: a closed loop's clients all send at t = 0.

A benchmark client in closed loop (vLLM's ``benchmark_serving.py --max-concurrency C``, AIPerf
``--concurrency C``) starts its C clients together: the engine meets C prompts at once, not the
steady state's one prompt every ``1 / X`` seconds, and their first tokens come one budget of
prompt tokens per step, the last after all C prompts are prefilled. The steady state
(:mod:`perfcast.serving.meanfield`) is the right TTFT for every later request; where a run counts
its first wave (``--warmup`` below C: the replays of measured runs, whose clients count every
request), :func:`first_wave_ttfts` gives those requests' own TTFTs, from the engine's schedule of
an idle engine meeting ``n`` prompts:

- ``vllm``, ``trtllm`` (mixed steps): each step spends its token budget on the decodes of the
  prompts already prefilled first (one token each, ``1 + k`` under speculative decoding), then on
  the waiting prompts in arrival order — a prompt's chunk where chunked prefill is on, else whole
  prompts while they fit (vllm/v1/core/sched/scheduler.py ``Scheduler.schedule``: RUNNING before
  WAITING under one ``token_budget``; TensorRT-LLM's MicroBatchScheduler: generation requests,
  then context requests within ``max_num_tokens``);
- ``sglang``: prefill batches of as many prompts as the budget holds, back to back while prompts
  wait, the decodes stalled (python/sglang/srt/managers/scheduler.py ``get_next_batch_to_run``: a
  new prefill batch before a decode batch).

A prompt's first token comes at the end of the step that computes its last prompt token, as in the
event simulation (:mod:`perfcast.serving.sim`). Prices are the step model's for each step's mix;
the prefilled prompts' decodes are priced at their prompt's context.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from perfcast.serving.meanfield import EngineConfig, Workload, _Model
from perfcast.serving.metrics import weighted_summary
from perfcast.serving.types import Chunk, Mix, ServingResult, StepCost, Summary


def counting_the_first_wave(r: ServingResult, step: StepCost, engine: EngineConfig, load: Workload, *,
                            warmup: int, num_requests: int, draft: StepCost | None = None) -> ServingResult:
    """The closed loop's result ``r`` (the steady state) over a run of ``num_requests`` whose
    first ``warmup`` are not counted, ``warmup`` below the concurrency: the first wave's counted
    requests at their own TTFT (:func:`first_wave_ttfts`), the rest at the steady state's; E2E
    moves with the TTFT. Throughput stays the steady state's."""
    m = _Model(step, engine, load, draft)
    wave = first_wave_ttfts(m, min(load.concurrency, m.cap))
    t = with_first_wave(r.ttft_s, wave, warmup, num_requests - warmup)
    tail = r.e2e_s.mean - r.ttft_s.mean
    own = max(0, len(wave) - warmup)
    return replace(r, ttft_s=t, e2e_s=Summary(t.mean + tail, t.p50 + tail, t.p90 + tail, t.p99 + tail), notes=tuple(
        x for x in r.notes if not x.startswith("TTFT: deterministic")) + (
        f"TTFT: the first wave counted (warm-up {warmup} < concurrency {load.concurrency}): {own} of the "
        f"{num_requests - warmup} counted requests sent together at t = 0 to an idle engine, at their own TTFT "
        f"(mean {np.mean(wave[warmup:]) if own else 0:.4g} s), the rest at the steady state's "
        f"{r.ttft_s.mean:.4g} s; throughput is the steady state's",))


def first_wave_ttfts(m: _Model, n: int) -> list[float]:
    """The TTFT of each of ``n`` prompts sent together to an idle engine, in arrival order."""
    return _sglang(m, n) if m.engine.policy == "sglang" else _mixed(m, n)


def _mixed(m: _Model, n: int) -> list[float]:
    need, past0, k = m.load.prefill_tokens, m.load.hit_tokens, m.engine.spec_k
    chunked = m.engine.chunked_prefill
    if not chunked:
        m.refuse_unchunkable()
    clock, done, progress, out = 0.0, 0, 0, []
    while done < n:
        budget = m.engine.step_tokens - done * (1 + k)
        chunks, finished, i, got = [], 0, done, progress
        while i < n and budget > 0:
            take = min(budget, need - got) if chunked else (need if need <= budget else 0)
            if take == 0:
                break
            chunks.append(Chunk(take, past0 + got))
            budget, got = budget - take, got + take
            if got == need:
                finished, i, got = finished + 1, i + 1, 0
        if not chunks:   # (the decodes alone fill the budget: whole prompts wait for a step of their own)
            chunks, finished, got = [Chunk(need, past0)], 1, 0
        clock += m.price(m.step, Mix(decodes=done, decode_context=done * m.load.isl, chunks=tuple(chunks), draft=k))
        out += [clock] * finished
        done, progress = done + finished, got
    return out


def _sglang(m: _Model, n: int) -> list[float]:
    clock, out, b_max = 0.0, [], m.prefill_batch_max
    while len(out) < n:
        b = min(b_max, n - len(out))
        clock += m.at(m.prefill_batch_s, b)
        out += [clock] * b
    return out


def with_first_wave(steady: Summary, wave: list[float], warmup: int, counted: int) -> Summary:
    """The TTFT over the ``counted`` requests after the first ``warmup``: the first wave's own
    (``wave``: requests 0 … n − 1) where counted, the steady state's for the rest — the mean and
    the percentiles of that mixture."""
    own = wave[warmup:]
    values = np.array(own + [steady.mean], float)
    weights = np.array([1] * len(own) + [counted - len(own)], np.int64)
    return weighted_summary(values, weights)
