"""``perfcast sensitivity``: derivatives of a deployment's TTFT, TPOT and throughput with respect to the
hardware and the load, and the inverse questions (flags only; the application is
:func:`perfcast.search.sensitivity.sensitivity`, the report :mod:`perfcast.report.search`)."""

from __future__ import annotations

from rich.console import Console

from perfcast.cli.args import Number, add_moe_routing, count, devices, engine_options, sequences

ENGINES = ("trtllm", "vllm", "sglang")


def add_parser(sub) -> None:
    p = sub.add_parser("sensitivity", help="how TTFT/TPOT/throughput move with HBM and link bandwidth, matrix rate, "
                                           "load and context; the lowest bandwidth or fewest devices for an objective",
                       description="Central differences of the serving closed form over the device's datasheet "
                                   "(HBM bandwidth, matrix rate, link bandwidth), the load and the input length; "
                                   "--solve finds the smallest multiplier (or the fewest devices) meeting --tpot or "
                                   "--ttft on the closed form and checks it by the event simulation "
                                   "(docs/design/search.md).")
    p.add_argument("model", help="catalog name (see `perfcast models`) or a path to a config.json")
    p.add_argument("--device", default="h100-sxm", help="device name (default h100-sxm)")
    p.add_argument("--engine", choices=ENGINES, help="serving engine (default: the device's)")
    p.add_argument("--engine-option", action="append", metavar="NAME=VALUE",
                   help="as text-generate's --engine-option (e.g. moe_backend=TRTLLM for trtllm on Blackwell)")
    p.add_argument("--tp-size", type=devices(), default=1, help="tensor parallelism")
    p.add_argument("--ep-size", type=devices(), default=1, help="expert parallelism")
    p.add_argument("--quantize", metavar="SCHEME", help="as text-generate's --quantize")
    p.add_argument("--kv-cache-dtype", choices=("bf16", "fp16", "fp8", "int8"), help="KV cache dtype")
    add_moe_routing(p)
    p.add_argument("--isl", type=count(), default=1024, help="input tokens per request (default 1024)")
    p.add_argument("--osl", type=count(), default=256, help="output tokens per request (default 256)")
    load = p.add_mutually_exclusive_group(required=True)
    load.add_argument("--concurrency", type=sequences(), help="closed loop: C clients")
    load.add_argument("--request-rate", type=Number(positive=True, maximum=1e9), help="open loop: requests per second")
    p.add_argument("--max-batch-size", type=sequences(), help="the engine's batch limit (default: its own)")
    p.add_argument("--solve", choices=("hbm_bandwidth", "matrix_rate", "link_bandwidth", "devices"),
                   help="the smallest multiplier of this datasheet figure (or the fewest devices) meeting the objective")
    p.add_argument("--tpot", type=Number(positive=True, maximum=1e6), metavar="S", help="objective of --solve: TPOT (s)")
    p.add_argument("--ttft", type=Number(positive=True, maximum=1e6), metavar="S", help="objective of --solve: TTFT (s)")
    p.add_argument("--seed", type=count(0), default=0, help="seed of the simulation")
    p.add_argument("--json", action="store_true", help="print the sensitivity document as JSON")
    p.set_defaults(run=run)


def run(args) -> int:
    from perfcast.capture.parallel import Layout
    from perfcast.cli.args import refuse
    from perfcast.report import search as report
    from perfcast.report.document import check, emit
    from perfcast.search.sensitivity import SensitivitySpec, sensitivity
    from perfcast.serving.step import Deployment

    refuse(args, ("--tpot", bool(args.solve), "is the objective of --solve"),
           ("--ttft", bool(args.solve), "is the objective of --solve"))
    dep = Deployment(args.model, args.device, args.engine, Layout(tp=args.tp_size, ep=args.ep_size),
                     quantize=args.quantize, kv_dtype=args.kv_cache_dtype,
                     engine_options=engine_options(args.engine_option), moe_routing=args.moe_routing)
    from perfcast.engines import check_exchange

    check_exchange(dep.engine_options, dep.layout)
    result = sensitivity(SensitivitySpec(dep, args.isl, args.osl, args.concurrency, args.request_rate,
                                         args.max_batch_size, args.solve, args.ttft, args.tpot, args.seed))
    doc = report.sensitivity_json(result)
    if args.json:
        return emit(doc)
    check(doc)
    report.render_sensitivity(Console(width=max(120, Console().width)), result, doc)
    return 0
