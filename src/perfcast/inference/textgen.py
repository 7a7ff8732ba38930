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
from perfcast.ir import Graph, UserError, dim
from perfcast.models import ModelConfig
from perfcast.perf import AnalyticPerformanceModel, EmpiricalPerformanceModel
from perfcast.rollup import Evaluation, FastRollup, LaunchModel, rollup

PERFORMANCE_MODELS = ("analytic", "profiling")


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
    cache: bool = True
    memory_utilization: float = 0.9
    layout: par.Layout = par.Layout()
    num_devices: int | None = None
    topology: str | None = None  # name, file or KIND:SHAPE; default: the device's shipped node
    images: object = None  # perfcast.inference.vision.ImageRequest: each sequence's images
    image_tokens: tuple | None = None  # (per sequence, width, DeepStack levels): a VLM's language model
    encoder_tp_mode: str | None = None  # a VLM's encoder: weights | data | replicated (default: the engine's)

    def validate(self) -> None:
        for flag, v in (("--num-queries", self.num_queries), ("--query-length", self.query_length)):
            if v < 1:
                raise UserError(f"{flag} must be at least 1 (got {v})")
        if self.context_length < 0:
            raise UserError(f"--context-length must be non-negative (got {self.context_length})")
        if self.decode and self.context_length < 1:
            raise UserError("--decode needs --context-length ≥ 1 (the tokens already in the KV cache)")
        if not 0 < self.memory_utilization <= 1:
            raise UserError(f"--memory-utilization must be in (0, 1] (got {self.memory_utilization})")
        for m in self.performance_models:
            if m not in PERFORMANCE_MODELS:
                raise UserError(f"--performance-model {m!r}: expected one of {', '.join(PERFORMANCE_MODELS)}")
        for dt in filter(None, (self.kv_dtype,)):
            if dt not in ("bf16", "fp16", "fp32", "fp8", "int8"):
                raise UserError(f"--kv-cache-dtype {dt!r}: expected bf16, fp16, fp32, fp8 or int8")
        vision.check(self)
        par.check(self.layout, self.model.data, self.model.name, self.num_devices, self.num_queries)
        self.profile()
        quantization.resolve(self)  # a bad --quantize or quantization_config is one line
        # a quantized linear runs natively or weight-only in the model dtype (capture/quant.py)
        if self.dtype not in (*self.device.spec.datasheet.matrix_flops_per_s, "fp32"):
            raise UserError(f"device {self.device.name} has no {self.dtype} matrix rate "
                            f"(has {', '.join(self.device.spec.datasheet.matrix_flops_per_s)}); choose another --dtype")

    def profile(self) -> engines.EngineProfile:
        """The engine profile the step is priced as (the device's default when none is named)."""
        return engines.resolve(self.engine, self.device)

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

    def step_time_s(self, name: str) -> float:
        """The step's time: one pass of the priced graph, or with pipeline micro-batches the
        fill and drain of the pipeline — all stages once, then the slowest once per further
        micro-batch (GPipe, Huang et al., NeurIPS 2019, §2.2)."""
        stages = self.stage_times_s.get(name)
        encoder = self.vision.time_s(name) if self.vision is not None else 0.0
        if not stages:
            return self.evaluations[name].time_s * self.request.micro_batches + encoder
        return sum(stages) + (self.request.micro_batches - 1) * max(stages) + encoder

    def tokens_per_s_per_device(self, name: str) -> float:
        t = self.step_time_s(name)
        return self.request.tokens / t / self.request.devices if t else float("inf")


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
    cap = par.parallelize(cap, layout, req.model.data)
    profile = req.profile()
    applied = engines.apply(profile, cap, decode=req.decode, device=req.device.name,
                            hidden_size=int(req.model.data["hidden_size"]))
    t1 = time.perf_counter()
    layers = int(req.model.data["num_hidden_layers"])
    stages = par.stages(cap, layout.pp, layers)  # memory: the step as captured, whatever the engine
    quant = quantization.resolve(req)
    lowered = [lower(c, quantize=quant.plan, model_dtype=req.dtype, kv_dtype=quant.kv_override, point=at,
                     name=f"{req.model.name}.stage{s}" if layout.pp > 1 else req.model.name,
                     plan=applied.plan, engine=profile.name)
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
    notes = _notes(req, low) + quantization.notes(quant, cap, groups) \
        + _engine_notes(profile, launch, low, applied.rotated) + _parallel_notes(req, mesh) + _pricing_notes(rollups)
    return Result(req, low, rollups, evals, mem,
                  {"capture_s": t1 - t0, "lower_and_price_s": t2 - t1}, notes, how, stage_times, profile, launch,
                  tuple(sorted(applied.used)), quantization=quant.as_dict(groups))


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


def _parallel_notes(req: Request, mesh: Mesh | None) -> list[str]:
    layout = req.layout
    if mesh is None:
        return []
    cfg = req.model.data
    kv = int(cfg.get("num_key_value_heads") or cfg["num_attention_heads"])
    spans = {a: " × ".join(f"{k} on {t.name}" for t, k in mesh.span(a) if k > 1) or "one device"
             for a, size, _ in mesh.axes if size > 1}
    notes = [f"layout: {layout.describe()} on {req.devices} devices of {mesh.topology.name} — "
             + "; ".join(f"{a}: {s}" for a, s in spans.items())]
    if layout.tp > kv:
        notes.append(f"{kv} KV heads < tp {layout.tp}: each KV head is replicated on {layout.tp // kv} devices")
    if layout.dp > 1 and not layout.attention_dp:
        notes.append(f"dp {layout.dp}: independent replicas, {math.ceil(req.num_queries / layout.dp)} sequences each")
    if layout.attention_dp:
        notes.append(f"attention data parallelism: each of {layout.dp} ranks runs attention on its own sequences; "
                     f"MoE layers dispatch top-k token copies over ep {layout.ep} (all-to-all, no de-duplication)")
    if layout.sequence_parallel:
        notes.append("sequence parallelism: reduce-scatter + all-gather replace each all-reduce; norms between "
                     "blocks are still priced on all tokens (an overestimate of their small cost)")
    if layout.pp > 1:
        rng = par.stage_layers(int(cfg["num_hidden_layers"]), layout.pp)
        notes.append(f"pipeline: {layout.pp} stages of {', '.join(str(len(r)) for r in rng)} layers, "
                     f"{req.micro_batches} micro-batches of {req.sequences_per_micro_batch} sequences; step = all "
                     f"stages once + (micro-batches − 1) × the slowest stage; memory is the fullest stage's")
    return notes


def _pricing_notes(rollups: dict[str, FastRollup]) -> list[str]:
    """What each performance model assumed on the way: which calibrated fits priced how many
    kernels, the units the generic roofline priced at datasheet peak, rate fallbacks."""
    notes: list[str] = []
    for name, r in rollups.items():
        model = r.model
        fits: dict[str, dict[str, int]] = {}
        seen: dict[str, int] = {}
        generic = 0
        for lt in r.leaves:
            calibrated = False
            for n in lt.result.notes:
                if n.startswith("calibrated ") and n.endswith(")"):
                    key, _, label = n.removeprefix("calibrated ").partition(" (")
                    by = fits.setdefault(label[:-1], {})
                    by[key] = by.get(key, 0) + int(lt.trips)
                    calibrated = True
                else:
                    seen[n] = seen.get(n, 0) + int(lt.trips)
            generic += not calibrated and lt.result.source.value == "analytic"
        for label, by in fits.items():
            notes.append(f"{name}: kernels priced by calibrated fits ({label}): "
                         + ", ".join(f"{k} ×{n:,}" for k, n in sorted(by.items(), key=lambda kv: -kv[1])))
        if generic:
            for unit in getattr(model, "uncalibrated", lambda: [])():
                notes.append(f"{name}: no {unit} efficiency curve for {model.device.name}; "
                             f"{unit} work of the {generic} kernel(s) no calibrated fit covers priced at datasheet peak")
        notes.extend(f"{name}: {n} ({k:,} call{'s' if k != 1 else ''})" for n, k in seen.items())
        if isinstance(model, EmpiricalPerformanceModel):
            notes.extend(f"{name}: {n}" for n in model.notes)
    return notes


def _notes(req: Request, low) -> list[str]:
    notes = []
    cfg = req.model.data
    experts = cfg.get("num_local_experts") or cfg.get("num_experts") or cfg.get("n_routed_experts")
    if experts:
        k = cfg.get("num_experts_per_tok")
        notes.append(f"MoE routing: balanced — each of {experts} experts receives tokens·{k}/{experts} "
                     f"tokens; the weights of min({experts}, tokens·{k}) experts are read per layer")
    if low.unknown:
        notes.append(f"{sum(low.unknown.values())} op calls have no cost rule and are NOT priced: "
                     + ", ".join(f"{op} ×{n}" for (op, _), n in low.unknown.most_common(5)))
    notes.append("kernels run one after another: no overlap between them is assumed")
    return notes


def _engine_notes(profile, launch: Launch, low: Lowered, rotated: bool) -> list[str]:
    """What the engine profile did to the captured step, and how its kernels are launched."""
    from perfcast.ir import leaves

    notes = [f"engine {profile.name} ({profile.framework} {profile.version}): {profile.description}",
             f"launch — {launch.description}"]
    if launch.host_source:
        notes.append(f"host launch interval: {launch.host_source}")
    if rotated:
        notes.append("each decoder layer ends with the next layer's input norm (fused with its residual add); "
                     "the first layer's norm runs before the loop and the final norm is the last layer's")
    for why, n in low.dropped.items():
        notes.append(f"not run per step by {profile.name} ({n} captured ops): {why}")
    left = [leaf for leaf in leaves(low.graph) if leaf.attr("rule") == "leftover" and leaf.kind not in
            ("matmul", "attention", "grouped_matmul", "gather")]
    if left and profile.leftover.memory == "per_op":
        names = sorted({str(leaf.attr("kernel")) for leaf in left})
        notes.append(f"{len(left)} memory-bound kernels match no fusion rule of {profile.name} and run one per op: "
                     + ", ".join(names[:6]) + ("…" if len(names) > 6 else ""))
    return notes
