"""``perfcast recommend``: the fewest devices (or the lowest cost) serving a target load under TTFT/TPOT
objectives (flags only; the application is :func:`perfcast.search.recommend.recommend`, the report
:mod:`perfcast.report.search`)."""

from __future__ import annotations

from rich.console import Console

from perfcast.cli.args import Number, count, devices, sequences
from perfcast.ir import UserError

ENGINES = ("trtllm", "vllm", "sglang")


def add_parser(sub) -> None:
    p = sub.add_parser("recommend", help="the fewest devices (or the lowest cost) serving a load under TTFT/TPOT "
                                         "objectives",
                       description="Size every aggregated layout and batch limit of each device type for a target "
                                   "request rate or concurrency under the TTFT and TPOT objectives (closed form), "
                                   "rank by devices or by cost from a price table, and confirm the best by the event "
                                   "simulation (docs/design/search.md).")
    p.add_argument("model", help="catalog name (see `perfcast models`) or a path to a config.json")
    p.add_argument("--devices", default="h100-sxm,h200-sxm", metavar="D1,D2,…",
                   help="device types to consider (default h100-sxm,h200-sxm)")
    load = p.add_mutually_exclusive_group(required=True)
    load.add_argument("--request-rate", type=Number(positive=True, maximum=1e9, why="requests per second"),
                      help="target: requests per second (Poisson)")
    load.add_argument("--concurrency", type=sequences(), help="target: clients in closed loop")
    p.add_argument("--isl", type=count(), default=4000, help="input tokens per request (default 4000)")
    p.add_argument("--osl", type=count(), default=500, help="output tokens per request (default 500)")
    p.add_argument("--ttft", type=Number(positive=True, maximum=1e6), default=2.0, metavar="S",
                   help="TTFT objective in seconds, on the mean (default 2)")
    p.add_argument("--tpot", type=Number(positive=True, maximum=1e6), default=0.03, metavar="S",
                   help="TPOT objective in seconds, on the mean (default 0.03)")
    p.add_argument("--objective", choices=("devices", "cost"), default="devices",
                   help="fewest devices (default; ties: cost) or lowest cost per hour")
    p.add_argument("--price-file", metavar="FILE",
                   help="prices per device-hour (YAML: prices: {device: price}); default: the shipped table")
    p.add_argument("--max-devices", type=devices(), default=4096, help="largest deployment to consider")
    p.add_argument("--max-instance-size", type=devices(), default=8,
                   help="most devices in one engine instance (default 8: one node)")
    p.add_argument("--engine", choices=ENGINES, help="serving engine (default: the device's)")
    p.add_argument("--quantize", action="append", metavar="SCHEME|none",
                   help="a quantization to consider (repeatable; default: none)")
    p.add_argument("--kv-cache-dtype", choices=("bf16", "fp16", "fp8", "int8"), help="KV cache dtype")
    p.add_argument("--batch-sizes", metavar="B1,B2,…", help="batch limits to consider (default 1,2,4,…,512)")
    p.add_argument("--seed", type=count(0), default=0, help="seed of the simulation")
    p.add_argument("--json", action="store_true", help="print the recommend document as JSON")
    p.set_defaults(run=run)


def run(args) -> int:
    from perfcast.cli.optimize import _devices, _ints
    from perfcast.report import search as report
    from perfcast.report.document import check, emit
    from perfcast.search.optimize import SearchSpec
    from perfcast.search.recommend import Target, price_table, recommend
    from perfcast.search.space import BATCHES, powers_of_two
    from perfcast.serving.types import SLO

    if args.osl < 2:
        raise UserError(f"--osl {args.osl}: needs at least 2 output tokens (TPOT is the gap between them)")
    largest = powers_of_two(args.max_instance_size)[-1]
    quantize = tuple(dict.fromkeys(None if q.strip().lower() == "none" else q.strip() for q in args.quantize or ["none"]))
    spec = SearchSpec(args.model, _devices(args.devices), largest, args.isl, args.osl,
                      SLO(ttft_s=args.ttft, tpot_s=args.tpot), engine=args.engine, quantize=quantize,
                      batches=_ints(args.batch_sizes, "--batch-sizes", sequences()) or BATCHES,
                      sizes=tuple(powers_of_two(largest)), kv_dtype=args.kv_cache_dtype, seed=args.seed)
    result = recommend(spec, Target(args.request_rate, args.concurrency), objective=args.objective,
                       prices=price_table(args.price_file), max_devices=args.max_devices)
    doc = report.recommend_json(result)
    if args.json:
        return emit(doc)
    check(doc)
    report.render_recommend(Console(width=max(120, Console().width)), result, doc)
    return 0
