"""``perfcast recommend``: the fewest devices (or the lowest cost) serving a target load under TTFT/TPOT
objectives (flags only; the application is :func:`perfcast.search.recommend.recommend`, the report
:mod:`perfcast.report.search`)."""

from __future__ import annotations

from rich.console import Console

from perfcast.cli.args import Number, count, devices, engine_options, sequences
from perfcast.cli.optimize import search_flags
from perfcast.ir import UserError


def add_parser(sub) -> None:
    p = sub.add_parser("recommend", help="the fewest devices (or the lowest cost) serving a load under TTFT/TPOT "
                                         "objectives",
                       description="Size every aggregated layout and batch limit of each device type for a target "
                                   "request rate or concurrency under the TTFT and TPOT objectives (closed form), "
                                   "rank by devices or by cost from a price table, and confirm the best by the event "
                                   "simulation (docs/design/search.md).")
    search_flags(p, "h100-sxm,h200-sxm")
    load = p.add_mutually_exclusive_group(required=True)
    load.add_argument("--request-rate", type=Number(positive=True, maximum=1e9, why="requests per second"),
                      help="target: requests per second (Poisson)")
    load.add_argument("--concurrency", type=sequences(), help="target: clients in closed loop")
    p.add_argument("--objective", choices=("devices", "cost"), default="devices",
                   help="fewest devices (default; ties: cost) or lowest cost per hour")
    p.add_argument("--price-file", metavar="FILE",
                   help="prices per device-hour (YAML: prices: {device: price}); default: the shipped table")
    p.add_argument("--max-devices", type=devices(), default=4096, help="largest deployment to consider")
    p.add_argument("--max-instance-size", type=devices(), default=8,
                   help="most devices in one engine instance (default 8: one node)")
    p.add_argument("--seed", type=count(0), default=0, help="seed of the simulation")
    p.add_argument("--json", action="store_true", help="print the recommend document as JSON")
    p.set_defaults(run=run)


def run(args) -> int:
    from perfcast.cli.optimize import _devices, _ints, quantizations
    from perfcast.report import search as report
    from perfcast.report.document import check, emit
    from perfcast.search.optimize import SearchSpec
    from perfcast.search.recommend import Target, price_table, recommend
    from perfcast.search.space import BATCHES, powers_of_two
    from perfcast.serving.types import SLO

    if args.osl < 2:
        raise UserError(f"--osl {args.osl}: needs at least 2 output tokens (TPOT is the gap between them)")
    largest = powers_of_two(args.max_instance_size)[-1]
    spec = SearchSpec(args.model, _devices(args.devices), largest, args.isl, args.osl,
                      SLO(ttft_s=args.ttft, tpot_s=args.tpot), engine=args.engine, quantize=quantizations(args),
                      engine_options=engine_options(args.engine_option),
                      batches=_ints(args.batch_sizes, "--batch-sizes", sequences()) or BATCHES,
                      sizes=tuple(powers_of_two(largest)), kv_dtype=args.kv_cache_dtype, seed=args.seed,
                      moe_routing=args.moe_routing)
    from perfcast.cli.progress import progress

    with progress(args, "sizing") as bar:
        result = recommend(spec, Target(args.request_rate, args.concurrency), objective=args.objective,
                           prices=price_table(args.price_file), max_devices=args.max_devices, progress=bar)
    doc = report.recommend_json(result)
    if args.json:
        return emit(doc)
    check(doc)
    report.render_recommend(Console(width=max(120, Console().width)), result, doc)
    return 0
