"""An engine's batching loop as data: which scheduler runs, and its limits.

The defaults come from the engine profile's ``scheduler:`` section
(``perfcast/engines/profiles/{vllm,sglang,trtllm}.yaml``), where every value cites the engine code
path that sets it; a user's flags override them. :mod:`.policies` runs the named loop.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from perfcast.engines.spec import EngineProfile, get_engine
from perfcast.inputs import checked_number
from perfcast.ir.errors import UserError

from .types import KVCache

#: the clip SGLang applies to a request's max_new_tokens when it reserves room for its output
#: (python/sglang/srt/managers/schedule_policy.py CLIP_MAX_NEW_TOKENS, default 4096)
SGLANG_CLIP_MAX_NEW_TOKENS = 4096


@dataclass(frozen=True)
class SchedulerConfig:
    """One engine instance's scheduler. ``policy`` names the loop (vLLM v1: one token budget,
    decodes and prefill chunks in one step; SGLang: a prefill batch runs alone unless
    ``mixed_chunk``; TRT-LLM: context and generation in one step, admission only with the whole
    sequence's blocks reserved). ``max_num_seqs`` None: bounded by the KV cache only."""

    policy: str
    max_num_seqs: int | None
    max_num_tokens: int
    chunked_prefill: bool
    mixed_chunk: bool
    block_size: int
    memory_fraction: float
    preemption: str                  # "recompute" | "retract" | "never"
    admission: str                   # "on_demand" | "reserve_ratio" | "reserve_full"
    #: SGLang's ``--max-prefill-tokens``: the most input tokens one prefill batch takes in
    #: (``PrefillAdder.rem_input_tokens``; None: no cap, the other engines)
    max_prefill_tokens: int | None = None
    new_token_ratio: tuple[float, float, int] | None = None  # (init, min_factor, decay_steps)
    engine: str = ""
    #: TensorRT-LLM batch waiting (``batch_wait_timeout_iters``, ``batch_wait_max_tokens_ratio``):
    #: context requests held back from steps with generation requests until that many steps have
    #: waited or the step's tokens reach the ratio of ``max_num_tokens``; (0, 0.0): off
    batch_wait: tuple[int, float] = (0, 0.0)
    #: SGLang's ``--scheduler-recv-interval``: new requests are taken in once every that many decode
    #: steps, and after any step that prefilled (1: every step, the default)
    recv_interval: int = 1
    #: the loop runs one step ahead of the device (SGLang's overlap schedule, TensorRT-LLM's overlap
    #: scheduler, vLLM's async scheduling): see :attr:`take_in_lag`
    overlap: bool = False
    #: batches in flight at once (pipeline parallelism: one per stage, each with its own budget of
    #: ``max_num_tokens``); the serving layer's step is one cycle of them
    #: (:mod:`perfcast.serving.step_pipeline`), its budget :attr:`step_tokens`; such a loop is not
    #: the engine's overlap loop (``overlap`` off: TensorRT-LLM's PyExecutor runs ``_executor_loop_pp``
    #: when ``pp_size > 1``, SGLang's ``event_loop_pp`` is "a non-overlap scheduler loop")
    micro_batches: int = 1
    #: the data-parallel load balancer (``round_robin`` or ``least_loaded``): which attention-DP rank a
    #: new request goes to (:mod:`perfcast.serving.sim_dp`)
    dp_balance: str = "least_loaded"
    #: TensorRT-LLM ``attention_dp_config`` with ``enable_balance``: (``batching_wait_iters``,
    #: ``timeout_iters``) — context requests held until every attention-DP rank has some (None: off,
    #: the engine's default; :mod:`perfcast.serving.sim_dp`)
    adp_balance: tuple[int, int] | None = None

    @property
    def step_tokens(self) -> int:
        """The token budget of one step of the serving layer: ``max_num_tokens`` per batch in
        flight (a request's own chunk stays within ``max_num_tokens``)."""
        return self.max_num_tokens * self.micro_batches

    def __post_init__(self):
        if self.policy not in ("vllm", "sglang", "trtllm"):
            raise UserError(f"scheduler policy: expected vllm, sglang or trtllm, got {self.policy!r}")
        for name in ("max_num_tokens", "block_size"):
            checked_number(getattr(self, name), f"scheduler {name}", integer=True, positive=True)
        if self.max_num_seqs is not None:
            checked_number(self.max_num_seqs, "--max-batch-size", integer=True, positive=True)
        iters, ratio = self.batch_wait
        checked_number(iters, "--batch-wait-iters", integer=True, minimum=0)
        checked_number(ratio, "--batch-wait-max-tokens-ratio", minimum=0, maximum=1)
        if self.waits and self.policy != "trtllm":
            raise UserError(f"--batch-wait-iters / --batch-wait-max-tokens-ratio: batch waiting is TensorRT-LLM's "
                            f"(batch_wait_timeout_iters, batch_wait_max_tokens_ratio); engine "
                            f"{self.engine or self.policy} has none")
        checked_number(self.recv_interval, "--scheduler-recv-interval", integer=True, positive=True)
        if self.adp_balance is not None:
            if self.policy != "trtllm":
                raise UserError(f"--attention-dp-balance: holding prompts until every attention-DP rank has one is "
                                f"TensorRT-LLM's (attention_dp_config.enable_balance); engine "
                                f"{self.engine or self.policy} has none")
            checked_number(self.adp_balance[0], "--attention-dp-balance batching_wait_iters", integer=True, minimum=0)
            checked_number(self.adp_balance[1], "--attention-dp-balance timeout_iters", integer=True, minimum=0)
        if self.max_prefill_tokens is not None:
            checked_number(self.max_prefill_tokens, "--max-prefill-tokens", integer=True, positive=True)
            if self.policy != "sglang":
                raise UserError(f"--max-prefill-tokens: a cap on one prefill batch's input tokens is SGLang's "
                                f"(--max-prefill-tokens); engine {self.engine or self.policy} has none")
        if self.recv_interval > 1 and self.policy != "sglang":
            raise UserError(f"--scheduler-recv-interval: taking in requests every N decode steps is SGLang's "
                            f"(scheduler_recv_interval); engine {self.engine or self.policy} has none")

    @property
    def take_in_lag(self) -> int:
        """Steps that start between a step's end and the first step that can take in a request a
        client sends on that step's outputs (a closed-loop client's next request). A synchronous loop
        has already launched the next step when the request arrives: 1. A loop one step ahead hands
        out a step's outputs only after launching the next, and has scheduled the one after by the
        time the request arrives: 2. (An idle engine takes a request in at once.)"""
        return 2 if self.overlap else 1

    @property
    def waits(self) -> bool:
        """TensorRT-LLM's ``enable_batch_waiting``: either setting above zero."""
        return self.batch_wait[0] > 0 or self.batch_wait[1] > 0

    def kv_cache(self, capacity_tokens: int, bytes_per_token: int = 0) -> KVCache:
        """A KV cache of at most ``capacity_tokens`` in this engine's blocks (rounded down to whole
        blocks, as the engines allocate whole blocks)."""
        blocks = int(capacity_tokens) // self.block_size
        if blocks < 1:
            raise UserError(f"--kv-capacity: {capacity_tokens} tokens is less than one {self.block_size}-token block")
        return KVCache(blocks * self.block_size, self.block_size, bytes_per_token)


def scheduler_config(engine: str | EngineProfile, *, max_batch_size: int | None = None,
                     max_num_tokens: int | None = None, chunked_prefill: bool | None = None,
                     mixed_chunk: bool | None = None, batch_wait: tuple[int, float] | None = None,
                     memory_fraction: float | None = None, recv_interval: int | None = None,
                     overlap: bool | None = None, micro_batches: int = 1,
                     adp_balance: tuple[int, int] | None = None, max_prefill_tokens: int | None = None,
                     device=None) -> SchedulerConfig:
    """The scheduler of ``engine`` (a profile or its name) with the engine's documented defaults
    (those the engine picks by the device's memory and name for ``device``, a :class:`Device`, where given),
    overridden by the user's ``--max-batch-size``, ``--max-num-tokens``, chunked prefill on/off,
    (SGLang) mixed chunk, recv interval and ``--max-prefill-tokens``, (TensorRT-LLM) batch waiting, the engine's memory
    fraction and overlap scheduling on/off; ``micro_batches``: the batches in flight (a
    pipeline's stages)."""
    prof = get_engine(engine) if isinstance(engine, str) else engine
    s = prof.scheduler
    if s is None:
        raise UserError(f"engine {prof.name!r}: its profile has no 'scheduler' section; serving needs one "
                        f"(engines with one: vllm, sglang, trtllm)")
    ratio = s.new_token_ratio
    cfg = SchedulerConfig(
        policy=s.policy, max_num_seqs=s.max_num_seqs.for_device(device),
        max_num_tokens=s.max_num_tokens.for_device(device),
        chunked_prefill=s.chunked_prefill.value, mixed_chunk=s.mixed_chunk.value,
        block_size=s.block_size_tokens.value, memory_fraction=s.memory_fraction.value,
        preemption=s.preemption.value, admission=s.admission.value,
        max_prefill_tokens=s.max_prefill_tokens.value if s.max_prefill_tokens else None,
        new_token_ratio=(ratio.init, ratio.min_factor, ratio.decay_steps) if ratio else None, engine=prof.name,
        batch_wait=(s.batch_wait.timeout_iters, s.batch_wait.max_tokens_ratio) if s.batch_wait else (0, 0.0),
        recv_interval=s.recv_interval.value if s.recv_interval else 1,
        overlap=s.overlap.value if s.overlap and micro_batches == 1 else False, micro_batches=int(micro_batches),
        dp_balance=s.dp_balance.value if s.dp_balance else "least_loaded")
    if micro_batches > 1 and overlap:
        raise UserError("--overlap-scheduling: a pipeline-parallel instance runs the engine's pipeline loop, not its "
                        "overlap loop (TensorRT-LLM _executor_loop_pp, SGLang's non-overlap event_loop_pp, vLLM's "
                        "batch queue of one batch per stage); drop --pp-size or the flag")
    return with_overrides(cfg, max_batch_size=max_batch_size, max_num_tokens=max_num_tokens,
                          chunked_prefill=chunked_prefill, mixed_chunk=mixed_chunk, batch_wait=batch_wait,
                          memory_fraction=memory_fraction, recv_interval=recv_interval, overlap=overlap,
                          adp_balance=adp_balance, max_prefill_tokens=max_prefill_tokens)


def deployment_scheduler(dep, **overrides) -> SchedulerConfig:
    """The scheduler of a :class:`~.step.Deployment`'s engine on its device (the profile the
    deployment resolves, the device's memory for the defaults the engine picks by it), with
    :func:`scheduler_config`'s ``overrides``."""
    req = dep.request(decode=True, batch=2, length=2)
    return scheduler_config(req.profile(), device=req.device, **overrides)


def with_overrides(cfg: SchedulerConfig, *, max_batch_size: int | None = None, max_num_tokens: int | None = None,
                   chunked_prefill: bool | None = None, mixed_chunk: bool | None = None,
                   batch_wait: tuple[int, float] | None = None,
                   memory_fraction: float | None = None, recv_interval: int | None = None,
                   overlap: bool | None = None, adp_balance: tuple[int, int] | None = None,
                   max_prefill_tokens: int | None = None) -> SchedulerConfig:
    """``cfg`` with the user's flags applied (None keeps the engine's value)."""
    changes: dict = {} if batch_wait is None else {"batch_wait": (batch_wait[0], float(batch_wait[1]))}
    if max_prefill_tokens is not None:   # (checked in SchedulerConfig.__post_init__: SGLang's only)
        changes["max_prefill_tokens"] = max_prefill_tokens
    if adp_balance is not None:
        changes["adp_balance"] = (adp_balance[0], adp_balance[1])
    if overlap is not None:
        changes["overlap"] = bool(overlap)
    if recv_interval is not None:   # (checked with the others in SchedulerConfig.__post_init__)
        changes["recv_interval"] = recv_interval
    if memory_fraction is not None:
        changes["memory_fraction"] = checked_number(memory_fraction, "--memory-fraction", positive=True, maximum=1)
    if max_batch_size is not None:
        changes["max_num_seqs"] = checked_number(max_batch_size, "--max-batch-size", integer=True, positive=True)
    if max_num_tokens is not None:
        changes["max_num_tokens"] = checked_number(max_num_tokens, "--max-num-tokens", integer=True, positive=True)
    if chunked_prefill is not None:
        changes["chunked_prefill"] = bool(chunked_prefill)
    if mixed_chunk is not None:
        changes["mixed_chunk"] = bool(mixed_chunk)
    return replace(cfg, **changes)
