"""``perfcast kernels``: the DSL kernel catalog."""

from __future__ import annotations

import json
import sys

from rich.console import Console
from rich.table import Table

from perfcast.kernels import catalog


def add_parser(sub) -> None:
    p = sub.add_parser("kernels", help="list the DSL kernel catalog")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(run=run)


def run(args) -> int:
    specs = sorted(catalog().values(), key=lambda s: s.name)
    if args.json:
        json.dump([{"name": s.name, "description": s.description, "defaults": s.defaults,
                    "padded": s.padded} for s in specs], sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    t = Table(title="Kernels")
    for col in ("name", "description", "default point"):
        t.add_column(col)
    for s in specs:
        t.add_row(s.name, s.description, " ".join(f"{k}={v}" for k, v in s.defaults.items()))
    Console(width=max(120, Console().width)).print(t)
    return 0
