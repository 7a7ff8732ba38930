"""The closed form's inputs (:mod:`perfcast.serving.meanfield`): one engine instance's limits and
one workload, as plain, hashable fields."""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

from perfcast.ir import UserError

POLICIES = ("vllm", "sglang", "trtllm")
#: the batch bound of an engine whose scheduler states none (bounded by its KV cache only): the
#: closed form's ``max_batch`` and the largest decode batch the step model tabulates
UNBOUNDED_BATCH = 4096


@dataclass(frozen=True)
class EngineConfig:
    """One engine instance's scheduler limits, KV capacity and speculative decoding, as plain
    fields: ``max_batch`` (vLLM ``max_num_seqs``, TRT-LLM ``max_batch_size``, SGLang
    ``max_running_requests``), ``max_num_tokens`` (the per-step token budget; SGLang's
    ``chunked_prefill_size`` for its prefill batches), ``spec_k`` draft tokens verified per step
    with per-position acceptance rates ``acceptance`` (``len == spec_k``), ``recv_interval``
    SGLang's ``--scheduler-recv-interval`` (new requests taken in once every that many decode
    steps), ``max_prefill_tokens`` SGLang's cap on one prefill batch's input tokens (None: none),
    ``take_in_lag`` the steps launched before one can take in a request sent on a step's
    outputs (:attr:`perfcast.serving.scheduler.SchedulerConfig.take_in_lag`: 1 or 2)."""

    policy: str = "vllm"
    max_batch: int = 256
    max_num_tokens: int = 8192
    chunked_prefill: bool = True
    kv_capacity_tokens: int = 1 << 20
    devices: int = 1
    spec_k: int = 0
    acceptance: tuple[float, ...] = ()
    recv_interval: int = 1
    max_prefill_tokens: int | None = None
    take_in_lag: int = 1
    micro_batches: int = 1   # batches in flight (a pipeline's stages): a step's budget is this many batches'
    #: attention-DP ranks that step together (an MoE engine's; 1: an independent instance): each step
    #: lasts as long as the slowest rank's (:func:`perfcast.serving.meanfield._state`)
    coupled_ranks: int = 1
    #: TensorRT-LLM's attention-DP balance of the coupled ranks (``attention_dp_config``:
    #: batching_wait_iters, timeout_iters): their prompts held until every rank has one, then run together
    adp_balance: tuple[int, int] | None = None

    @classmethod
    def of(cls, sched, capacity_tokens: int, **deployment) -> "EngineConfig":
        """The closed form's view of a :class:`perfcast.serving.scheduler.SchedulerConfig` ``sched``
        with a KV cache of ``capacity_tokens``; ``deployment``: the fields a deployment adds
        (``devices``, ``spec_k``, ``acceptance``, ``coupled_ranks``)."""
        return cls(policy=sched.policy, max_batch=sched.max_num_seqs or UNBOUNDED_BATCH,
                   max_num_tokens=sched.max_num_tokens, micro_batches=sched.micro_batches,
                   chunked_prefill=sched.chunked_prefill, kv_capacity_tokens=capacity_tokens,
                   recv_interval=sched.recv_interval, take_in_lag=sched.take_in_lag,
                   adp_balance=sched.adp_balance, max_prefill_tokens=sched.max_prefill_tokens, **deployment)

    @property
    def step_tokens(self) -> int:
        """A step's token budget: ``max_num_tokens`` per batch in flight (a prompt's chunk within one)."""
        return self.max_num_tokens * self.micro_batches

    def __post_init__(self):
        if self.policy not in POLICIES:
            raise UserError(f"policy {self.policy!r}: not one of {', '.join(POLICIES)}")
        if self.recv_interval < 1 or (self.recv_interval > 1 and self.policy != "sglang"):
            raise UserError(f"recv_interval {self.recv_interval}: a positive count, above 1 only for sglang")
        if self.max_prefill_tokens is not None and (self.max_prefill_tokens < 1 or self.policy != "sglang"):
            raise UserError(f"max_prefill_tokens {self.max_prefill_tokens}: a positive count, SGLang's only")
        if self.take_in_lag not in (1, 2):
            raise UserError(f"take_in_lag {self.take_in_lag}: 1 (a synchronous loop) or 2 (one step ahead)")
        for name in ("max_batch", "max_num_tokens", "kv_capacity_tokens", "devices", "coupled_ranks"):
            if getattr(self, name) < 1:
                raise UserError(f"{name} {getattr(self, name)}: must be at least 1")
        if self.adp_balance is not None and (self.policy != "trtllm" or min(self.adp_balance) < 0):
            raise UserError(f"adp_balance {self.adp_balance}: TensorRT-LLM's (batching_wait_iters, timeout_iters), "
                            f"each at least 0")
        if self.spec_k < 0 or len(self.acceptance) != self.spec_k:
            raise UserError(f"speculative decoding: {len(self.acceptance)} acceptance rates for k = {self.spec_k}")
        if any(not 0.0 <= a <= 1.0 for a in self.acceptance):
            raise UserError(f"acceptance rates {self.acceptance}: each must lie in [0, 1]")


@dataclass(frozen=True)
class Workload:
    """Fixed lengths and one load: ``concurrency`` clients in a closed loop, or Poisson arrivals
    at ``rate_per_s`` (open loop), or neither (max load: all requests queued at t = 0)."""

    isl: int
    osl: int
    concurrency: int | None = None
    rate_per_s: float | None = None
    prefix_hit_rate: float = 0.0

    def __post_init__(self):
        if self.isl < 1 or self.osl < 2:
            raise UserError(f"isl {self.isl}, osl {self.osl}: the closed form needs isl ≥ 1 and osl ≥ 2")
        if self.concurrency is not None and self.rate_per_s is not None:
            raise UserError("a workload has a concurrency or a rate, not both")
        if self.concurrency is not None and self.concurrency < 1:
            raise UserError(f"concurrency {self.concurrency}: must be at least 1")
        if self.rate_per_s is not None and not 0.0 < self.rate_per_s < math.inf:
            raise UserError(f"rate {self.rate_per_s}/s: must be positive and finite")
        if not 0.0 <= self.prefix_hit_rate <= 1.0:
            raise UserError(f"prefix hit rate {self.prefix_hit_rate}: must lie in [0, 1]")

    @cached_property
    def hit_tokens(self) -> int:
        """Prompt tokens served from the prefix cache; the last prompt token is always computed
        (vLLM recomputes it on a full hit to produce the logits)."""
        return min(round(self.isl * self.prefix_hit_rate), self.isl - 1)

    @cached_property
    def prefill_tokens(self) -> int:
        return self.isl - self.hit_tokens
