"""``perfcast text-generate`` (one prefill or decode step of a real model) and ``perfcast
explain`` (the same step captured once with symbolic sizes, as closed forms)."""

from __future__ import annotations

import argparse

from rich.console import Console

from perfcast.cli.args import (Number, add_moe_routing, add_report_arguments, count, devices, engine_options, images,
                               pixels, refuse, report_files, report_paths, sequences, tokens, written)
from perfcast.cli.devices import ad_hoc, add_device_arguments, resolve_device
from perfcast.cli.kernel import add_overlap_argument
from perfcast.ir import UserError
from perfcast.report.document import check, emit, write


def _common(p, topology: bool) -> None:
    p.add_argument("model", help="catalog name (see `perfcast models`) or a path to a config.json")
    add_device_arguments(p, topology)
    p.add_argument("--decode", action="store_true", help="price one decode step (default: prefill)")
    p.add_argument("--dtype", default="bf16", choices=("bf16", "fp16", "fp32"), help="model dtype")
    p.add_argument("--quantize", metavar="SCHEME|GROUP=SCHEME,…",
                   help="override the checkpoint's quantization_config: one scheme for every linear but "
                        "routers and lm_head (fp8 (per-tensor, static activation scale), fp8_dynamic, fp8_block, w8a8, w8a16, "
                        "w4a16, fp4 (NVFP4), mxfp4), none "
                        "(the model dtype throughout), or per module group (attention, mlp, experts, lm_head), "
                        "e.g. experts=mxfp4,attention=none (default: as the checkpoint says)")
    p.add_argument("--kv-cache-dtype", choices=("bf16", "fp16", "fp32", "fp8", "int8"),
                   help="KV cache dtype (default: the checkpoint's stated KV-cache quantization, else the model dtype)")
    p.add_argument("--no-cache", action="store_true",
                   help="capture afresh instead of reusing the cached symbolic capture")
    p.add_argument("--engine", metavar="NAME",
                   help="serving engine whose kernels and launches are priced: trtllm, vllm, sglang, "
                        "vllm-ascend, xla, eager (PyTorch as Hugging Face runs it) or a profile YAML file; default: "
                        "the device's (see `perfcast engines`)")
    p.add_argument("--engine-option", action="append", metavar="NAME=VALUE",
                   help="an engine setting that changes its kernels, repeatable: moe_backend=CUTLASS|TRTLLM for "
                        "trtllm (TensorRT-LLM moe_config.backend; TRTLLM on Blackwell); `perfcast engines NAME` "
                        "lists an engine's options")
    p.add_argument("--cuda-graph-max-batch-size", type=count(0), metavar="N",
                   help="the engine's largest decode CUDA graph, in sequences (TensorRT-LLM "
                        "cuda_graph_config.max_batch_size, SGLang --cuda-graph-max-bs, vLLM max_cudagraph_capture_size); "
                        "0: decode runs eagerly; default: the engine's")
    add_moe_routing(p)
    p.add_argument("--no-fusion", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--json", action="store_true", help="print JSON instead of tables")


def add_parser(sub) -> None:
    p = sub.add_parser("text-generate", help="predict one prefill or decode step of a model",
                       description="Capture a Hugging Face causal LM on fake tensors and predict one "
                                   "serving step: time per op and in total, tokens/s per device, "
                                   "memory, bounds.")
    _common(p, topology=True)
    p.add_argument("--num-queries", type=sequences(), default=1, help="sequences in the batch (default 1)")
    p.add_argument("--query-length", type=tokens(), default=1024,
                   help="new tokens per sequence in prefill (default 1024)")
    p.add_argument("--context-length", type=tokens(0), default=0,
                   help="tokens already in each sequence's KV cache (required with --decode)")
    p.add_argument("--performance-model", action="append", metavar="NAME",
                   help="analytic (default), profiling (measured kernel tables) or roofline (the naive "
                        "datasheet roofline, a baseline); repeatable, several print side by side")
    p.add_argument("--profiling-database", metavar="DIR",
                   help="profiling database for --performance-model profiling (default: the one "
                        "shipped for the device)")
    p.add_argument("--export-empirical-metrics", metavar="FILE",
                   help="write the profiling model's hits and misses as JSON")
    p.add_argument("--memory-utilization", type=Number(positive=True, maximum=1, why="a share"), default=0.9,
                   help="share of device memory the engine may use (default 0.9, as vLLM)")
    p.add_argument("--strict-memory", action="store_true",
                   help="fail (exit 2) when the model does not fit instead of reporting it")
    p.add_argument("--no-reroll", action="store_true",
                   help="capture every decoder layer instead of one per distinct structure")
    p.add_argument("--chrome-trace", metavar="FILE",
                   help="write a Perfetto/Chrome trace (the kernels in order; with --rollup slow or "
                        "both, the modulo schedule, one track per resource)")
    p.add_argument("--rollup", choices=("fast", "slow", "both"), default="fast",
                   help="fast: the closed-form sum (default); slow: a resource-aware schedule of the "
                        "step (see docs/design/slow-rollup.md); both: side by side")
    g = p.add_argument_group("parallelism (devices = tp × dp × pp)")
    g.add_argument("--num-devices", type=devices(), help="devices in the deployment (checked against the sizes)")
    g.add_argument("--tp-size", type=devices(), default=1, help="tensor parallelism (heads, MLP, vocabulary split)")
    g.add_argument("--ep-size", type=devices(), default=1,
                   help="expert parallelism: routed experts split over ep devices of the MoE group")
    g.add_argument("--dp-size", type=devices(), default=1,
                   help="data parallelism: replicas, or with --attention-dp ranks that share MoE layers")
    g.add_argument("--pp-size", type=devices(), default=1, help="pipeline stages (contiguous layers)")
    g.add_argument("--attention-dp", action="store_true",
                   help="MoE models: dp ranks run attention on their own sequences and pool their "
                        "tokens in the MoE layers (dispatch/combine all-to-all over ep = tp × dp)")
    g.add_argument("--sequence-parallel", action="store_true",
                   help="reduce-scatter + all-gather around norms instead of all-reduce")
    g.add_argument("--micro-batches", type=sequences(), help="pipeline micro-batches (default: --pp-size)")
    g.add_argument("--topology", metavar="NAME|FILE",
                   help="how the devices are wired (default: the device's shipped node, e.g. hgx-h200)")
    v = p.add_argument_group("images (vision-language models: Qwen2.5-VL, Qwen3-VL)")
    v.add_argument("--image-batch-size", type=images(), metavar="N",
                   help="images per sequence: the vision encoder runs on them and their tokens join the prefill "
                        "(after the --query-length text tokens)")
    v.add_argument("--image-height", type=pixels(), metavar="PX",
                   help="image height in pixels (with --image-batch-size)")
    v.add_argument("--image-width", type=pixels(), metavar="PX", help="image width in pixels (with --image-batch-size)")
    v.add_argument("--encoder-tp-mode", choices=("weights", "data", "replicated"),
                   help="the vision encoder under --tp-size: weights split over the ranks, or images split over "
                        "them with full weights (vLLM --mm-encoder-tp-mode, SGLang --mm-enable-dp-encoder), or "
                        "replicated (TensorRT-LLM); default: the engine's")
    p.add_argument("--top", type=count(), default=15, help="rows of the op table (default 15)")
    add_report_arguments(p)
    add_overlap_argument(p)
    p.set_defaults(run=run)

    e = sub.add_parser("explain", help="closed-form FLOPs, bytes and time of a model step",
                       description="Capture once with symbolic batch B, new tokens S (prefill) and "
                                   "context C, and print closed forms.")
    _common(e, topology=False)
    e.add_argument("--context-length", type=tokens(0), default=0,
                   help="prefill after a cached prefix: make the context C symbolic too")
    e.set_defaults(run=run_explain)


def _request(args, topo=None, **extra):
    from perfcast.inference.textgen import Request
    from perfcast.models import load_model_config

    if args.no_fusion:
        raise UserError("--no-fusion: use --engine eager (one kernel per captured op, each launched from the host)")
    device = resolve_device(args, topo)
    return Request(model=load_model_config(args.model), device=device,
                   decode=args.decode, dtype=args.dtype, quantize=args.quantize,
                   kv_dtype=args.kv_cache_dtype, engine=args.engine,
                   engine_options=engine_options(args.engine_option), cache=not args.no_cache,
                   cuda_graph_max=args.cuda_graph_max_batch_size, moe_routing=args.moe_routing, **extra)


def _images(args):
    from perfcast.inference.vision import ImageRequest

    given = {f: getattr(args, f.removeprefix("--").replace("-", "_"))
             for f in ("--image-batch-size", "--image-height", "--image-width")}
    if all(v is None for v in given.values()):
        return None
    missing = [f for f, v in given.items() if v is None]
    if missing:
        raise UserError(f"{', '.join(missing)}: needed with {', '.join(f for f in given if f not in missing)} "
                        f"(images are --image-batch-size N --image-height H --image-width W)")
    for flag, used in (("--rollup " + args.rollup, args.rollup != "fast"), ("--chrome-trace", args.chrome_trace)):
        if used:
            raise UserError(f"{flag}: schedules and traces the language model's kernels only; with "
                            f"--image-batch-size use the fast roll-up (the report's encoder section has its kernels)")
    return ImageRequest(*given.values())


def _inapplicable(args) -> None:
    """Flags given where they change nothing, and sizes no engine runs, are refused before any
    capture (docs/design/cli.md)."""
    from perfcast.inputs.limits import MAX_TOKENS

    new = 1 if args.decode else args.query_length
    for what, n in (("in one step (--num-queries × new tokens)", args.num_queries * new),
                    ("in one sequence (--context-length + new tokens)", args.context_length + new)):
        if n > MAX_TOKENS:
            raise UserError(f"{n:,} tokens {what}: more than the {MAX_TOKENS:,} attention kernels count in "
                            f"32-bit integers")
    profiling = "profiling" in (args.performance_model or ())
    refuse(args,
           ("--query-length", not args.decode, "a decode step prices one new token per sequence; "
                                               "--context-length sets the tokens already cached"),
           ("--micro-batches", args.pp_size > 1, "pipeline micro-batches need --pp-size > 1"),
           ("--attention-dp", args.dp_size > 1, "needs --dp-size > 1 (the data-parallel ranks that pool "
                                                "their tokens in the MoE layers)"),
           ("--encoder-tp-mode", args.tp_size > 1, "how the vision encoder runs over --tp-size ranks; "
                                                   "with --tp-size 1 every mode is the same"),
           ("--profiling-database", profiling, "is read by --performance-model profiling only"),
           ("--export-empirical-metrics", profiling, "writes the profiling model's hits and misses: add "
                                                     "--performance-model profiling"),
           ("--top", not args.json, "sets the rows of the tables; --json lists every op"))


def _topology(args):
    """The ``--topology`` of a step on several devices (None without one)."""
    from perfcast.hardware.topology import resolve_topology

    if args.topology is None:
        return None
    if ad_hoc(args.topology):
        raise UserError(f"--topology {args.topology}: text-generate takes a shipped topology (see "
                        f"`perfcast topologies`) or a topology YAML file, which gives the links' bandwidth")
    if args.tp_size * args.dp_size * args.pp_size == 1:
        raise UserError(f"--topology {args.topology}: a step on one device uses no links; give --tp-size, "
                        f"--dp-size or --pp-size (or --device alone for one device)")
    return resolve_topology(args.topology)


def run(args) -> int:
    from perfcast.capture.parallel import Layout
    from perfcast.inference.textgen import simulate
    from perfcast.report import textgen as report
    from perfcast.rollup.overlap import parse

    transforms = parse(args.overlap)
    _inapplicable(args)
    report_paths(args)
    req = _request(args, _topology(args), num_queries=args.num_queries, query_length=args.query_length,
                   context_length=args.context_length,
                   performance_models=tuple(dict.fromkeys(args.performance_model or ("analytic",))),
                   profiling_database=args.profiling_database,
                   reroll=not args.no_reroll, memory_utilization=args.memory_utilization,
                   layout=Layout(args.tp_size, args.ep_size, args.dp_size, args.pp_size, args.attention_dp,
                                 args.sequence_parallel, args.micro_batches),
                   num_devices=args.num_devices, topology=args.topology, images=_images(args),
                   encoder_tp_mode=args.encoder_tp_mode, overlap=transforms, rollup=args.rollup)
    from perfcast.cli.progress import progress
    from perfcast.engines import check_exchange

    check_exchange(req.engine_options, req.layout)
    with progress(args, f"capturing and pricing {req.model.name}"):  # a first capture takes seconds
        result = simulate(req)
    if args.strict_memory and not result.memory.fits:
        raise UserError(f"{req.model.name} does not fit on {req.device.name}: needs "
                        f"{result.memory.used_bytes:,} of {result.memory.capacity_bytes:,} bytes "
                        f"(short by {result.memory.shortfall_bytes:,})")
    if args.chrome_trace:
        from perfcast.report.trace import step_trace

        written("--chrome-trace", args.chrome_trace, step_trace, result, args.chrome_trace)
    if args.export_empirical_metrics:
        written("--export-empirical-metrics", args.export_empirical_metrics, write,
                {"performance_models": report.empirical_metrics(result)}, args.export_empirical_metrics)
    doc = check(report.to_json(result))  # the tables and figures below are drawn from the same figures
    wrote = []
    if args.plot or args.html:
        from perfcast.report import plots_step

        wrote = report_files(args, doc, plots_step.text_generate, result)
    if args.json:
        return emit(doc)
    console = Console(width=max(120, Console().width))
    report.render(console, result, top=args.top)
    if result.vision is not None:
        from perfcast.report.vision import render as render_vision

        render_vision(console, result, top=args.top)
    if result.slow:
        from perfcast.report.slow import render as render_slow

        for n in result.slow:
            console.print(f"[bold]slow roll-up ({n})[/]: kernels on one stream keep their order; "
                          f"overlap inside a kernel only")
            render_slow(console, result.slow_comparison(n))
    for line in wrote:
        console.print(line, highlight=False, markup=False, soft_wrap=True)
    return 0


def run_explain(args) -> int:
    from perfcast.inference.explain import explain

    refuse(args, ("--context-length", not args.decode, "a decode step's context C is always symbolic; "
                                                       "--context-length makes it symbolic in a prefill"))
    req = _request(args, context_length=args.context_length or (1 if args.decode else 0))
    doc = explain(req)
    if args.json:
        return emit(doc)
    check(doc)
    console = Console(width=max(120, Console().width))
    eng = doc["engine"]
    console.print(f"[bold]{doc['model']}[/] on [bold]{doc['device']}[/] · {eng['name']} ({eng['framework']} "
                  f"{eng['version']}) · {doc['phase']} · symbols: "
                  + ", ".join(f"{k} = {v}" for k, v in doc["symbols"].items()))
    from rich.panel import Panel

    from perfcast.report.format import si

    mem = doc["memory"]
    if not mem["fits"]:
        console.print(Panel(f"DOES NOT FIT: the weights alone need {si(mem['weights_bytes'], 'B')} of the "
                            f"{si(mem['capacity_bytes'] - mem['reserved_bytes'], 'B')} the engine may use "
                            f"(short by {si(mem['shortfall_bytes'], 'B')}). These closed forms are NOT deployable.",
                            style="bold red"))
    else:
        console.print(f"memory: weights {si(mem['weights_bytes'], 'B')} of {si(mem['capacity_bytes'], 'B')}; "
                      f"{si(mem['free_bytes_before_kv_cache'], 'B')} left for the KV cache and activations")
    for k, v in doc["symbolic"].items():
        console.print(f"[bold]{k}[/] = {v}", overflow="fold", highlight=False)
    for n in doc["notes"]:
        if not n.startswith("DOES NOT FIT"):  # shown above, in red
            console.print(f"[yellow]note:[/] {n}")
    return 0
