"""The overlap engine: a fold over the op tree that rewrites loops and blocks where work runs
concurrently (the transforms are defined in :mod:`perfcast.rollup.overlap`).

Every part of the tree evaluates to a :class:`Timing` — its time and how long it keeps each
resource busy — so that concurrent parts can be charged for the resources they share
(:func:`conc`). Busy time is what a resource must do whatever the schedule, so no rewrite
changes it; the time of every part stays at least its busiest resource's.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import sympy

from perfcast.ir import BYTES_HBM, Graph, Leaf, Loop, Op, walk
from perfcast.ir.rules import COLLECTIVE_KINDS
from perfcast.rollup.fast import FastRollup, LeafTotal
from perfcast.rollup.streams import ZERO, Timing, conc, on_stream, serial, switches, timing


def weight_bytes(leaf: Leaf) -> sympy.Expr:
    """HBM bytes of model weights one call of ``leaf`` reads. The IR does not mark parameters;
    they are recognised by structure: a captured ``mm``/``addmm`` is ``F.linear``'s lowering, whose
    last operand is the weight; a ``grouped_matmul`` reads the weights of the experts that receive
    tokens (its rule-book formula). Batched products (``bmm``: attention, MLA's absorbed
    projections), norms' scale vectors and DSL tiles count as activations — the prefetch may so
    miss a few weights, never take activations for weights."""
    packet = str(leaf.attr("op") or "").split(".")
    if leaf.kind == "matmul" and len(packet) > 1 and packet[1] in ("mm", "addmm"):
        return leaf.inputs[-1].nbytes
    if leaf.kind == "grouped_matmul":
        hidden, gate_up, down = leaf.inputs[:3]
        experts, shards = leaf.attr("num_experts"), leaf.attr("expert_shards", 1)
        pairs = hidden.numel / hidden.shape[-1] * leaf.attr("top_k") * sympy.sympify(leaf.attr("token_share", 1))
        return sympy.Min(sympy.Rational(experts, shards), pairs) * (gate_up.nbytes + down.nbytes) / experts
    return ZERO


@dataclass(frozen=True)
class Site:
    """Where a transform fired: the loop or block at ``path``, run ``trips`` times, taking per
    execution ``before`` → ``after`` seconds; ``moved``: the leaves it runs concurrently (loads,
    collectives, weight reads), ``under``: what they run alongside."""

    transform: str
    path: tuple[str, ...]
    trips: sympy.Expr
    before: sympy.Expr
    after: sympy.Expr
    moved: tuple[str, ...]
    under: tuple[str, ...]
    prefetched_bytes: sympy.Expr | None = None
    weight_bytes: sympy.Expr | None = None


@dataclass(frozen=True)
class Ctx:
    rules: frozenset
    split: bool = False  # the micro-batch variant of the graph
    prefetch: dict = field(default_factory=dict)  # id(leaf) → prefetched fraction of its weights
    sites: list | None = None  # where to record sites (None: a re-evaluation, not recorded)


def _is_comm(leaf) -> bool:
    return isinstance(leaf, Leaf) and leaf.kind in COLLECTIVE_KINDS


def _short(name: str) -> str:
    """``model.layers.0.self_attn.q_proj/mm#12`` → ``q_proj/mm#12``."""
    head, _, tail = name.rpartition("/")
    return f"{head.rsplit('.', 1)[-1]}/{tail}" if head else name


class Evaluator:
    """The op tree's time under a set of rules: a recursive fold with rewrites at loops and blocks."""

    def __init__(self, base: FastRollup, staging: sympy.Expr | None):
        self.base, self.staging = base, staging
        self.price = {(v.path, id(v.op)): lt for v, lt in
                      zip((v for v in walk(base.op) if isinstance(v.op, Leaf)), base.leaves)}
        self.launch = base.launch.time_s

    # Leaves --------------------------------------------------------------------------------
    def weight_time(self, lt: LeafTotal) -> sympy.Expr:
        """The share of the leaf's HBM term spent reading weights."""
        w, b = weight_bytes(lt.leaf), lt.result.breakdown
        if w == 0 or "memory.hbm" not in b or not lt.leaf.cost.get(BYTES_HBM):
            return ZERO
        return b["memory.hbm"] * w / lt.leaf.cost[BYTES_HBM]

    def leaf(self, leaf: Leaf, path, ctx: Ctx, split: bool = False) -> Timing:
        lt = self.price[(path, id(leaf))]
        terms, t = dict(lt.result.breakdown), lt.result.time_s
        phi = ctx.prefetch.get(id(leaf), ZERO)
        # weights read in line: (1 − φ) of them, twice when the block runs as two micro-batches
        extra = ((1 - phi) if split else 0) - phi
        wt = self.weight_time(lt) if extra != 0 else ZERO
        if wt != 0:
            old = sympy.Max(*terms.values())
            terms["memory.hbm"] = terms["memory.hbm"] + extra * wt
            t = sympy.Max(*terms.values()) if t == old else t - old + sympy.Max(*terms.values())
        return timing(terms, t)

    # Tree ----------------------------------------------------------------------------------
    def node(self, op: Op, path, trips, kernel: bool, ctx: Ctx) -> Timing:
        if isinstance(op, Leaf):
            return self.leaf(op, path, ctx)
        kernel = kernel or (isinstance(op, Graph) and op.launch)
        if isinstance(op, Loop):
            return self.loop(op, path, trips, kernel, ctx)
        if ctx.split and self.block_sites(op, ctx.rules):
            return self.block(op, path, trips, kernel, ctx)
        return self.streams(self.children(op, path, trips, kernel, ctx))

    def streams(self, parts: list[tuple[Op, Timing]]) -> Timing:
        """A block's children one after another, except the kernels the engine runs on two streams
        (:mod:`perfcast.rollup.streams`): each marked block's main and aux sides run at once."""
        mode, rest, groups = self.base.launch_model.mode, [], {}
        for c, t in parts:
            if isinstance(c, Leaf) and switches(c, mode):
                sides = groups.setdefault(c.attr("stream_join"), {"main": [], "aux": []})
                sides[c.attr("stream")].append(on_stream(c, t))
            else:
                rest.append(t)
        out = serial(rest)
        for g in groups.values():
            main, aux = serial(g["main"]), serial(g["aux"])
            out = out + (conc(main, aux) if g["main"] and g["aux"] else main + aux)
        return out

    def children(self, g: Graph, path, trips, kernel, ctx) -> list[tuple[Op, Timing]]:
        return [(c, self.node(c, path + (c.name,), trips, kernel, ctx)) for c in g.ops]

    def loop(self, op: Loop, path, trips, kernel, ctx: Ctx) -> Timing:
        n, inner, bpath = op.n_iter, trips * op.n_iter, path + (op.body.name,)
        pipelined = "double-buffer" in ctx.rules and _pipelinable(op)

        def iterations(c: Ctx) -> tuple[Timing, Timing]:
            """(one iteration alone, one steady-state iteration) under ``c``."""
            if not pipelined:
                body = self.node(op.body, bpath, inner, kernel, c)
                return body, body
            parts = self.children(op.body, bpath, inner, kernel, c)
            loads = serial(t for o, t in parts if _is_load(o))
            rest = serial(t for o, t in parts if not _is_load(o))
            return loads + rest, conc(loads, rest)

        first, steady = iterations(ctx)
        if pipelined and n != 1:
            self.record(ctx, "double-buffer", path, trips, n * first.time, first.time + (n - 1) * steady.time,
                        [o.name for o in op.body.ops if _is_load(o)],
                        [o.name for o in op.body.ops if not _is_load(o)])
        if "weight-prefetch" in ctx.rules and n != 1 and (phi := self.fractions(op.body)):
            _, staged = iterations(replace(ctx, prefetch={**ctx.prefetch, **phi}, sites=None))
            weights = [(v.op, self.price[(v.path, id(v.op))]) for v in _body_leaves(op.body, path)
                       if id(v.op) in phi]
            stream = sum((phi[id(leaf)] * self.weight_time(lt) for leaf, lt in weights), ZERO)
            prefetched = conc(staged, Timing(stream, {"memory.hbm": stream}))
            self.record(ctx, "weight-prefetch", path, trips, first.time + (n - 1) * steady.time,
                        first.time + (n - 1) * prefetched.time, [leaf.name for leaf, _ in weights], (),
                        sum((phi[id(leaf)] * weight_bytes(leaf) for leaf, _ in weights), ZERO),
                        sum((weight_bytes(leaf) for leaf, _ in weights), ZERO))
            steady = Timing(prefetched.time, steady.busy)
        # resources are busy for the same total however the iterations overlap
        time = n * first.time if steady is first else first.time + (n - 1) * steady.time
        return Timing(time, (first * n).busy)

    def fractions(self, body: Graph) -> dict:
        """Prefetched fraction of each weight-reading leaf of one iteration, in order of use,
        until the staging capacity is full."""
        out, used = {}, ZERO
        for v in _body_leaves(body, ()):
            w = weight_bytes(v.op)
            if w == 0:
                continue
            out[id(v.op)] = 1 if self.staging is None else sympy.Max(0, sympy.Min(1, (self.staging - used) / w))
            used += w
        return out

    # Blocks (micro-batch transforms) ---------------------------------------------------------
    def block_sites(self, g: Graph, rules) -> dict:
        """The micro-batch rewrites that apply to ``g``: a block (a graph of leaves only)."""
        if not g.ops or not all(isinstance(o, Leaf) for o in g.ops):
            return {}
        out = {}
        a2a = [i for i, o in enumerate(g.ops) if o.kind == "all_to_all"]
        if "a2a-experts" in rules and len(a2a) > 1 and any(not _is_comm(o) for o in g.ops[a2a[0]:a2a[-1]]):
            out["a2a-experts"] = (a2a[0], a2a[-1])
        if "comm-overlap" in rules and any(map(_is_comm, g.ops)) and not all(map(_is_comm, g.ops)):
            out["comm-overlap"] = True
        return out

    def block(self, g: Graph, path, trips, kernel, ctx: Ctx) -> Timing:
        sites = self.block_sites(g, ctx.rules)
        leaves = list(g.ops)
        stage = serial(self.leaf(o, path + (o.name,), ctx) for o in leaves)
        split = [(o, self.leaf(o, path + (o.name,), ctx, split=not _is_comm(o))) for o in leaves]
        relaunch = Timing(ZERO if kernel else len(leaves) * self.launch)
        if "a2a-experts" in sites:
            i, j = sites["a2a-experts"]
            seg = split[i:j + 1]
            unit = conc(serial(t for o, t in seg if _is_comm(o)), serial(t for o, t in seg if not _is_comm(o)))
            after = serial(t for _, t in split[:i] + split[j + 1:]) + unit + relaunch
            self.record(ctx, "a2a-experts", path, trips, stage.time, after.time,
                        [o.name for o, _ in seg if _is_comm(o)], [o.name for o, _ in seg if not _is_comm(o)])
            stage = after
        if "comm-overlap" in sites:  # every collective, the all-to-alls included, under all the compute
            comm = [(o, t) for o, t in split if _is_comm(o)]
            after = conc(serial(t for _, t in comm), serial(t for o, t in split if not _is_comm(o))) + relaunch
            self.record(ctx, "comm-overlap", path, trips, stage.time, after.time, [o.name for o, _ in comm],
                        [o.name for o, _ in split if not _is_comm(o)])
            stage = after
        return stage

    def record(self, ctx: Ctx, transform, path, trips, before, after, moved, under, pre=None, w=None):
        if ctx.sites is not None:
            ctx.sites.append(Site(transform, path, trips, before, after, tuple(map(_short, moved)),
                                  tuple(map(_short, under)), pre, w))

    def splits(self, root: Op, rules) -> bool:
        return any(isinstance(v.op, Graph) and self.block_sites(v.op, rules) for v in walk(root))


def _is_load(op: Op) -> bool:
    return isinstance(op, Leaf) and op.kind == "load"


def _pipelinable(loop: Loop) -> bool:
    ops = loop.body.ops
    return any(_is_load(o) for o in ops) and not all(_is_load(o) for o in ops)


def _body_leaves(body: Graph, path):
    """The leaves one iteration runs once (nested graphs, not nested loops), with their paths."""
    for c in body.ops:
        here = path + (body.name, c.name)
        if isinstance(c, Leaf):
            yield _Visit(c, here)
        elif isinstance(c, Graph):
            yield from _body_leaves(c, path + (body.name,))


@dataclass(frozen=True)
class _Visit:
    op: Leaf
    path: tuple[str, ...]
