"""An engine profile applied to a segment of captured records: which records each of the
engine's kernels runs (:class:`perfcast.capture.kernels.KernelGroup`).

The records are first given roles (:mod:`perfcast.engines.roles`); then the profile's rules run
in order over the segment, each claiming records no earlier rule claimed (one table of rule
handlers, keyed by the rule's name); what is left follows the profile's ``leftover`` rule. The
order of the kernels is the engine's: a merged GEMM runs where its first member was captured.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import sympy

from perfcast.capture.kernels import KernelGroup
from perfcast.capture.lower import FUSIBLE, kind_of
from perfcast.capture.types import OpRecord
from perfcast.engines.roles import assign, packet
from perfcast.engines.spec import EngineProfile, When
from perfcast.ir.registry import Registry
from perfcast.ir.rules import COLLECTIVE_KINDS


@dataclass(frozen=True)
class Context:
    """What a profile's conditions read: the phase, the device, the model's hidden size."""

    phase: str
    device: str
    hidden_size: int
    rotated: frozenset = frozenset()  # ids of the norm records a rotation moved (the next layer's norm)
    used: set = field(default_factory=set, compare=False)  # indices of the rules that claimed records


@dataclass
class Entry:
    """One kernel of the plan under construction (``how`` None: a record no rule claimed yet)."""

    recs: list[OpRecord]
    roles: list[str]
    how: str | None = None
    kernel: str | None = None
    kernel_class: str = ""
    main: OpRecord | None = None
    launches: int = 1
    outputs: tuple | None = None
    cache_of: OpRecord | None = None
    attrs: dict = field(default_factory=dict)
    reason: str = ""
    internal: tuple = ()
    source_format_shapes: tuple = ()

    @property
    def open(self) -> bool:
        return self.how is None and self.kernel is None

    @property
    def role(self) -> str:
        """The role of the op whose kernel this is."""
        if self.main is not None:
            return self.roles[self.recs.index(self.main)] if self.main in self.recs else "cache_write"
        return self.roles[0]

    @property
    def head(self) -> OpRecord:
        return self.main if self.main is not None else self.recs[0]


HANDLERS: Registry[Callable] = Registry("engine rule")


def holds(when: When, ctx: Context, tokens=None) -> bool:
    if when.hidden_size_gt is not None and not ctx.hidden_size > when.hidden_size_gt:
        return False
    if tokens is not None and tokens.is_number:
        if when.tokens_le is not None and not tokens <= when.tokens_le:
            return False
        if when.tokens_gt is not None and not tokens > when.tokens_gt:
            return False
    return True


def _is_mla(rec: OpRecord) -> bool:
    """MLA attention: K and V one latent (absorbed decode) or a latent cache layout (prefill)."""
    return bool(rec.scalars[3]) or int(rec.scalars[4]) > 0


def segment_plan(profile: EngineProfile, ctx: Context, records: list[OpRecord], lw) -> list[KernelGroup]:
    recs = [r for r in records if kind_of(r) is not None]
    entries = [Entry([r], [role]) for r, role in zip(recs, assign(recs, kind_of))]
    attention = [r for r in recs if kind_of(r) == "attention"]
    mla = any(_is_mla(r) for r in attention)
    # ids of attentions whose KV write another kernel does ("cached") or their own ("in_kernel")
    state = {"cached": set(), "in_kernel": set()}
    for n, rule in enumerate(profile.rules):
        if (rule.phases and ctx.phase not in rule.phases) or (rule.devices and ctx.device not in rule.devices) \
                or not profile.selects(rule):
            continue
        if (rule.attention == "mla" and not mla) or (rule.attention == "mha" and (mla or not attention)):
            continue
        before = _signature(entries)
        entries = HANDLERS[rule.rule](rule, entries, ctx, lw, state)
        if _signature(entries) != before:
            ctx.used.add(n)
    entries = _leftover(profile, entries)
    return [KernelGroup(e.how or "op", tuple(e.recs), e.kernel, e.kernel_class, e.main, e.launches, e.outputs,
                        e.cache_of, e.attrs, e.reason, e.internal, e.source_format_shapes) for e in entries]


def _signature(entries: list[Entry]) -> list[tuple]:
    """What a rule can change about the plan (to tell which rules claimed records)."""
    return [(id(e), e.how, e.kernel, e.launches, len(e.recs), e.cache_of is not None, len(e.attrs))
            for e in entries]


def _runs(entries: list[Entry], ok: Callable[[Entry], bool]):
    """(start, end) of each maximal run of consecutive open entries satisfying ``ok``."""
    i = 0
    while i < len(entries):
        if entries[i].open and ok(entries[i]):
            j = i
            while j + 1 < len(entries) and entries[j + 1].open and ok(entries[j + 1]):
                j += 1
            yield i, j
            i = j + 1
        else:
            i += 1


def _joined(run: list[Entry], **kw) -> Entry:
    return Entry([r for e in run for r in e.recs], [x for e in run for x in e.roles], **kw)


def _norm_outputs(recs: list[OpRecord], roles: list[str]) -> tuple:
    """A fused (residual add +) norm kernel writes the new residual and the normed activation."""
    adds = [r.outputs[0] for r, role in zip(recs, roles) if role == "residual_add"]
    normed = [r for r, role in zip(recs, roles) if role != "residual_add"]
    return (*adds, normed[-1].outputs[0]) if normed else tuple(adds)


@HANDLERS.register("drop")
def _drop(rule, entries, ctx, lw, state):
    for e in entries:
        if e.open and e.role in rule.roles:
            e.how, e.kernel, e.reason = "drop", "-", rule.why
    return entries


@HANDLERS.register("merge_gemms")
def _merge(rule, entries, ctx, lw, state):
    role = "attn_gemm" if rule.region == "attention" else "mlp_gemm"
    groups: dict[tuple, list[int]] = {}
    for i, e in enumerate(entries):
        if e.open and e.role == role:
            r = e.recs[0]
            act = r.inputs[1 if packet(r.op) == "addmm" else 0]
            key = (r.module.rsplit(".", 1)[0], lw.key(act), r.inputs[-1].dtype, packet(r.op))
            groups.setdefault(key, []).append(i)
    drop: set[int] = set()
    for idx in groups.values():
        if len(idx) < 2:
            continue
        members = [entries[i] for i in idx]
        names = "+".join(e.recs[0].module.rsplit(".", 1)[-1] for e in members)
        entries[idx[0]] = _joined(members, how="merge", kernel=rule.kernel_by_modules.get(names, rule.kernel),
                                  kernel_class="gemm")
        drop.update(idx[1:])
    return [e for i, e in enumerate(entries) if i not in drop]


@HANDLERS.register("norm")
def _norm(rule, entries, ctx, lw, state):
    out: list[Entry] = []
    i = 0
    while i < len(entries):
        e = entries[i]
        if not (e.open and e.role in rule.roles):
            out.append(e)
            i += 1
            continue
        j = i
        while j + 1 < len(entries) and entries[j + 1].open and entries[j + 1].role in rule.roles \
                and entries[j + 1].recs[0].module == e.recs[0].module:
            j += 1
        run = entries[i:j + 1]
        prev = out[-1] if out else None
        kernel = rule.kernel
        feeds = {lw.key(prev.recs[0].outputs[0])} & {lw.key(t) for x in run for t in x.recs[0].inputs} \
            if prev is not None else set()
        moved = id(run[0].recs[0]) in ctx.rotated  # the next layer's norm: it reads this residual add
        internal = ()
        if rule.with_residual and prev is not None and prev.open and prev.role == "residual_add" and (feeds or moved):
            run = [out.pop(), *run]
            kernel = rule.with_residual
            # the moved norm's captured input is the layer's input; in the engine it reads the sum
            internal = (run[1].recs[0].inputs[0],) if moved else ()
            while out and out[-1].open and out[-1].role in rule.prefix_roles:
                run.insert(0, out.pop())
        g = _joined(run, how="fuse", kernel=kernel, kernel_class=rule.kernel_class, internal=internal)
        g.outputs = _norm_outputs(g.recs, g.roles)
        out.append(g)
        i = j + 1
    return out


def _keys(lw, entries, side: str) -> set:
    return {lw.key(t) for e in entries for r in e.recs for t in (r.outputs if side == "out" else r.inputs)}


def _pass(lw, run: list[Entry], roles) -> tuple[list[Entry], list[Entry], list[Entry]] | None:
    """Split a run into (ops moved before it, the fused ops, ops moved after it): an op with a
    role in ``across`` moves before the run when it reads nothing the run's earlier ops produce,
    else after it when nothing later in the run reads it. None when an op can move neither way."""
    before, fused, after = [], [], []
    for n, e in enumerate(run):
        if e.role in roles:
            fused.append(e)
            continue
        later = [x for x in run[n + 1:] if x.role in roles]
        if not _keys(lw, [e], "in") & _keys(lw, fused, "out"):
            before.append(e)
        elif not _keys(lw, [e], "out") & _keys(lw, later, "in"):
            after.append(e)
        else:
            return None
    return before, fused, after


@HANDLERS.register("fuse")
def _fuse(rule, entries, ctx, lw, state):
    spans = list(_runs(entries, lambda e: e.role in rule.roles or e.role in rule.across))
    for i, j in reversed(spans):
        split = _pass(lw, entries[i:j + 1], rule.roles)
        if split is None:
            continue
        before, run, after = split
        if not run or not set(rule.require) <= {e.role for e in run}:
            continue
        g = _joined(run, how="fuse", kernel=rule.kernel, kernel_class=rule.kernel_class)
        if rule.writes_cache:
            attn = next((x.head for x in entries[j + 1:] if x.role == "attention"), None)
            if attn is not None:
                g.cache_of = attn
                state["cached"].add(id(attn))
        entries[i:j + 1] = [*before, g, *after]
    return entries


def _adjacent(entries, at: int, step: int, roles) -> list[int]:
    """Indices of the open entries with ``roles`` next to ``at`` (one norm module at most)."""
    out, modules, k = [], set(), at + step
    while 0 <= k < len(entries) and entries[k].open and entries[k].role in roles:
        if entries[k].role.endswith("norm"):
            modules.add(entries[k].recs[0].module)
            if len(modules) > 1:
                break
        out.append(k)
        k += step
    return out


def _absorb_into(entries, i: int, side: str, roles, kernel=None, source_format_shapes=()) -> int:
    """Absorb the runs of ``roles`` beside entry ``i``; returns the entry's new index."""
    idx = _adjacent(entries, i, -1 if side == "before" else 1, roles)
    if not idx:
        return i
    target = entries[i]
    taken = [entries[k] for k in sorted(idx)]
    run = [*taken, target] if side == "before" else [target, *taken]
    g = _joined(run, how="absorb", kernel=kernel or target.kernel, kernel_class=target.kernel_class,
                main=target.head, launches=target.launches, attrs=dict(target.attrs),
                source_format_shapes=tuple(source_format_shapes))
    if any(e.role == "residual_add" for e in taken):
        g.outputs = _norm_outputs([r for e in taken for r in e.recs], [x for e in taken for x in e.roles])
    lo, hi = min(idx + [i]), max(idx + [i])
    entries[lo:hi + 1] = [g]
    return lo


@HANDLERS.register("absorb")
def _absorb(rule, entries, ctx, lw, state):
    i = 0
    while i < len(entries):
        if entries[i].role == rule.into and entries[i].how in (None, "absorb"):
            i = _absorb_into(entries, i, rule.side, rule.roles, rule.kernel, rule.source_format_shapes)
            if rule.cache_in_kernel and entries[i].how == "absorb":
                state["in_kernel"].add(id(entries[i].head))
        i += 1
    return entries


@HANDLERS.register("name")
def _name(rule, entries, ctx, lw, state):
    for e in entries:
        if e.kernel is None and e.how in (None, "absorb") and e.role in rule.roles:
            e.kernel, e.launches = rule.kernel, rule.launches
            e.kernel_class = rule.kernel_class or e.kernel_class or _class_of(e.head)
    return entries


@HANDLERS.register("attention")
def _attention(rule, entries, ctx, lw, state):
    out: list[Entry] = []
    for e in entries:
        if e.kernel is None and e.how in (None, "absorb") and e.role == "attention":
            attn = e.head
            mla = _is_mla(attn)
            names = rule.kernel
            e.kernel = (getattr(names, f"mla_{ctx.phase}") if mla else None) or getattr(names, ctx.phase)
            e.kernel_class = "attention"
            how = (rule.mla_cache_write if mla and rule.mla_cache_write else rule.cache_write)[ctx.phase]
            if id(attn) in state["in_kernel"]:
                pass
            elif id(attn) in state["cached"]:
                e.attrs["cache_write"] = False
            elif how.mode in ("separate", "concat"):
                e.attrs["cache_write"] = False
                out.append(Entry([], [], how="cache", kernel=how.kernel, kernel_class="cache_write", main=attn,
                                 launches=how.launches, attrs={"cache_concat": True} if how.mode == "concat" else {}))
        out.append(e)
    return out


def _tokens(lw, rec: OpRecord):
    t = rec.inputs[0]
    n = sympy.Integer(1)
    for d in t.shape[:-1]:
        n *= lw.decide(d)
    return n


@HANDLERS.register("allreduce")
def _allreduce(rule, entries, ctx, lw, state):
    i = 0
    while i < len(entries):
        e = entries[i]
        if e.kernel is None and e.how is None and kind_of(e.head) == "all_reduce":
            rec = e.head
            size, tokens, group = lw.decide_nbytes(rec.inputs[0]), _tokens(lw, rec), int(rec.scalars[1])
            pick = next(s for s in rule.strategies if _fits(s, size, tokens, group))
            e.kernel, e.kernel_class = pick.kernel, "allreduce"
            e.attrs["algorithm"] = pick.algorithm
            if pick.algorithm in ("oneshot", "twoshot"):  # the engine's own kernel, measured apart from NCCL's
                e.attrs["op"] = "custom_all_reduce"
            ep = rule.epilogue
            limit = ep.max_bytes_by_group.get(group) if ep is not None else None
            if ep is not None and pick.fuses_epilogue and holds(ep.when, ctx, tokens) \
                    and (not ep.max_bytes_by_group or (limit is not None and size.is_number and size <= limit)):
                i = _absorb_into(entries, i, "after", ep.roles, ep.kernel)
        i += 1
    return entries


def _fits(s, size, tokens, group) -> bool:
    """Whether strategy ``s``'s limits admit the message; a symbolic size fits only a strategy
    with no size limit (the profile's last, catch-all entry)."""
    if s.max_group is not None and group > s.max_group:
        return False
    for limit, value in ((s.max_bytes, size), (s.max_tokens, tokens)):
        if limit is not None and not (value.is_number and value <= limit):
            return False
    return True


def _class_of(rec: OpRecord) -> str:
    kind = kind_of(rec)
    if kind in COLLECTIVE_KINDS:
        return "collective"
    return {"matmul": "gemm", "grouped_matmul": "moe", "attention": "attention", "gather": "gather",
            "scatter": "scatter"}.get(kind, "elementwise")


def _leftover(profile: EngineProfile, entries: list[Entry]) -> list[Entry]:
    """Open entries: memory-bound ops one kernel each or one per run (the profile's ``leftover``);
    any other op a kernel of its own named by its op; named absorbs keep their main op's name."""
    memory = lambda e: kind_of(e.head) in FUSIBLE  # noqa: E731
    if profile.leftover.memory == "fuse_runs":
        for i, j in reversed(list(_runs(entries, memory))):
            run = entries[i:j + 1]
            entries[i:j + 1] = [_joined(run, how="fuse" if len(run) > 1 else None, kernel=profile.leftover.kernel,
                                        kernel_class="elementwise", attrs={"rule": "leftover"})]
    for e in entries:
        if e.kernel is None:
            e.kernel = e.head.op.removesuffix(".default")
            e.kernel_class = e.kernel_class or _class_of(e.head)
            e.attrs.setdefault("rule", "leftover")
    return entries


# the MoE rules (all-to-all kernels, the second stream) register their handlers on import
from perfcast.engines import plan_moe  # noqa: E402, F401
