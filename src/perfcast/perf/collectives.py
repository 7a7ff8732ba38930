"""Collective costs on one topology tier: α–β closed forms per algorithm (symbolic in bytes,
group size and link bandwidth), the cheapest chosen per call unless one is forced.

``V`` is the message a device ends with (all-gather) or starts with (reduce-scatter, all-reduce,
all-to-all), ``N`` the group size, ``L`` the links per device, ``B`` the link bandwidth, ``α`` the
per-hop latency. Sources: ring algorithms — Patarasuk & Yuan, "Bandwidth optimal all-reduce
algorithms for clusters of workstations", JPDC 69(2), 2009 (each device moves (N−1)/N·V per
phase over one link); bandwidth-optimal multi-port — the same volume spread over all L distinct
links (Chan et al., "Collective communication: theory, practice, and experience", CCPE 19(13),
2007, §7 on multi-port torus collectives); all-reduce = reduce-scatter + all-gather; tree
broadcast — log2 N steps of the whole message.
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy

from perfcast.hardware.topology import Tier
from perfcast.ir.errors import UserError

OPS = ("all_gather", "reduce_scatter", "all_reduce", "all_to_all", "broadcast", "send_recv")
ALGORITHMS = ("ring", "multiport", "tree", "direct")


@dataclass(frozen=True)
class CollectiveCost:
    op: str
    algorithm: str
    time_s: sympy.Expr
    links_used: int
    formula: str


def _phases(op: str) -> int:
    return 2 if op == "all_reduce" else 1


def costs(op: str, message_bytes, tier: Tier, group_size: int | None = None) -> list[CollectiveCost]:
    """Every applicable algorithm's cost for ``op`` over ``group_size`` devices of ``tier``."""
    if op not in OPS:
        raise UserError(f"unknown collective {op!r}; expected one of {', '.join(OPS)}")
    n = tier.size if group_size is None else group_size
    if n < 1 or n > tier.size:
        raise UserError(f"--group-size {n}: the tier {tier.name} has {tier.size} devices")
    v = sympy.sympify(message_bytes)
    bw, alpha = tier.link_bandwidth_bytes_per_s, tier.link_latency_s
    links = tier.links_per_device
    frac = sympy.Rational(n - 1, n)
    out: list[CollectiveCost] = []
    if n == 1:
        return [CollectiveCost(op, "none", sympy.Integer(0), 0, "0 (a group of one)")]
    if op == "send_recv":
        return [CollectiveCost(op, "direct", alpha + v / bw, 1, "α + V/B")]
    if op == "broadcast":
        steps = sympy.ceiling(sympy.log(n, 2))
        out.append(CollectiveCost(op, "tree", steps * (alpha + v / bw), 1, "⌈log2 N⌉·(α + V/B)"))
        out.append(CollectiveCost(op, "ring", (n - 1) * alpha + v / bw, 1, "(N−1)·α + V/B (pipelined)"))
        return out
    k = _phases(op)
    # ring: N−1 steps per phase over one link
    out.append(CollectiveCost(op, "ring", k * ((n - 1) * alpha + frac * v / bw), 1,
                              f"{k}·((N−1)·α + (N−1)/N·V/B)" if k > 1 else "(N−1)·α + (N−1)/N·V/B"))
    if links > 1 and op != "all_to_all":
        hops = tier.diameter
        out.append(CollectiveCost(op, "multiport", k * (hops * alpha + frac * v / (links * bw)), links,
                                  (f"{k}·(D·α + (N−1)/N·V/(L·B))" if k > 1 else "D·α + (N−1)/N·V/(L·B)")))
    if op == "all_to_all" and tier.kind in ("switch", "full_mesh"):
        per_link = frac * v / (bw * (n - 1 if tier.kind == "full_mesh" else 1))
        out.append(CollectiveCost(op, "direct", alpha + per_link, links,
                                  "α + (N−1)/N·V/(B·(N−1))" if tier.kind == "full_mesh" else "α + (N−1)/N·V/B"))
    return out


def cost(op: str, message_bytes, tier: Tier, group_size: int | None = None,
         algorithm: str | None = None) -> CollectiveCost:
    """The cheapest algorithm (at a numeric size), or the one forced."""
    options = costs(op, message_bytes, tier, group_size)
    if algorithm is not None:
        chosen = [c for c in options if c.algorithm == algorithm]
        if not chosen:
            raise UserError(f"--algorithm {algorithm!r} does not apply to {op} on {tier.name}; "
                            f"available: {', '.join(c.algorithm for c in options)}")
        return chosen[0]
    if all(c.time_s.is_number for c in options):
        return min(options, key=lambda c: float(c.time_s))
    return options[0]
