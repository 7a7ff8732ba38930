"""The serving layer's plain inputs: what one engine step holds, and what prices it.

A step of a continuous-batching engine holds decodes (one new token each, or ``1 + k`` under
speculative decoding) and prefill chunks (``tokens`` new tokens after ``past`` tokens already in
the KV cache) — vLLM v1's scheduler builds exactly such steps under one token budget
(vllm/v1/core/sched/scheduler.py ``Scheduler.schedule``: running requests first, then waiting
ones, ``num_new_tokens`` capped by ``token_budget``). Every type here is frozen and hashable so
that a search can evaluate it many thousand times and memoise by value.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np


@dataclass(frozen=True)
class Chunk:
    """A prefill chunk: ``tokens`` new prompt tokens after ``past`` tokens already cached."""

    tokens: int
    past: int = 0


@dataclass(frozen=True)
class Mix:
    """One engine step's batch: ``decodes`` sequences decoding with ``decode_context`` tokens
    in their KV caches in all (the sum over the decodes, before the step), each producing
    ``1 + draft`` tokens' worth of work (``draft``: speculative tokens verified per sequence),
    and the prefill ``chunks``."""

    decodes: int = 0
    decode_context: int = 0
    chunks: tuple[Chunk, ...] = ()
    draft: int = 0

    @property
    def prefill_tokens(self) -> int:
        return sum(c.tokens for c in self.chunks)

    @property
    def tokens(self) -> int:
        """Tokens through the step's dense layers: decodes × (1 + draft) + the chunks' tokens."""
        return self.decodes * (1 + self.draft) + self.prefill_tokens

    @property
    def sequences(self) -> int:
        return self.decodes + len(self.chunks)

    @property
    def empty(self) -> bool:
        return self.decodes == 0 and not self.chunks


@runtime_checkable
class StepCost(Protocol):
    """Prices one engine step; ``step_s`` is pure (same mix, same seconds)."""

    def step_s(self, mix: Mix) -> float: ...


@runtime_checkable
class StepCostArray(StepCost, Protocol):
    """A step cost that also prices many steps at once: element ``i`` of ``step_s_array`` is
    ``step_s(Mix(decodes[i], decode_context[i], (Chunk(chunk_tokens[i], chunk_past[i]),) * chunks[i],
    draft))`` — the same seconds, computed on arrays (the closed form's grid tabulates with it)."""

    def step_s_array(self, decodes, decode_context, chunk_tokens, chunk_past, chunks, draft: int = 0) -> np.ndarray: ...


@dataclass(frozen=True)
class AffineStep:
    """A step priced as ``fixed_s + per_token_s · tokens + per_context_s · attended keys`` —
    the hand-checkable step of docs/design/serving.md's worked examples, and a user's own
    measured line (e.g. fitted on one engine's per-step timings). Attended keys: each decode
    reads its context plus its new tokens; a chunk of ``t`` tokens after ``p`` cached ones
    attends ``t · p + t (t + 1) / 2`` keys (causal)."""

    fixed_s: float
    per_token_s: float
    per_context_s: float = 0.0
    source: str = "affine step (stated)"

    def step_s(self, mix: Mix) -> float:
        keys = mix.decode_context * (1 + mix.draft) + mix.decodes * (1 + mix.draft) * (2 + mix.draft) // 2
        keys += sum(c.tokens * c.past + c.tokens * (c.tokens + 1) // 2 for c in mix.chunks)
        return self.fixed_s + self.per_token_s * mix.tokens + self.per_context_s * keys

    def step_s_array(self, decodes, decode_context, chunk_tokens, chunk_past, chunks, draft: int = 0) -> np.ndarray:
        """:meth:`step_s` elementwise (:class:`StepCostArray`), in the same integer and float steps."""
        d, ctx, t, p, c = np.broadcast_arrays(*(np.asarray(v, dtype=np.int64) for v in
                                               (decodes, decode_context, chunk_tokens, chunk_past, chunks)))
        keys = ctx * (1 + draft) + d * (1 + draft) * (2 + draft) // 2 + c * (t * p + t * (t + 1) // 2)
        return self.fixed_s + self.per_token_s * (d * (1 + draft) + c * t) + self.per_context_s * keys


def expected_tokens_per_step(acceptance: tuple[float, ...]) -> float:
    """Tokens a sequence gains per verify step: ``E = 1 + Σ_i Π_{j≤i} a_j`` — draft ``i`` counts
    only if drafts ``1 … i`` are all accepted, and the verify step always yields one token (the
    bonus or the correction); Leviathan et al. 2023, "Fast Inference from Transformers via
    Speculative Decoding", eq. (1) with per-position rates."""
    total, run = 1.0, 1.0
    for a in acceptance:
        run *= a
        total += run
    return total


@dataclass(frozen=True)
class KVCache:
    """The KV cache of one engine instance: ``capacity_tokens`` slots in blocks of
    ``block_size`` tokens (``capacity_tokens`` a multiple of it)."""

    capacity_tokens: int
    block_size: int = 16
    bytes_per_token: int = 0

    @property
    def blocks(self) -> int:
        return self.capacity_tokens // self.block_size

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size)


@dataclass(frozen=True)
class Summary:
    """A latency's distribution over requests (or, for ITL, over inter-token gaps), seconds."""

    mean: float
    p50: float
    p90: float
    p99: float

    def as_dict(self) -> dict:
        return {"mean": self.mean, "p50": self.p50, "p90": self.p90, "p99": self.p99}


@dataclass(frozen=True)
class Samples:
    """The per-request figures a simulation's summaries are made of, seconds, counted requests in
    request order: TTFT of each, TPOT of each with more than one output token."""

    ttft_s: tuple[float, ...]
    tpot_s: tuple[float, ...]


@dataclass(frozen=True)
class SLO:
    """Service-level objectives a request must meet to count towards goodput (None: no bound)."""

    ttft_s: float | None = None
    tpot_s: float | None = None
    e2e_s: float | None = None


@dataclass(frozen=True)
class ServingResult:
    """What both tiers (the event simulation and the closed form) report for one deployment at
    one load. Per-device figures divide by ``devices``; per-user is one request's output rate
    (1 / TPOT averaged over requests). ``stable`` False: the offered rate exceeds what the
    deployment sustains (``sustainable_rate``), and the latencies are not reported as finite; the
    throughputs are then the saturated ones, per user the decode rate at that load (the simulation:
    as its requests ran; the closed form: at saturation)."""

    tier: str                      # "simulation" | "closed form"
    ttft_s: Summary | None
    tpot_s: Summary | None
    itl_s: Summary | None
    e2e_s: Summary | None
    output_tokens_per_s: float
    output_tokens_per_s_per_device: float
    output_tokens_per_s_per_user: float
    requests_per_s: float
    devices: int
    kv_capacity_tokens: int
    kv_peak_tokens: int
    preemptions: int
    requests: int                  # requests counted (warm-up excluded)
    goodput_requests_per_s: float | None = None
    stable: bool = True
    sustainable_rate: float | None = None
    mean_batch: float | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)
    steps: int | None = None                       # engine steps simulated (simulation tier)
    decode_tokens_per_step: float | None = None    # tokens a decoding sequence emits per step (> 1: speculative)
    samples: Samples | None = None                 # the simulation's per-request TTFT and TPOT (stable runs)
