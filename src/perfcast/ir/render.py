"""A readable text rendering of an op tree, each node with its rolled-up cost."""

from __future__ import annotations

from collections.abc import Mapping

import sympy

from perfcast.ir.op import Graph, Leaf, Loop, Op, cost


def _fmt(expr: sympy.Expr, values: Mapping | None) -> str:
    if values is None:
        return str(expr)
    num = expr.subs(values)
    return f"{int(num):,}" if num.is_Integer else str(num)


def _label(op: Op) -> str:
    if isinstance(op, Leaf):
        return f"{op.name} [{op.kind}]"
    if isinstance(op, Loop):
        extra = f", gather axis {op.gather_axis}" if op.gather_axis is not None else ""
        return f"{op.name} [{op.kind} × {op.n_iter}{extra}]"
    return f"{op.name}" + (" [kernel]" if op.launch else "")


def render(op: Op, values: Mapping | None = None) -> str:
    """One line per node: ``├─ name [kind × n]  resource=expr …`` with the node's rolled-up
    cost — its own cost times the trip counts of every loop around it, so each line is that
    node's share of the root's total — symbolic, or evaluated at ``values``."""
    lines: list[str] = []

    def visit(node: Op, prefix: str, tail: str, trips=sympy.Integer(1)):
        c = cost(node) * trips
        figures = "  ".join(f"{k}={_fmt(v, values)}" for k, v in c.items())
        lines.append(f"{prefix}{tail}{_label(node)}  {figures}".rstrip())
        children = node.ops if isinstance(node, Graph) else node.body.ops if isinstance(node, Loop) else ()
        inner = trips * node.n_iter if isinstance(node, Loop) else trips
        child_prefix = prefix + ("   " if tail == "└─ " else "│  " if tail else "")
        for i, child in enumerate(children):
            visit(child, child_prefix, "└─ " if i == len(children) - 1 else "├─ ", inner)

    visit(op, "", "")
    return "\n".join(lines)
