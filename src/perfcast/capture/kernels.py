"""Kernel groups: which captured records one engine kernel runs, and the leaf each group lowers to.

A serving engine does not run the ops a Hugging Face forward dispatches; it runs its own kernels,
each covering some of them. A *plan* (an engine profile applied to a segment of records, see
:mod:`perfcast.engines.plan`) groups the records, and :func:`build` turns every group into one
leaf whose kind is a rule-book kind and whose cost is the fused kernel's:

- ``op``: one record, one kernel (the leaf the plain lowering makes);
- ``merge``: matmuls reading the same activation as one GEMM of ``N = Σ N_i`` — the activation
  is read once, the weights and outputs side by side (``2·M·ΣN·K`` FLOPs);
- ``fuse``: a run of memory-bound ops as one kernel (its external inputs read once, its outputs
  written once, intermediates on chip; FLOPs the members' sum). ``outputs`` may name the kernel's
  outputs explicitly (a fused residual add + RMSNorm writes the new residual and the normed
  activation, which a rotated layer's next iteration reads); ``cache_of`` makes the kernel also
  write an attention's new KV-cache entries (it reads V and writes the entries);
- ``absorb``: a main op (attention, a collective) whose kernel also runs ``records`` before or
  after it: the main op's cost plus the absorbed ops' FLOPs and the HBM traffic they add;
- ``cache``: the KV-cache write of an attention as a kernel of its own (reads K and V, writes the
  entries in the cache dtype); the attention leaf then carries ``cache_write=False``. With the
  ``cache_concat`` attr the kernel is a whole-cache copy (transformers' ``DynamicCache``:
  ``torch.cat([cached, new], dim=-2)`` per layer for keys and values): it also reads the
  ``past`` cached entries and writes all ``past + S`` of them;
- ``drop``: records the engine never runs per step (its reason is reported, never silent).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import sympy

from perfcast.capture.types import OpRecord, TensorMeta
from perfcast.ir import BYTES_HBM, FLOPS_VECTOR, Cost, Leaf, Tensor, make_leaf


@dataclass(frozen=True)
class KernelGroup:
    how: str  # op | merge | fuse | absorb | cache | drop
    records: tuple[OpRecord, ...]
    kernel: str
    kernel_class: str = ""
    main: OpRecord | None = None  # absorb: the op whose kernel it is; cache: the attention
    launches: int = 1
    outputs: tuple[TensorMeta, ...] | None = None
    cache_of: OpRecord | None = None
    attrs: dict = field(default_factory=dict)  # extra leaf attrs (e.g. an all-reduce's algorithm)
    reason: str = ""  # drop: why the engine does not run it
    internal: tuple[TensorMeta, ...] = ()  # inputs the kernel itself produces on chip (not read)
    source_format_shapes: tuple[tuple[int, int], ...] = ()  # absorb: see _source_format


def engine_attrs(lw, g: KernelGroup) -> dict:
    out = {"engine": lw.engine, "kernel": g.kernel, **g.attrs}
    if g.kernel_class:
        out["kernel_class"] = g.kernel_class
    if g.launches != 1:
        out["launches"] = g.launches
    return out


def cache_entry(lw, attn: OpRecord) -> Tensor:
    """The new tokens' cache entries of ``attn``: (B, S, elements per token) in the cache dtype."""
    q, k, v = attn.inputs[:3]
    shared, width = bool(attn.scalars[3]), int(attn.scalars[4])
    per_token = width or k.shape[1] * (k.shape[-1] if shared else k.shape[-1] + v.shape[-1])
    dtype = lw.kv_dtype or k.dtype
    return Tensor(f"{attn.module}/kv_cache_entries", (lw.expr(q.shape[0]), lw.expr(q.shape[2]), lw.expr(per_token)),
                  dtype)


def _cache_reads(attn: OpRecord) -> list[TensorMeta]:
    k, v = attn.inputs[1:3]
    return [k] if bool(attn.scalars[3]) else [k, v]


def build(lw, g: KernelGroup, index: int) -> Leaf | None:
    attrs = engine_attrs(lw, g)
    if g.how == "drop":
        return None
    if g.how == "op":
        return lw.leaf(g.records[0], index, attrs, count=False)
    if g.how == "merge":
        return _merge(lw, g, index, attrs)
    if g.how == "fuse":
        run = [(r, lw.leaf(r, index + i, count=False)) for i, r in enumerate(g.records)]
        run = [(r, leaf) for r, leaf in run if leaf is not None]
        extra_in = [t for t in _cache_reads(g.cache_of)] if g.cache_of is not None else []
        extra_out = [cache_entry(lw, g.cache_of)] if g.cache_of is not None else []
        if len(run) == 1 and not extra_out and g.outputs is None:
            return lw.leaf(run[0][0], index, attrs, count=False)
        return lw.fuse(run, attrs, outputs=g.outputs, extra_inputs=extra_in, extra_outputs=extra_out,
                       internal=g.internal)
    if g.how == "absorb":
        return _absorb(lw, g, index, attrs)
    if g.how == "cache":
        name = f"{g.main.module}/{g.kernel}#{index}"
        ins = [lw.tensor(f"{name}:in{i}", t) for i, t in enumerate(_cache_reads(g.main))]
        new = cache_entry(lw, g.main)
        out = new
        if g.attrs.get("cache_concat"):
            b, s, width = new.shape
            past = lw.expr(g.main.scalars[0])
            ins.append(Tensor(f"{name}:in{len(ins)}", (b, past, width), new.dtype))
            out = Tensor(new.name, (b, past + s, width), new.dtype)
        return make_leaf("copy", name, ins, [out.renamed(f"{name}:out0")],
                         op=f"{lw.engine}.{g.kernel}", module=g.main.module, **attrs)
    raise ValueError(f"kernel group {g.kernel!r}: unknown grouping {g.how!r}")


def _act_index(rec: OpRecord) -> int:
    """The activation operand of a captured linear: ``mm(x, W)``, ``addmm(bias, x, W)``."""
    return 1 if rec.op.split(".")[1] == "addmm" else 0


def _merge(lw, g: KernelGroup, index: int, attrs: dict) -> Leaf:
    first = g.records[0]
    act = first.inputs[_act_index(first)]
    weights = [r.inputs[-1] for r in g.records]
    k = weights[0].shape[0]
    n = sum((w.shape[-1] for w in weights), sympy.Integer(0))
    name = f"{first.module.rsplit('.', 1)[0]}/{g.kernel}#{index}"
    w = TensorMeta((k, n), weights[0].dtype, True, -1)
    metas = [act, w]
    if _act_index(first):  # addmm: the biases side by side
        metas.insert(1, TensorMeta((n,), first.inputs[0].dtype, True, -1))
    inputs = [lw.tensor(f"{name}:in{i}", t) for i, t in enumerate(metas)]
    out = first.outputs[0]
    outputs = [Tensor(f"{name}:out0", (*(lw.expr(d) for d in out.shape[:-1]), lw.expr(n)), out.dtype)]
    attrs = {**attrs, "op": first.op, "module": first.module.rsplit(".", 1)[0],
             "members": tuple(lw.leaf(r, index + i, count=False) for i, r in enumerate(g.records))}
    lw.quantize_inputs(first, "matmul", metas, inputs, attrs)
    return make_leaf("matmul", name, inputs, outputs, **attrs)


def _absorb(lw, g: KernelGroup, index: int, attrs: dict) -> Leaf:
    """The main op's leaf with the absorbed ops' FLOPs and the HBM traffic they add: inputs not
    produced inside the kernel, outputs read after it (or the explicit ``outputs``), less the main
    op's inputs the absorbed ops produced (the kernel reads their sources instead)."""
    members = [r for r in g.records if r is not g.main]
    main_leaf = lw.leaf(g.main, index, attrs, count=False)
    member_leaves = [leaf for i, r in enumerate(members) if (leaf := lw.leaf(r, index + 1 + i, count=False)) is not None]
    produced_m = {lw.key(o) for r in members for o in r.outputs}
    produced = produced_m | {lw.key(o) for o in g.main.outputs}
    ins = {lw.key(t): t for r in members for t in r.inputs if lw.key(t) not in produced}
    if g.outputs is not None:
        outs = {lw.key(t): t for t in g.outputs}
    else:
        end = max(lw.position[id(r)] for r in g.records)
        outs = {k: lw.meta[k] for k in produced_m if lw.last_read.get(k, -1) > end}
    replaced = {lw.key(t): t for t in g.main.inputs if lw.key(t) in produced_m}
    extra = sum((lw.nbytes(t) for t in (*ins.values(), *outs.values())), sympy.Integer(0)) \
        - sum((lw.nbytes(t) for t in replaced.values()), sympy.Integer(0))
    flops = sum((leaf.cost.get(FLOPS_VECTOR) for leaf in member_leaves), sympy.Integer(0))
    # ``extra`` may be negative (a cast absorbed into a GEMM: the kernel reads the narrower source),
    # never below the main op's own traffic, which reads every replaced input
    cost = main_leaf.cost + Cost({BYTES_HBM: extra, FLOPS_VECTOR: flops})
    merged = {**dict(main_leaf.attrs), "members": tuple(member_leaves), "absorbed": len(member_leaves),
              **_source_format(lw, g, members, main_leaf)}
    return Leaf(main_leaf.name, main_leaf.kind, main_leaf.inputs, main_leaf.outputs, cost, merged)


#: Casts a kernel can take in as its input conversion.
_CASTS = ("aten._to_copy", "aten.to", "aten.type_as")
_NARROW = ("bf16", "fp16")


def _source_format(lw, g: KernelGroup, members: list[OpRecord], main_leaf: Leaf) -> dict:
    """An absorbing GEMM of one of the shapes (K, N) its engine's rule names
    (``source_format_shapes``) whose activation is a 16-bit source cast up inside its kernel, its
    other operand a weight, computes in that format: ``compute_dtype`` (the matrix rate and the GEMM
    fit the leaf is priced by). A weight's own cast is done once at load (the capture folds it: the
    weight arrives in the cast's dtype); the engine keeps the checkpoint's 16-bit weight. E.g.
    Hugging Face's DeepSeek-V3 router, ``F.linear(h.float(), W.float())``, which TensorRT-LLM,
    SGLang and vLLM run as a bf16 × bf16 GEMM with fp32 output (their profiles' router rule)."""
    main = g.main
    if not g.source_format_shapes or main_leaf.kind != "matmul" or main_leaf.attr("quant_format") \
            or not main.inputs:
        return {}
    made = {lw.key(o): r for r in members for o in r.outputs}
    act = main.inputs[_act_index(main)]
    cast = made.get(lw.key(act))
    if cast is None or not cast.op.startswith(_CASTS) or not cast.inputs or cast.inputs[0].dtype not in _NARROW:
        return {}
    if any(not t.is_param for t in main.inputs if t is not act):
        return {}
    shape = (lw.expr(act.shape[-1]), lw.expr(main.outputs[0].shape[-1]))
    if shape not in set(map(tuple, g.source_format_shapes)):
        return {}
    return {"compute_dtype": cast.inputs[0].dtype}

