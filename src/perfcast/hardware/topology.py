"""Topologies: how devices are wired, tier by tier, and how many links each device drives.

A tier is a torus (any number of dims, with or without wraparound), a ring, a switch or a full
mesh, with a link bandwidth (per link, per direction) and a per-hop latency. Links per device
are counted by *distinct neighbours*: on a torus dim of size 2 the + and − neighbours are the
same device, so that dim contributes one link, not two (ARCHITECTURE.md §4, WE-2).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import sympy

from perfcast.hardware.device import exact
from perfcast.ir.errors import UserError

KINDS = ("torus", "ring", "switch", "full_mesh")


@dataclass(frozen=True)
class Tier:
    name: str
    kind: str
    dims: tuple[int, ...]  # torus dims; (n,) for the other kinds
    link_bandwidth_bytes_per_s: sympy.Expr
    link_latency_s: sympy.Expr = sympy.Integer(0)
    wraparound: bool = True

    def __post_init__(self):
        if self.kind not in KINDS:
            raise UserError(f"topology tier {self.name}: kind {self.kind!r} is not one of {', '.join(KINDS)}")
        if not self.dims or any(d < 1 for d in self.dims):
            raise UserError(f"topology tier {self.name}: sizes must be positive integers, got {self.dims}")
        if self.kind != "torus" and len(self.dims) != 1:
            raise UserError(f"topology tier {self.name}: a {self.kind} has one size, got {self.dims}")

    @property
    def size(self) -> int:
        return math.prod(self.dims)

    @property
    def links_per_device(self) -> int:
        """Distinct neighbours: torus dims of size 1 add none, of size 2 one, larger two (or one
        at the ends without wraparound — interior devices still have two); a ring has two
        (one when it has two devices); a switch port is one link; a full mesh links to all."""
        n = self.size
        if self.kind == "torus":
            return sum(0 if d == 1 else 1 if d == 2 else 2 for d in self.dims)
        if self.kind == "ring":
            return 0 if n == 1 else 1 if n == 2 else 2
        if self.kind == "switch":
            return 1
        return n - 1

    @property
    def diameter(self) -> int:
        """Hops between the farthest two devices."""
        if self.kind == "torus":
            return sum(d // 2 if self.wraparound else d - 1 for d in self.dims)
        if self.kind == "ring":
            return self.size // 2
        return 1 if self.size > 1 else 0


def parse_tier(text: str, link_bandwidth: float, link_latency: float = 0.0) -> Tier:
    """An ad-hoc tier: ``torus:2x2x2``, ``mesh:4x4`` (torus without wraparound), ``ring:8``,
    ``switch:8``, ``full_mesh:8``."""
    kind, sep, shape = text.partition(":")
    try:
        dims = tuple(int(x) for x in shape.split("x"))
    except ValueError:
        dims = ()
    if not sep or not dims:
        raise UserError(f"--topology {text!r}: expected KIND:SHAPE such as torus:2x2x2, ring:8, switch:8")
    wrap = kind != "mesh"
    kind = "torus" if kind == "mesh" else kind
    if link_bandwidth <= 0:
        raise UserError(f"--link-bandwidth must be positive (got {link_bandwidth})")
    return Tier(text, kind, dims, exact(link_bandwidth), exact(link_latency), wrap)
