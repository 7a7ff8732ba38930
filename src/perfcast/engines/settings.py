"""The engine profile's settings: the scheduler's defaults (each with the engine code path that
sets it) and the options that change which kernels run (``--engine-option``), with the field
types every profile section shares (:mod:`perfcast.engines.spec` is the profile's schema)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

Text = Annotated[str, Field(strict=True, min_length=1)]
Sources = Annotated[list[Text], Field(min_length=1)]
#: a count, a token or byte limit: an integer a float holds exactly
PositiveInt = Annotated[int, Field(strict=True, gt=0, le=2**53)]
Phase = Literal["prefill", "decode"]


class _Strict(BaseModel):
    # NaN and infinity (YAML's .nan, .inf, and 1e400) are not figures
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class MemoryTier(_Strict):
    """The value an engine picks on devices of at least ``from_gib`` GiB of memory, except those
    whose name holds one of ``except_names`` (vLLM: ``"a100" not in device_name``), which take the
    tier below."""

    from_gib: Annotated[float, Field(ge=0)]
    value: PositiveInt
    except_names: list[Annotated[str, Field(strict=True, min_length=1, pattern=r"^[a-z0-9-]+$")]] = []


class CountSetting(_Strict):
    """A count or token limit the engine uses by default (``null``: none of its own; the engine
    derives it from memory), with where the engine sets it. ``by_memory``: the engine picks it by
    the device's memory instead (SGLang's ``chunked_prefill_size``; vLLM's token budget and batch,
    A100s excepted), ``value`` then being its pick where the device is not known."""

    value: PositiveInt | None
    sources: Sources
    by_memory: list[MemoryTier] | None = None

    @model_validator(mode="after")
    def _tiers(self):
        if self.by_memory is not None:
            edges = [t.from_gib for t in self.by_memory]
            if not edges or edges[0] != 0 or edges != sorted(set(edges)):
                raise ValueError("@by_memory: tiers from 0 GiB up, in ascending order")
            if self.by_memory[0].except_names:
                raise ValueError("@by_memory: the 0 GiB tier applies to every device (no except_names)")
        return self

    def for_device(self, device=None) -> int | None:
        """The value on ``device`` (a :class:`~perfcast.hardware.device.Device`; None: not known):
        the highest tier its memory reaches whose ``except_names`` its name holds none of."""
        if self.by_memory is None or device is None:
            return self.value
        gib, name = float(device.hbm_capacity_bytes) / 2**30, device.name.lower()
        return [t.value for t in self.by_memory
                if t.from_gib <= gib and not any(n in name for n in t.except_names)][-1]


class FlagSetting(_Strict):
    value: Annotated[bool, Field(strict=True)]
    sources: Sources


class FractionSetting(_Strict):
    value: Annotated[float, Field(gt=0, le=1)]
    sources: Sources


class ChoiceSetting(_Strict):
    value: Literal["recompute", "retract", "never", "on_demand", "reserve_ratio", "reserve_full"]
    sources: Sources


class BalanceSetting(_Strict):
    """How the engine gives a new request to one of its data-parallel ranks: ``round_robin`` (in
    turn) or ``least_loaded`` (the rank with the fewest unfinished requests)."""

    value: Literal["round_robin", "least_loaded"]
    sources: Sources


class TokenRatio(_Strict):
    """SGLang's estimate of the share of a running request's remaining output it will still
    generate, used to admit new requests: starts at ``init``, decays per decode step to
    ``init · min_factor`` over ``decay_steps`` steps, back to ``init`` on a retraction."""

    init: Annotated[float, Field(gt=0, le=1)]
    min_factor: Annotated[float, Field(gt=0, le=1)]
    decay_steps: PositiveInt
    sources: Sources


class BatchWait(_Strict):
    """TensorRT-LLM's batch waiting: context requests held out of steps that carry generation
    requests until ``timeout_iters`` steps have waited or the step's tokens reach
    ``max_tokens_ratio`` × ``max_num_tokens`` (0 and 0: off, the default)."""

    timeout_iters: Annotated[int, Field(strict=True, ge=0)]
    max_tokens_ratio: Annotated[float, Field(ge=0, le=1)]
    sources: Sources


class SchedulerSection(_Strict):
    """The engine's batching loop (``policy``: whose ``schedule`` the simulation runs) and its
    defaults, each with the engine code path that sets it."""

    policy: Literal["vllm", "sglang", "trtllm"]
    policy_sources: Sources
    max_num_seqs: CountSetting
    max_num_tokens: CountSetting
    chunked_prefill: FlagSetting
    mixed_chunk: FlagSetting
    block_size_tokens: CountSetting
    memory_fraction: FractionSetting
    preemption: ChoiceSetting
    admission: ChoiceSetting
    max_prefill_tokens: CountSetting | None = None
    new_token_ratio: TokenRatio | None = None
    batch_wait: BatchWait | None = None
    #: SGLang ``--scheduler-recv-interval``: the scheduler takes in new requests once every that many
    #: decode steps (and after every other step)
    recv_interval: CountSetting | None = None
    #: the scheduler runs one step ahead of the device (SGLang's overlap schedule, TensorRT-LLM's
    #: overlap scheduler, vLLM's async scheduling): a step's outputs are handled after the next step
    #: is launched, so a request sent on them is taken in a step later than a synchronous loop takes it
    overlap: FlagSetting | None = None
    #: the data-parallel load balancer: which rank a new request goes to
    dp_balance: BalanceSetting | None = None

    @model_validator(mode="after")
    def _choices(self):
        if self.preemption.value not in ("recompute", "retract", "never"):
            raise ValueError("@preemption.value: expected recompute, retract or never")
        if self.admission.value not in ("on_demand", "reserve_ratio", "reserve_full"):
            raise ValueError("@admission.value: expected on_demand, reserve_ratio or reserve_full")
        if self.block_size_tokens.value is None:
            raise ValueError("@block_size_tokens.value: the KV block size is a number")
        if self.max_num_tokens.value is None:
            raise ValueError("@max_num_tokens.value: the step token budget is a number")
        if self.admission.value == "reserve_ratio" and self.new_token_ratio is None:
            raise ValueError("@new_token_ratio: reserve_ratio admission needs the ratio")
        return self


class EngineOption(_Strict):
    """A documented engine setting that changes which kernels run (TensorRT-LLM's
    ``moe_config.backend``): ``value`` is the value in force (in a profile, the engine's default;
    ``default`` keeps that where ``--engine-option`` set another), ``choices`` the values perfcast
    prices, ``setting`` the engine's own key. Rules with ``option: {name: value}`` apply only where
    the option has that value; ``devices`` (per choice) lists the devices a choice runs on."""

    value: Text
    choices: Annotated[list[Text], Field(min_length=1)]
    setting: Text
    devices: dict[Text, list[Text]] = Field(default_factory=dict)
    sources: Sources
    default: Text | None = None  # the engine's value where --engine-option set another (not written in a profile)

    @model_validator(mode="after")
    def _known(self):
        for v in (self.value, *self.devices):
            if v not in self.choices:
                raise ValueError(f"@value: {v!r} is not one of the choices ({', '.join(self.choices)})")
        return self
