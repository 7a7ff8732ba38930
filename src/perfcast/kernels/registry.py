"""The kernel catalog: named DSL kernels with embedded default design points."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property

from perfcast.dsl import Builder, trace
from perfcast.ir import Graph
from perfcast.ir.errors import UserError


@dataclass(frozen=True)
class KernelSpec:
    name: str
    fn: Callable[[Builder], object] = field(compare=False)
    description: str
    defaults: dict[str, int] = field(compare=False)
    padded: bool = False

    @cached_property
    def graph(self) -> Graph:
        return trace(self.fn, self.name, padded=self.padded)

    @cached_property
    def mesh_axes(self) -> tuple[tuple[str, object], ...]:
        """The device mesh the kernel declares — (axis, size) in declaration order, the first
        laid innermost on a topology — or () for a single-device kernel."""
        b = Builder(self.name)
        self.fn(b)
        return b.declared_mesh.axes if b.declared_mesh is not None else ()

    @cached_property
    def padded_graph(self) -> Graph:
        """The same kernel traced with padded (ceil) tiling."""
        return trace(self.fn, self.name, padded=True)


_CATALOG: dict[str, KernelSpec] = {}


def kernel(name: str, *, description: str, defaults: dict[str, int], padded: bool = False):
    """Register a kernel under ``name``; a name registered twice raises."""

    def deco(fn):
        if name in _CATALOG:
            raise ValueError(f"kernel {name!r} is already registered")
        _CATALOG[name] = KernelSpec(name, fn, description, dict(defaults), padded)
        return fn

    return deco


def catalog() -> dict[str, KernelSpec]:
    return dict(_CATALOG)


def get_kernel(name: str) -> KernelSpec:
    try:
        return _CATALOG[name]
    except KeyError:
        raise UserError(f"unknown kernel {name!r}; known: {', '.join(sorted(_CATALOG))}") from None
