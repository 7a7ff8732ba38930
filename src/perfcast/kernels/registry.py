"""The kernel catalog: named DSL kernels with embedded default design points."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cached_property

import sympy

from perfcast.dsl import Builder, trace
from perfcast.ir import Graph
from perfcast.ir.errors import UserError
from perfcast.ir.symbols import result

# A figure's placeholder for the kernel's time: neither a design nor a hardware symbol, it is
# replaced by the roll-up's number before the figure is evaluated (Figure.at).
TIME = result("time_s")


@dataclass(frozen=True)
class Figure:
    """A figure derived from the kernel's time: ``formula`` is an expression in :data:`TIME`
    and the kernel's design symbols (e.g. a control rate ``1/time_s``); ``definition`` says in
    words what it counts."""

    name: str
    unit: str
    formula: sympy.Expr
    definition: str

    def at(self, time_s: float, point: Mapping[str, float]) -> float:
        """The figure at a design point whose time is ``time_s``."""
        values = {TIME: sympy.Float(time_s)}
        values.update({s: sympy.nsimplify(point[s.name]) for s in self.formula.free_symbols
                       if s is not TIME and s.name in point})
        value = self.formula.xreplace(values)
        if not value.is_number:
            raise UserError(f"figure {self.name} = {self.formula} needs a value for "
                            f"{', '.join(sorted(str(x) for x in value.free_symbols))}")
        return float(value)


@dataclass(frozen=True)
class KernelSpec:
    name: str
    fn: Callable[[Builder], object] = field(compare=False)
    description: str
    defaults: dict[str, int] = field(compare=False)
    padded: bool = False
    figures: tuple[Figure, ...] = ()
    notes: tuple[str, ...] = ()  # the assumptions a report of the kernel carries

    def figures_at(self, time_s: float, point: Mapping[str, float]) -> list[dict]:
        """Every figure at a point, as JSON-ready rows."""
        return [{"name": f.name, "value": f.at(time_s, point), "unit": f.unit, "formula": str(f.formula),
                 "definition": f.definition} for f in self.figures]

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


def kernel(name: str, *, description: str, defaults: dict[str, int], padded: bool = False,
           figures: tuple[Figure, ...] = (), notes: tuple[str, ...] = ()):
    """Register a kernel under ``name``; a name registered twice raises."""

    def deco(fn):
        if name in _CATALOG:
            raise ValueError(f"kernel {name!r} is already registered")
        _CATALOG[name] = KernelSpec(name, fn, description, dict(defaults), padded, tuple(figures), tuple(notes))
        return fn

    return deco


def catalog() -> dict[str, KernelSpec]:
    return dict(_CATALOG)


def get_kernel(name: str) -> KernelSpec:
    try:
        return _CATALOG[name]
    except KeyError:
        raise UserError(f"unknown kernel {name!r}; known: {', '.join(sorted(_CATALOG))}") from None
