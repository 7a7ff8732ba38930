"""``perfcast profile``: measure the kernels a model needs on this machine's torch device and
write a profiling database (``--performance-model profiling --profiling-database DIR`` reads it).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from perfcast.cli.args import MAX_BYTES, Number, count, refuse, sequences, tokens
from perfcast.ir import UserError


def add_parser(sub) -> None:
    p = sub.add_parser("profile", help="time a model's kernels on the local torch device and "
                                        "write a profiling database")
    p.add_argument("model", help="catalog name (see `perfcast models`) or a path to a config.json")
    p.add_argument("--device-name", required=True, metavar="NAME",
                   help="device name the database is filed under (e.g. cpu-local)")
    p.add_argument("--out", required=True, metavar="DIR",
                   help="database root; writes DIR/NAME/torch/<torch version>/ (merging)")
    p.add_argument("--num-queries", type=sequences(), default=1, help="sequences in the batch (default 1)")
    p.add_argument("--query-length", type=tokens(), default=128,
                   help="new tokens per sequence in prefill (default 128)")
    p.add_argument("--context-length", type=tokens(0), default=0, help="tokens already in the KV cache")
    p.add_argument("--decode", action="store_true", help="profile one decode step (default: prefill)")
    p.add_argument("--dtype", choices=("bf16", "fp16", "fp32"),
                   help="model dtype (default: bf16 on a CUDA device, fp32 on a CPU — what each runs well)")
    p.add_argument("--engine", default="eager", metavar="NAME",
                   help="profile the kernels this engine profile runs (default eager: one torch kernel per "
                        "captured op, what this collector runs faithfully; see `perfcast engines`)")
    p.add_argument("--no-fusion", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--repeats", type=count(1, 10**6, "a million samples"), default=10,
                   help="timed samples per kernel, at least (default 10)")
    p.add_argument("--torch-device", metavar="DEV", help="torch device (default: cuda if present, else cpu)")
    p.add_argument("--timing", default="events", choices=("events", "graph"),
                   help="CUDA: events = back-to-back calls between CUDA events, host launch gaps included "
                        "(as an eager step runs them; default); graph = replays of a CUDA graph of those "
                        "calls (device time only)")
    p.add_argument("--rotate-bytes", type=Number(integer=True, minimum=0, maximum=MAX_BYTES, why="2**64 bytes"),
                   metavar="BYTES",
                   help="cycle each kernel's weights (GEMM weights, K/V, expert weights) through copies of "
                        "at least this many bytes, so they are read from memory, not cache (default: twice "
                        "the GPU's L2 on CUDA, 0 on a CPU)")
    p.add_argument("--quiet", action="store_true", help="print only the database directory")
    p.set_defaults(run=run)


def run(args) -> int:
    from perfcast.models import load_model_config
    from perfcast.profiler import profile_model

    if args.no_fusion:
        raise UserError("--no-fusion: use --engine eager (one kernel per captured op; the default)")
    refuse(args, ("--query-length", not args.decode, "a decode step runs one new token per sequence; "
                                                     "--context-length sets the tokens already cached"))
    model = load_model_config(args.model)
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out}: exists and is not a directory")
    from perfcast.cli.progress import progress

    with progress(args, f"profiling {model.name}", lines=not args.quiet) as bar:
        root = profile_model(model, out, args.device_name, num_queries=args.num_queries,
                             query_length=args.query_length, context_length=args.context_length,
                             decode=args.decode, dtype=args.dtype, engine=args.engine,
                             repeats=args.repeats, device=args.torch_device, timing=args.timing,
                             rotate_bytes=args.rotate_bytes, progress=bar)
    print(root)
    return 0
