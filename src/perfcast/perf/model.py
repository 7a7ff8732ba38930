"""The performance-model interface: ``process_op(leaf) -> Result``.

A result carries a (symbolic) time, its provenance, and a breakdown of the time into named
terms, each labelled with the bound it represents (compute, memory, comm), so a report can say
both how long and why.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum

import sympy

from perfcast.ir import Cost, Leaf


class Provenance(str, Enum):
    MEASURED = "measured"
    INTERPOLATED = "interpolated"
    PARTIAL = "partial"
    ANALYTIC = "analytic"
    # an analytic price made with the kernel fit of another format whose kernel does the same
    # work (a weight-only NVFP4 GEMM with the bf16 GEMM's fit), at the leaf's own bytes and rate
    DERIVED = "derived"
    # no measurement: a profiling database's op mapping prices the op at zero (a view, no kernel)
    # or accepts its miss — counted apart, so that it never inflates the measured share
    MAPPED = "mapped"


BOUNDS = ("compute", "memory", "comm", "latency")


def bound_of(term: str) -> str:
    """``compute.matrix`` → ``compute``; term names start with their bound."""
    head = term.split(".", 1)[0]
    if head not in BOUNDS:
        raise ValueError(f"time term {term!r} does not start with one of {BOUNDS}")
    return head


@dataclass(frozen=True)
class Result:
    """``time_s`` = the leaf's time; ``breakdown`` = term → time of the resources that
    compete for it (the time is their max); ``notes`` = assumptions made on the way."""

    time_s: sympy.Expr
    source: Provenance
    breakdown: Mapping[str, sympy.Expr] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    includes_launch: bool = False  # a measured kernel time already contains its launch cost


class PerformanceModel(ABC):
    name: str
    #: an empirical model prices a miss with its analytic fallback: its analytic figures are
    #: fallbacks, and ``misses`` lists what its data did not answer (leaf, op, reason)
    falls_back: bool = False
    misses: Sequence = ()

    def uncalibrated(self) -> list[str]:
        """Units priced at datasheet peak because the device has no efficiency curve for them
        (none, for a model without efficiency curves)."""
        return []

    @abstractmethod
    def process_op(self, op: Leaf, kernel: Cost | None = None) -> Result:
        """Price one leaf. ``kernel`` is the rolled-up work of the kernel the leaf runs in
        (None when the leaf is a kernel of its own): size-dependent effects such as ramp-up
        and tail belong to the whole kernel, not to each tile inside it."""

    @abstractmethod
    def launch_overhead(self) -> Result:
        """The fixed cost of one kernel launch."""

    def resource_times(self, op: Leaf, kernel: Cost | None = None) -> dict[str, sympy.Expr]:
        """How long the leaf keeps each of the device's resources busy (``matrix``, ``vector``,
        ``hbm``, ``onchip``, ``link:<axis>``): what the slow roll-up schedules. A model without
        resource terms prices the fast roll-up only."""
        raise NotImplementedError(f"performance model {self.name!r} has no resource terms: the slow roll-up "
                                  f"cannot schedule it")

    def realize(self, expr: sympy.Expr) -> sympy.Expr:
        """Replace the model's opaque functions (if any) at numeric arguments by values."""
        return expr

    def numpy_functions(self) -> dict[str, object]:
        """NumPy implementations of the model's opaque functions, for ``lambdify``."""
        return {}
