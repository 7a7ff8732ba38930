"""The engine-plan rules for a MoE block (:mod:`perfcast.engines.plan`): the all-to-alls an engine
runs as its own kernels (``moe_a2a``), and the work it runs on a second stream (``aux_stream``)."""

from __future__ import annotations

import re

from perfcast.capture.lower import kind_of
from perfcast.capture.types import moe_a2a_side
from perfcast.engines.plan import HANDLERS, Entry


@HANDLERS.register("moe_a2a")
def _moe_a2a(rule, entries, ctx, lw, state):
    for e in entries:  # the parallel plan marks a MoE layer's two all-to-alls
        side = moe_a2a_side(e.head.scalars) if kind_of(e.head) == "all_to_all" else None
        if side and e.kernel is None and e.how is None:
            e.kernel, e.kernel_class = getattr(rule, side), "moe_a2a"
            e.attrs.update(op=rule.op, wire_dtype=getattr(rule, f"{side}_dtype"))
    return entries


#: the MoE block a module belongs to, and the rest of its path (``model.layers.3.mlp``, ``shared_experts.act_fn``)
_BLOCK = re.compile(r"^(model\.layers\.\d+\.(?:mlp|block_sparse_moe|feed_forward))(?:\.(.+))?$")


@HANDLERS.register("aux_stream")
def _aux_stream(rule, entries, ctx, lw, state):
    """Mark the kernels of each MoE block that run on the engine's second stream (``stream: aux``)
    and those of the main stream they run alongside (``stream: main``), both with the block
    (``stream_join``) and the launch modes under which the engine switches streams."""
    launch = ",".join(rule.launch)
    blocks: dict[str, list[Entry]] = {}
    for e in entries:
        m = _BLOCK.match(e.head.module or "")
        if m:
            blocks.setdefault(m.group(1), []).append(e)
    for block, members in blocks.items():
        aux = [e for e in members if (_BLOCK.match(e.head.module).group(2) or "").split(".")[0] in rule.modules]
        if not aux:
            continue
        join = next((i for i, e in enumerate(members) if e.role == "moe_add"), len(members))
        on_aux = {id(e) for e in aux}
        main = [e for e in members[:join] if id(e) not in on_aux and e.role in rule.alongside]
        if not main:
            continue
        for side, group in (("aux", aux), ("main", main)):
            for e in group:
                e.attrs.update(stream=side, stream_join=block, stream_launch=launch)
    return entries
