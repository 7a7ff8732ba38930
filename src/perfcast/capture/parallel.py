"""Parallel layouts for captured models: tensor, expert, data and pipeline parallelism applied
as a sharding plan on the captured step.

A layout is ``tp × dp × pp`` devices (``ep`` and ``moe_tp`` factor the devices an MoE layer
runs on). The plan is Megatron-LM's for the dense parts (Shoeybi et al., "Megatron-LM",
arXiv:1909.08053, §3: column-parallel q/k/v and gate/up, row-parallel o and down, vocab-parallel
embedding and ``lm_head``), vLLM's and SGLang's for serving MoE (experts sharded over ``ep``,
attention data parallelism with dispatch/combine all-to-all, DeepSeek-V3 report
arXiv:2412.19437 §3.4):

- **Shapes per device** come from capturing the *per-rank model* — the config with attention
  heads, KV heads (replicated when fewer than ``tp``), MLP and expert intermediates and the
  vocabulary divided — so every op (rotary, attention, norms) has its per-device shape and the
  per-device weights and KV cache follow. Stacked expert weights are divided by ``ep`` at the
  memory count and in the grouped GEMM (local experts, and the token-expert pairs this rank
  receives under balanced routing).
- **Collectives** follow from the shardings by the einsum rule of ARCHITECTURE.md §2 (see
  :func:`row_parallel_collective`): a row-parallel linear contracts a dim sharded on ``tp`` in
  both operands, so its output is a partial sum; the partial sums of a block (attention, MLP or
  shared + routed experts) are reduced once at the block's output — an all-reduce over ``tp``,
  or with sequence parallelism a reduce-scatter there and an all-gather before the next block.
  The vocab-parallel embedding's output is partial too (all-reduce); ``lm_head``'s logits are
  sharded on the vocabulary (all-gather for sampling). Only the MoE dispatch and combine
  all-to-alls (attention-DP) and the pipeline's send/recv are layout changes written by hand.
- **Pipeline parallelism** splits the decoder layers into ``pp`` contiguous stages (embedding
  on the first, final norm and ``lm_head`` on the last); each stage sends its activations to the
  next (send/recv over ``pp``).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace

import sympy

from perfcast.capture.types import (MOE_A2A_COMBINE, MOE_A2A_DISPATCH, MOE_DISPATCH, Capture, LayerGroup, OpRecord,
                                    TensorMeta)
from perfcast.ir import UserError
from perfcast.models import architecture

#: Config keys of the routed experts' count, per model family.
EXPERT_COUNT_KEYS = ("n_routed_experts", "num_local_experts", "num_experts")
_LAYER = re.compile(r"^model\.layers\.(\d+)\.")


@dataclass(frozen=True)
class Layout:
    tp: int = 1
    ep: int = 1
    dp: int = 1
    pp: int = 1
    attention_dp: bool = False  # dp ranks run attention on their own requests and share MoE layers
    sequence_parallel: bool = False
    micro_batches: int | None = None  # pipeline micro-batches (default: pp)

    @property
    def num_devices(self) -> int:
        return self.tp * self.dp * self.pp

    @property
    def moe_group(self) -> int:
        """Devices one MoE layer runs on: the tensor-parallel group, and with attention data
        parallelism the data-parallel ranks too."""
        return self.tp * (self.dp if self.attention_dp else 1)

    @property
    def moe_tp(self) -> int:
        """Tensor parallelism inside each expert (the MoE group's devices not used by ``ep``)."""
        return self.moe_group // self.ep

    @property
    def moe_exchange_applies(self) -> bool:  # attention DP, ep the whole MoE group: MoeExchange's layouts
        return self.attention_dp and self.moe_tp == 1

    @property
    def trivial(self) -> bool:
        return self.num_devices == 1

    def describe(self) -> str:
        parts = [f"{a}{v}" for a, v in (("tp", self.tp), ("ep", self.ep), ("dp", self.dp), ("pp", self.pp)) if v > 1]
        extra = [x for x, on in (("attention-dp", self.attention_dp), ("sequence-parallel", self.sequence_parallel)) if on]
        return " ".join(parts + extra) or "single device"

    def mesh_axes(self, moe: bool = True) -> list[tuple[str, int, int]]:
        """(axis, size, stride): tp innermost, then dp, then pp; for MoE models ``moe_tp`` × ``ep``
        factor the MoE group (tp, or tp × dp with attention data parallelism)."""
        axes = [("tp", self.tp, 1), ("dp", self.dp, self.tp), ("pp", self.pp, self.tp * self.dp)]
        return axes + ([("moe_tp", self.moe_tp, 1), ("ep", self.ep, self.moe_tp)] if moe else [])


def experts_of(cfg: dict) -> int:
    return next((int(cfg[k]) for k in EXPERT_COUNT_KEYS if cfg.get(k)), 0)


def check(layout: Layout, cfg: dict, model: str, num_devices: int | None, num_queries: int) -> None:
    """Refuse, with one line naming the flag, a layout the model or the request cannot take."""
    for flag, v in (("--tp-size", layout.tp), ("--ep-size", layout.ep), ("--dp-size", layout.dp),
                    ("--pp-size", layout.pp)):
        if v < 1:
            raise UserError(f"{flag} must be at least 1 (got {v})")
    if num_devices is not None and num_devices != layout.num_devices:
        raise UserError(f"--num-devices {num_devices} ≠ --tp-size {layout.tp} × --dp-size {layout.dp} × "
                        f"--pp-size {layout.pp} = {layout.num_devices}")
    arch = architecture(cfg["model_type"])
    if layout.tp > 1 and arch.no_tensor_parallel:
        raise UserError(f"--tp-size {layout.tp}: {model} ({arch.model_type}): {arch.no_tensor_parallel}; "
                        f"use --tp-size 1 (with --dp-size or --pp-size)")
    heads, kv = int(cfg["num_attention_heads"]), int(cfg.get("num_key_value_heads") or cfg["num_attention_heads"])
    if heads % layout.tp:
        raise UserError(f"--tp-size {layout.tp} does not divide the {heads} attention heads of {model}")
    if kv % layout.tp and layout.tp % kv:
        raise UserError(f"--tp-size {layout.tp} and the {kv} KV heads of {model}: neither divides the other "
                        f"(KV heads are split when tp divides them, replicated when they divide tp)")
    layers = int(cfg["num_hidden_layers"])
    if layout.pp > layers:
        raise UserError(f"--pp-size {layout.pp} exceeds the {layers} decoder layers of {model}")
    experts = experts_of(cfg)
    if layout.ep > 1 and not experts:
        raise UserError(f"--ep-size {layout.ep}: {model} has no routed experts (expert parallelism needs an MoE model)")
    if layout.attention_dp and not experts:
        raise UserError(f"--attention-dp: {model} has no MoE layers to share; use --dp-size alone for replicas")
    if experts and experts % layout.ep:
        raise UserError(f"--ep-size {layout.ep} does not divide the {experts} routed experts of {model}")
    if layout.attention_dp and layout.moe_group % layout.ep:
        raise UserError(f"--attention-dp: --ep-size {layout.ep} must divide --tp-size × --dp-size = "
                        f"{layout.moe_group} (the MoE layer's devices: ep expert shards × expert tensor parallelism)")
    if not layout.attention_dp and layout.tp % layout.ep:
        raise UserError(f"--ep-size {layout.ep} must divide --tp-size {layout.tp} (experts are sharded over the "
                        f"tensor-parallel group; pass --attention-dp to shard them over the data-parallel ranks too)")
    for key, div, flag in _divided_sizes(cfg, layout):
        if cfg.get(key) and int(cfg[key]) % div:
            raise UserError(f"{flag} {div}: does not divide {model}'s {key} = {cfg[key]}")
    if num_queries < layout.dp:
        raise UserError(f"--num-queries {num_queries} cannot feed --dp-size {layout.dp} data-parallel ranks")
    per_rank = math.ceil(num_queries / layout.dp)
    if layout.micro_batches is not None and not 1 <= layout.micro_batches <= per_rank:
        raise UserError(f"--micro-batches {layout.micro_batches}: expected 1 to the {per_rank} sequences per "
                        f"data-parallel rank")
    if layout.sequence_parallel and layout.tp == 1:
        raise UserError("--sequence-parallel needs --tp-size > 1")


def _divided_sizes(cfg: dict, layout: Layout) -> list[tuple[str, int, str]]:
    """(config key, divisor, flag) of the sizes tensor parallelism divides besides the attention
    heads: the dense MLP widths and extra head counts of the model's architecture row, and the
    routed and shared experts' widths by expert tensor parallelism."""
    arch = architecture(cfg["model_type"])
    expert_key = arch.expert_intermediate if experts_of(cfg) else None
    out = [(k, layout.tp, "--tp-size") for k in (*arch.intermediate_keys(), *arch.tensor_parallel)]
    if expert_key:
        out.append((expert_key, layout.moe_tp, "expert tensor parallelism (MoE group / --ep-size) ="))
        out.append((arch.experts.get("shared_intermediate", "shared_expert_intermediate_size"), layout.moe_tp,
                    "expert tensor parallelism (MoE group / --ep-size) ="))
    return out


def rank_config(cfg: dict, layout: Layout) -> dict:
    """The config of the model one device holds: heads, KV heads (at least one: replicated when
    fewer than tp), intermediates and vocabulary divided; the head size kept."""
    out = dict(cfg)
    tp = layout.tp
    heads = int(cfg["num_attention_heads"])
    if tp > 1 and not cfg.get("head_dim") and "kv_lora_rank" not in cfg:
        # the head size defaults to hidden / heads: keep the whole model's (MLA sizes its heads
        # itself); an attention that derives it from hidden / heads has its projections resized
        # by the capture (the row's head_projections)
        key = "perfcast_head_dim" if architecture(cfg["model_type"]).head_projections else "head_dim"
        out[key] = int(cfg["hidden_size"]) // heads
    out["num_attention_heads"] = heads // tp
    if cfg.get("num_key_value_heads"):
        out["num_key_value_heads"] = max(1, int(cfg["num_key_value_heads"]) // tp)
    for key, div, _ in _divided_sizes(cfg, layout):
        if cfg.get(key):
            out[key] = int(cfg[key]) // div
    out["vocab_size"] = -(-int(cfg["vocab_size"]) // tp)  # vocab-parallel: ceil(V / tp) rows each
    if tp > 1:  # ids of the whole vocabulary: the config class's defaults too (MiniMax-M2's file
        # states none of them) and a VLM's image / vision-start ids
        for key in sorted({"bos_token_id", "eos_token_id", "pad_token_id", *(k for k in cfg if k.endswith("_token_id"))}):
            out[key] = None
    return out


# --- collectives -------------------------------------------------------------------------------


def row_parallel_collective(sequence_parallel: bool) -> str:
    """What a block's partial sums need, by the DSL's sharded-einsum rule (the same function,
    :func:`perfcast.dsl.sharding.plan_einsum`): a row-parallel linear ``x[t,k] · w[k,n]`` with
    ``k`` sharded on ``tp`` in both operands leaves partial sums, reduce-scattered onto the tokens
    when the output is wanted sharded there (sequence parallelism), else all-reduced. (The
    vocab-parallel embedding is the same einsum with a one-hot ``x[t,v]``.)"""
    from perfcast.dsl.sharding import plan_einsum

    wanted = (("tp",), ()) if sequence_parallel else ((), ())
    plan = plan_einsum("row_parallel", ("tk", "kn"), "tn", (((), ("tp",)), (("tp",), ())), ("x", "w"), wanted)
    (step,) = plan.after
    return step.kind


class _Uids:
    def __init__(self, cap: Capture):
        self.next = 1 + max((t.uid for r in cap.records for t in (*r.inputs, *r.outputs)), default=0)

    def __call__(self) -> int:
        self.next += 1
        return self.next


def _tokens_by_hidden(t: TensorMeta) -> tuple[sympy.Expr, sympy.Expr]:
    """(tokens, hidden) of an activation whose last dim is the hidden size."""
    return t.numel / t.shape[-1], t.shape[-1]


def _collective(kind: str, src: TensorMeta, out_shape, axis: str, group: int, uids: _Uids,
                module: str, layer, *, in_shape=None, mark: tuple = ()) -> OpRecord:
    tokens, hidden = _tokens_by_hidden(src)
    in_t = TensorMeta(tuple(in_shape) if in_shape else (tokens, hidden), src.dtype, False,
                      src.uid if in_shape is None else uids())
    out_t = TensorMeta(tuple(out_shape), src.dtype, False, src.uid if kind == "all_reduce" else uids())
    return OpRecord(f"perfcast.{kind}.default", (in_t,), (out_t,), (axis, group, *mark), module, layer)


def _region(module: str) -> str | None:
    """``model.layers.3.self_attn.q_proj`` → ``model.layers.3.self_attn`` (the block whose
    partial sums are reduced together); None outside the attention and MLP blocks."""
    m = re.match(r"^(model\.layers\.\d+\.(self_attn|mlp|block_sparse_moe|feed_forward))(\.|$)", module or "")
    return m.group(1) if m else None


def parallelize(cap: Capture, layout: Layout, cfg: dict, exchange: str = "all_to_all") -> Capture:
    """The captured per-rank step with the plan's collectives inserted and the grouped GEMMs
    told their share of the experts and tokens. ``exchange``: how an attention-data-parallel
    MoE group moves its tokens (the engine's :class:`~perfcast.engines.spec.MoeExchange`)."""
    if layout.trivial:
        return cap
    uids = _Uids(cap)
    tp, sp = layout.tp, layout.sequence_parallel
    experts, top_k = experts_of(cfg), int(cfg.get("num_experts_per_tok") or 0)
    out: list[OpRecord] = []
    records = cap.records
    moe_regions = {_region(r.module) for r in records if r.op.startswith("perfcast.moe_experts")}
    pending_gather: TensorMeta | None = None  # sequence parallelism: tokens to gather before the next block

    reduce_kind = row_parallel_collective(sp)

    def reduce_block(last: OpRecord, region: str) -> None:
        nonlocal pending_gather
        tokens, hidden = _tokens_by_hidden(last.outputs[0])
        if reduce_kind == "reduce_scatter":  # then gathered again before the next block
            rs = _collective("reduce_scatter", last.outputs[0], (tokens / tp, hidden), "tp", tp, uids,
                             region, last.layer)
            out.append(rs)
            pending_gather = rs.outputs[0]
        else:
            out.append(_collective("all_reduce", last.outputs[0], (tokens, hidden), "tp", tp, uids,
                                   region, last.layer))

    produced: OpRecord | None = None  # the latest record with an output: a block's result
    for i, rec in enumerate(records):
        region = _region(rec.module)
        if rec.outputs:
            produced = rec
        if pending_gather is not None and region is not None and (i == 0 or _region(records[i - 1].module) != region) \
                or pending_gather is not None and rec.module == "lm_head":
            tokens, hidden = pending_gather.shape
            out.append(_collective("all_gather", pending_gather, (tokens * tp, hidden), "tp", tp, uids,
                                   region or rec.module, rec.layer, in_shape=(tokens, hidden)))
            pending_gather = None
        if rec.op.startswith("perfcast.moe_experts"):
            rec = _moe_record(rec, layout, out, uids, experts, top_k, exchange)
        else:
            out.append(rec)
        if rec.module == "model.embed_tokens" and tp > 1 and rec.op.split(".")[1] == "embedding":
            reduce_block(rec, rec.module)  # vocab-parallel rows: each rank's lookup is partial
        if rec.module == "lm_head" and tp > 1 and rec.op.split(".")[1] in ("mm", "addmm", "bmm", "linear"):
            tokens, vocab = _tokens_by_hidden(rec.outputs[0])
            out.append(_collective("all_gather", rec.outputs[0], (tokens, vocab * tp), "tp", tp, uids,
                                   rec.module, rec.layer, in_shape=(tokens, vocab)))
        nxt = records[i + 1] if i + 1 < len(records) else None
        if region is not None and (nxt is None or _region(nxt.module) != region):
            split = tp > 1 and not (region in moe_regions and layout.attention_dp)
            if split and produced is not None:
                reduce_block(produced, region)
    return replace(cap, records=out)


def _moe_record(rec: OpRecord, layout: Layout, out: list[OpRecord], uids: _Uids, experts: int,
                top_k: int, exchange: str) -> OpRecord:
    """The grouped GEMM with its expert and token shares; with attention data parallelism, the
    dispatch all-to-all before it and the combine after (each of the tp ranks of a data-parallel
    rank dispatches 1/tp of its tokens, top-k copies each), then an all-gather over tp.

    With expert tensor parallelism inside the MoE group as well (ep < tp·dp: each expert's
    FFN split over moe_tp devices, aiconfigurator's ``tp · attention_dp = moe_tp · moe_ep``),
    the moe_tp devices of an expert shard all compute every token routed to it — their share of
    the group's token-expert pairs is moe_tp/tp of their own rows — so the dispatched tokens are
    also all-gathered over moe_tp before the GEMMs and the partial sums reduce-scattered after
    (TensorRT-LLM's attention-DP MoE without all-to-all: all-gather + reduce-scatter over the
    group, tensorrt_llm/_torch/modules/fused_moe/fused_moe_cutlass.py). ``exchange == "gather"``
    (moe_tp 1, an engine without its all-to-all on this device): the ep ranks all-gather their
    1/tp shares before the GEMMs and reduce-scatter the outputs after (``use_allgather`` there)."""
    tp, ep, moe_tp = layout.tp, layout.ep, layout.moe_tp
    share = sympy.Rational(moe_tp, tp) if layout.attention_dp else sympy.Rational(1, ep)
    rec = replace(rec, scalars=(*rec.scalars[:2], ep, share, layout.attention_dp and ep > 1, moe_tp))
    hidden = rec.inputs[0]
    tokens, width = _tokens_by_hidden(hidden)
    if not (layout.attention_dp and layout.moe_group > 1):
        out.append(rec)
        return rec
    own, where = (tokens / tp, width), (rec.module, rec.layer)
    if exchange == "gather" and layout.moe_exchange_applies:
        everyone = (tokens / tp * ep, width)
        before = [_collective("all_gather", hidden, everyone, "ep", ep, uids, *where, in_shape=own, mark=(MOE_DISPATCH,))]
        after = [_collective("reduce_scatter", rec.outputs[0], own, "ep", ep, uids, *where, in_shape=everyone)]
    else:
        routed = (tokens * top_k / tp, width) if ep > 1 else own
        gathered = (routed[0] * moe_tp, width)
        def a2a(mark):  # the dispatch, then the combine: one record each
            return [_collective("all_to_all", hidden, routed, "ep", ep, uids, *where, in_shape=routed,
                                mark=(mark, top_k))] if ep > 1 else []
        before = a2a(MOE_A2A_DISPATCH) + ([_collective("all_gather", hidden, gathered, "moe_tp", moe_tp, uids, *where,
                                                       in_shape=routed)] if moe_tp > 1 else [])
        after = ([_collective("reduce_scatter", rec.outputs[0], routed, "moe_tp", moe_tp, uids, *where,
                              in_shape=gathered)] if moe_tp > 1 else []) + a2a(MOE_A2A_COMBINE)
    out.extend(before + [rec] + after)
    if tp > 1:
        out.append(_collective("all_gather", rec.outputs[0], (tokens, width), "tp", tp, uids, *where, in_shape=own))
    return rec


# --- pipeline stages ---------------------------------------------------------------------------


def stage_layers(num_layers: int, pp: int) -> list[range]:
    """Contiguous stages, the first ``num_layers % pp`` one layer longer."""
    base, extra = divmod(num_layers, pp)
    out, start = [], 0
    for s in range(pp):
        n = base + (1 if s < extra else 0)
        out.append(range(start, start + n))
        start += n
    return out


def stages(cap: Capture, pp: int, num_layers: int) -> list[tuple[Capture, range]]:
    """One capture per pipeline stage: its layers (each layer group counted by the members in
    the stage), the embedding on the first, the final norm and ``lm_head`` on the last, and a
    send of the activations to the next stage on every stage but the last."""
    if pp == 1:
        return [(cap, range(num_layers))]
    uids = _Uids(cap)
    head = [r for r in cap.records[: _first_layer(cap)] if r.layer is None]
    tail = [r for r in cap.records[_first_layer(cap):] if r.layer is None]
    by_layer: dict[int, list[OpRecord]] = {}
    for r in cap.records:
        if r.layer is not None:
            by_layer.setdefault(r.layer, []).append(r)
    out = []
    ranges = stage_layers(num_layers, pp)
    for s, rng in enumerate(ranges):
        groups, records = [], list(head) if s == 0 else []
        for g in cap.groups:
            members = [i for i in g.indices if i in rng]
            if members:
                groups.append(LayerGroup(g.signature, (g.representative, *members[1:])))
                records.extend(by_layer.get(g.representative, []))
        if s + 1 < pp:
            act = next((t for r in reversed(records) for t in r.outputs if not t.is_param), None)
            if act is not None:
                tokens, hidden = _tokens_by_hidden(act)
                records.append(_collective("send_recv", act, (tokens, hidden), "pp", 2, uids, "pipeline", None))
        else:
            records.extend(tail)
        out.append((replace(cap, records=records, groups=groups), rng))
    return out


def _first_layer(cap: Capture) -> int:
    return next((i for i, r in enumerate(cap.records) if r.layer is not None), len(cap.records))


def param_share(name: str, cap: Capture, layout: Layout, rng: range, first: bool, last: bool,
                tied: bool = False) -> sympy.Expr:
    """The share of parameter ``name`` (of the per-rank model) one device of the stage holds;
    with tied embeddings the last stage keeps a copy of the embedding for ``lm_head``."""
    m = _LAYER.match(name)
    if m:
        if int(m.group(1)) not in rng:
            return sympy.Integer(0)
    elif name.startswith("lm_head") or name == "model.norm.weight" or name.startswith("model.norm."):
        if not last:
            return sympy.Integer(0)
    elif not (first or last and tied and name.startswith("model.embed_tokens")):
        return sympy.Integer(0)
    stacked = name in cap.linear_params and len(cap.params[name].shape) == 3
    return sympy.Rational(1, layout.ep) if stacked else sympy.Integer(1)
