"""``perfcast schema``: the JSON Schema of each document perfcast prints or writes (shipped with
the package; see docs/design/output.md)."""

from __future__ import annotations

import json
import sys

from perfcast.ir import UserError
from perfcast.report.document import SCHEMA_VERSION, schema_names, schema_text


def add_parser(sub) -> None:
    p = sub.add_parser("schema", help="print the JSON Schema of a command's --json output",
                       description="Print the JSON Schema (draft 2020-12) of a document perfcast prints or "
                                   "writes; without a name, list the documents and what writes each.")
    p.add_argument("name", nargs="?", help="a document: text-generate, kernel, devices, … (see `perfcast schema`)")
    p.set_defaults(run=run)


def run(args) -> int:
    names = schema_names()
    if args.name is None:
        sys.stdout.write(f"schema_version {SCHEMA_VERSION}\n")
        for n in names:
            sys.stdout.write(f"{n:<18} {json.loads(schema_text(n))['title']}\n")
        return 0
    if args.name not in names:
        raise UserError(f"unknown document {args.name!r}; known: {', '.join(names)}")
    sys.stdout.write(schema_text(args.name))
    return 0
