"""Overlap transforms: named rewrites of the fast roll-up's sum where work runs at the same time.

The fast roll-up charges every leaf after the one before: ``T = Σ trips·t_leaf + launches·t_launch``.
A transform says which work runs concurrently with which, and rewrites that part of the sum; the
result is again one closed form (``Max``/``Min`` of sums). Any subset may be enabled; they apply
in this fixed order, inner structure first (:data:`ORDER`):

1. ``double-buffer`` — a loop's tile loads are issued one iteration ahead, so iteration i+1's
   loads run under iteration i's other work (software pipelining with two buffers; the TMA
   producer / MMA consumer split of FlashAttention-3, Shah et al., arXiv:2407.08608, §3.1;
   CUTLASS's multistage main loop). Per loop of n iterations with loads L and the rest R:
   ``T = L + (n − 1)·conc(L, R) + R`` — the first tile's loads (the fill), n − 1 steps that each
   cost the longer stage, the last tile's work (the drain).
2. ``a2a-experts`` — in a block holding an MoE layer's dispatch and combine all-to-alls, the
   leaves between them (the expert GEMMs) run under the all-to-alls: ``conc(a2a, experts)``
   instead of their sum (DeepSeek-V3 report, arXiv:2412.19437, §3.4: two micro-batches, one's
   attention and MoE under the other's dispatch and combine; §3.2.1 for the training-time form;
   DeepEP's hook-based overlap; vLLM's dual batch overlap, docs/design/dbo.md).
3. ``comm-overlap`` — a block's collectives run on their own stream under its compute:
   ``conc(collectives, compute)``. A tensor-parallel all-reduce sits on the critical path of its
   own micro-batch (Megatron-LM, arXiv:1909.08053, §3: the next block needs the reduced sum), so
   only *independent* work can hide it: the block is split into two micro-batches whose compute
   and communication interleave (Domino, arXiv:2409.15241; NanoFlow, arXiv:2408.12757).
4. ``weight-prefetch`` — in a loop over layers, the next iteration's weights are read from HBM
   into on-chip staging while this iteration runs (FlexGen, Sheng et al., ICML 2023, §4: the next
   layer's weights load under the current layer's compute; PRESERVE, arXiv:2501.08192: HBM→L2
   prefetch under collectives). ``T = S + (n − 1)·conc(S', stream)``: S the body, S' the body with
   the prefetched weights on chip, ``stream`` the prefetch's HBM time; the first iteration reads
   its own weights in line (the fill).

Two rules make every rewrite honest. **Concurrent work shares resources**: parts that run at
once take ``conc(A, B) = Max(t_A, t_B, Σ busy_r)`` over each resource r both parts use (compute,
HBM, on-chip memory, the network — all links of a device counted as one), so HBM is one resource
and prefetching weights cannot speed up a layer whose HBM is already busy. **A micro-batch split
pays for itself or is not made**: transforms 2 and 3 assume two micro-batches, which read every
weight twice and launch every kernel twice; the whole graph is priced both ways and the closed
form is ``Min(unsplit, split)``. (Two further costs of the split are not charged: each collective
paying its latency twice, and smaller kernels running at lower efficiency.) No rewrite can raise
the time, nor bring it below ``max_r Σ busy_r`` + launches (the max-over-resources bound).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import sympy

from perfcast.inputs import excerpt
from perfcast.ir import Graph, Op, UserError, walk
from perfcast.rollup.fast import FastRollup
from perfcast.rollup.overlap_account import OverlapEvaluation, account
from perfcast.rollup.overlap_rules import ZERO, Ctx, Evaluator, Site, Timing, weight_bytes

ORDER = ("double-buffer", "a2a-experts", "comm-overlap", "weight-prefetch")
DEVICE = "device"  # staging capacity: the device's on-chip capacity
#: One line per transform: what it assumes (reports print it when the transform is applied).
SUMMARY = {
    "double-buffer": "tile loads issued one iteration ahead run under the previous iteration's other work",
    "a2a-experts": "dispatch/combine all-to-alls run under the expert GEMMs between them (two micro-batches)",
    "comm-overlap": "collectives run on their own stream under the block's compute (two micro-batches: "
                    "each weight read and each kernel launched twice)",
    "weight-prefetch": "the next layer's weights stream into on-chip staging under the current layer "
                       "(HBM shared; staging capped at the device's on-chip capacity)",
}

__all__ = ["ORDER", "SUMMARY", "OverlapRollup", "Step", "overlap", "parse", "weight_bytes"]


def parse(names: Iterable[str]) -> tuple[str, ...]:
    """Transform names (``all`` = every one) → the enabled ones in application order."""
    wanted = set()
    for given in names:
        n = given.replace("_", "-")  # double_buffer is double-buffer, as all_gather is all-gather
        if n == "all":
            wanted |= set(ORDER)
        elif n in ORDER:
            wanted.add(n)
        else:
            raise UserError(f"--overlap {excerpt(given)}: expected one of {', '.join(ORDER)} or all")
    return tuple(n for n in ORDER if n in wanted)


@dataclass(frozen=True)
class Step:
    """The closed form after ``name`` and every transform before it, per micro-batch variant
    (``split`` is None when no block can be split), and the sites ``name`` rewrote in each."""

    name: str
    unsplit: sympy.Expr
    split: sympy.Expr | None
    sites: dict  # variant (False/True) → tuple of Site

    @property
    def time_s(self) -> sympy.Expr:
        return self.unsplit if self.split is None else sympy.Min(self.unsplit, self.split)


class OverlapRollup:
    """A fast roll-up with overlap transforms applied: ``time_s`` is a closed form in the same
    free symbols; ``evaluate`` and ``lambdify`` run the same parameter guard."""

    def __init__(self, base: FastRollup, transforms: Sequence[str], staging_bytes=DEVICE,
                 root: Op | None = None):
        self.base, self.transforms = base, parse(transforms)
        if staging_bytes == DEVICE:
            device = getattr(base.model, "device", None)
            staging_bytes = None if device is None else device.spec.datasheet.onchip_capacity_bytes
        self.staging_bytes = None if staging_bytes is None else sympy.nsimplify(staging_bytes)
        self.root = base.op if root is None else root
        self._path = _path_to(base.op, self.root)
        outer = _kernel_of(base.op, self.root)
        ev = Evaluator(base, self.staging_bytes)
        # the roll-up's launch cost of the subtree (with eager launches, each a Max of its kernel's
        # GPU time and the host's launch time: see :mod:`perfcast.rollup.fast`)
        self.launch_time_s = sympy.Integer(0) if outer is not None else base.launch_time_of(self.root)

        def total(rules, split) -> tuple[Timing, tuple[Site, ...]]:
            sites: list = []
            t = ev.node(self.root, self._path, sympy.Integer(1), outer is not None,
                        Ctx(frozenset(rules), split, {}, sites))
            return t, tuple(sites)

        plain, _ = total((), False)
        self.before_s = base.time_s if root is None else plain.time + self.launch_time_s
        self.bound_s = (sympy.Max(*plain.busy.values()) if plain.busy else ZERO) + self.launch_time_s
        self.steps: list[Step] = []
        for k, name in enumerate(self.transforms, start=1):
            rules = self.transforms[:k]
            unsplit, s0 = total(rules, False)
            split, s1 = total(rules, True) if ev.splits(self.root, rules) else (None, ())
            self.steps.append(Step(name, unsplit.time + self.launch_time_s,
                                   None if split is None else split.time + self.launch_time_s,
                                   {False: tuple(s for s in s0 if s.transform == name),
                                    True: tuple(s for s in s1 if s.transform == name)}))

    @property
    def time_s(self) -> sympy.Expr:
        return self.steps[-1].time_s if self.steps else self.before_s

    def evaluate(self, values) -> OverlapEvaluation:
        """Numbers at one design point (checked by the guard): before, after, the bound, and each
        transform's hidden time, in total and per site."""
        return account(self, values)

    def lambdify(self, names: Sequence[str] | None = None):
        """A NumPy function of the free symbols returning the time with overlap (guarded)."""
        return self.base.lambdify(names, expr=self.time_s)



def _path_to(root: Op, node: Op) -> tuple[str, ...]:
    for v in walk(root):
        if v.op is node:
            if v.trips != 1:
                raise ValueError(f"{node.name}: an overlap root inside a loop is not supported")
            return v.path
    raise ValueError(f"{node.name} is not in the roll-up's tree")


def _kernel_of(root: Op, node: Op) -> Graph | None:
    """The launch graph enclosing ``node`` (not ``node`` itself)."""
    for v in walk(root):
        if v.op is node:
            return v.kernel if v.kernel is not node else None
    return None


def overlap(base: FastRollup, transforms: Sequence[str], staging_bytes=DEVICE, root: Op | None = None) -> OverlapRollup:
    """Apply the named overlap transforms (see :data:`ORDER`) to a priced roll-up."""
    return OverlapRollup(base, transforms, staging_bytes, root)
