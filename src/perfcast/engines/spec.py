"""Engine profiles as data: a strict schema for the YAML files in ``profiles/``.

A profile names the serving engine and the version it represents (``framework``, ``version``),
the profiling database it goes with, the devices it runs on (by vendor), its launch mode per
phase (with measured host figures), and the rewrite rules that turn a captured Hugging Face step
into the kernels the engine launches (:mod:`perfcast.engines.plan`). Everything carries its sources;
the loader rejects a missing, unknown or mistyped key in one line naming the file and the key.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Annotated, Literal, Union

from pydantic import Field, model_validator

from perfcast.engines.settings import EngineOption, Phase, PositiveInt, SchedulerSection, Sources, Text, _Strict
from perfcast.hardware.spec import NonNegative, SpecError, parse_spec, read_yaml


class When(_Strict):
    """Conditions on the model and the step under which a rule applies (all must hold)."""

    hidden_size_gt: PositiveInt | None = None
    tokens_le: PositiveInt | None = None
    tokens_gt: PositiveInt | None = None


class _Rule(_Strict):
    phases: list[Phase] = Field(default_factory=list)  # empty: both phases
    devices: list[Text] = Field(default_factory=list)  # device names; empty: every device
    option: dict[Text, Text] = Field(default_factory=dict)  # only where the engine options have these values
    attention: Literal["mla", "mha"] | None = None  # only segments whose attention is (not) MLA
    sources: Sources


class DropRule(_Rule):
    """Ops the engine does not run per step (e.g. the rotary table, precomputed at load)."""

    rule: Literal["drop"]
    roles: Annotated[list[Text], Field(min_length=1)]
    why: Text


class MergeGemmsRule(_Rule):
    """Matmuls of one block reading the same activation become one GEMM, N summed."""

    rule: Literal["merge_gemms"]
    region: Literal["attention", "mlp"]
    kernel: Text
    kernel_by_modules: dict[Text, Text] = Field(default_factory=dict)


class NormRule(_Rule):
    """Each norm module's ops are one kernel; with ``with_residual``, an immediately preceding
    residual add that feeds it joins it. ``across_layers`` rotates the layer so a layer's
    closing residual add meets the next layer's input norm (the engines' ``next_layer_layernorm``)."""

    rule: Literal["norm"]
    roles: Annotated[list[Text], Field(min_length=1)] = Field(default_factory=lambda: ["norm"])
    kernel: Text
    with_residual: Text | None = None
    prefix_roles: list[Text] = Field(default_factory=list)  # glue right before the residual add that joins too
    across_layers: bool = False
    kernel_class: Text = "norm"


class FuseRule(_Rule):
    """Each maximal run of consecutive ops whose roles are in ``roles`` is one kernel."""

    rule: Literal["fuse"]
    roles: Annotated[list[Text], Field(min_length=1)]
    kernel: Text
    kernel_class: Text = "elementwise"
    require: list[Text] = Field(default_factory=list)  # roles the run must contain
    across: list[Text] = Field(default_factory=list)  # ops the run may pass (moved before or after it)
    writes_cache: bool = False  # the kernel also writes the next attention's new KV entries


class AbsorbRule(_Rule):
    """Runs of ``roles`` right before (``side: before``) or after the op with role ``into`` run
    inside its kernel."""

    rule: Literal["absorb"]
    roles: Annotated[list[Text], Field(min_length=1)]
    into: Text
    side: Literal["before", "after"]
    kernel: Text | None = None  # rename the absorbing kernel
    cache_in_kernel: bool = False  # the absorbing attention kernel writes the new KV entries itself
    # (K, N) of the absorbing GEMMs that compute in their activation's 16-bit source: the absorbed cast
    # up is the kernel's input conversion, not its compute format (capture.kernels._source_format)
    source_format_shapes: list[tuple[int, int]] = []


class NameRule(_Rule):
    """Ops with these roles are kernels of their own under the engine's name; ``launches`` is the
    number of kernels the engine launches for the op (a fused MoE op launches several)."""

    rule: Literal["name"]
    roles: Annotated[list[Text], Field(min_length=1)]
    kernel: Text
    kernel_class: Text | None = None
    launches: PositiveInt = 1


class AttentionKernels(_Strict):
    prefill: Text
    decode: Text
    mla_prefill: Text | None = None
    mla_decode: Text | None = None


class CacheWrite(_Strict):
    """Where the new tokens' KV entries are written: inside the attention kernel, in a kernel of
    their own (``kernel``), by the fused prologue kernel before attention — or, ``concat``, by a
    kernel of their own that copies the whole cache with them into a new one (transformers'
    ``DynamicCache``: ``torch.cat([cached, new])`` every step)."""

    mode: Literal["in_kernel", "separate", "prologue", "concat"]
    kernel: Text | None = None
    launches: PositiveInt = 1  # a separate or concat write run as this many kernels (keys, values)

    @model_validator(mode="after")
    def _named(self):
        if self.mode in ("separate", "concat") and not self.kernel:
            raise ValueError(f"@kernel: a {self.mode} cache write needs a kernel name")
        return self


class AttentionRule(_Rule):
    rule: Literal["attention"]
    kernel: AttentionKernels
    cache_write: dict[Phase, CacheWrite]
    mla_cache_write: dict[Phase, CacheWrite] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _phases(self):
        missing = {"prefill", "decode"} - set(self.cache_write)
        if missing:
            raise ValueError(f"@cache_write.{sorted(missing)[0]}: missing")
        return self


class Strategy(_Strict):
    """One all-reduce implementation and when the engine picks it (first match wins)."""

    kernel: Text
    algorithm: Literal["oneshot", "twoshot", "nccl", "hccl", "ring"]
    max_group: PositiveInt | None = None
    max_bytes: PositiveInt | None = None
    max_tokens: PositiveInt | None = None
    fuses_epilogue: bool = False


class Epilogue(_Strict):
    """Ops after an all-reduce that its kernel runs too (residual add + RMSNorm)."""

    roles: Annotated[list[Text], Field(min_length=1)]
    kernel: Text
    when: When = When()
    max_bytes_by_group: dict[int, PositiveInt] = Field(default_factory=dict)


class AllReduceRule(_Rule):
    rule: Literal["allreduce"]
    strategies: Annotated[list[Strategy], Field(min_length=1)]
    epilogue: Epilogue | None = None


class MoeA2aRule(_Rule):
    """A MoE layer's dispatch and combine all-to-alls (attention data parallelism, the all-to-all
    exchange) run as the engine's own kernels — DeepEP's — named ``dispatch`` and ``combine``, each
    sending its copies in its ``*_dtype`` (the dispatch casts to FP8, the combine sends bf16), priced by
    the kernel class fitted on ``op``'s measured kernels where the device has that fit (within one
    NVLink domain); elsewhere on the topology, as any all-to-all."""

    rule: Literal["moe_a2a"]
    op: Literal["deepep_low_latency"]
    dispatch: Text
    combine: Text
    dispatch_dtype: Literal["fp8", "bf16"]
    combine_dtype: Literal["fp8", "bf16"]


class AuxStreamRule(_Rule):
    """Work the engine runs on a second CUDA stream, at the same time as the main stream's: in each
    MoE block, the kernels of its submodules named in ``modules`` (the shared experts) run alongside
    the block's kernels whose roles are in ``alongside`` (the router, the routed experts and their
    exchange) up to the op that joins them (role ``moe_add``) — only where the step's kernels are
    launched as one of ``launch`` (an engine may switch streams only inside a CUDA graph). The
    roll-ups charge the two streams as concurrent work sharing the device's resources
    (:mod:`perfcast.rollup.streams`)."""

    rule: Literal["aux_stream"]
    modules: Annotated[list[Text], Field(min_length=1)]
    alongside: Annotated[list[Text], Field(min_length=1)]
    launch: Annotated[list[Literal["cuda_graph", "compiled", "eager"]], Field(min_length=1)]


Rule = Annotated[Union[DropRule, MergeGemmsRule, NormRule, FuseRule, AbsorbRule, NameRule,
                       AttentionRule, AllReduceRule, MoeA2aRule,
                       AuxStreamRule], Field(discriminator="rule")]


class Leftover(_Strict):
    """What happens to ops no rule claimed: memory-bound ones run one kernel per op (``per_op``)
    or one kernel per maximal run between other kernels (``fuse_runs``); every other op is a
    kernel of its own named by the op."""

    memory: Literal["per_op", "fuse_runs"]
    kernel: Text = "fused"
    sources: Sources


class LaunchMode(_Strict):
    """``cuda_graph`` steps of more tokens than the largest captured graph (``max_tokens``, or
    per device ``max_tokens_by_device``; a decode step has one token per sequence) run eagerly."""

    mode: Literal["cuda_graph", "eager", "compiled"]
    max_tokens: PositiveInt | None = None
    max_tokens_by_device: dict[Text, PositiveInt] = Field(default_factory=dict)
    sources: Sources

    @model_validator(mode="after")
    def _graph_only(self):
        if (self.max_tokens is not None or self.max_tokens_by_device) and self.mode != "cuda_graph":
            raise ValueError("@max_tokens: only a cuda_graph launch has a capture size")
        return self

    def capture_limit(self, device: str) -> int | None:
        return self.max_tokens_by_device.get(device, self.max_tokens)


class HostFigure(_Strict):
    value_s: NonNegative
    source: Text


class Launch(_Strict):
    prefill: LaunchMode
    decode: LaunchMode
    host_launch_interval_s: dict[Text, HostFigure] = Field(default_factory=dict)  # by vendor
    iteration_gap_s: dict[Text, HostFigure] = Field(default_factory=dict)  # GPU idle between decode steps


class Database(_Strict):
    framework: Text
    version: Text
    source: Text


class CalibrationRef(_Strict):
    """Whose measured kernels the analytic model's kernel fits come from, for an engine whose own
    framework has no measured tables (PyTorch eager runs cuBLAS GEMMs, as vLLM's unquantized
    linear layers do)."""

    framework: Text
    reason: Text


class MoeExchange(_Strict):
    """How the devices of one MoE layer exchange tokens under attention data parallelism:
    ``all_to_all`` — each rank dispatches its routed copies to the experts' ranks and combines
    their outputs back; ``gather`` — every rank all-gathers all ranks' tokens before the experts
    (the activations quantized first unless the experts are block-scaled FP8, whose kernel
    quantizes them) and reduce-scatters the expert outputs after. ``all_to_all_devices`` run the
    all-to-all, every other device ``default``."""

    default: Literal["all_to_all", "gather"]
    all_to_all_devices: list[Text] = Field(default_factory=list)
    #: an engine option's values that choose the exchange whatever the device (SGLang's
    #: ``--moe-a2a-backend deepep``: the all-to-all; ``none``: the gather)
    by_option: dict[Text, dict[Text, Literal["all_to_all", "gather"]]] = Field(default_factory=dict)
    sources: Sources

    def method(self, device: str, options: dict | None = None) -> str:
        for name, values in self.by_option.items():
            opt = (options or {}).get(name)
            if opt is not None and opt.value in values:
                return values[opt.value]
        return "all_to_all" if device in self.all_to_all_devices else self.default


class EngineProfile(_Strict):
    name: Annotated[str, Field(strict=True, pattern=r"^[a-z0-9][a-z0-9-]*$")]
    description: Text
    framework: Text
    version: Text
    vendors: Annotated[list[Text], Field(min_length=1)]
    database: Database | None = None
    calibration: CalibrationRef | None = None
    launch: Launch
    rules: list[Rule] = Field(default_factory=list)
    leftover: Leftover
    scheduler: SchedulerSection | None = None
    moe_exchange: MoeExchange | None = None  # None: the all-to-all
    options: dict[Annotated[str, Field(pattern=r"^[a-z][a-z0-9_]*$")], EngineOption] = Field(default_factory=dict)

    def exchange(self, device: str) -> str:
        """The MoE token exchange on ``device``: the ``moe_exchange`` option where set to other
        than ``auto``, else the profile's :class:`MoeExchange` (absent: the all-to-all)."""
        opt = self.options.get("moe_exchange")
        if opt is not None and opt.value != "auto":
            return opt.value
        return self.moe_exchange.method(device, self.options) if self.moe_exchange else "all_to_all"

    def selects(self, rule) -> bool:
        """Whether ``rule`` applies under the options' values."""
        return all(k in self.options and self.options[k].value == v for k, v in rule.option.items())

    @model_validator(mode="after")
    def _rule_options(self):
        for n, rule in enumerate(self.rules):
            for k, v in rule.option.items():
                if k not in self.options or v not in self.options[k].choices:
                    raise ValueError(f"@rules.{n}.option.{k}: {v!r} is not a value of a declared option "
                                     f"({', '.join(f'{o}: {c.choices}' for o, c in self.options.items()) or 'none declared'})")
        return self

    @model_validator(mode="after")
    def _known_roles(self):
        """Every role a rule names is one the role table gives (a misspelt role would match nothing)."""
        from perfcast.engines.roles import ROLES

        for n, rule in enumerate(self.rules):
            lists = {k: getattr(rule, k, None) for k in ("roles", "prefix_roles", "require", "across", "alongside")}
            lists["epilogue.roles"] = rule.epilogue.roles if getattr(rule, "epilogue", None) else None
            named = [(f"{k}.{i}", r) for k, v in lists.items() for i, r in enumerate(v or [])]
            bad = next(((k, r) for k, r in named + [("into", getattr(rule, "into", None))] if r and r not in ROLES), None)
            if bad:
                raise ValueError(f"@rules.{n}.{bad[0]}: {bad[1]!r} is not a role (known: {', '.join(ROLES)})")
        return self

    @model_validator(mode="after")
    def _exchange_options(self):
        for name, values in (self.moe_exchange.by_option if self.moe_exchange else {}).items():
            opt = self.options.get(name)
            if opt is None:
                raise ValueError(f"@moe_exchange.by_option.{name}: not a declared option")
            for v in values:
                if v not in opt.choices:
                    raise ValueError(f"@moe_exchange.by_option.{name}.{v}: not one of the option's choices "
                                     f"({', '.join(opt.choices)})")
        return self

    @model_validator(mode="after")
    def _host_figures(self):
        modes = [getattr(self.launch, p) for p in ("prefill", "decode")]
        eager = any(m.mode == "eager" or m.max_tokens or m.max_tokens_by_device for m in modes)
        missing = [v for v in self.vendors if v not in self.launch.host_launch_interval_s]
        if eager and missing:
            raise ValueError(f"@launch.host_launch_interval_s.{missing[0]}: missing (the profile launches "
                             f"kernels eagerly on {missing[0]} devices)")
        return self


@lru_cache(maxsize=None)
def profiles_dir() -> Path:
    from importlib import resources

    return Path(str(resources.files("perfcast.engines") / "profiles"))


def engine_names() -> list[str]:
    return sorted(p.stem for p in profiles_dir().glob("*.yaml"))


def _profile_data(path: Path, seen: tuple[Path, ...] = ()) -> object:
    """A profile file's data; ``extends: NAME`` starts from the shipped profile ``NAME``, whose
    top-level keys the file's own replace (``rules`` as a whole list)."""
    data = read_yaml(path)
    if not isinstance(data, dict) or "extends" not in data:
        return data
    base = data["extends"]
    if not isinstance(base, str) or not (profiles_dir() / f"{base}.yaml").exists():
        raise SpecError(f"{path}: key 'extends' is {base!r}; expected a shipped engine ({', '.join(engine_names())})")
    chain = (*seen, path.resolve())
    parent_path = (profiles_dir() / f"{base}.yaml").resolve()
    if parent_path in chain:
        raise SpecError(f"{path}: key 'extends': profiles extend each other in a cycle "
                        f"({' → '.join(p.stem for p in (*chain, parent_path))})")
    return {**_profile_data(parent_path, chain), **{k: v for k, v in data.items() if k != "extends"}}


@lru_cache(maxsize=None)
def load_profile_file(path: str | Path) -> EngineProfile:
    path = Path(path)
    return parse_spec(EngineProfile, path, _profile_data(path))


def get_engine(name: str) -> EngineProfile:
    """A shipped engine profile by name; an unknown name lists the known ones."""
    path = profiles_dir() / f"{name}.yaml"
    if not path.exists():
        raise SpecError(f"unknown engine {name!r}; known: {', '.join(engine_names())}")
    prof = load_profile_file(path)
    if prof.name != name:
        raise SpecError(f"{path}: key 'name' is {prof.name!r}, expected {name!r} (the file name)")
    return prof
