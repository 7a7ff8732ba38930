"""``perfcast op``: price single ops (or a CSV of them) through the text-generate path."""

from __future__ import annotations

import csv

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from perfcast.cli.args import number
from perfcast.cli.devices import resolve_device
from perfcast.ir import UserError
from perfcast.report.document import check, emit_lines
from perfcast.report.format import seconds


def add_parser(sub) -> None:
    p = sub.add_parser("op", help="price one op (or a CSV of ops) on a device",
                       description="Price single ops exactly as text-generate prices captured ones.")
    p.add_argument("op", nargs="?", help="op name, e.g. mm, aten.mul.Tensor, perfcast.attention")
    p.add_argument("--shape", action="append", default=[], metavar="DxD…",
                   help="an input tensor's shape, e.g. 4096x4096; repeat per input")
    p.add_argument("--arg", action="append", default=[], metavar="VALUE",
                   help="a non-tensor argument after the tensors (int, float, true/false)")
    p.add_argument("--dtype", default="bf16", help="input dtype (default bf16)")
    p.add_argument("--batch", metavar="FILE.csv",
                   help="price many ops: columns op,shapes,dtype (and optionally args, ';'-separated)")
    p.add_argument("--device", default="h100-sxm")
    p.add_argument("--device-file", metavar="PATH")
    p.add_argument("--performance-model", action="append", metavar="NAME",
                   help="analytic (default) or profiling; repeatable")
    p.add_argument("--profiling-database", metavar="DIR")
    p.add_argument("--engine", metavar="NAME",
                   help="serving engine whose kernels price the op (its calibrated fits and measured tables; "
                        "default: the device's, see `perfcast engines`)")
    p.add_argument("--json", action="store_true", help="one JSON object per op, in order")
    p.set_defaults(run=run)


def _arg(text: str):
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    return number(text, "--arg", "VALUE")


def _requests(args):
    from perfcast.inference.single_op import OpRequest, parse_shapes

    if args.batch:
        try:
            with open(args.batch, newline="") as f:
                rows = list(csv.DictReader(f))
        except OSError as e:
            raise UserError(f"--batch {args.batch}: cannot read ({e.strerror})") from None
        for i, row in enumerate(rows, start=2):
            missing = [c for c in ("op", "shapes", "dtype") if not row.get(c)]
            if missing:
                raise UserError(f"{args.batch}: line {i}: missing column {missing[0]!r} (expected op,shapes,dtype)")
            extra = tuple(_arg(a) for a in (row.get("args") or "").split(";") if a.strip())
            yield OpRequest(row["op"], parse_shapes(row["shapes"], f"{args.batch}: line {i}"), row["dtype"], extra)
        return
    if not args.op or not args.shape:
        raise UserError("give an op and its --shape(s), or --batch FILE.csv")
    shapes = tuple(s for text in args.shape for s in parse_shapes(text, "--shape"))
    yield OpRequest(args.op, shapes, args.dtype, tuple(_arg(a) for a in args.arg))


def run(args) -> int:
    from perfcast.inference.single_op import price

    device = resolve_device(args.device, args.device_file)
    models = tuple(dict.fromkeys(args.performance_model or ("analytic",)))
    results = [price(r, device, models, args.profiling_database, args.engine) for r in _requests(args)]
    if args.json:
        return emit_lines(results)
    check(results)
    engine = results[0]["engine"] if results else None
    t = Table(title=f"Ops on {device.name}" + (f" (engine {engine})" if engine else ""))
    for col in ("op", "shapes", "dtype", *(f"time ({m})" for m in models), "source", "bound"):
        t.add_column(col)
    for r in results:
        first = r["performance_models"][models[0]]
        t.add_row(escape(r["op"]), ";".join("x".join(map(str, s)) for s in r["shapes"]), r["dtype"],
                  *(seconds(r["performance_models"][m]["time_s"]) for m in models),
                  ", ".join(r["performance_models"][m]["source"] for m in models), first["bound"])
    Console(width=max(120, Console().width)).print(t)
    return 0
