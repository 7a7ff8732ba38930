"""``perfcast serve``: TTFT, TPOT, ITL and throughput of a deployment under load (flags only;
the application is :func:`perfcast.serving.serve.serve`, the report :mod:`perfcast.report.serving`)."""

from __future__ import annotations

from rich.console import Console

from perfcast.cli.args import (Number, add_moe_routing, add_report_arguments, count, devices, engine_options, given,
                               refuse, report_files, report_paths, sequences, written)
from perfcast.ir import UserError

ENGINES = ("trtllm", "vllm", "sglang")
SPECULATIVE = ("mtp", "eagle", "draft")


def add_parser(sub) -> None:
    p = sub.add_parser("serve", help="TTFT, TPOT, ITL and throughput of a deployment under load",
                       description="Serve a workload on a deployment — the engine's scheduler, its KV cache sized "
                                   "from the memory model, every step priced by the step model — by a "
                                   "discrete-event simulation and a closed form (docs/design/serving.md).")
    p.add_argument("model", nargs="?",
                   help="catalog name (see `perfcast models`) or a path to a config.json (or give --deployment)")
    p.add_argument("--deployment", metavar="FILE",
                   help="a deployment YAML (what `perfcast optimize --save-dir` writes): the model, device, engine, "
                        "layout and limits, and the load it was chosen for as the default load")
    p.add_argument("--device", default="h100-sxm", help="device name (default h100-sxm; see `perfcast devices`)")
    p.add_argument("--engine", choices=ENGINES, help="serving engine (default: the device's, e.g. trtllm on NVIDIA)")
    p.add_argument("--engine-option", action="append", metavar="NAME=VALUE",
                   help="as text-generate's --engine-option (e.g. moe_backend=TRTLLM for trtllm on Blackwell)")
    p.add_argument("--cuda-graph-max-batch-size", type=count(0), metavar="N",
                   help="as text-generate's: the engine's largest decode CUDA graph (0: none); default: the engine's")
    p.add_argument("--dtype", default="bf16", choices=("bf16", "fp16"), help="model dtype")
    p.add_argument("--quantize", metavar="SCHEME|GROUP=SCHEME,…", help="as text-generate's --quantize")
    p.add_argument("--kv-cache-dtype", choices=("bf16", "fp16", "fp8", "int8"), help="KV cache dtype")
    add_moe_routing(p)
    p.add_argument("--performance-model", default="analytic", choices=("analytic", "roofline"),
                   help="how each step is priced: analytic (calibrated kernels, default) or roofline (datasheet)")
    g = p.add_argument_group("layout of one engine instance (the decode pool's with --disagg)")
    g.add_argument("--tp-size", type=devices(), default=1, help="tensor parallelism")
    g.add_argument("--ep-size", type=devices(), default=1, help="expert parallelism")
    g.add_argument("--dp-size", type=devices(), default=1,
                   help="data-parallel ranks (with --attention-dp: ranks that share the MoE layers), one engine "
                        "instance each, the load split evenly")
    g.add_argument("--pp-size", type=devices(), default=1, help="pipeline stages (not modelled yet: refused above 1)")
    g.add_argument("--attention-dp", action="store_true", help="MoE: dp ranks run attention on their own requests")
    g.add_argument("--topology", metavar="NAME|FILE", help="how the devices are wired (default: the device's node)")
    w = p.add_argument_group("workload")
    w.add_argument("--isl", default="1024", metavar="N|DIST",
                   help="input length: N, uniform:LO-HI, normal:MEAN,STD or lognormal:MEAN,SIGMA (default 1024)")
    w.add_argument("--osl", default="256", metavar="N|DIST", help="output length, as --isl (default 256)")
    load = w.add_mutually_exclusive_group()
    load.add_argument("--concurrency", type=sequences(), help="closed loop: C clients, each sending its next "
                                                               "request when its last completes")
    load.add_argument("--request-rate", type=Number(positive=True, maximum=1e9, why="requests per second"),
                      help="open loop: requests per second (Poisson; --cv for gamma)")
    load.add_argument("--max-load", action="store_true",
                      help="every request queued at t = 0: the saturated throughput trtllm-bench and vLLM's "
                           "throughput benchmark measure")
    load.add_argument("--trace", metavar="FILE", help="a trace (CSV or JSONL: arrival_s or timestamp, input_length, "
                                                      "output_length, optional hash_ids)")
    w.add_argument("--cv", type=Number(positive=True, maximum=100), default=1.0,
                   help="open loop: coefficient of variation of the gaps (1: Poisson; gamma otherwise)")
    w.add_argument("--num-requests", type=count(), default=1000, help="requests in the run (default 1000)")
    w.add_argument("--warmup", type=count(0), help="requests excluded from the statistics (default: the first "
                                                   "concurrency in closed loop, 10 %% in open loop)")
    w.add_argument("--prefix-hit-rate", type=Number(minimum=0, maximum=1, why="a share"), default=0.0,
                   help="share of each prompt's full KV blocks already cached (prefix caching)")
    w.add_argument("--seed", type=count(0), default=0, help="seed of the lengths, arrivals and acceptances")
    s = p.add_argument_group("engine limits (default: the engine's own, see `perfcast engines NAME`)")
    s.add_argument("--max-batch-size", type=sequences(), help="most sequences in flight per instance")
    s.add_argument("--max-num-tokens", type=count(), help="token budget of a step")
    s.add_argument("--chunked-prefill", action="store_true", default=None, help="split prompts over steps")
    s.add_argument("--no-chunked-prefill", dest="chunked_prefill", action="store_false", help="whole prompts")
    s.add_argument("--batch-wait-iters", type=count(0), metavar="N",
                   help="TensorRT-LLM batch_wait_timeout_iters: hold prompts out of steps with decodes for up to N "
                        "steps (default 0: off)")
    s.add_argument("--batch-wait-max-tokens-ratio", type=Number(minimum=0, maximum=1, why="a share"), metavar="R",
                   help="TensorRT-LLM batch_wait_max_tokens_ratio: release held prompts once the step's tokens reach "
                        "R × max num tokens (default 0)")
    s.add_argument("--attention-dp-balance", nargs="?", const="10,50", metavar="WAIT,TIMEOUT",
                   help="TensorRT-LLM attention_dp_config enable_balance: hold prompts until every attention-DP rank "
                        "has one (WAIT: batching_wait_iters, TIMEOUT: timeout_iters; default 10,50, the engine's)")
    s.add_argument("--scheduler-recv-interval", type=count(), metavar="N",
                   help="SGLang --scheduler-recv-interval: take in new requests once every N decode steps (and "
                        "after each prefill; default 1: every step)")
    s.add_argument("--max-prefill-tokens", type=count(), metavar="T",
                   help="SGLang --max-prefill-tokens: the most input tokens one prefill batch takes in (default "
                        "16384, the engine's)")
    s.add_argument("--overlap-scheduling", action="store_true", default=None,
                   help="the loop runs a step ahead of the device, a request sent on a step's outputs taken in two "
                        "steps later (default for SGLang, TensorRT-LLM's PyTorch flow and vLLM ≥ 0.14)")
    s.add_argument("--no-overlap-scheduling", dest="overlap_scheduling", action="store_false",
                   help="a synchronous loop: SGLang --disable-overlap-schedule, TensorRT-LLM "
                        "disable_overlap_scheduler, vLLM --no-async-scheduling (vLLM's default before 0.14)")
    s.add_argument("--memory-fraction", type=Number(positive=True, maximum=1, why="a share"), metavar="F",
                   help="the engine's memory share for the KV cache: vLLM --gpu-memory-utilization, SGLang "
                        "--mem-fraction-static, TensorRT-LLM free_gpu_memory_fraction (default: the engine's own)")
    s.add_argument("--kv-capacity", type=count(), metavar="TOKENS",
                   help="KV-cache tokens per instance (default: from the memory model and the engine's memory "
                        "fraction)")
    x = p.add_argument_group("speculative decoding")
    x.add_argument("--speculative", metavar="mtp:K|eagle:K|draft:MODEL:K",
                   help="K draft tokens per step: MTP or EAGLE (one decoder layer per draft token) or a draft model")
    x.add_argument("--acceptance", metavar="A1,A2,…", help="per-position acceptance rates (K of them)")
    d = p.add_argument_group("disaggregated serving")
    d.add_argument("--disagg", metavar="XpYd|auto:N",
                   help="X prefill and Y decode instances (e.g. 1p2d), or auto:N (the best split of N instances "
                        "for --request-rate under the SLOs, by the closed form)")
    d.add_argument("--prefill-tp-size", type=devices(), help="the prefill instances' tp (default --tp-size)")
    d.add_argument("--prefill-ep-size", type=devices(), help="the prefill instances' ep (default --ep-size)")
    d.add_argument("--router", choices=("round_robin", "least_loaded"), default="round_robin",
                   help="how requests are spread over instances (default round_robin)")
    o = p.add_argument_group("output")
    o.add_argument("--tier", choices=("simulation", "closed-form", "both"), default="both",
                   help="the event simulation, the closed form, or both (default)")
    o.add_argument("--ttft-slo", type=Number(positive=True, maximum=1e6), metavar="S", help="goodput: TTFT bound (s)")
    o.add_argument("--tpot-slo", type=Number(positive=True, maximum=1e6), metavar="S", help="goodput: TPOT bound (s)")
    o.add_argument("--json", action="store_true", help="print the serve document as JSON")
    o.add_argument("--chrome-trace", metavar="FILE",
                   help="write the simulation as a Perfetto trace (a track per engine instance, a span per "
                        "request phase, batch and KV counters)")
    add_report_arguments(o)
    p.set_defaults(run=run)


def _number(text: str, flag: str, **limits) -> int | float:
    """A number inside a flag's value (``auto:N``, ``mtp:K``), checked as argparse checks flags."""
    import argparse

    try:
        return Number(**limits)(text)
    except argparse.ArgumentTypeError as e:
        raise UserError(f"{flag}: {e}") from None


def _adp_balance(text: str | None) -> tuple[int, int] | None:
    """``--attention-dp-balance WAIT,TIMEOUT`` as (batching_wait_iters, timeout_iters)."""
    if text is None:
        return None
    parts = text.split(",")
    if len(parts) != 2:
        raise UserError(f"--attention-dp-balance {text!r}: expected WAIT,TIMEOUT (two step counts, e.g. 0,60)")
    wait, timeout = (_number(x.strip(), "--attention-dp-balance", integer=True, minimum=0) for x in parts)
    return int(wait), int(timeout)


def _speculative(args):
    from perfcast.serving.sim import Speculative
    from perfcast.serving.step import Deployment, compile_step

    if not args.speculative:
        return None
    kind, _, rest = args.speculative.partition(":")
    if kind not in SPECULATIVE or not rest:
        raise UserError(f"--speculative {args.speculative!r}: expected mtp:K, eagle:K or draft:MODEL:K")
    model, _, k_text = rest.rpartition(":") if kind == "draft" else ("", "", rest)
    k = _number(k_text, "--speculative", integer=True, positive=True, maximum=16) if k_text.strip().isdigit() else None
    if k is None or (kind == "draft" and not model):
        raise UserError(f"--speculative {args.speculative!r}: expected a draft count K of 1–16"
                        + (" and a model (draft:MODEL:K)" if kind == "draft" else ""))
    if not args.acceptance:
        raise UserError("--speculative needs --acceptance A1,…,AK (the share of drafts accepted at each position)")
    try:
        acc = tuple(float(a) for a in args.acceptance.split(","))
    except ValueError:
        raise UserError(f"--acceptance {args.acceptance!r}: expected comma-separated numbers in 0..1") from None
    if kind == "draft":
        draft = compile_step(Deployment(model, args.device, args.engine, dtype=args.dtype))
        return Speculative(k, acc, draft_step=draft)
    from perfcast.models import load_model_config

    layers = int(load_model_config(args.model).data["num_hidden_layers"])
    # DeepSeek-V3 §2.2 (MTP: one transformer block per depth, sharing the embedding and head);
    # EAGLE (Li et al., ICML 2024, §4): one decoder layer over the target's features
    return Speculative(k, acc, draft_fraction=1.0 / layers)


def _workload(args):
    from perfcast.serving.workload import Workload, parse_lengths, read_trace

    trace = read_trace(args.trace) if args.trace else None
    concurrency = args.num_requests if args.max_load else args.concurrency  # max load: every request at t = 0
    if not (concurrency or args.request_rate or args.max_load or trace):
        raise UserError("give a load: --concurrency C, --request-rate R, --max-load or --trace FILE")
    return Workload(parse_lengths(args.isl, "--isl"), parse_lengths(args.osl, "--osl"),
                    num_requests=args.num_requests if not (trace and not given(args, "--num-requests"))
                    else len(trace.arrival_s),
                    concurrency=concurrency, rate=args.request_rate, cv=args.cv, trace=trace, warmup=args.warmup,
                    seed=args.seed, prefix_hit_rate=args.prefix_hit_rate)


def _disagg(args, layout):
    from dataclasses import replace

    if not args.disagg:
        return None
    text = args.disagg.strip().lower()
    if text.startswith("auto:"):
        n = _number(text[5:], "--disagg auto:N", integer=True, minimum=2, maximum=4096)
        counts = {"auto_instances": n}
    else:
        import re

        m = re.fullmatch(r"(\d+)p(\d+)d", text)
        if not m or min(int(m[1]), int(m[2])) < 1:
            raise UserError(f"--disagg {args.disagg!r}: expected XpYd (e.g. 1p2d) or auto:N")
        counts = {"prefill_instances": int(m[1]), "decode_instances": int(m[2])}
    pre = replace(layout, tp=args.prefill_tp_size or layout.tp, ep=args.prefill_ep_size or layout.ep)
    return pre, counts


#: Flags a deployment file sets (refused beside --deployment).
DEPLOYMENT_FLAGS = ("--device", "--engine", "--engine-option", "--dtype", "--quantize", "--kv-cache-dtype",
                    "--moe-routing", "--tp-size", "--ep-size", "--dp-size", "--pp-size", "--attention-dp",
                    "--max-batch-size", "--max-num-tokens", "--chunked-prefill", "--no-chunked-prefill", "--disagg",
                    "--prefill-tp-size", "--prefill-ep-size")


def _from_deployment(args) -> None:
    """``--deployment FILE``: the file's deployment into ``args``; its workload as the default load."""
    from perfcast.serving.deployment_file import read_deployment

    if args.model is not None:
        raise UserError(f"--deployment {args.deployment} names the model; drop {args.model!r}")
    for flag in DEPLOYMENT_FLAGS:
        if given(args, flag):
            raise UserError(f"{flag}: --deployment {args.deployment} sets it; edit the file instead")
    d = read_deployment(args.deployment)
    lay = d.layout
    if d.mode == "agg" and d.instances > 1 and lay.attention_dp:
        raise UserError(f"--deployment {args.deployment}: {d.instances} instances of an attention-DP layout; serve one "
                        f"(instances: 1, with its share of the load)")
    args.model, args.device, args.engine, args.dtype = d.model, d.device, d.engine, d.dtype
    args.engine_option = [f"{k}={v}" for k, v in sorted((d.engine_options or {}).items())]
    args.what_if = tuple(sorted((d.what_if or {}).items()))
    args.quantize, args.kv_cache_dtype, args.moe_routing = d.quantize, d.kv_cache_dtype, d.moe_routing
    # instances of a layout without attention DP are its data-parallel ranks: one engine each, the load split
    args.tp_size, args.ep_size, args.pp_size, args.attention_dp = lay.tp, lay.ep, lay.pp, lay.attention_dp
    args.dp_size = lay.dp * (d.instances if d.mode == "agg" else 1)
    args.max_batch_size, args.max_num_tokens, args.chunked_prefill = d.max_batch_size, d.max_num_tokens, \
        d.chunked_prefill
    if d.disagg is not None:
        args.disagg = f"{d.disagg.prefill_instances}p{d.disagg.decode_instances}d"
        args.prefill_tp_size, args.prefill_ep_size = d.disagg.prefill_layout.tp, d.disagg.prefill_layout.ep
    w = d.workload
    if w is not None:
        if not given(args, "--isl"):
            args.isl = str(w.isl)
        if not given(args, "--osl"):
            args.osl = str(w.osl)
        if not (args.concurrency or args.request_rate or args.max_load or args.trace):
            args.concurrency, args.request_rate = w.concurrency, w.request_rate


def run(args) -> int:
    from dataclasses import replace

    if args.deployment:
        _from_deployment(args)
    elif args.model is None:
        raise UserError("give a model (a catalog name or a config.json) or --deployment FILE")

    from perfcast.capture.parallel import Layout
    from perfcast.report import serving as report
    from perfcast.report.document import check, emit, write_trace
    from perfcast.serving.serve import Disagg, ServeSpec, serve
    from perfcast.serving.step import Deployment
    from perfcast.serving.types import SLO

    refuse(args,
           ("--acceptance", bool(args.speculative), "applies with --speculative"),
           ("--prefill-tp-size", bool(args.disagg), "sizes the prefill pool of --disagg"),
           ("--prefill-ep-size", bool(args.disagg), "sizes the prefill pool of --disagg"),
           ("--router", bool(args.disagg), "spreads requests over the pools of --disagg"),
           ("--cv", bool(args.request_rate), "shapes the gaps of --request-rate arrivals"),
           ("--chrome-trace", args.tier != "closed-form", "writes the simulation's timeline; --tier closed-form "
                                                          "runs none"),
           ("--attention-dp", args.dp_size > 1, "needs --dp-size above 1"),
           ("--memory-fraction", args.kv_capacity is None, "sizes the KV cache from memory; --kv-capacity gives "
                                                            "its tokens"),
           ("--batch-wait-iters", args.tier != "closed-form", "holds prompts in the simulation; the closed form "
                                                              "does not model batch waiting"),
           ("--batch-wait-max-tokens-ratio", args.tier != "closed-form", "holds prompts in the simulation; the "
                                                                         "closed form does not model batch waiting"))
    report_paths(args)
    layout = Layout(tp=args.tp_size, ep=args.ep_size, dp=args.dp_size, pp=args.pp_size,
                    attention_dp=args.attention_dp)
    dep = Deployment(args.model, args.device, args.engine, layout, args.dtype, args.quantize, args.kv_cache_dtype,
                     args.topology, args.performance_model, what_if=getattr(args, "what_if", ()),
                     engine_options=engine_options(args.engine_option), cuda_graph_max=args.cuda_graph_max_batch_size,
                     moe_routing=args.moe_routing)
    slo = SLO(args.ttft_slo, args.tpot_slo) if args.ttft_slo or args.tpot_slo else None
    dis = _disagg(args, layout)
    from perfcast.engines import check_exchange

    check_exchange(dep.engine_options, layout, *([dis[0]] if dis else []))
    spec = ServeSpec(dep, _workload(args), max_batch_size=args.max_batch_size, max_num_tokens=args.max_num_tokens,
                     chunked_prefill=args.chunked_prefill, kv_capacity_tokens=args.kv_capacity,
                     speculative=_speculative(args), slo=slo, tier=args.tier,
                     trace=bool(args.chrome_trace or args.plot or args.html),
                     max_load=args.max_load,
                     disagg=None if dis is None else Disagg(replace(dep, layout=dis[0]), router=args.router, **dis[1]),
                     batch_wait=None if args.batch_wait_iters is None and args.batch_wait_max_tokens_ratio is None
                     else (args.batch_wait_iters or 0, args.batch_wait_max_tokens_ratio or 0.0),
                     memory_fraction=args.memory_fraction, recv_interval=args.scheduler_recv_interval,
                     overlap=args.overlap_scheduling, adp_balance=_adp_balance(args.attention_dp_balance),
                     max_prefill_tokens=args.max_prefill_tokens)
    from perfcast.cli.progress import progress

    with progress(args, f"serving {args.model}: compiling the step model, simulating"):
        result = serve(spec)
    if args.chrome_trace:
        written("--chrome-trace", args.chrome_trace, write_trace, result.trace.events(), args.chrome_trace, "ms")
    doc = check(report.to_json(result))  # the tables and figures below are drawn from the same figures
    wrote = []
    if args.plot or args.html:
        from perfcast.report import plots_serving

        wrote = report_files(args, doc, plots_serving.serve, result)
    if args.json:
        return emit(doc)
    console = Console(width=max(120, Console().width))
    report.render(console, result, doc)
    for line in wrote:
        console.print(line, highlight=False, markup=False, soft_wrap=True)
    return 0
