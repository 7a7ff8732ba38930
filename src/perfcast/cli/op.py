"""``perfcast op``: price single ops (or a CSV of them) through the text-generate path."""

from __future__ import annotations

import csv

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from perfcast.cli.args import number, refuse
from perfcast.cli.devices import add_device_arguments, resolve_device
from perfcast.inputs import excerpt
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
    add_device_arguments(p)
    p.add_argument("--performance-model", action="append", metavar="NAME",
                   help="analytic (default), profiling or roofline (the naive datasheet roofline, a baseline); repeatable")
    p.add_argument("--profiling-database", metavar="DIR")
    p.add_argument("--engine", metavar="NAME",
                   help="serving engine whose kernels price the op (its calibrated fits and measured tables; "
                        "default: the device's, see `perfcast engines`)")
    p.add_argument("--json", action="store_true", help="one JSON object per op, in order")
    p.set_defaults(run=run)


def _arg(text: str, where: str | None = None):
    """A non-tensor argument: true, false or a finite number; ``where`` names a batch cell."""
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    if where is None:
        return number(text, "--arg", "VALUE")
    try:
        return number(text, "--arg", "VALUE")
    except UserError:
        from perfcast.inputs import excerpt

        raise UserError(f"{where}: {excerpt(text)} is not a finite number, true or false") from None


#: The columns of a --batch CSV; the first three are required.
BATCH_COLUMNS = ("op", "shapes", "dtype", "args")


def _batch(path: str):
    """(line, request) for each row of a ``--batch`` CSV: a header naming the columns
    (:data:`BATCH_COLUMNS`), then one op per line; every problem is one line naming the file,
    the line and the column."""
    import io

    from perfcast.capture.build import TORCH_DTYPES
    from perfcast.inference.single_op import OpRequest, parse_shapes
    from perfcast.inputs import excerpt, read_text

    reader = csv.reader(io.StringIO(read_text(path), newline=""))
    records, last = [], 0
    try:
        for record in reader:
            start, last = last + 1, reader.line_num
            if record:
                records.append((start, record))
    except csv.Error as e:
        raise UserError(f"{path}: line {reader.line_num}: not CSV ({excerpt(str(e), 80)})") from None
    if not records:
        raise UserError(f"{path}: empty; expected a header naming the columns {','.join(BATCH_COLUMNS[:3])} "
                        f"(and optionally args), then one op per line")
    line, header = records[0]
    missing = [c for c in BATCH_COLUMNS[:3] if c not in header]
    if missing:
        raise UserError(f"{path}: line {line}: expected a header naming the columns {','.join(BATCH_COLUMNS[:3])} "
                        f"(and optionally args), got {excerpt(','.join(header), 80)} (no column {missing[0]!r})")
    unknown = [c for c in header if c not in BATCH_COLUMNS or header.count(c) > 1]
    if unknown:
        raise UserError(f"{path}: line {line}: column {excerpt(unknown[0])} is unknown or repeated "
                        f"(expected {', '.join(BATCH_COLUMNS)})")
    if len(records) == 1:
        raise UserError(f"{path}: no ops, only the header (expected one op per line)")
    for line, record in records[1:]:
        if len(record) != len(header):
            raise UserError(f"{path}: line {line}: {len(record)} cells, the header has {len(header)}")
        row = dict(zip(header, record))
        where = f"{path}: line {line}: column"
        for c in BATCH_COLUMNS[:3]:
            if not row[c].strip():
                raise UserError(f"{where} {c!r}: empty")
        if row["dtype"] not in TORCH_DTYPES:
            raise UserError(f"{where} 'dtype': {excerpt(row['dtype'])}: expected one of {', '.join(TORCH_DTYPES)}")
        extra = tuple(_arg(a.strip(), f"{where} 'args'") for a in row.get("args", "").split(";") if a.strip())
        yield line, OpRequest(row["op"].strip(), parse_shapes(row["shapes"], f"{where} 'shapes'"), row["dtype"], extra)


def _requests(args):
    """(line or None, request) for each op to price."""
    from perfcast.inference.single_op import OpRequest, parse_shapes

    if args.batch:
        yield from _batch(args.batch)
        return
    if not args.op or not args.shape:
        raise UserError("give an op and its --shape(s), or --batch FILE.csv")
    shapes = tuple(s for text in args.shape for s in parse_shapes(text, "--shape"))
    yield None, OpRequest(args.op, shapes, args.dtype, tuple(_arg(a) for a in args.arg))


def _priced(args, device, models):
    """Each request priced; a batch row's own mistake (an unknown op, shapes the op refuses)
    names its line."""
    from perfcast.hardware.spec import SpecError
    from perfcast.inference.single_op import price

    for line, r in _requests(args):
        try:
            yield price(r, device, models, args.profiling_database, args.engine)
        except SpecError:
            raise  # a file's problem (the database), not the row's
        except UserError as e:
            if line is None:
                raise
            raise UserError(f"{args.batch}: line {line}: {e}") from None


def run(args) -> int:
    models = tuple(dict.fromkeys(args.performance_model or ("analytic",)))
    refuse(args, ("--profiling-database", "profiling" in models, "is read by --performance-model profiling only"),
           *((flag, not args.batch, "the --batch CSV gives each op's; give one or the other")
             for flag in ("--shape", "--arg", "--dtype")))
    if args.batch and args.op:
        raise UserError(f"op {excerpt(args.op)}: the --batch CSV names the ops; give one or the other")
    device = resolve_device(args)
    results = list(_priced(args, device, models))
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
