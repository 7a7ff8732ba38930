"""Lowering: captured op records → IR leaves, through one table from op name to leaf kind.

Views and metadata ops are explicitly free (listed in :data:`FREE`); every other op needs a
rule; an op with no rule becomes an entry in :attr:`Lowered.unknown` (name, count, shapes) that
reports print — never a silent zero. Identical decoder layers, captured once, become
``Loop(count, layer)``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import sympy

from perfcast.capture.mixer_kinds import ATTRS as MIXER_ATTRS
from perfcast.capture.mixer_kinds import CACHED as MIXER_CACHED
from perfcast.capture.mixer_kinds import KINDS as MIXER_KINDS
from perfcast.capture.quant import QuantPlan, as_plan, group_of, record_group
from perfcast.capture.types import MOE_DISPATCH, Capture, OpRecord, TensorMeta, moe_a2a_side, storage_roots
from perfcast.ir.routing import DEFAULT as DEFAULT_ROUTING
from perfcast.ir import FLOPS_VECTOR, Graph, Leaf, Loop, Tensor, itemsize, make_leaf

FREE = frozenset({
    "view", "_unsafe_view", "reshape", "_reshape_alias", "t", "transpose", "permute", "expand",
    "unsqueeze", "squeeze", "slice", "select", "split", "split_with_sizes", "chunk", "unbind",
    "as_strided", "alias", "detach", "lift_fresh", "device", "empty", "empty_like",
    "empty_strided", "new_empty", "new_empty_strided", "sym_size", "sym_stride", "sym_numel",
    "sym_storage_offset", "view_as", "expand_as", "unflatten", "flatten", "dim", "is_same_size",
    "_local_scalar_dense", "arange", "view_as_complex", "view_as_real",
})

_ELEMENTWISE = {
    "add", "sub", "rsub", "mul", "div", "neg", "pow", "rsqrt", "sqrt", "exp", "log", "log1p",
    "silu", "gelu", "sigmoid", "tanh", "relu", "where", "masked_fill", "clamp", "clamp_min",
    "clamp_max", "minimum", "maximum", "cos", "sin", "reciprocal", "abs", "eq", "ne", "gt", "lt",
    "ge", "le", "logical_not", "logical_and", "logical_or", "bitwise_not", "bitwise_and",
    "bitwise_or", "erf", "sign", "floor", "ceil", "round", "add_", "sub_", "mul_", "div_",
    "masked_fill_", "clamp_", "exp_", "sigmoid_", "silu_", "gelu_", "tanh_", "relu_", "lerp",
    "addcmul", "addcdiv", "fmod", "remainder", "isinf", "isnan", "logical_xor", "floor_divide",
    "softplus", "polar",
}
_TABLE: dict[str, str] = {
    **{op: "elementwise" for op in _ELEMENTWISE},
    **{op: "matmul" for op in ("mm", "addmm", "bmm", "baddbmm")},
    **{op: "copy" for op in ("cat", "stack", "clone", "_to_copy", "copy_", "copy", "repeat",
                             "repeat_interleave", "roll", "flip", "constant_pad_nd", "contiguous",
                             "index_copy")},
    **{op: "memset" for op in ("zeros", "zeros_like", "ones", "ones_like", "full", "full_like",
                               "fill_", "zero_", "new_zeros", "new_ones", "new_full", "scalar_tensor")},
    **{op: "reduction" for op in ("sum", "mean", "amax", "amin", "max", "min", "argmax", "argmin",
                                  "var", "var_mean", "std", "prod", "cumsum", "any", "all")},
    **{op: "softmax" for op in ("_softmax", "softmax", "_log_softmax", "log_softmax")},
    **{op: "norm" for op in ("native_layer_norm", "layer_norm", "_fused_rms_norm", "rms_norm",
                             "native_group_norm")},
    **{op: "topk" for op in ("topk", "sort", "argsort")},
    **{op: "gather" for op in ("embedding", "index", "index_select", "gather")},
    **{op: "scatter" for op in ("scatter", "scatter_", "scatter_add", "scatter_add_", "index_add",
                                "index_add_", "index_put", "index_put_", "masked_scatter",
                                "scatter_reduce")},
    "attention": "attention",
    "moe_experts": "grouped_matmul",
    **{op: op for op in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv")},
    "_scaled_dot_product_flash_attention": "attention",
    "_scaled_dot_product_efficient_attention": "attention",
    "_scaled_dot_product_cudnn_attention": "attention",
}
_TABLE.update(MIXER_KINDS)


def op_packet(op: str) -> str:
    """``aten.mm.default`` → ``mm``; ``perfcast.attention.default`` → ``attention``."""
    parts = op.split(".")
    return parts[1] if len(parts) >= 2 else op


#: Kinds a serving engine runs fused between GEMMs (RMSNorm + residual, rotary, SiLU·mul,
#: router softmax/top-k: vLLM's custom ops, torch.compile/Inductor's pointwise fusion).
FUSIBLE = frozenset({"elementwise", "copy", "memset", "reduction", "softmax", "norm", "topk"})


@dataclass
class Lowered:
    graph: Graph
    unknown: Counter = field(default_factory=Counter)  # (op, shapes) → count
    free: Counter = field(default_factory=Counter)  # op → count
    quantize: QuantPlan | None = None
    dropped: Counter = field(default_factory=Counter)  # reason → ops an engine does not run per step


def kind_of(rec: OpRecord) -> str | None:
    """The leaf kind of a record, or None when it makes no leaf (a view, or an op with no rule)."""
    packet = op_packet(rec.op)
    return None if packet in FREE else _TABLE.get(packet)


#: A plan groups one segment's records into engine kernels: ``(records, segment name, lowerer)
#: -> [KernelGroup]`` (see :mod:`perfcast.capture.kernels`).
Plan = Callable[[list, str, "_Lowerer"], list]


@dataclass
class _Lowerer:
    capture: Capture
    quantize: QuantPlan | None
    model_dtype: str
    kv_dtype: str | None = None
    fusion: bool = True
    point: dict = field(default_factory=dict)  # dim → value: lower a symbolic capture at a point
    plan: Plan | None = None
    engine: str | None = None
    unknown: Counter = field(default_factory=Counter)
    free: Counter = field(default_factory=Counter)
    dropped: Counter = field(default_factory=Counter)
    decide_at: dict = field(default_factory=dict)  # dim → value the engine's size decisions use
    routing: str = DEFAULT_ROUTING  # the MoE routing assumed (perfcast.ir.routing)

    def __post_init__(self):
        records = self.capture.records
        self.root = storage_roots(records, FREE)
        self.position = {id(r): i for i, r in enumerate(records)}
        self.last_read: dict[int, int] = {}
        self.meta: dict[int, TensorMeta] = {}
        for i, r in enumerate(records):
            for t in r.inputs:
                self.last_read[self._key(t)] = i
            for t in (*r.inputs, *r.outputs):
                self.meta.setdefault(self._key(t), t)

    def _key(self, t: TensorMeta) -> int:
        return self.root.get(t.uid, t.uid)

    key = _key

    def nbytes(self, t: TensorMeta) -> sympy.Expr:
        """Bytes of the data ``t`` stores (broadcast dims once), at the lowering's point."""
        return self.tensor("t", t, stored=True).nbytes

    def decide(self, e) -> sympy.Expr:
        """``e`` where an engine rule decides by size (an all-reduce's algorithm, a rule's token
        condition): at the lowering's point, else at ``decide_at`` — so a symbolic lowering can
        keep its sizes symbolic and still take the decisions of a concrete step."""
        return self.capture.at(e, {**self.decide_at, **self.point})

    def decide_nbytes(self, t: TensorMeta) -> sympy.Expr:
        n = itemsize(t.dtype)
        for d in t.stored_shape:
            n *= self.decide(d)
        return n

    def expr(self, e) -> sympy.Expr:
        return self.capture.at(e, self.point)

    def tensor(self, name: str, t: TensorMeta, dtype: str | None = None, stored: bool = False) -> Tensor:
        shape = t.stored_shape if stored else t.shape
        return Tensor(name, tuple(self.expr(d) for d in shape), dtype or t.dtype)

    def leaf(self, rec: OpRecord, index: int, extra: dict | None = None, count: bool = True) -> Leaf | None:
        """The record's leaf (``extra``: attributes an engine plan adds, e.g. its kernel name);
        None for a view (counted as free) or an op with no rule (counted as unknown)."""
        packet = op_packet(rec.op)
        if packet in FREE:
            if count:
                self.free[packet] += 1
            return None
        kind = _TABLE.get(packet)
        if kind is None:
            if count:
                shapes = ", ".join("x".join(str(d) for d in t.shape) for t in rec.inputs)
                self.unknown[(rec.op, shapes)] += 1
            return None
        name = f"{rec.module or 'model'}/{packet}#{index}"
        attrs: dict[str, object] = {"op": rec.op, "module": rec.module}
        metas = list(rec.inputs)
        if packet == "addmm":  # addmm(bias, x, W): the activation first, the weight last, as mm's
            metas = [metas[1], metas[0], *metas[2:]]
        # An input read through an expanded (stride-0) view costs its stored data only.
        inputs = [self.tensor(f"{name}:in{i}", t, stored=True) for i, t in enumerate(metas)]
        outputs = [self.tensor(f"{name}:out{i}", t) for i, t in enumerate(rec.outputs)]
        if kind in ("matmul", "grouped_matmul"):
            self.quantize_inputs(rec, kind, metas, inputs, attrs)
        elif kind == "all_gather" and rec.scalars[2:3] == (MOE_DISPATCH,):
            inputs, outputs = self.dispatched(rec, inputs, outputs)
        if kind in ("attention", *MIXER_CACHED) and self.kv_dtype:
            for i in MIXER_CACHED.get(kind, (1, 2)):  # the KV cache is stored (and read) in its own dtype
                inputs[i] = Tensor(inputs[i].name, inputs[i].shape, self.kv_dtype)
        _ATTRS.get(kind, lambda r, a, s: None)(rec, attrs, self)
        attrs.update(extra or {})
        return make_leaf(kind, name, inputs, outputs, **attrs)

    def quantize_inputs(self, rec: OpRecord, kind: str, metas: list[TensorMeta], inputs: list[Tensor],
                        attrs: dict) -> None:
        """A quantized linear as its plan says (:mod:`perfcast.capture.quant`): weights
        (parameters of rank ≥ 2; biases stay) in their storage dtype, scales included, the
        activation (the first operand) in the dtype the kernel reads, the rate of its
        ``compute_dtype`` and its kernel format as ``quant_format``."""
        if self.quantize is None or not any(t.is_param and len(t.shape) >= 2 for t in metas):
            return
        fmt = self.quantize.format(rec.module or "", record_group(rec, kind))
        if fmt is None:
            return
        for i, t in enumerate(metas):
            if t.is_param and len(t.shape) >= 2:
                inputs[i] = Tensor(inputs[i].name, inputs[i].shape, fmt.weight)
            elif i == 0:
                inputs[i] = Tensor(inputs[i].name, inputs[i].shape, fmt.activation)
        attrs.update(compute_dtype=fmt.compute, quant_format=fmt.kernel)

    def dispatched(self, rec: OpRecord, inputs: list[Tensor], outputs: list[Tensor]):
        """A MoE layer's gathered tokens in the format its experts read them, quantized before
        the gather (TensorRT-LLM fused_moe_cutlass.py: ``quantize_input`` then ``allgather``)
        — but block-scaled FP8, which the grouped GEMM quantizes itself
        (``use_deepseek_fp8_block_scale``: the gather carries the model dtype)."""
        fmt = self.quantize.format(rec.module or "", group_of(rec.module or "", experts=True)) \
            if self.quantize is not None else None
        if fmt is None or not fmt.native or fmt.scheme.name == "fp8_block":
            return inputs, outputs
        return ([Tensor(t.name, t.shape, fmt.activation) for t in inputs],
                [Tensor(t.name, t.shape, fmt.activation) for t in outputs])

    def graph(self, records: list[OpRecord], name: str) -> Graph:
        if self.plan is not None:
            return self.planned(records, name)
        ops: list[Leaf] = []
        run: list[tuple[OpRecord, Leaf]] = []
        for i, r in enumerate(records):
            leaf = self.leaf(r, i)
            if leaf is None:
                continue  # free ops neither cost nor break a fused run
            if self.fusion and leaf.kind in FUSIBLE:
                run.append((r, leaf))
                continue
            ops.extend(self.fuse(run))
            run = []
            ops.append(leaf)
        ops.extend(self.fuse(run))
        return Graph(name, tuple(ops))

    def planned(self, records: list[OpRecord], name: str) -> Graph:
        """The segment as the plan's kernels, in the plan's order."""
        from perfcast.capture.kernels import build

        for r in records:  # views and ops with no rule, counted once (a plan skips them)
            if kind_of(r) is None:
                self.leaf(r, 0)
        ops = []
        for g in self.plan(records, name, self):
            if g.how == "drop":
                self.dropped[g.reason] += len(g.records)
                continue
            leaf = build(self, g, self.position[id(g.records[0] if g.records else g.main)])
            if leaf is not None:
                ops.append(leaf)
        return Graph(name, tuple(ops))

    def fuse(self, run: list[tuple[OpRecord, Leaf]], attrs: dict | None = None, outputs=None,
             extra_inputs=(), extra_outputs=(), internal=()):
        """One kernel for a run of memory-bound ops: it reads what the run consumes from outside
        and writes what is read after it (or ``outputs``); intermediates never reach HBM. With
        ``attrs`` (an engine plan's group) the result is one leaf, else a list."""
        if len(run) < 2 and attrs is None:
            return [leaf for _, leaf in run]
        produced = {self._key(o) for r, _ in run for o in r.outputs} | {self._key(t) for t in internal}
        end = self.position[id(run[-1][0])]
        ins: dict[int, TensorMeta] = {}
        for r, _ in run:
            for t in r.inputs:
                k = self._key(t)
                if k not in produced:
                    ins.setdefault(k, t)
        for t in extra_inputs:
            ins.setdefault(self._key(t), t)
        if outputs is not None:
            outs = list(dict.fromkeys(self._key(t) for t in outputs))
        else:
            outs = [k for k in dict.fromkeys(self._key(o) for r, _ in run for o in r.outputs)
                    if self.last_read.get(k, -1) > end]
        first = run[0][1]
        name = first.name.rsplit("/", 1)[0] + f"/{(attrs or {}).get('kernel', 'fused')}#{first.name.rsplit('#', 1)[1]}"
        packets = list(dict.fromkeys(op_packet(r.op) for r, _ in run))
        flops = sum((leaf.cost.get(FLOPS_VECTOR) for _, leaf in run), sympy.Integer(0))
        leaf = make_leaf("fused", name,
                         [self.tensor(f"{name}:in{i}", t) for i, t in enumerate(ins.values())],
                         [self.tensor(f"{name}:out{i}", self.meta[k]) for i, k in enumerate(outs)]
                         + [t.renamed(f"{name}:out{len(outs) + i}") for i, t in enumerate(extra_outputs)],
                         **{"op": "fused[" + "+".join(packets) + "]", "module": run[0][0].module,
                            "flops": flops, "members": tuple(leaf for _, leaf in run), **(attrs or {})})
        return leaf if attrs is not None else [leaf]


def _attention_attrs(rec: OpRecord, attrs: dict, lw: _Lowerer) -> None:
    if op_packet(rec.op) == "attention":
        past, causal, window, shared, width = rec.scalars[:5]
        attrs.update(past=lw.expr(past), causal=bool(causal), window=int(window),
                     shared_kv=bool(shared), cache_width=int(width))
        if len(rec.scalars) > 5:  # chunked local attention, logit soft-capping
            attrs.update(chunk=int(rec.scalars[5]), softcap=float(rec.scalars[6]))
    else:  # plain SDPA: no cache
        attrs.update(past=sympy.Integer(0), causal=True, window=0, shared_kv=False, cache_width=0)


def _moe_attrs(rec: OpRecord, attrs: dict, lw: _Lowerer) -> None:
    top_k, experts = rec.scalars[:2]
    attrs.update(top_k=int(top_k), num_experts=int(experts), routing=lw.routing)
    if len(rec.scalars) > 2:  # a parallel plan's expert shards, token share and dispatch
        shards, share, dispatched, expert_tp = rec.scalars[2:6]
        attrs.update(expert_shards=int(shards), token_share=sympy.sympify(share), dispatched=bool(dispatched),
                     expert_tp=int(expert_tp))


def _collective_attrs(rec: OpRecord, attrs: dict, lw: _Lowerer) -> None:
    axis, group = rec.scalars[:2]
    # ``op`` is the collective's name, as on DSL collective leaves (the profiling mapping's key)
    attrs.update(op=op_packet(rec.op), collective=op_packet(rec.op), axis=str(axis), group_size=int(group))
    if moe_a2a_side(rec.scalars):  # a MoE layer's dispatch or combine
        attrs["top_k"] = int(rec.scalars[3])


def _topk_attrs(rec: OpRecord, attrs: dict, lw: _Lowerer) -> None:
    packet = op_packet(rec.op)
    if packet == "topk":
        attrs["k"] = int(rec.scalars[0])
    else:
        n = lw.expr(rec.inputs[0].shape[-1])
        attrs["k"] = int(n) if n.is_Integer else 1024  # symbolic sort length: a bound


def _scatter_attrs(rec: OpRecord, attrs: dict, lw: _Lowerer) -> None:
    attrs["accumulate"] = "add" in op_packet(rec.op) or "reduce" in op_packet(rec.op)


_ATTRS: dict[str, Callable] = {"attention": _attention_attrs, "grouped_matmul": _moe_attrs,
                               "topk": _topk_attrs, "scatter": _scatter_attrs,
                               **{k: _collective_attrs for k in ("all_reduce", "all_gather", "reduce_scatter",
                                                                 "all_to_all", "send_recv")}}
_ATTRS.update(MIXER_ATTRS)


def lower(capture: Capture, *, quantize: QuantPlan | str | None = None, model_dtype: str = "bf16",
          kv_dtype: str | None = None, fusion: bool = True, point: dict | None = None,
          name: str = "model", plan: Plan | None = None, engine: str | None = None,
          decide_at: dict | None = None, moe_routing: str = DEFAULT_ROUTING) -> Lowered:
    """The captured step as ``Graph(prologue…, Loop(count, layer)…, epilogue…)``. ``point``
    (dim → value) evaluates a symbolic capture's sizes while lowering. ``plan`` (an engine
    profile's, :func:`perfcast.engines.apply`) groups each segment's records into the
    engine's kernels instead of ``fusion``'s one rule; its size-dependent choices (all-reduce
    algorithm, token conditions) are taken at ``decide_at`` when the sizes stay symbolic.
    ``quantize``: the step's :class:`~perfcast.capture.quant.QuantPlan`, or a ``--quantize``
    text (:func:`perfcast.models.quantization.from_flag`). ``moe_routing``: how routed tokens
    spread over the experts (:mod:`perfcast.ir.routing`), recorded on every MoE leaf."""
    quantize = as_plan(quantize, model_dtype)
    lw = _Lowerer(capture, quantize, model_dtype, kv_dtype, fusion, dict(point or {}), plan, engine,
                  decide_at=dict(decide_at or {}), routing=moe_routing)
    by_layer: dict[int, list[OpRecord]] = {}
    head, tail = [], []
    for rec in capture.records:
        if rec.layer is None:
            (tail if by_layer else head).append(rec)
        else:
            by_layer.setdefault(rec.layer, []).append(rec)
    ops: list = list(lw.graph(head, "prologue").ops)
    for g in capture.groups:
        body = lw.graph(by_layer.get(g.representative, []), f"layer{g.representative}")
        ops.append(Loop(f"layers[{g.representative}]×{g.count}", g.count, body, kind="map")
                   if g.count > 1 else body)
    ops.extend(lw.graph(tail, "epilogue").ops)
    return Lowered(Graph(name, tuple(ops)), lw.unknown, lw.free, quantize, lw.dropped)
