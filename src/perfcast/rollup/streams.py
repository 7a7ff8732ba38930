"""Concurrent work: a part's time and the resources it keeps busy, and the engine's second stream.

Every part of a step can be summarised as a :class:`Timing` — its time and how long it keeps each
resource busy (compute, each memory level, the network: all links of a device counted as one) —
so that parts running at once are charged for what they share (:func:`conc`): the longer part, or
a resource both use, whichever is busier. Busy time is what a resource must do whatever the
schedule, so running parts at once never takes less than the busiest resource's total.

**The engine's second stream.** An engine may run part of a block on a second CUDA stream while
the main stream runs the rest: TensorRT-LLM runs a MoE layer's shared experts on an auxiliary
stream alongside the router and the routed experts (``maybe_execute_in_parallel``), and only
inside a CUDA graph (engine profile rule ``aux_stream``, docs/design/engines.md). The engine plan
marks those kernels (leaf attributes ``stream`` = ``aux`` or ``main``, ``stream_join`` = the block,
``stream_launch`` = the launch modes under which the engine switches streams); a block's two sides
then take ``conc(main, aux)`` instead of their sum, every compute kernel holding the device's SMs
(:func:`on_stream`): what the second stream hides is what runs beside the main stream's
collectives. :func:`stream_groups` finds the sides; :func:`hidden` is the time the second stream
hides.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import sympy

from perfcast.ir.rules import COLLECTIVE_KINDS
from perfcast.perf import bound_of

ZERO = sympy.Integer(0)


@dataclass(frozen=True)
class Timing:
    """A part's time and the time it keeps each resource busy (per execution)."""

    time: sympy.Expr
    busy: dict = field(default_factory=dict)

    def __add__(self, other: "Timing") -> "Timing":
        busy = dict(self.busy)
        for r, v in other.busy.items():
            busy[r] = busy.get(r, ZERO) + v
        return Timing(self.time + other.time, busy)

    def __mul__(self, n) -> "Timing":
        return Timing(n * self.time, {r: n * v for r, v in self.busy.items()})


def serial(parts: Iterable[Timing]) -> Timing:
    return sum(parts, Timing(ZERO))


def conc(*parts: Timing) -> Timing:
    """Parts that run at once: the longest part, or a resource two parts share, whichever is busier."""
    parts = [p for p in parts if p.time != 0]
    total = serial(parts)
    shared = [total.busy[r] for r in total.busy if sum(r in p.busy for p in parts) > 1]
    return Timing(sympy.Max(*(p.time for p in parts), *shared), total.busy) if parts else total


def resource(term: str) -> str:
    """A breakdown term's resource: memory terms keep their level, all links are one network."""
    head = bound_of(term)
    return term if head == "memory" else head


def timing(terms: dict, time: sympy.Expr) -> Timing:
    """A leaf's Timing from its priced breakdown (``{term: seconds}``) and time."""
    busy: dict = {}
    for k, v in terms.items():
        busy[resource(k)] = busy.get(resource(k), ZERO) + v
    return Timing(time, busy)


#: the resource every compute kernel holds while it runs (see :func:`on_stream`)
SMS = "sms"


def on_stream(leaf, t: Timing) -> Timing:
    """A kernel's Timing as one side of a two-stream block: a compute kernel also holds the device's
    SMs for its whole time (an assumption: the engines' GEMM and MoE kernels are sized to fill the
    device — CUTLASS's persistent tile schedulers launch min(tiles, SMs) CTAs, one per SM — so a
    kernel on the other stream waits for SMs rather than sharing them); a collective waits on the
    links and leaves the SMs to the other stream."""
    if leaf.kind in COLLECTIVE_KINDS:
        return t
    return Timing(t.time, {**t.busy, SMS: t.busy.get(SMS, ZERO) + t.time})


def switches(leaf, mode: str) -> bool:
    """Whether ``leaf`` is a side of a two-stream block and launch ``mode`` lets the engine switch streams."""
    return leaf.attr("stream_join") is not None and mode in str(leaf.attr("stream_launch") or "").split(",")


def stream_groups(leaves: Iterable, mode: str) -> dict[tuple, dict[str, list]]:
    """The blocks whose kernels run on two streams under launch ``mode``: ``{(block, trips):
    {"main": [...], "aux": [...]}}`` over objects with ``.leaf`` and ``.trips`` (a roll-up's leaf
    totals); a block with only one side marked is not one."""
    groups: dict[tuple, dict[str, list]] = {}
    for r in leaves:
        if switches(r.leaf, mode):
            sides = groups.setdefault((r.leaf.attr("stream_join"), r.trips), {"main": [], "aux": []})
            sides[r.leaf.attr("stream")].append(r)
    return {k: g for k, g in groups.items() if g["main"] and g["aux"]}


def hidden(main: Timing, aux: Timing) -> sympy.Expr:
    """The time a second stream hides: the two sides' sum less their concurrent time (≥ 0)."""
    return main.time + aux.time - conc(main, aux).time
