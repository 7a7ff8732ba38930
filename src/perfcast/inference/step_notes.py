"""The notes of a text-generation step: what it assumed, how the engine ran it, how it was
laid out on the devices, which fits priced it."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from perfcast.capture import Lowered
from perfcast.capture import parallel as par
from perfcast.engines.launch import Launch
from perfcast.hardware.topology import Mesh
from perfcast.perf import EmpiricalPerformanceModel
from perfcast.rollup import FastRollup

if TYPE_CHECKING:
    from perfcast.inference.textgen import Request


def parallel_notes(req: Request, mesh: Mesh | None) -> list[str]:
    layout = req.layout
    if mesh is None:
        return []
    cfg = req.model.data
    kv = int(cfg.get("num_key_value_heads") or cfg["num_attention_heads"])
    spans = {a: " × ".join(f"{k} on {t.name}" for t, k in mesh.span(a) if k > 1) or "one device"
             for a, size, _ in mesh.axes if size > 1}
    notes = [f"layout: {layout.describe()} on {req.devices} devices of {mesh.topology.name} — "
             + "; ".join(f"{a}: {s}" for a, s in spans.items())]
    if layout.tp > kv:
        notes.append(f"{kv} KV heads < tp {layout.tp}: each KV head is replicated on {layout.tp // kv} devices")
    if layout.dp > 1 and not layout.attention_dp:
        notes.append(f"dp {layout.dp}: independent replicas, {math.ceil(req.num_queries / layout.dp)} sequences each")
    if layout.attention_dp:
        profile = req.profile()
        moves = (f"all-gather the group's tokens over ep {layout.ep} and reduce-scatter the expert outputs "
                 f"({profile.name}'s MoE exchange on {req.device.name})"
                 if profile.exchange(req.device.name) == "gather" and layout.moe_exchange_applies else
                 f"dispatch top-k token copies over ep {layout.ep} (all-to-all, no de-duplication)")
        notes.append(f"attention data parallelism: each of {layout.dp} ranks runs attention on its own sequences; "
                     f"MoE layers {moves}")
    if layout.sequence_parallel:
        notes.append("sequence parallelism: reduce-scatter + all-gather replace each all-reduce; norms between "
                     "blocks are still priced on all tokens (an overestimate of their small cost)")
    if layout.pp > 1:
        rng = par.stage_layers(int(cfg["num_hidden_layers"]), layout.pp)
        notes.append(f"pipeline: {layout.pp} stages of {', '.join(str(len(r)) for r in rng)} layers, "
                     f"{req.micro_batches} micro-batches of {req.sequences_per_micro_batch} sequences; step = all "
                     f"stages once + (micro-batches − 1) × the slowest stage; memory is the fullest stage's")
    return notes


def pricing_notes(rollups: dict[str, FastRollup]) -> list[str]:
    """What each performance model assumed on the way: which calibrated fits priced how many
    kernels, the units the generic roofline priced at datasheet peak, rate fallbacks."""
    notes: list[str] = []
    for name, r in rollups.items():
        model = r.model
        fits: dict[str, dict[str, int]] = {}
        seen: dict[str, int] = {}
        generic = 0
        for lt in r.leaves:
            calibrated = False
            for n in lt.result.notes:
                if n.startswith("calibrated ") and n.endswith(")"):
                    key, _, label = n.removeprefix("calibrated ").partition(" (")
                    by = fits.setdefault(label[:-1], {})
                    by[key] = by.get(key, 0) + int(lt.trips)
                    calibrated = True
                else:
                    seen[n] = seen.get(n, 0) + int(lt.trips)
            generic += not calibrated and lt.result.source.value == "analytic"
        for label, by in fits.items():
            notes.append(f"{name}: kernels priced by calibrated fits ({label}): "
                         + ", ".join(f"{k} ×{n:,}" for k, n in sorted(by.items(), key=lambda kv: -kv[1])))
        if generic:
            for unit in model.uncalibrated():
                notes.append(f"{name}: no {unit} efficiency curve for {model.device.name}; "
                             f"{unit} work of the {generic} kernel(s) no calibrated fit covers priced at datasheet peak")
        notes.extend(f"{name}: {n} ({k:,} call{'s' if k != 1 else ''})" for n, k in seen.items())
        if isinstance(model, EmpiricalPerformanceModel):
            notes.extend(f"{name}: {n}" for n in model.notes)
    return notes


def step_notes(req: Request, low) -> list[str]:
    notes = []
    cfg = req.model.data
    experts = par.experts_of(cfg)
    if experts:
        k = cfg.get("num_experts_per_tok")
        if req.moe_routing == "balanced":
            notes.append(f"MoE routing: balanced (--moe-routing) — each of {experts} experts receives tokens·{k}/"
                         f"{experts} tokens; the weights of min({experts}, tokens·{k}) experts are read per layer")
        else:
            notes.append(f"MoE routing: random — each token's {k} of {experts} experts drawn uniformly and "
                         f"independently; the weights of {experts}·(1 − (1 − {k}/{experts})^tokens) experts are "
                         f"read per layer in expectation (balanced routing would read min({experts}, tokens·{k}))")
    if low.unknown:
        notes.append(f"{sum(low.unknown.values())} op calls have no cost rule and are NOT priced: "
                     + ", ".join(f"{op} ×{n}" for (op, _), n in low.unknown.most_common(5)))
    notes.append("kernels run one after another: no overlap between them is assumed")
    return notes


def engine_notes(profile, launch: Launch, low: Lowered, rotated: bool) -> list[str]:
    """What the engine profile did to the captured step, and how its kernels are launched."""
    from perfcast.ir import leaves

    notes = [f"engine {profile.name} ({profile.framework} {profile.version}): {profile.description}",
             f"launch — {launch.description}"]
    if launch.host_source:
        notes.append(f"host launch interval: {launch.host_source}")
    for name, opt in profile.options.items():
        notes.append(f"engine option {name}: {opt.value} ({profile.framework} {opt.setting}; "
                     + (f"set by --engine-option; default {opt.default}" if opt.default else "the engine's default")
                     + ")")
    if rotated:
        notes.append("each decoder layer ends with the next layer's input norm (fused with its residual add); "
                     "the first layer's norm runs before the loop and the final norm is the last layer's")
    for why, n in low.dropped.items():
        notes.append(f"not run per step by {profile.name} ({n} captured ops): {why}")
    kernels = leaves(low.graph)
    notes += _stream_notes(profile, launch, [leaf for leaf in kernels if leaf.attr("stream_join")])
    left = [leaf for leaf in kernels if leaf.attr("rule") == "leftover" and leaf.kind not in
            ("matmul", "attention", "grouped_matmul", "gather")]
    if left and profile.leftover.memory == "per_op":
        names = sorted({str(leaf.attr("kernel")) for leaf in left})
        notes.append(f"{len(left)} memory-bound kernels match no fusion rule of {profile.name} and run one per op: "
                     + ", ".join(names[:6]) + ("…" if len(names) > 6 else ""))
    return notes


def _stream_notes(profile, launch: Launch, marked: list) -> list[str]:
    """The engine's second stream (rule ``aux_stream``): what runs on it, and whether this step's
    launch lets the engine switch streams (:mod:`perfcast.rollup.streams`)."""
    if not marked:
        return []
    blocks = sorted({str(leaf.attr("stream_join")) for leaf in marked})
    aux = sorted({str(leaf.attr("kernel")) for leaf in marked if leaf.attr("stream") == "aux"})
    main = sorted({str(leaf.attr("kernel")) for leaf in marked if leaf.attr("stream") == "main"})
    modes = str(marked[0].attr("stream_launch")).split(",")
    where = f"every MoE block ({blocks[0]}" + (f" and {len(blocks) - 1} more as captured)" if len(blocks) > 1 else ")")
    if launch.mode in modes:
        return [f"second stream: in {where}, {', '.join(aux)} run on {profile.name}'s auxiliary stream alongside "
                f"{', '.join(main)} on the main one — priced as concurrent work sharing the device's resources, "
                f"each compute kernel holding every SM, so what hides is what runs beside the main stream's "
                f"collectives; the rest one after another (stream_overlap_s)"]
    return [f"second stream: {profile.name} would run {', '.join(aux)} alongside {', '.join(main)} in {where}, "
            f"but only under {' or '.join(modes)} launches; this step launches {launch.mode}: one stream"]
