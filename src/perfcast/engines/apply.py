"""Choosing an engine for a device, and applying its profile to a captured step: the layer
rotation some engines' fused norms need, the per-segment plan the lowering follows, and the
launch mode the roll-up charges.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from perfcast.capture.kernels import KernelGroup
from perfcast.capture.lower import Plan, kind_of
from perfcast.capture.types import Capture, OpRecord
from perfcast.engines.plan import Context, segment_plan
from perfcast.engines.roles import assign
from perfcast.engines.spec import AllReduceRule, EngineProfile, NormRule, engine_names, get_engine, load_profile_file
from perfcast.ir import UserError


def compatible(profile: EngineProfile, device) -> bool:
    return device.spec.vendor in profile.vendors


def engines_for(device) -> list[str]:
    return [n for n in engine_names() if compatible(get_engine(n), device)]


def resolve(name: str | None, device, options: tuple[tuple[str, str], ...] = ()) -> EngineProfile:
    """The engine named ``name`` (an error if it cannot run on ``device``), or the device's
    declared default engine, with ``options`` (``--engine-option NAME=VALUE``) in force."""
    if name is None:
        default = device.spec.default_engine
        if default is None:
            raise UserError(f"device {device.name} declares no default_engine; pass --engine "
                            f"(one of {', '.join(engines_for(device))})")
        name = default.name
    profile = load_profile_file(name) if name.endswith((".yaml", ".yml")) else get_engine(name)
    if not compatible(profile, device):
        raise UserError(f"--engine {name}: runs on {', '.join(profile.vendors)} devices; {device.name} is "
                        f"{device.spec.vendor} (engines for it: {', '.join(engines_for(device)) or 'none'})")
    return with_options(profile, options, device) if options else profile


def with_options(profile: EngineProfile, options: tuple[tuple[str, str], ...], device) -> EngineProfile:
    """``profile`` with each named option set to its value: one line naming ``--engine-option``
    for an option the engine does not declare, a value it does not offer, or a device the value
    does not run on."""
    chosen = dict(profile.options)
    for key, value in options:
        opt = chosen.get(key)
        if opt is None:
            raise UserError(f"--engine-option {key}={value}: engine {profile.name} has no option {key!r} (its options: "
                            f"{', '.join(sorted(profile.options)) or 'none'})")
        match = next((c for c in opt.choices if c.lower() == value.lower()), None)
        if match is None:
            raise UserError(f"--engine-option {key}={value}: expected one of {', '.join(opt.choices)} "
                            f"(engine {profile.name}'s {opt.setting})")
        runs_on = opt.devices.get(match)
        if runs_on is not None and device.name not in runs_on:
            raise UserError(f"--engine-option {key}={match}: {profile.name}'s {opt.setting} {match} runs on "
                            f"{', '.join(runs_on)}, not {device.name}")
        if match != opt.value:
            chosen[key] = opt.model_copy(update={"value": match, "default": opt.default or opt.value})
    return profile.model_copy(update={"options": chosen})


def check_options(options: tuple[tuple[str, str], ...], model, profile: EngineProfile | None = None,
                  quantization=None) -> None:
    """Options that cannot apply to ``model``: a MoE backend or MoE activation type for a model
    without routed experts, or (given the resolved ``profile`` and the step's ``quantization``)
    TensorRT-LLM's TRTLLM backend for experts in the model dtype (TRTLLMGenFusedMoE serves
    block-FP8, NVFP4 and MXFP4 experts only), vLLM's MXFP4 MoE activations for experts that are
    not MXFP4."""
    from perfcast.capture.parallel import experts_of

    named = dict(options)
    for key in ("moe_backend", "moe_mxfp4_activations", "moe_exchange", "moe_a2a_backend"):  # the experts' options
        if key in named and not experts_of(model.data):
            raise UserError(f"--engine-option {key}={named[key]}: {model.name} has no routed experts")
    if quantization is None:
        return
    experts = quantization.scheme("mlp.experts", "experts")
    if "moe_backend" in named and profile.options["moe_backend"].value == "TRTLLM" and experts is None:
        raise UserError(f"--engine-option moe_backend=TRTLLM: TensorRT-LLM's TRTLLM MoE backend serves block-FP8, "
                        f"NVFP4 or MXFP4 experts, and {model.name}'s experts are unquantized here (pass --quantize)")
    act, scheme = named.get("moe_mxfp4_activations"), getattr(experts, "name", None)
    if act is not None and scheme != "mxfp4":
        raise UserError(f"--engine-option moe_mxfp4_activations={act}: vLLM's MXFP4 MoE backends serve MXFP4 "
                        f"experts, and {model.name}'s experts are {scheme or 'unquantized'} here")


#: options that choose how an attention-DP MoE group exchanges its tokens (TensorRT-LLM's forced method,
#: SGLang's all-to-all backend): they apply to such a layout only
EXCHANGE_OPTIONS = ("moe_exchange", "moe_a2a_backend")


def check_exchange(options: tuple[tuple[str, str], ...], *layouts) -> None:
    """``--engine-option moe_exchange`` or ``moe_a2a_backend`` where no instance of the deployment
    (``layouts``: one, or a disaggregated run's two pools) can take it: attention data parallelism
    with expert parallelism over the whole MoE group (moe_tp 1). An instance that cannot runs as its
    layout fixes (:func:`exchange_options`)."""
    for key in EXCHANGE_OPTIONS:
        if key in dict(options) and not any(x.moe_exchange_applies for x in layouts):
            raise UserError(f"--engine-option {key}: applies with --attention-dp and --ep-size the MoE group "
                            "(tp × dp) only; otherwise the MoE's tokens move as the layout fixes")


def merged_options(options: tuple[tuple[str, str], ...], more) -> tuple[tuple[str, str], ...]:
    """``options`` with ``more`` (pairs or a mapping) set over them, sorted by name: a later setting
    of the same option wins."""
    return tuple(sorted({**dict(options), **dict(more)}.items()))


def exchange_options(options: tuple[tuple[str, str], ...], layout) -> tuple[tuple[str, str], ...]:
    """``options`` as an instance of ``layout`` takes them: the exchange's options dropped where its MoE
    group exchanges no tokens (no attention DP, or experts split inside the group)."""
    return options if layout.moe_exchange_applies else tuple(o for o in options if o[0] not in EXCHANGE_OPTIONS)


def rotates(profile: EngineProfile, phase: str) -> bool:
    return any(isinstance(r, NormRule) and r.across_layers and (not r.phases or phase in r.phases)
               for r in profile.rules)


def _leading_norm(block: list[OpRecord]) -> int:
    """How many records open the layer with its input norm (views inside it included); 0 if the
    layer does not start with a norm."""
    roles = assign(block, kind_of)
    module, end = None, 0
    for i, (r, role) in enumerate(zip(block, roles)):
        if role is None:
            continue
        if role != "norm" or (module is not None and r.module != module):
            break
        module, end = r.module, i + 1
    return end


def rotate(cap: Capture) -> tuple[Capture, frozenset]:
    """The step with every decoder layer rotated to end with the *next* layer's input norm, as
    engines that fuse a layer's closing residual add into that norm run it (TensorRT-LLM's
    ``next_layer_layernorm``, vLLM's and SGLang's ``input_layernorm(hidden, residual)``): the
    first layer's input norm moves into the prologue, each layer body becomes ``rest…, norm``,
    and the final norm is the last layer's rotated one. Costs are exact because every layer's
    input norm and the final norm normalise the same hidden size (checked; otherwise the step
    is returned unrotated). Returns (capture, ids of the moved norm records — they stand for the
    next layer's norm, which reads the residual add before them; empty when not rotated)."""
    none: frozenset = frozenset()
    records = cap.records
    layered = [i for i, r in enumerate(records) if r.layer is not None]
    if not layered:
        return cap, none
    head, tail = records[: layered[0]], records[layered[-1] + 1:]
    blocks: list[list[OpRecord]] = []
    for r in records[layered[0]: layered[-1] + 1]:
        if r.layer is None:
            return cap, none  # something between layers (not a plain decoder stack)
        if not blocks or blocks[-1][0].layer != r.layer:
            blocks.append([])
        blocks[-1].append(r)
    cuts = [_leading_norm(b) for b in blocks]
    tail_roles = assign(tail, kind_of)
    final = [i for i, (r, role) in enumerate(zip(tail, tail_roles)) if role == "norm" and r.module == "model.norm"]
    if not all(cuts) or not final:
        return cap, none
    shape = blocks[0][0].inputs[0].shape
    if tail[final[0]].inputs[0].shape != shape or any(b[0].inputs[0].shape != shape for b in blocks):
        return cap, none
    drop = set(range(final[0], final[-1] + 1))
    out = list(head) + [replace(r, layer=None) for r in blocks[0][: cuts[0]]]
    for b, k in zip(blocks, cuts):
        out += b[k:] + b[:k]
    out += [r for i, r in enumerate(tail) if i not in drop]
    return replace(cap, records=out), frozenset(id(r) for b, k in zip(blocks, cuts) for r in b[:k])


@dataclass(frozen=True)
class Applied:
    """An engine applied to one step: the (possibly rotated) capture and the lowering's plan."""

    profile: EngineProfile
    capture: Capture
    plan: Plan
    rotated: bool
    used: set  # indices of the profile's rules that claimed records (filled as the plan runs)


def apply(profile: EngineProfile, cap: Capture, *, decode: bool, device: str, hidden_size: int) -> Applied:
    phase = "decode" if decode else "prefill"
    moved: frozenset = frozenset()
    if rotates(profile, phase):
        cap, moved = rotate(cap)
    ctx = Context(phase, device, hidden_size, moved)

    def plan(records: list[OpRecord], segment: str, lw) -> list[KernelGroup]:
        return segment_plan(profile, ctx, records, lw)

    return Applied(profile, cap, plan, bool(moved), ctx.used)


def size_decisions(profile: EngineProfile, *, tokens: int, nbytes: int) -> tuple[bool, ...]:
    """Which side of each of ``profile``'s size thresholds an all-reduce of ``nbytes`` over
    ``tokens`` tokens falls on (strategy limits, epilogue limits, token conditions). Two steps
    with equal tuples take the same size decisions, so one lowering with ``decide_at`` either
    step serves both."""
    out: list[bool] = []
    for rule in profile.rules:
        if not isinstance(rule, AllReduceRule):
            continue
        for s in rule.strategies:
            out += [nbytes <= s.max_bytes] if s.max_bytes is not None else []
            out += [tokens <= s.max_tokens] if s.max_tokens is not None else []
        ep = rule.epilogue
        if ep is not None:
            out += [nbytes <= v for _, v in sorted(ep.max_bytes_by_group.items())]
            out += [tokens <= ep.when.tokens_le] if ep.when.tokens_le is not None else []
            out += [tokens > ep.when.tokens_gt] if ep.when.tokens_gt is not None else []
    return tuple(out)
