"""``perfcast db``: list, import and check profiling databases.

``perfcast db list`` shows the shipped databases (or those under ``--dir``) with their kernel
types and row counts; ``perfcast db import aiconfigurator`` converts the measured kernel tables
shipped in the ``aiconfigurator-core`` package (Apache-2.0; data only) into perfcast's format;
``perfcast db check DIR`` lists every problem in a database.
"""

from __future__ import annotations

import re
from pathlib import Path

from perfcast.inputs import excerpt
from perfcast.ir import UserError

AIC_PIN = "aiconfigurator-core==0.12.0"


def add_parser(sub) -> None:
    p = sub.add_parser("db", help="list, import and check profiling databases")
    dbsub = p.add_subparsers(dest="db_command", required=True, parser_class=type(p))
    lst = dbsub.add_parser("list", help="the shipped profiling databases (device, framework, version, tables)")
    lst.add_argument("--dir", type=Path, help="list the databases under this root instead of the shipped ones")
    lst.add_argument("--device", help="only this device's databases")
    lst.add_argument("--json", action="store_true", help="print JSON")
    lst.set_defaults(run=run_list)
    imp = dbsub.add_parser("import", help="import measured kernel tables from another tool")
    src = imp.add_subparsers(dest="source", required=True, parser_class=type(p))
    aic = src.add_parser("aiconfigurator", help="from the aiconfigurator-core package's tables")
    aic.add_argument("--system", required=True, help="aiconfigurator system, e.g. h200_sxm")
    aic.add_argument("--backend", required=True, help="framework directory, e.g. trtllm")
    aic.add_argument("--version", help="framework version, e.g. 1.3.0rc20 (default: the newest with GEMM "
                                       "and attention tables)")
    aic.add_argument("--out", required=True, type=Path, help="database root to write under")
    aic.add_argument("--device", help="perfcast device name (default: the system with - for _)")
    aic.add_argument("--aic-root", type=Path,
                     help="the aiconfigurator_core package directory (default: the installed one)")
    aic.add_argument("--nccl-version", help="NCCL table version (default: the newest)")
    aic.add_argument("--dtype", action="append", dest="dtypes", metavar="DTYPE",
                     help="keep only rows in this perfcast dtype (repeatable; default: all known)")
    aic.add_argument("--uncompressed", action="store_true",
                     help="write plain .csv tables (default: gzip-compressed .csv.gz)")
    aic.set_defaults(run=run_import)
    chk = dbsub.add_parser("check", help="list every problem in a profiling database")
    chk.add_argument("dir", type=Path, help="a directory with op_mapping.yaml, or a tree of them")
    chk.set_defaults(run=run_check)


def run_list(args) -> int:
    from perfcast.db.listing import list_databases

    if args.dir is not None and not args.dir.is_dir():
        raise UserError(f"--dir {args.dir}: not a directory")
    # the name is a folder of the database tree: a path or a glob pattern ('*') would list others
    if args.device is not None and not re.fullmatch(r"[a-z0-9][a-z0-9.-]*", args.device):
        raise UserError(f"--device {excerpt(args.device)}: expected a device name (lower-case letters, digits, "
                        f"'.' and '-')")
    rows = list_databases(args.dir, args.device)
    if not rows:
        where = f"under {args.dir}" if args.dir else "shipped"
        raise UserError(f"no profiling databases {where}" + (f" for {args.device}" if args.device else ""))
    from perfcast.report.document import check, emit

    if args.json:
        return emit({"databases": rows})
    check(rows)
    from rich.console import Console
    from rich.table import Table

    t = Table(title="Profiling databases")
    for col in ("device", "framework", "version", "kernel types (rows)", "collectives (rows)", "source"):
        t.add_column(col)
    for r in rows:
        comm = r.get("communication")
        t.add_row(r["device"], r["framework"], r["version"],
                  ", ".join(f"{k} {n:,}" for k, n in r["kernels"].items()),
                  f"{Path(comm['path']).parent.name} {Path(comm['path']).name}: "
                  + ", ".join(f"{k} {n:,}" for k, n in comm["tables"].items()) if comm else "none",
                  r.get("source", "—"))
    Console(width=max(160, Console().width)).print(t)
    return 0


def run_import(args) -> int:
    from perfcast.db.aiconfigurator import default_root, import_aiconfigurator

    root = args.aic_root or default_root()
    if root is None:
        raise UserError(f"aiconfigurator_core is not importable and no --aic-root was given "
                        f"(pip install {AIC_PIN})")
    device = args.device or args.system.replace("_", "-")
    got = import_aiconfigurator(root, args.system, args.backend, args.version, args.out, device,
                                dtypes=args.dtypes, nccl_version=args.nccl_version,
                                compress=not args.uncompressed)
    print(f"wrote {got['root']}")
    for name, rows in got["tables"].items():
        print(f"  {name}: {rows} rows")
    for name, why in got["missing"].items():
        print(f"  missing {name}: {why}")
    if got["communication"] is not None:
        print(f"wrote {got['communication']}")
        for name, rows in got["collectives"].items():
            print(f"  {name}: {rows} rows")
    return 0


#: Problems ``db check`` lists before it counts the rest (one line each: a table's bad rows are one
#: problem, so a long list is many broken files, and the first ones are what to fix first).
MAX_LISTED = 30


def run_check(args) -> int:
    from perfcast.db.check import inspect

    if not args.dir.is_dir():
        raise UserError(f"{args.dir}: not a directory (expected a profiling database, or a tree of them)")
    report = inspect(args.dir)
    if report.problems:
        n, listed = len(report.problems), report.problems[:MAX_LISTED]
        rest = [f"… and {n - len(listed)} more"] if n > len(listed) else []
        raise UserError("\n".join([f"{args.dir}: {n} problem{'s' if n > 1 else ''}", *listed, *rest]))
    print(f"ok: {report.tables} kernel tables, {report.rows} rows")
    return 0
