"""``perfcast kernels``: the DSL kernel catalog."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from perfcast.kernels import catalog
from perfcast.report.document import check, emit


def add_parser(sub) -> None:
    p = sub.add_parser("kernels", help="list the DSL kernel catalog")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(run=run)


def run(args) -> int:
    specs = sorted(catalog().values(), key=lambda s: s.name)
    rows = [{"name": s.name, "description": s.description, "defaults": s.defaults, "padded": s.padded}
            for s in specs]
    if args.json:
        return emit({"kernels": rows})
    check(rows)
    t = Table(title="Kernels")
    for col in ("name", "description", "default point"):
        t.add_column(col)
    for s in specs:
        t.add_row(s.name, s.description, " ".join(f"{k}={v}" for k, v in s.defaults.items()))
    Console(width=max(120, Console().width)).print(t)
    return 0
