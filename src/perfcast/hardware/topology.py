"""Topologies: how devices are wired, tier by tier, and how many links each device drives.

A topology is a list of tiers, innermost first (die → node → pod): tier ``i`` joins ``size``
units of tier ``i−1`` (devices for tier 0). A tier is a torus (any number of dims, with or
without wraparound), a ring, a switch or a full mesh, with a link bandwidth (per link, per
direction) and a per-hop latency. Links per device are counted by *distinct neighbours*: on a
torus dim of size 2 the + and − neighbours are the same device, so that dim contributes one
link, not two (ARCHITECTURE.md §4, WE-2). A switch tier says how many ports each device has
(18 NVLinks into the NVSwitches of an HGX H100 node; one NIC per GPU on a rail-optimised
InfiniBand fabric).

Shipped topologies are YAML files in ``topologies/`` with the same strictness as devices:
every datasheet number has a source; calibration (per-collective bandwidth efficiency, per-step
and per-call latency fitted on measured collectives, optionally per protocol) is kept apart, with
sources of its own.

A :class:`Mesh` lays named parallel axes (``tp``, ``dp``, ``pp`` …) over a topology, innermost
axis first on the innermost tier, and says which tiers each axis's groups span.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Literal

import sympy
from pydantic import Field, model_validator

from perfcast.hardware.device import exact
from perfcast.hardware.spec import (Efficiency, NonNegative, Positive, PositiveInt, Text, _Strict, get_shipped,
                                    parse_spec, read_yaml, shipped_files, source_problems)
from perfcast.inputs.limits import MAX_DEVICES
from perfcast.ir.errors import UserError

KINDS = ("torus", "ring", "switch", "full_mesh")
COLLECTIVES = ("all_gather", "reduce_scatter", "all_reduce", "all_to_all", "broadcast", "send_recv")


@dataclass(frozen=True)
class Calibration:
    """A collective's fitted figures on one tier, for one protocol: achieved / datasheet link
    bandwidth, the per-step latency that replaces the datasheet hop latency (``None``: keep it),
    and a latency paid once per call. NCCL prices a call the same way — a base latency plus a
    hardware latency per step, each per protocol (``src/graph/tuning.cc``: ``baseLat`` and
    ``hwLat``) — and its protocols trade one for the other: LL and LL128 cut latency at a
    fraction of the link bandwidth, Simple runs at full bandwidth after a longer start. A
    collective calibrated with several protocols (``protocol`` names each) is priced under each,
    the cheapest taken per call."""

    bandwidth_efficiency: sympy.Expr = sympy.Integer(1)
    latency_s: sympy.Expr | None = None
    base_latency_s: sympy.Expr = sympy.Integer(0)
    protocol: str | None = None


@dataclass(frozen=True)
class Tier:
    name: str
    kind: str
    dims: tuple[int, ...]  # torus dims; (n,) for the other kinds
    link_bandwidth_bytes_per_s: sympy.Expr
    link_latency_s: sympy.Expr = sympy.Integer(0)
    wraparound: bool = True
    ports: int | None = None  # a switch's ports per device (default 1)
    calibration: tuple[tuple[str, tuple[Calibration, ...]], ...] = ()  # op → one per protocol

    def __post_init__(self):
        if self.kind not in KINDS:
            raise UserError(f"topology tier {self.name}: kind {self.kind!r} is not one of {', '.join(KINDS)}")
        if not self.dims or any(d < 1 for d in self.dims):
            raise UserError(f"topology tier {self.name}: sizes must be positive integers, got {self.dims}")
        if math.prod(self.dims) > MAX_DEVICES:
            raise UserError(f"topology tier {self.name}: {math.prod(self.dims):,} devices; expected at most "
                            f"{MAX_DEVICES:,} (2**20, about a thousand times the largest deployments)")
        if self.kind != "torus" and len(self.dims) != 1:
            raise UserError(f"topology tier {self.name}: a {self.kind} has one size, got {self.dims}")
        if self.ports is not None and self.kind != "switch":
            raise UserError(f"topology tier {self.name}: links_per_device is given only for a switch "
                            f"(a {self.kind} counts its distinct neighbours)")
        for op, options in self.calibration:
            names = [c.protocol for c in options]
            if not options or (len(options) > 1 and None in names) or len(set(names)) != len(names):
                raise UserError(f"topology tier {self.name}: the calibration of {op} needs one entry, "
                                f"or one per distinctly named protocol")

    @property
    def size(self) -> int:
        return math.prod(self.dims)

    @property
    def links_per_device(self) -> int:
        """Distinct neighbours: torus dims of size 1 add none, of size 2 one, larger two (or one
        at the ends without wraparound — interior devices still have two); a ring has two
        (one when it has two devices); a switch has its ports; a full mesh links to all."""
        n = self.size
        if self.kind == "torus":
            return sum(0 if d == 1 else 1 if d == 2 else 2 for d in self.dims)
        if self.kind == "ring":
            return 0 if n == 1 else 1 if n == 2 else 2
        if self.kind == "switch":
            return self.ports or 1
        return n - 1

    @property
    def bottleneck_links(self) -> int:
        """Links of the worst-placed device, which sets the pace of a bandwidth-optimal
        collective: without wraparound a torus's edge devices have one neighbour per dim."""
        if self.kind == "torus" and not self.wraparound:
            return sum(1 for d in self.dims if d > 1)
        return self.links_per_device

    @property
    def diameter(self) -> int:
        """Hops between the farthest two devices."""
        if self.kind == "torus":
            return sum(d // 2 if self.wraparound else d - 1 for d in self.dims)
        if self.kind == "ring":
            return self.size // 2
        return 1 if self.size > 1 else 0

    def calibrated(self, op: str) -> tuple[Calibration, ...]:
        """The calibration of ``op`` on this tier, one per protocol (or the tier's ``default``
        one; without either, the datasheet figures)."""
        table = dict(self.calibration)
        return table.get(op) or table.get("default") or (Calibration(),)

    def resized(self, size: int) -> "Tier":
        if self.kind == "torus" and len(self.dims) > 1:
            raise UserError(f"topology tier {self.name}: a {'x'.join(map(str, self.dims))} torus cannot be "
                            f"resized to {size}; choose a topology of that shape")
        return replace(self, dims=(size,))


@dataclass(frozen=True)
class Topology:
    name: str
    tiers: tuple[Tier, ...]  # innermost first
    description: str = ""
    device: str | None = None  # the accelerator the topology is built from
    path: Path | None = field(default=None, compare=False)

    @property
    def size(self) -> int:
        return math.prod(t.size for t in self.tiers)

    def scaled_links(self, factor: float) -> "Topology":
        """Every tier's link bandwidth × ``factor`` (a hardware what-if)."""
        if factor == 1:
            return self
        return replace(self, tiers=tuple(replace(t, link_bandwidth_bytes_per_s=t.link_bandwidth_bytes_per_s
                                                 * exact(factor)) for t in self.tiers))

    def with_devices(self, n: int) -> "Topology":
        """The topology with room for ``n`` devices: itself when it has enough, else with its
        outermost tier grown (``n`` must then fill whole units of the inner tiers)."""
        if n <= self.size:
            return self
        inner = math.prod(t.size for t in self.tiers[:-1])
        if n % inner:
            raise UserError(f"{n} devices do not fill whole units of {inner} devices "
                            f"({self.tiers[-2].name}) on topology {self.name}")
        return replace(self, tiers=(*self.tiers[:-1], self.tiers[-1].resized(n // inner)))

    def span(self, group_size: int, stride: int = 1) -> list[tuple[Tier, int]]:
        """The tiers a group of ``group_size`` devices ``stride`` apart crosses, with how many
        units of each tier it takes part in (their product is the group size). Groups must line
        up with tier boundaries (a stride and a size that are products of tier sizes, or fit in
        one tier)."""
        if group_size < 1 or group_size * stride > self.size:
            raise UserError(f"a group of {group_size} devices {stride} apart does not fit on topology "
                            f"{self.name} ({self.size} devices)")
        out: list[tuple[Tier, int]] = []
        r, g = stride, group_size
        for tier in self.tiers:
            if g == 1:
                break
            if r >= tier.size:
                if r % tier.size:
                    raise UserError(f"topology {self.name}: a stride of {stride} devices does not line up "
                                    f"with tier {tier.name} of {tier.size}")
                r //= tier.size
                continue
            if tier.kind == "switch" and g * r <= tier.size:
                # Every pair of a switch's devices is one hop apart: a group that fits in one
                # switch (a TP×DP layout of 16-wide groups in a 72-GPU NVLink rack) needs no
                # alignment; its stride only has to keep it inside.
                out.append((tier, g))
                break
            if tier.size % r:
                raise UserError(f"topology {self.name}: a stride of {stride} devices does not line up "
                                f"with tier {tier.name} of {tier.size}")
            take = min(g, tier.size // r)
            if g % take:
                raise UserError(f"topology {self.name}: a group of {group_size} devices does not line up "
                                f"with tier {tier.name} of {tier.size}")
            out.append((tier, take))
            g //= take
            r = 1
        return out


def parse_tier(text: str, link_bandwidth: float, link_latency: float = 0.0) -> Tier:
    """An ad-hoc tier: ``torus:2x2x2``, ``mesh:4x4`` (torus without wraparound), ``ring:8``,
    ``switch:8``, ``full_mesh:8``."""
    kind, sep, shape = text.partition(":")
    try:
        dims = tuple(int(x) for x in shape.split("x"))
    except ValueError:
        dims = ()
    if not sep or not dims:
        raise UserError(f"--topology {text!r}: expected a topology name, a YAML file or KIND:SHAPE "
                        f"such as torus:2x2x2, ring:8, switch:8")
    wrap = kind != "mesh"
    kind = "torus" if kind == "mesh" else kind
    if link_bandwidth <= 0:
        raise UserError(f"--link-bandwidth must be positive (got {link_bandwidth})")
    return Tier(text, kind, dims, exact(link_bandwidth), exact(link_latency), wrap)


# --- YAML schema ---------------------------------------------------------------------------------


Protocol = Annotated[str, Field(strict=True, pattern=r"^[a-z][a-z0-9_]*$")]


class _ProtocolSpec(_Strict):
    bandwidth_efficiency: Efficiency = 1.0
    latency_s: NonNegative | None = None  # per step; absent: the tier's link_latency_s
    base_latency_s: NonNegative = 0.0  # once per call


class _CalibrationSpec(_ProtocolSpec):
    """One collective's calibration: the figures once, or ``protocols`` giving them per protocol."""

    protocols: dict[Protocol, _ProtocolSpec] = Field(default_factory=dict, min_length=1)

    @model_validator(mode="after")
    def _either(self):
        flat = sorted(self.model_fields_set - {"protocols"})
        if self.protocols and flat:
            raise ValueError(f"@{flat[0]}: give the figures once or per protocol (under protocols), "
                             f"not both")
        return self

    def options(self) -> tuple[Calibration, ...]:
        def one(c: _ProtocolSpec, name: str | None) -> Calibration:
            return Calibration(exact(c.bandwidth_efficiency), None if c.latency_s is None else exact(c.latency_s),
                               exact(c.base_latency_s), name)
        if not self.protocols:
            return (one(self, None),)
        return tuple(one(c, name) for name, c in self.protocols.items())


class _TierSpec(_Strict):
    name: Annotated[str, Field(strict=True, pattern=r"^[a-z0-9][a-z0-9_-]*$")]
    kind: Literal[KINDS]  # type: ignore[valid-type]
    shape: list[PositiveInt] = Field(min_length=1)
    wraparound: Annotated[bool, Field(strict=True)] = True
    links_per_device: PositiveInt | None = None
    link_bandwidth_bytes_per_s: Positive
    link_latency_s: Positive
    calibration: dict[Literal[(*COLLECTIVES, "default")], _CalibrationSpec] = Field(default_factory=dict)  # type: ignore[valid-type]

    @model_validator(mode="after")
    def _consistent(self):
        if self.kind != "torus" and len(self.shape) != 1:
            raise ValueError(f"@shape: a {self.kind} has one size, got {self.shape}")
        if self.kind == "switch" and self.links_per_device is None:
            raise ValueError("@links_per_device: a switch tier needs its ports per device")
        if self.kind != "switch" and self.links_per_device is not None:
            raise ValueError(f"@links_per_device: a {self.kind} counts its distinct neighbours; "
                             f"give links_per_device only for a switch")
        return self


class TopologySpec(_Strict):
    name: Annotated[str, Field(strict=True, pattern=r"^[a-z0-9][a-z0-9.-]*$")]
    description: Text
    device: Text
    tiers: list[_TierSpec] = Field(min_length=1)
    sources: dict[str, Text]
    calibration_sources: dict[str, Text] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _sourced(self):
        names = [t.name for t in self.tiers]
        if len(set(names)) != len(names):
            raise ValueError("@tiers: tier names must be distinct")
        values = {}
        cal = {}
        for t in self.tiers:
            d = t.model_dump(exclude={"name", "kind", "wraparound", "calibration", "shape"}, exclude_none=True)
            values.update({f"{t.name}.{k}": v for k, v in d.items()})
            cal.update({f"{t.name}.{op}": v for op, v in t.calibration.items()})
        found = source_problems(set(values), self.sources)
        found += source_problems(set(cal), self.calibration_sources, "calibration_sources")
        if found:
            raise ValueError("\n".join(found))
        return self


def _tier(spec: _TierSpec) -> Tier:
    cal = tuple((op, c.options()) for op, c in spec.calibration.items())
    return Tier(spec.name, spec.kind, tuple(spec.shape), exact(spec.link_bandwidth_bytes_per_s),
                exact(spec.link_latency_s), spec.wraparound, spec.links_per_device, cal)


def topology_names() -> list[str]:
    return sorted(shipped_files("topologies"))


@lru_cache(maxsize=None)
def load_topology_file(path: str | Path) -> Topology:
    path = Path(path)
    spec = parse_spec(TopologySpec, path, read_yaml(path))
    return Topology(spec.name, tuple(_tier(t) for t in spec.tiers), spec.description, spec.device, path)


def get_topology(name: str) -> Topology:
    """A shipped topology by name; an unknown name is an error that suggests the closest."""
    return get_shipped("topology", "topologies", name, load_topology_file)


def resolve_topology(text: str, link_bandwidth: float | None = None, link_latency: float = 0.0) -> Topology:
    """``--topology``: a shipped name, a YAML file, or an ad-hoc ``KIND:SHAPE`` tier (which
    needs ``link_bandwidth``)."""
    if ":" in text and not text.endswith((".yaml", ".yml")):
        if link_bandwidth is None:
            raise UserError(f"--topology {text}: an ad-hoc tier needs --link-bandwidth (B/s per link)")
        tier = parse_tier(text, link_bandwidth, link_latency)
        return Topology(text, (tier,), f"ad-hoc {text}")
    if text.endswith((".yaml", ".yml")) or "/" in text:
        return load_topology_file(text)
    return get_topology(text)


@dataclass(frozen=True)
class Mesh:
    """Named parallel axes laid over a topology: each axis is a group size and the distance
    (in devices) between its consecutive members. :meth:`ordered` lays axes out innermost
    first; several factorisations of the same devices may coexist (``tp`` = ``moe_tp`` × ``ep``)."""

    topology: Topology
    axes: tuple[tuple[str, int, int], ...]  # (name, size, stride)

    @classmethod
    def ordered(cls, topology: Topology, axes) -> "Mesh":
        """Axes ``[(name, size), …]``, the first innermost (its devices adjacent), each later one
        strided by the product of the sizes before it."""
        out, stride = [], 1
        for name, size in axes:
            out.append((name, size, stride))
            stride *= size
        return cls(topology, tuple(out))

    def __post_init__(self):
        for name, size, stride in self.axes:
            if size * stride > self.topology.size:
                raise UserError(f"mesh {self.describe()} needs {size * stride} devices; topology "
                                f"{self.topology.name} has {self.topology.size}")

    def describe(self) -> str:
        return "×".join(f"{a}{s}" for a, s, _ in self.axes) or "1"

    def _axis(self, axis: str) -> tuple[int, int]:
        for a, size, stride in self.axes:
            if a == axis:
                return size, stride
        raise UserError(f"mesh axis {axis!r} is not one of {', '.join(a for a, _, _ in self.axes) or 'none'}")

    def size(self, axis: str) -> int:
        return self._axis(axis)[0]

    def stride(self, axis: str) -> int:
        return self._axis(axis)[1]

    def span(self, axis: str, group_size: int | None = None) -> list[tuple[Tier, int]]:
        size, stride = self._axis(axis)
        return self.topology.span(group_size or size, stride)
