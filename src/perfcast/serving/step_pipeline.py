"""A pipeline-parallel engine instance's step: its stages' step models composed over micro-batches.

With pipeline parallelism an engine keeps as many batches in flight as it has stages, each made of
requests no other in-flight batch holds, so that every stage works on one while the others work
on the rest:

- vLLM v1: ``EngineCore.batch_queue_size = vllm_config.max_concurrent_batches`` (the pipeline
  size) and ``step_with_batch_queue`` ("required by pipeline parallelism to eliminate pipeline
  bubbles", vllm/v1/engine/core.py); each scheduled batch has its own ``max_num_batched_tokens``;
- TensorRT-LLM: ``PyExecutor._executor_loop_pp`` schedules one micro-batch per pipeline stage from
  the requests not in flight (tensorrt_llm/_torch/pyexecutor/py_executor.py), each within
  ``max_num_tokens``;
- SGLang: ``Scheduler.event_loop_pp`` runs ``pp_size`` micro-batches (python/sglang/srt/managers/
  scheduler_pp_mixin.py).

In the steady state every stage runs every micro-batch once per *cycle*, and each request gains
one token per cycle, so the serving layer treats one cycle as the instance's step: the step's mix
is split into ``P`` micro-batches as evenly as it divides (decodes, their context in proportion,
prefill chunks dealt to the micro-batches with fewer decodes first), stage ``s`` prices micro-batch
``m_i`` with its own compiled step model (its layers, the embedding on the first stage, the final
norm and LM head on the last, the activations' send to the next stage on all but the last:
:func:`perfcast.capture.parallel.stages`), and

    cycle(mix) = max(max_s Σ_i t_s(m_i), max_i Σ_s t_s(m_i))

— the busiest stage sets the pace of a full pipeline (GPipe's steady state, Huang et al.,
NeurIPS 2019, §2.2), and no micro-batch comes round faster than its own pass through every stage
(a lone request at low load waits for all of them, as on one device). This is not text-generate's ``pipeline_time_s``, the latency of one step
of ``M`` micro-batches with its fill and drain (``Σ_s t_s + (M − 1) · max_s t_s``): a serving
engine never drains between steps. The scheduler sees a cycle's token budget as ``P`` times the
engine's per-batch budget (:attr:`~perfcast.serving.scheduler.SchedulerConfig.micro_batches`), a
request's prompt chunk within one batch's budget.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from functools import reduce

import numpy as np

from perfcast.capture.parallel import stage_layers
from perfcast.serving.step import Deployment, StepModel
from perfcast.serving.types import Mix, StepCost


def micro_batches(mix: Mix, p: int) -> list[Mix]:
    """``mix`` split into ``p`` micro-batches: micro-batch ``i`` gets ``⌈(d − i) / p⌉`` of the
    ``d`` decodes and their share of the context (:func:`_decode_shares`); the prefill chunks,
    largest first, are dealt in turn from micro-batch ``d mod p`` on (the ones with fewer decodes
    first). Dealt so, no micro-batch holds more chunk tokens than the largest chunk plus an even
    share of them all (each later chunk is at most one of the round before it), so within a cycle
    budget of ``p`` batches of ``B`` tokens, chunks of at most ``B`` each, a micro-batch holds at
    most ``2 B`` prompt tokens beside its decodes."""
    chunks: list[list] = [[] for _ in range(p)]
    for j, c in enumerate(sorted(mix.chunks, key=lambda c: -c.tokens)):
        chunks[(mix.decodes % p + j) % p].append(c)
    return [Mix(di, ci, tuple(chunks[i]), mix.draft)
            for i, (di, ci) in enumerate(_decode_shares(mix.decodes, mix.decode_context, p))]


def _decode_shares(d, ctx, p: int):
    """Each micro-batch's (decodes, context) of ``d`` decodes holding ``ctx`` cached tokens:
    ``⌈(d − i) / p⌉`` decodes, the context cumulative so the shares sum to it (integers or
    integer arrays alike: where ``d`` is 0 so is ``ctx``, and every share)."""
    before = taken = 0
    for i in range(p):
        di = (d + p - 1 - i) // p
        before = before + di
        ci = ctx * before // (d + (d == 0)) - taken
        taken = taken + ci
        yield di, ci


def _cycle(rows: dict, stages: Sequence, top=max):
    """``max(max_s Σ_i t_s(m_i), max_i Σ_s t_s(m_i))`` from ``rows`` (each distinct stage's
    times of the micro-batches, by ``id``) over ``stages`` in order (a stage as often as it
    occurs); ``top``: ``max`` for seconds, ``numpy.maximum`` for arrays of them."""
    busiest = reduce(top, (sum(row) for row in rows.values()))
    return top(busiest, reduce(top, (sum(rows[id(s)][i] for s in stages) for i in range(len(stages)))))


def cycle_s(stages: Sequence[StepCost], mix: Mix) -> float:
    """One cycle of ``mix`` through ``stages`` (one step cost per stage, in order, as many
    micro-batches as stages): ``max(max_s Σ_i t_s(m_i), max_i Σ_s t_s(m_i))``."""
    if mix.empty:
        return 0.0
    parts = micro_batches(mix, len(stages))
    rows = {id(stage): [0.0 if m.empty else stage.step_s(m) for m in parts] for stage in stages}  # distinct once
    return _cycle(rows, stages)


class PipelineStepModel:
    """Prices one cycle of a pipeline-parallel deployment (see the module's docstring): one
    :class:`~perfcast.serving.step.StepModel` per distinct stage (first, last, and the middle
    stages by their number of layers), composed over ``P`` micro-batches."""

    def __init__(self, deployment: Deployment, *, max_tokens: int = 16384):
        self.deployment = deployment
        self.pp = p = deployment.layout.pp
        self.max_tokens = int(max_tokens)
        layers = stage_layers(int(_layers(deployment)), p)
        compiled: dict[tuple, StepModel] = {}
        self.stages: list[StepModel] = []
        for s, rng in enumerate(layers):
            sig = (s == 0, s == p - 1, len(rng))
            if sig not in compiled:
                compiled[sig] = StepModel(deployment, max_tokens=max_tokens, stage=s)
            self.stages.append(compiled[sig])
        self.distinct = list(compiled.values())
        self.iteration_gap = None   # the pipeline loop's idle between steps: no measured figure
        self.unpriced = sum((m.unpriced for m in self.distinct), Counter())
        self.source = (f"{self.stages[0].profile.name} step of {deployment.model} on {deployment.device} "
                       f"({deployment.layout.describe()}), {deployment.performance_model} pricing: {p} pipeline "
                       f"stages with {p} micro-batches in flight, a step one cycle of the busiest stage")

    def step_s(self, mix: Mix) -> float:
        return cycle_s(self.stages, mix)

    def decode_s(self, decodes: int, context: int) -> float:
        """``step_s(Mix(decodes, context))`` without building the mixes (the simulation's decode
        steps): the same split, each stage's ``decode_s``."""
        if decodes == 0:
            return self.step_s(Mix(decodes, context))
        shares = list(_decode_shares(decodes, context, self.pp))
        return _cycle({id(s): [s.decode_s(di, ci) if di else 0.0 for di, ci in shares] for s in self.distinct},
                      self.stages)

    def host_floor_s(self, decode: bool, tokens: int) -> float:
        """The host's issue time of one micro-batch's launches of ``tokens`` on the slowest stage."""
        return max(stage.host_floor_s(decode, tokens) for stage in self.distinct)

    def step_s_array(self, decodes, decode_context, chunk_tokens, chunk_past, chunks, draft: int = 0) -> np.ndarray:
        """:meth:`step_s` elementwise (:class:`~perfcast.serving.types.StepCostArray`), the same split."""
        d, ctx, t, past, c = (v.astype(np.int64) for v in np.broadcast_arrays(
            *(np.asarray(v) for v in (decodes, decode_context, chunk_tokens, chunk_past, chunks))))
        p = self.pp
        extra = d % p
        rows: dict[int, list] = {id(s): [] for s in self.distinct}
        for i, (di, ci) in enumerate(_decode_shares(d, ctx, p)):
            r = (i - extra) % p                                   # the chunks dealt to micro-batch i
            ni = np.where(r < c, (c - r + p - 1) // p, 0)
            for s in self.distinct:
                rows[id(s)].append(s.step_s_array(di, ci, t, past, ni, draft))
        return _cycle(rows, self.stages, np.maximum)


def _layers(deployment: Deployment) -> int:
    from perfcast.inference.silicon import catalog_model

    return int(catalog_model(deployment.model).data["num_hidden_layers"])
