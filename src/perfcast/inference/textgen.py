"""Text generation, one step: capture the model, lower it, price it, track its memory.

Prefill: ``num_queries`` sequences of ``query_length`` new tokens (after ``context_length``
cached ones, 0 by default); logits for the last position only. Decode: one new token per
sequence with ``context_length`` tokens in the KV cache.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace

from perfcast import engines
from perfcast.capture import Capture, Lowered, cache, heap, lower
from perfcast.capture.quant import summary as quant_summary
from perfcast.capture import parallel as par
from perfcast.engines.launch import Launch, launch_for
from perfcast.hardware import Device
from perfcast.hardware.spec import SpecError
from perfcast.hardware.topology import Mesh, Topology, get_topology, resolve_topology, topology_names
from perfcast.inference import memory, quantization, vision
from perfcast.inference.slow import SlowComparison, schedule
from perfcast.inference.step_notes import engine_notes, parallel_notes, pricing_notes, step_notes
from perfcast.ir import Graph, UserError, dim, routing
from perfcast.models import ModelConfig
from perfcast.perf import AnalyticPerformanceModel, EmpiricalPerformanceModel
from perfcast.rollup import Evaluation, FastRollup, LaunchModel, OverlapEvaluation, OverlapRollup, rollup
from perfcast.rollup.slow import SlowResult

#: roofline: the naive datasheet roofline (:mod:`perfcast.inference.roofline`), the same-run baseline
PERFORMANCE_MODELS = ("analytic", "profiling", "roofline")
ROLLUPS = ("fast", "slow", "both")


@dataclass(frozen=True)
class Request:
    model: ModelConfig
    device: Device
    num_queries: int = 1
    query_length: int = 1024
    context_length: int = 0
    decode: bool = False
    dtype: str = "bf16"
    quantize: str | None = None
    kv_dtype: str | None = None
    performance_models: tuple[str, ...] = ("analytic",)
    profiling_database: str | None = None
    reroll: bool = True
    engine: str | None = None  # an engine profile (perfcast.engines); None: the device's default
    engine_options: tuple[tuple[str, str], ...] = ()  # --engine-option NAME=VALUE (perfcast.engines.with_options)
    cache: bool = True
    memory_utilization: float = 0.9
    layout: par.Layout = par.Layout()
    num_devices: int | None = None
    topology: str | None = None  # name, file or KIND:SHAPE; default: the device's shipped node
    link_scale: float = 1.0  # a what-if: every topology tier's link bandwidth × this (perfcast.search.sensitivity)
    images: object = None  # perfcast.inference.vision.ImageRequest: each sequence's images
    image_tokens: tuple | None = None  # (per sequence, width, DeepStack levels): a VLM's language model
    encoder_tp_mode: str | None = None  # a VLM's encoder: weights | data | replicated (default: the engine's)
    overlap: tuple[str, ...] = ()  # overlap transforms (perfcast.rollup.overlap) rewriting the fast sum
    rollup: str = "fast"  # fast | slow | both: with slow or both, the slow roll-up of the step too
    cuda_graph_max: int | None = None  # decode CUDA graphs up to this many sequences (0: none); None: the engine's
    moe_routing: str = routing.DEFAULT  # how routed tokens spread over the experts (perfcast.ir.routing)

    def validate(self) -> None:
        for flag, v in (("--num-queries", self.num_queries), ("--query-length", self.query_length)):
            if v < 1:
                raise UserError(f"{flag} must be at least 1 (got {v})")
        if self.context_length < 0:
            raise UserError(f"--context-length must be non-negative (got {self.context_length})")
        if self.decode and self.context_length < 1:
            raise UserError("--decode needs --context-length ≥ 1 (the tokens already in the KV cache)")
        if self.cuda_graph_max is not None and self.cuda_graph_max < 0:
            raise UserError(f"--cuda-graph-max-batch-size must be non-negative (got {self.cuda_graph_max})")
        if not 0 < self.memory_utilization <= 1:
            raise UserError(f"--memory-utilization must be in (0, 1] (got {self.memory_utilization})")
        if self.rollup not in ROLLUPS:
            raise UserError(f"--rollup {self.rollup!r}: expected one of {', '.join(ROLLUPS)}")
        for m in self.performance_models:
            if m not in PERFORMANCE_MODELS:
                raise UserError(f"--performance-model {m!r}: expected one of {', '.join(PERFORMANCE_MODELS)}")
        routing.check(self.moe_routing, par.experts_of(self.model.data), self.model.name)
        for dt in filter(None, (self.kv_dtype,)):
            if dt not in ("bf16", "fp16", "fp32", "fp8", "int8"):
                raise UserError(f"--kv-cache-dtype {dt!r}: expected bf16, fp16, fp32, fp8 or int8")
        vision.check(self)
        par.check(self.layout, self.model.data, self.model.name, self.num_devices, self.num_queries)
        profile = self.profile()
        quant = quantization.resolve(self)  # a bad --quantize or quantization_config is one line
        engines.check_options(self.engine_options, self.model, profile, quant.quantization)
        # a quantized linear runs natively or weight-only in the model dtype (capture/quant.py)
        if self.dtype not in (*self.device.spec.datasheet.matrix_flops_per_s, "fp32"):
            raise UserError(f"device {self.device.name} has no {self.dtype} matrix rate "
                            f"(has {', '.join(self.device.spec.datasheet.matrix_flops_per_s)}); choose another --dtype")

    def profile(self) -> engines.EngineProfile:
        """The engine profile the step is priced as (the device's default when none is named), its
        decode graphs as ``--cuda-graph-max-batch-size`` captures them where given."""
        profile = engines.resolve(self.engine, self.device, engines.exchange_options(self.engine_options, self.layout))
        if self.cuda_graph_max is None:
            return profile
        return engines.with_cuda_graphs(profile, self.cuda_graph_max, self.device)

    @property
    def new_tokens(self) -> int:
        return 1 if self.decode else self.query_length

    @property
    def device_tokens(self) -> int:
        """Tokens one device's step processes (one micro-batch of its data-parallel rank)."""
        return self.sequences_per_micro_batch * self.new_tokens

    @property
    def tokens(self) -> int:
        """Tokens produced (decode) or processed (prefill) by the step, all sequences."""
        return self.num_queries * self.new_tokens

    @property
    def devices(self) -> int:
        return self.layout.num_devices

    @property
    def micro_batches(self) -> int:
        """Pipeline micro-batches per data-parallel rank (default: one per stage, at most one
        per sequence)."""
        per_rank = math.ceil(self.num_queries / self.layout.dp)
        return self.layout.micro_batches or min(self.layout.pp, per_rank)

    @property
    def sequences_per_micro_batch(self) -> int:
        return math.ceil(math.ceil(self.num_queries / self.layout.dp) / self.micro_batches)

    def mesh(self) -> Mesh | None:
        """The layout's axes on the topology (None on one device)."""
        if self.layout.trivial:
            return None
        if self.topology is not None:
            if ":" in self.topology and not self.topology.endswith((".yaml", ".yml")):
                raise UserError(f"--topology {self.topology}: text-generate takes a shipped topology (see "
                                f"`perfcast topologies`) or a topology YAML file, which gives the links' bandwidth")
            topo = resolve_topology(self.topology)
            if topo.device is not None and topo.device != self.device.name:
                raise UserError(f"--topology {topo.name} is built from {topo.device} devices, not {self.device.name}")
        else:
            topo = default_topology(self.device.name)
        topo = topo.scaled_links(self.link_scale)
        return Mesh(topo.with_devices(self.devices), tuple(self.layout.mesh_axes(bool(par.experts_of(self.model.data)))))


def default_topology(device: str) -> Topology:
    """The shipped topology built from ``device`` (hgx-h200 for h200-sxm), if exactly one is."""
    matches = [t for t in (get_topology(n) for n in topology_names()) if t.device == device]
    if len(matches) != 1:
        raise UserError(f"several devices on {device} need a topology: pass --topology (a shipped name — "
                        f"see `perfcast topologies` — or a topology YAML file)"
                        if not matches else f"--topology: {device} is in {', '.join(t.name for t in matches)}; "
                        f"choose one")
    return matches[0]


def pipeline_time_s(one_pass_s: float, stage_times_s: list[float] | None, micro_batches: int,
                    encoder_s: float = 0.0) -> float:
    """A step's time: one pass through the priced graph per micro-batch, or with pipeline
    stages their fill and drain — all stages once, then the slowest once per further
    micro-batch (GPipe, Huang et al., NeurIPS 2019, §2.2); a VLM's encoder runs before it."""
    if not stage_times_s:
        return one_pass_s * micro_batches + encoder_s
    return sum(stage_times_s) + (micro_batches - 1) * max(stage_times_s) + encoder_s


@dataclass(frozen=True)
class StepOverlap:
    """One performance model's overlap roll-up of one pass through the priced graph, and with
    pipeline stages each stage's time after overlap (the split into two micro-batches is decided
    per stage)."""

    rollup: OverlapRollup
    evaluation: OverlapEvaluation
    stage_times_s: list[float] | None


@dataclass
class Result:
    request: Request
    lowered: object
    rollups: dict[str, FastRollup]
    evaluations: dict[str, Evaluation]
    memory: memory.MemoryReport
    timings_s: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    capture_source: str = "concrete capture"
    stage_times_s: dict[str, list[float]] = field(default_factory=dict)  # pipeline: per model, per stage
    engine: engines.EngineProfile | None = None
    launch: Launch | None = None
    rules_applied: tuple[int, ...] = ()  # indices of the engine's rules that claimed captured ops
    vision: object = None  # perfcast.inference.vision.VisionPart: a VLM's encoder, run before the prefill
    quantization: dict = field(default_factory=dict)  # what was quantized how, and from where
    overlaps: dict[str, StepOverlap] = field(default_factory=dict)  # per model, with request.overlap
    slow: dict[str, SlowResult] = field(default_factory=dict)  # per model, with request.rollup slow|both

    def step_time_s(self, name: str, overlap: bool = False) -> float:
        """The step's time (:func:`pipeline_time_s`) under performance model ``name``; with
        ``overlap``, from the times after the overlap transforms (when the request has any)."""
        ov = self.overlaps.get(name) if overlap else None
        encoder = self.vision.time_s(name) if self.vision is not None else 0.0
        if ov is not None:
            return pipeline_time_s(ov.evaluation.after_s, ov.stage_times_s, self.request.micro_batches, encoder)
        return pipeline_time_s(self.evaluations[name].time_s, self.stage_times_s.get(name),
                               self.request.micro_batches, encoder)

    def tokens_per_s_per_device(self, name: str, overlap: bool = False) -> float:
        t = self.step_time_s(name, overlap)
        return self.request.tokens / t / self.request.devices if t else float("inf")

    def encoder_share(self, name: str) -> float:
        """A VLM's vision encoder: its share of the step's time (without overlap)."""
        t = self.step_time_s(name)
        return self.vision.time_s(name) / t if t and self.vision is not None else 0.0

    def slow_comparison(self, name: str) -> SlowComparison:
        """The slow roll-up of one pass beside the step's fast time (without overlap)."""
        return SlowComparison(self.slow[name], self.step_time_s(name))


def make_model(name: str, device: Device, database: str | None = None, mesh: Mesh | None = None,
               engine: engines.EngineProfile | None = None):
    """A performance model for steps the engine runs (the device's default engine when None).
    The analytic one prices each kernel class with the fits made from the engine's measured
    kernels (:func:`perfcast.perf.calibrated.kernel_calibration`: the engine version's, else the
    newest of its framework, else a lender device's). The profiling one reads the database of
    the engine's framework and version among the shipped ones (the newest of its framework when
    that version is not shipped for the device); a database the user names is taken as it is.
    Its misses fall back to the calibrated analytic model."""
    from perfcast.perf.calibrated import kernel_calibration

    if engine is None and device.spec.default_engine is not None:
        engine = engines.resolve(None, device)
    ref = (engine.calibration or engine.database) if engine is not None else None
    analytic = AnalyticPerformanceModel(device, mesh=mesh, calibration=kernel_calibration(
        device, ref.framework if ref else None, getattr(ref, "version", None)))
    if name == "analytic":
        return analytic
    if name == "roofline":
        from perfcast.inference.roofline import DatasheetRoofline

        return DatasheetRoofline(device, mesh)
    if name == "profiling":
        from perfcast.perf.profiling import find_database, load_database

        db = engine.database if database is None and engine is not None else None
        try:
            root = find_database(device.name, database, framework=db.framework if db else None,
                                 version=db.version if db else None)
        except SpecError:
            if db is None:
                raise
            root = find_database(device.name, None, framework=db.framework)
        source = load_database(root)
        return EmpiricalPerformanceModel(device, source, fallback=analytic, mesh=mesh,
                                         notes=source.fits(device.name, engine))
    raise UserError(f"--performance-model {name!r}: expected one of {', '.join(PERFORMANCE_MODELS)}")


def point(req: Request) -> dict:
    return {dim("B"): req.num_queries, dim("S"): req.new_tokens, dim("C"): req.context_length}


def step_capture(req: Request) -> tuple[Capture, dict | None, str]:
    """The capture for the request: the cached symbolic capture evaluated at the request's
    point when it is exact there, else a fresh concrete capture. Returns (capture, the point to
    lower it at or None, how it was obtained)."""
    pt = point(req)
    context = req.decode or req.context_length > 0
    symbolic_dims = [dim("B")] + ([] if req.decode else [dim("S")]) + ([dim("C")] if context else [])
    if req.cache and req.image_tokens is None and all(pt[d] >= 2 for d in symbolic_dims):
        sym, hit = cache.symbolic_capture(req.model, dtype=req.dtype, decode=req.decode,
                                          context=context, reroll=req.reroll)
        if cache.valid_at(sym, pt):
            return sym, pt, "symbolic capture (cached)" if hit else "symbolic capture"
    with heap.first_capture():
        from perfcast.capture import capture, hf_config, vision_lm

        cap = capture(hf_config(req.model), dtype=req.dtype, batch=req.num_queries,
                      new_tokens=req.new_tokens, past=req.context_length, decode=req.decode, reroll=req.reroll,
                      images=vision_lm.ImageTokens(*req.image_tokens) if req.image_tokens else None)
    return cap, None, "concrete capture"


def simulate(req: Request) -> Result:
    if vision.is_vision_language(req.model):  # the encoder, then this function on its language model
        return vision.simulate(req, simulate)
    req.validate()
    layout = req.layout
    mesh = req.mesh()
    t0 = time.perf_counter()
    # one device's share: the per-rank model, its data-parallel rank's sequences, one micro-batch
    rank = replace(req, model=replace(req.model, data=par.rank_config(req.model.data, layout))
                   if not layout.trivial else req.model, num_queries=req.sequences_per_micro_batch)
    cap, at, how = step_capture(rank)
    profile = req.profile()
    cap = par.parallelize(cap, layout, req.model.data, profile.exchange(req.device.name))
    applied = engines.apply(profile, cap, decode=req.decode, device=req.device.name,
                            hidden_size=int(req.model.data["hidden_size"]))
    t1 = time.perf_counter()
    layers = int(req.model.data["num_hidden_layers"])
    stages = par.stages(cap, layout.pp, layers)  # memory: the step as captured, whatever the engine
    quant = quantization.resolve(req)
    lowered = [lower(c, quantize=quant.plan, model_dtype=req.dtype, kv_dtype=quant.kv_override, point=at,
                     name=f"{req.model.name}.stage{s}" if layout.pp > 1 else req.model.name,
                     plan=applied.plan, engine=profile.name, moe_routing=req.moe_routing)
               for s, (c, _) in enumerate(par.stages(applied.capture, layout.pp, layers))]
    low = lowered[0] if len(lowered) == 1 else _pipeline(lowered, req.model.name)
    launch = launch_for(profile, decode=req.decode, tokens=req.device_tokens, device=req.device)
    launch_model = LaunchModel(launch.mode, launch.host_interval_s)
    rollups, evals, stage_times = {}, {}, {}
    for name in req.performance_models:
        model = make_model(name, req.device, req.profiling_database, mesh, profile)
        r = rollup(low.graph, model, launch_model)
        rollups[name] = r
        evals[name] = r.evaluate({})
        if layout.pp > 1:
            stage_times[name] = [rollup(lw.graph, model, launch_model).evaluate({}).time_s for lw in lowered]
    t2 = time.perf_counter()
    mem = max((_memory(req, c, lw, rng, s, layout, at, quant.plan) for s, ((c, rng), lw)
               in enumerate(zip(stages, lowered))), key=lambda m: m.used_bytes)
    groups = quant_summary(quant.plan, cap, req.dtype)
    notes = step_notes(req, low) + quantization.notes(quant, cap, groups) \
        + engine_notes(profile, launch, low, applied.rotated) + parallel_notes(req, mesh) + pricing_notes(rollups)
    return Result(req, low, rollups, evals, mem,
                  {"capture_s": t1 - t0, "lower_and_price_s": t2 - t1}, notes, how, stage_times, profile, launch,
                  tuple(sorted(applied.used)), quantization=quant.as_dict(groups),
                  overlaps=overlaps(rollups, stage_times, req.overlap),
                  slow={name: schedule(r.model, req.device, low.graph, {}, evals[name].launch_time_s)
                        for name, r in rollups.items()} if req.rollup != "fast" else {})


def overlaps(rollups: dict[str, FastRollup], stage_times_s: dict[str, list[float]],
             transforms: tuple[str, ...]) -> dict[str, StepOverlap]:
    """Per performance model, the overlap roll-up of one pass (and of each pipeline stage)."""
    out: dict[str, StepOverlap] = {}
    if not transforms:
        return out
    for name, r in rollups.items():
        ov = OverlapRollup(r, transforms)
        stages = ([OverlapRollup(r, transforms, root=st).evaluate({}).after_s for st in r.op.ops]
                  if stage_times_s.get(name) else None)
        out[name] = StepOverlap(ov, ov.evaluate({}), stages)
    return out


def _pipeline(lowered: list[Lowered], name: str) -> Lowered:
    """The stages one after another: one micro-batch's pass through the pipeline."""
    graph = Graph(name, tuple(Graph(f"stage{s}", lw.graph.ops) for s, lw in enumerate(lowered)))
    unknown, free = sum((lw.unknown for lw in lowered), type(lowered[0].unknown)()), \
        sum((lw.free for lw in lowered), type(lowered[0].free)())
    dropped = sum((lw.dropped for lw in lowered), type(lowered[0].dropped)())
    return Lowered(graph, unknown, free, lowered[0].quantize, dropped)


def _memory(req: Request, cap: Capture, low: Lowered, rng: range, stage: int, layout: par.Layout,
            at: dict | None, plan) -> memory.MemoryReport:
    """One device of pipeline stage ``stage``: its weights, the KV cache of its layers for all
    its data-parallel rank's sequences (every micro-batch in flight), its peak activations."""
    last = stage == layout.pp - 1

    def share(name):
        return par.param_share(name, cap, layout, rng, stage == 0, last,
                               bool(req.model.data.get("tie_word_embeddings")))

    params, wbytes = memory.weights(cap, plan, share if not layout.trivial else None)
    kv, kv_per_token = memory.kv_cache(low, {})
    capacity = int(req.device.hbm_capacity_bytes)
    return memory.MemoryReport(
        capacity_bytes=capacity, weights_bytes=wbytes, kv_cache_bytes=kv * req.micro_batches,
        kv_cache_bytes_per_token=kv_per_token, activation_peak_bytes=memory.activation_peak(cap, at),
        reserved_bytes=int(round(capacity * (1 - req.memory_utilization))), parameters=params)
