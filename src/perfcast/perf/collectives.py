"""Collective costs on a topology: α–β closed forms per algorithm (symbolic in bytes, group size
and link bandwidth), the cheapest chosen per call unless one is forced.

``V`` is the message a device ends with (all-gather) or starts with (reduce-scatter, all-reduce,
all-to-all), ``N`` the group size, ``L`` the links per device, ``B`` the link bandwidth, ``α`` the
per-step latency, ``α₀`` a per-call latency (zero unless calibrated). Sources: ring algorithms —
Patarasuk & Yuan, "Bandwidth optimal all-reduce algorithms for clusters of workstations", JPDC
69(2), 2009 (each device moves (N−1)/N·V per phase over one link); bandwidth-optimal multi-port —
the same volume spread over all L distinct links (Chan et al., "Collective communication: theory,
practice, and experience", CCPE 19(13), 2007, §7 on multi-port torus collectives); all-reduce =
reduce-scatter + all-gather; tree broadcast — log2 N steps of the whole message. On a switch a
ring's steps stripe over all of a device's ports (NCCL spreads a ring's channels over every
NVLink). On a torus without wraparound the multi-port algorithm runs at the pace of an edge
device, which has one neighbour per dim (``Tier.bottleneck_links``): half the links of an
interior one on dims longer than 2, so about twice the bandwidth time of the same torus with
wraparound (Austin et al., "How to Scale Your Model", 2025, part 3, collective costs on TPU ICI:
without wraparound links a collective typically takes twice as long).

A group that spans several tiers (8 GPUs of a node × 4 nodes) runs **hierarchically** (Thakur,
Rabenseifner & Gropp, "Optimization of collective communication operations in MPICH", IJHPCA
19(1), 2005; NCCL's tree/2-D algorithms): reduce-scatter innermost tier first, so each slower
tier carries only 1/(inner group) of the data; all-gather outermost first; all-reduce =
hierarchical reduce-scatter, all-reduce over the outermost tier, hierarchical all-gather.
All-to-all sends to near and far peers at once, so the slowest tier's share sets the time. The
alternative, one flat ring over the whole group, runs at the slowest tier's links.

A tier's calibration (per collective, fitted on measured NCCL runs) scales its link bandwidth
(``bandwidth_efficiency``), replaces its per-step latency and adds a per-call one
(``base_latency_s``), as NCCL's own tuning model does (``src/graph/tuning.cc``: ``baseLat +
nsteps·hwLat``). A collective calibrated per protocol (NCCL's LL / LL128 / Simple trade latency
for bandwidth and NCCL picks one per call) offers every algorithm once per protocol, named
``ring/ll``, ``ring/simple`` …; the cheapest is chosen per call, as among algorithms.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import sympy

from perfcast.hardware.topology import Tier, Topology
from perfcast.ir.errors import UserError

OPS = ("all_gather", "reduce_scatter", "all_reduce", "all_to_all", "broadcast", "send_recv")
ALGORITHMS = ("ring", "multiport", "tree", "direct", "hierarchical")


@dataclass(frozen=True)
class CollectiveCost:
    op: str
    algorithm: str
    time_s: sympy.Expr
    links_used: int
    formula: str


def _check(op: str) -> None:
    if op not in OPS:
        raise UserError(f"unknown collective {op!r}; expected one of {', '.join(OPS)}")


@dataclass(frozen=True)
class _Rate:
    """``op`` on one tier under one protocol, after calibration."""

    protocol: str | None
    bandwidth: sympy.Expr  # per link, B/s
    latency: sympy.Expr  # per step, α
    base_latency: sympy.Expr  # per call, α₀


def _rates(op: str, tier: Tier) -> list[_Rate]:
    """``op``'s figures on ``tier``, one per calibrated protocol (one when uncalibrated)."""
    return [_Rate(c.protocol, tier.link_bandwidth_bytes_per_s * c.bandwidth_efficiency,
                 tier.link_latency_s if c.latency_s is None else c.latency_s, c.base_latency_s)
            for c in tier.calibrated(op)]


def _under(rate: _Rate, c: CollectiveCost) -> CollectiveCost:
    """An algorithm's cost under ``rate``'s protocol: its per-call latency added, its name
    extended (``ring/ll``)."""
    name = c.algorithm if rate.protocol is None else f"{c.algorithm}/{rate.protocol}"
    if rate.base_latency == 0:
        return replace(c, algorithm=name)
    return replace(c, algorithm=name, time_s=rate.base_latency + c.time_s, formula=f"α₀ + {c.formula}")


def costs(op: str, message_bytes, tier: Tier, group_size: int | None = None) -> list[CollectiveCost]:
    """Every applicable algorithm's cost for ``op`` over ``group_size`` devices of one tier, once
    per calibrated protocol (algorithm by algorithm)."""
    _check(op)
    n = tier.size if group_size is None else group_size
    if n < 1 or n > tier.size:
        raise UserError(f"--group-size {n}: the tier {tier.name} has {tier.size} devices")
    if n == 1:
        return [CollectiveCost(op, "none", sympy.Integer(0), 0, "0 (a group of one)")]
    v = sympy.sympify(message_bytes)
    per = [[_under(r, c) for c in _algorithms(op, v, tier, n, r.bandwidth, r.latency)] for r in _rates(op, tier)]
    return [options[i] for i in range(len(per[0])) for options in per]


def _algorithms(op: str, v: sympy.Expr, tier: Tier, n: int, bw: sympy.Expr, alpha: sympy.Expr) -> list[CollectiveCost]:
    """The α–β forms of ``op`` over ``n`` > 1 devices of ``tier`` at bandwidth ``bw`` per link
    and ``alpha`` per step."""
    links = tier.links_per_device
    frac = sympy.Rational(n - 1, n)
    # a ring's step on a switch stripes over every port; on a torus or ring it takes one link
    ring_links = links if tier.kind == "switch" else 1
    lb = "(L·B)" if ring_links > 1 else "B"
    if op == "send_recv":
        return [CollectiveCost(op, "direct", alpha + v / (ring_links * bw), ring_links, f"α + V/{lb}")]
    out: list[CollectiveCost] = []
    if op == "broadcast":
        steps = sympy.ceiling(sympy.log(n, 2))
        out.append(CollectiveCost(op, "tree", steps * (alpha + v / (ring_links * bw)), ring_links,
                                  f"⌈log2 N⌉·(α + V/{lb})"))
        out.append(CollectiveCost(op, "ring", (n - 1) * alpha + v / (ring_links * bw), ring_links,
                                  f"(N−1)·α + V/{lb} (pipelined)"))
        return out
    k = 2 if op == "all_reduce" else 1
    one = f"(N−1)·α + (N−1)/N·V/{lb}"
    out.append(CollectiveCost(op, "ring", k * ((n - 1) * alpha + frac * v / (ring_links * bw)), ring_links,
                              f"{k}·({one})" if k > 1 else one))
    # multi-port at the pace of the worst-placed device (an edge device without wraparound)
    edge = tier.bottleneck_links
    if edge > 1 and op != "all_to_all" and tier.kind != "switch":
        hops = tier.diameter
        one = "D·α + (N−1)/N·V/(L·B)"
        out.append(CollectiveCost(op, "multiport", k * (hops * alpha + frac * v / (edge * bw)), edge,
                                  f"{k}·({one})" if k > 1 else one))
    if op == "all_to_all" and tier.kind in ("switch", "full_mesh"):
        # listed first: one step over as many links as the ring or more, it wins a tie (α = 0)
        width = links if tier.kind == "switch" else n - 1
        out.insert(0, CollectiveCost(op, "direct", alpha + frac * v / (bw * width), width,
                                     "α + (N−1)/N·V/(B·(N−1))" if tier.kind == "full_mesh" else "α + (N−1)/N·V/(L·B)"))
    return out


def cheapest(options: list[CollectiveCost], algorithm: str | None, where: str) -> CollectiveCost:
    """The cheapest option (at a numeric size; the first when symbolic), or the one forced:
    ``ring`` forces the ring under its cheapest protocol, ``ring/ll`` one protocol."""
    if algorithm is not None:
        forced = [c for c in options if algorithm in (c.algorithm, c.algorithm.split("/")[0])]
        if not forced:
            raise UserError(f"--algorithm {algorithm!r} does not apply to {options[0].op} on {where}; "
                            f"available: {', '.join(c.algorithm for c in options)}")
        options = forced
    if all(c.time_s.is_number for c in options):
        return min(options, key=lambda c: float(c.time_s))
    return options[0]


def _best(options: list[CollectiveCost]) -> CollectiveCost:
    """The cheapest option; at a symbolic size, their Min (named ``min(ring/ll, ring/simple)``)."""
    if len(options) == 1:
        return options[0]
    if all(c.time_s.is_number for c in options):
        return min(options, key=lambda c: float(c.time_s))
    names = ", ".join(c.algorithm for c in options)
    return CollectiveCost(options[0].op, f"min({names})", sympy.Min(*(c.time_s for c in options)),
                          max(c.links_used for c in options), f"min({'; '.join(c.formula for c in options)})")


def cost(op: str, message_bytes, tier: Tier, group_size: int | None = None,
         algorithm: str | None = None) -> CollectiveCost:
    """The cheapest algorithm on one tier (at a numeric size), or the one forced."""
    return cheapest(costs(op, message_bytes, tier, group_size), algorithm, tier.name)


def span_costs(op: str, message_bytes, span: list[tuple[Tier, int]]) -> list[CollectiveCost]:
    """Every applicable algorithm for a group crossing the tiers of ``span`` ((tier, units of it
    in the group), innermost first): the single tier's algorithms, or hierarchical and flat ring."""
    _check(op)
    span = [(t, c) for t, c in span if c > 1]
    if not span:
        return [CollectiveCost(op, "none", sympy.Integer(0), 0, "0 (a group of one)")]
    if len(span) == 1:
        return costs(op, message_bytes, *span[0])
    v = sympy.sympify(message_bytes)
    counts = [c for _, c in span]
    g = math.prod(counts)

    def stage(sub: str, t: Tier, c: int, size) -> CollectiveCost:  # the cheapest on its tier
        return _best(costs(sub, size, t, c))

    steps: list[tuple[str, CollectiveCost]] = []
    if op == "all_gather":  # outermost first: stage i ends with V·Π_{j≥i} c_j / g
        for i in reversed(range(len(span))):
            t, c = span[i]
            steps.append((f"AG {t.name}({c})", stage(op, t, c, v * math.prod(counts[i:]) / g)))
        total = sum(s.time_s for _, s in steps)
    elif op == "reduce_scatter":  # innermost first: stage i starts with V / Π_{j<i} c_j
        for i, (t, c) in enumerate(span):
            steps.append((f"RS {t.name}({c})", stage(op, t, c, v / math.prod(counts[:i]))))
        total = sum(s.time_s for _, s in steps)
    elif op == "all_reduce":
        for i, (t, c) in enumerate(span[:-1]):
            steps.append((f"RS {t.name}({c})", stage("reduce_scatter", t, c, v / math.prod(counts[:i]))))
        t, c = span[-1]
        steps.append((f"AR {t.name}({c})", stage("all_reduce", t, c, v / math.prod(counts[:-1]))))
        for i in reversed(range(len(span) - 1)):
            t, c = span[i]
            steps.append((f"AG {t.name}({c})", stage("all_gather", t, c, v / math.prod(counts[:i]))))
        total = sum(s.time_s for _, s in steps)
    elif op == "all_to_all":  # near and far peers at once: tier i carries V·(c_i−1)·Π_{j<i}c_j/g
        for i, (t, c) in enumerate(span):
            steps.append((f"A2A {t.name}({c})", stage(op, t, c, v * math.prod(counts[: i + 1]) / g)))
        total = sympy.Max(*(s.time_s for _, s in steps))
    elif op == "broadcast":
        for t, c in reversed(span):
            steps.append((f"BC {t.name}({c})", stage(op, t, c, v)))
        total = sum(s.time_s for _, s in steps)
    else:  # send_recv: one hop over the outermost tier the pair crosses
        t, c = span[-1]
        steps.append((f"P2P {t.name}", stage(op, t, c, v)))
        total = steps[0][1].time_s
    sep = " max " if op == "all_to_all" else " + "
    hier = CollectiveCost(op, "hierarchical", total, steps[0][1].links_used,
                          sep.join(f"{name} [{s.algorithm}]" for name, s in steps))
    out = [hier]
    if op in ("all_gather", "reduce_scatter", "all_reduce"):
        out += _flat_rings(op, v, span, g)
    return out


def _flat_rings(op: str, v: sympy.Expr, span: list[tuple[Tier, int]], g: int) -> list[CollectiveCost]:
    """One flat ring through every device: each step waits for the slowest tier's link. The ring
    runs one protocol throughout; a tier calibrated once serves every protocol, a tier
    calibrated per protocol only its own."""
    k = 2 if op == "all_reduce" else 1
    per_tier = [_rates(op, t) for t, _ in span]

    def under(protocol, tier_rates: list[_Rate]) -> _Rate | None:
        named = [r for r in tier_rates if r.protocol == protocol] or [r for r in tier_rates if r.protocol is None]
        return named[0] if named else None

    out = []
    for protocol in dict.fromkeys(r.protocol for tier_rates in per_tier for r in tier_rates):
        picked = [under(protocol, tier_rates) for tier_rates in per_tier]
        if None in picked:
            continue
        ring_bw = sympy.Min(*(r.bandwidth * (t.links_per_device if t.kind == "switch" else 1)
                              for (t, _), r in zip(span, picked)))
        alpha = sympy.Max(*(r.latency for r in picked))
        one = "(N−1)·α_max + (N−1)/N·V/B_min"
        ring = CollectiveCost(op, "ring", k * ((g - 1) * alpha + sympy.Rational(g - 1, g) * v / ring_bw), 1,
                              f"{k}·({one})" if k > 1 else one)
        base = sympy.Max(*(r.base_latency for r in picked))
        out.append(_under(_Rate(protocol, ring_bw, alpha, base), ring))
    return out


def topology_cost(op: str, message_bytes, topology: Topology, group_size: int | None = None,
                  stride: int = 1, algorithm: str | None = None) -> CollectiveCost:
    """The cheapest algorithm for a group of ``group_size`` devices ``stride`` apart (default:
    the innermost tier) on ``topology``."""
    n = group_size or topology.tiers[0].size
    options = span_costs(op, message_bytes, topology.span(n, stride))
    return cheapest(options, algorithm, topology.name)
