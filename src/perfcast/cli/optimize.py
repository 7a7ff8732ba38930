"""``perfcast optimize``: the best deployment under TTFT/TPOT objectives, the Pareto front and why the
rest were rejected (flags only; the application is :func:`perfcast.search.optimize.optimize`, the
report :mod:`perfcast.report.search`)."""

from __future__ import annotations

from rich.console import Console

from perfcast.cli.args import (Number, add_moe_routing, add_report_arguments, count, devices, engine_options, refuse,
                               report_files, report_paths, sequences, tokens, written)
from perfcast.ir import UserError

ENGINES = ("trtllm", "vllm", "sglang")


def add_parser(sub) -> None:
    p = sub.add_parser("optimize", help="the best deployment under TTFT/TPOT objectives, and the Pareto front",
                       description="Search device types, layouts (TP, EP, attention DP; PP counted, not modelled), "
                                   "batch limits and quantization for the most output tokens/s per device under "
                                   "the TTFT and TPOT objectives: every candidate screened in closed form, the "
                                   "front and the best confirmed by the event simulation (docs/design/search.md).")
    search_flags(p, "h200-sxm")
    p.add_argument("--total-devices", type=devices(), default=8, help="devices of the deployment (default 8)")
    p.add_argument("--serving-mode", choices=("agg", "disagg", "both"), default="agg",
                   help="aggregated (default), disaggregated, or both")
    p.add_argument("--what-if", action="append", metavar="NAME=F1,F2,…",
                   help="hardware what-ifs: also search every device with this datasheet figure × each factor "
                        "(hbm_bandwidth, matrix_rate, link_bandwidth); repeat to combine")
    p.add_argument("--dtype", default="bf16", choices=("bf16", "fp16"), help="model dtype")
    p.add_argument("--instance-sizes", metavar="S1,S2,…",
                   help="devices per engine instance to search (default: every power of two dividing "
                        "--total-devices)")
    p.add_argument("--max-num-tokens", metavar="T1,T2,…",
                   help="token budget of a step (default: the engine's); several, comma-separated, are each "
                        "searched with every layout and batch limit")
    p.add_argument("--performance-model", default="analytic", choices=("analytic", "roofline"),
                   help="how each step is priced (default analytic)")
    p.add_argument("--confirm", type=count(0, 256), default=4,
                   help="best closed-form candidates under the SLOs to confirm by simulation, beside the front "
                        "(default 4)")
    p.add_argument("--simulate-all", action="store_true",
                   help="simulate every priced candidate, not only the front and the best (slower)")
    p.add_argument("--jobs", type=count(1, 1024), help="processes for the simulations (default: the CPUs available)")
    p.add_argument("--executor", choices=("local", "ray"), default="local",
                   help="where the screening runs: this process (default) or a Ray cluster (RAY_ADDRESS, else a "
                        "local one); one task per deployment's sweep, the results identical")
    p.add_argument("--workers", type=count(1, 4096), help="--executor ray without RAY_ADDRESS: the local cluster's "
                                                          "CPUs (default: all)")
    p.add_argument("--seed", type=count(0), default=0, help="seed of the simulations")
    p.add_argument("--json", action="store_true", help="print the optimize document as JSON")
    p.add_argument("--save-dir", metavar="DIR", help="write every candidate and the front as CSV and JSON")
    add_report_arguments(p)
    p.set_defaults(run=run)


def search_flags(p, default_devices: str) -> None:
    """The flags ``optimize`` and ``recommend`` share: the model, the device types, the workload
    and its objectives, the engine, the quantizations, the KV dtype and the batch limits."""
    p.add_argument("model", help="catalog name (see `perfcast models`) or a path to a config.json")
    p.add_argument("--devices", default=default_devices, metavar="D1,D2,…",
                   help=f"device types to search (default {default_devices}; see `perfcast devices`)")
    p.add_argument("--isl", type=count(), default=4000, help="input tokens per request (default 4000)")
    p.add_argument("--osl", type=count(), default=500, help="output tokens per request (default 500)")
    p.add_argument("--ttft", type=Number(positive=True, maximum=1e6), default=2.0, metavar="S",
                   help="TTFT objective in seconds, on the mean (default 2)")
    p.add_argument("--tpot", type=Number(positive=True, maximum=1e6), default=0.03, metavar="S",
                   help="TPOT objective in seconds, on the mean (default 0.03)")
    p.add_argument("--engine", choices=ENGINES, help="serving engine (default: the device's, e.g. trtllm on NVIDIA)")
    p.add_argument("--engine-option", action="append", metavar="NAME=VALUE",
                   help="an engine option for every candidate, as text-generate's (e.g. moe_backend=TRTLLM for trtllm "
                        "on Blackwell); written into the deployment files and launch configs")
    p.add_argument("--quantize", action="append", metavar="SCHEME|none",
                   help="a quantization to search (as text-generate's --quantize; 'none' for the model dtype); "
                        "repeat to search several (default: none)")
    p.add_argument("--kv-cache-dtype", choices=("bf16", "fp16", "fp8", "int8"), help="KV cache dtype")
    add_moe_routing(p)
    p.add_argument("--batch-sizes", metavar="B1,B2,…",
                   help="batch limits per instance rank to search (default 1,2,4,…,512)")


def _budgets(text: str | None) -> dict:
    """``--max-num-tokens``: one budget for every candidate, or several searched."""
    values = _ints(text, "--max-num-tokens", tokens())
    if values is None or len(values) == 1:
        return {"max_num_tokens": values[0] if values else None}
    return {"token_budgets": values}


def quantizations(args) -> tuple[str | None, ...]:
    """``--quantize`` (repeatable; ``none``: the model dtype), each once, in order."""
    return tuple(dict.fromkeys(None if q.strip().lower() == "none" else q.strip() for q in args.quantize or ["none"]))


def _ints(text: str | None, flag: str, kind) -> tuple[int, ...] | None:
    import argparse

    if text is None:
        return None
    try:
        values = tuple(kind(v.strip()) for v in text.split(",") if v.strip())
    except argparse.ArgumentTypeError as e:
        raise UserError(f"{flag}: {e}") from None
    if not values:
        raise UserError(f"{flag} {text!r}: expected comma-separated positive integers")
    return tuple(sorted(set(values)))


def _devices(text: str) -> tuple[str, ...]:
    from perfcast.hardware import get_device

    names = tuple(dict.fromkeys(d.strip() for d in text.split(",") if d.strip()))
    if not names:
        raise UserError(f"--devices {text!r}: expected comma-separated device names (see `perfcast devices`)")
    for n in names:
        get_device(n)  # an unknown name: one line naming it
    return names


def _variants(devices: tuple[str, ...], what_ifs: list[str] | None) -> tuple[str, ...]:
    """The devices and, for ``--what-if NAME=F1,F2`` (repeatable), every device under every
    combination of the factors (the datasheet's own figure included)."""
    import itertools

    from perfcast.hardware.device import WHAT_IF
    from perfcast.search.space import variant

    axes = {}
    for text in what_ifs or []:
        name, _, values = text.partition("=")
        name = name.strip()
        if name not in WHAT_IF or not values:
            raise UserError(f"--what-if {text!r}: expected NAME=F1,F2,… with NAME one of {', '.join(WHAT_IF)}")
        if name in axes:
            raise UserError(f"--what-if {name} given twice; give its factors once, comma-separated")
        factors = _ints_or_floats(values, "--what-if")
        axes[name] = sorted({1.0, *factors})
    names = sorted(axes)
    return tuple(variant(d, {k: f for k, f in zip(names, combo) if f != 1.0})
                 for d in devices for combo in itertools.product(*(axes[n] for n in names)))


def _ints_or_floats(text: str, flag: str) -> list[float]:
    import argparse

    try:
        return [Number(positive=True, maximum=1e3)(v.strip()) for v in text.split(",") if v.strip()]
    except argparse.ArgumentTypeError as e:
        raise UserError(f"{flag}: {e}") from None


def run(args) -> int:
    from perfcast.report import search as report
    from perfcast.report.document import check, emit
    from perfcast.search.optimize import SearchSpec, optimize
    from perfcast.search.space import BATCHES
    from perfcast.serving.types import SLO

    refuse(args, ("--confirm", not args.simulate_all, "picks the candidates to simulate; --simulate-all simulates "
                                                     "every one"),
           ("--workers", args.executor == "ray", "sizes the local Ray cluster of --executor ray"))
    report_paths(args)
    sizes = _ints(args.instance_sizes, "--instance-sizes", devices())
    if sizes and any(args.total_devices % s for s in sizes):
        bad = next(s for s in sizes if args.total_devices % s)
        raise UserError(f"--instance-sizes {bad} does not divide --total-devices {args.total_devices}")
    spec = SearchSpec(args.model, _variants(_devices(args.devices), args.what_if), args.total_devices, args.isl,
                      args.osl,
                      SLO(ttft_s=args.ttft, tpot_s=args.tpot), engine=args.engine,
                      engine_options=engine_options(args.engine_option),
                      modes=("agg", "disagg") if args.serving_mode == "both" else (args.serving_mode,),
                      quantize=quantizations(args),
                      batches=_ints(args.batch_sizes, "--batch-sizes", sequences()) or BATCHES, sizes=sizes,
                      **_budgets(args.max_num_tokens), dtype=args.dtype, kv_dtype=args.kv_cache_dtype,
                      moe_routing=args.moe_routing,
                      performance_model=args.performance_model, confirm=args.confirm, seed=args.seed,
                      simulate_all=args.simulate_all)
    from perfcast.cli.progress import progress
    from perfcast.search.executor import executor

    with progress(args, "screening") as bar:  # starting a Ray cluster, then the screening
        ex = executor(args.executor, args.workers)
        try:
            result = optimize(spec, progress=bar, jobs=args.jobs, executor=ex)
        finally:
            ex.close()
    if args.save_dir:
        written("--save-dir", args.save_dir, report.save, result, args.save_dir)
    doc = check(report.to_json(result))  # the tables and figures below are drawn from the same figures
    wrote = []
    if args.plot or args.html:
        from perfcast.report import plots_serving

        wrote = report_files(args, doc, plots_serving.optimize, result)
    if args.json:
        return emit(doc)
    console = Console(width=max(140, Console().width))
    report.render(console, result, doc)
    for line in wrote:
        console.print(line, highlight=False, markup=False, soft_wrap=True)
    return 0

