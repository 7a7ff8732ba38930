"""Pricing the steps of many measured runs at once: grouped, closed form where exact.

Runs that share (model, device, quantization, layout, engine, phase) differ only in the batch
``B`` and the context ``C``. Such a group is captured once with symbolic sizes (the capture
cache, :mod:`perfcast.capture.cache`), lowered and rolled up once per performance model, and its
closed form is ``lambdify``-ed and evaluated at every run's point at once
(:meth:`perfcast.rollup.FastRollup.lambdify`). That is exactly :func:`simulate`'s number where
the symbolic capture is exact — every dim ≥ 2 and the capture's guards hold (a test checks the
two paths agree); at the other points (a batch of one, every prefill of one sequence per rank)
and for the profiling model, which needs concrete shapes, each distinct point goes through
:func:`perfcast.inference.textgen.simulate` once. The datasheet roofline baseline
(:mod:`perfcast.inference.roofline`) prices the same lowered graphs.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, replace

import numpy as np

from perfcast import engines
from perfcast.capture import cache, lower
from perfcast.capture import parallel as par
from perfcast.hardware import get_device
from perfcast.hardware.spec import SpecError
from perfcast.inference import memory, quantization
from perfcast.inference.roofline import DatasheetRoofline
from perfcast.inference.silicon import Case, catalog_model, phases
from perfcast.inference.textgen import Request, make_model, pipeline_time_s, simulate
from perfcast.ir import UserError, dim, itemsize
from perfcast.perf import Provenance
from perfcast.rollup import LaunchModel, rollup

BASELINE = "roofline"


@dataclass(frozen=True)
class Group:
    """What the runs of a group share; their points differ only in batch and context (decode)
    or prompt length (prefill)."""

    model: str
    device: str
    quantize: str | None
    layout: par.Layout
    engine: str
    decode: bool
    dtype: str = "bf16"
    kv_dtype: str | None = None
    engine_options: tuple[tuple[str, str], ...] = ()
    cuda_graph_max: int | None = None


@dataclass(frozen=True)
class StepTime:
    """One step's time under one performance model, or why it has none. ``how``: the path
    (closed form / simulate); ``measured_share``: the share of the time priced from measured or
    interpolated kernel tables (profiling model); ``unpriced``: op calls with no cost rule."""

    seconds: float | None
    how: str = ""
    reason: str | None = None
    measured_share: float | None = None
    unpriced: int = 0


def step_request(group: Group, *, batch: int, length: int,
                 performance_models: tuple[str, ...] = ("analytic",)) -> Request:
    """The perfcast request of one step: decode — ``batch`` sequences per data-parallel rank with
    ``length`` tokens of context; prefill — ``batch`` sequences of ``length`` new tokens per rank
    (one for a continuous-batching prefill, the whole batch for a static batch)."""
    layout = group.layout
    # the one place a validation step becomes a Request: the row's serving engine prices it
    return Request(model=catalog_model(group.model), device=get_device(group.device),
                   num_queries=batch * layout.dp,
                   query_length=1 if group.decode else length,
                   context_length=length if group.decode else 0, decode=group.decode,
                   dtype=group.dtype, quantize=group.quantize, kv_dtype=group.kv_dtype, layout=layout,
                   performance_models=performance_models, engine=group.engine,
                   engine_options=group.engine_options, cuda_graph_max=group.cuda_graph_max)


def group_of(case: Case, decode: bool) -> Group:
    return Group(case.model, case.device, case.quantize, case.layout, case.engine, decode, case.dtype,
                 case.kv_dtype, case.engine_options, case.cuda_graph_max)


def point_of(case: Case, decode: bool) -> tuple[int, int]:
    """(batch per rank, context) of the decode step; (sequences per rank, prompt length) of the
    prefill: one prompt under continuous batching, the whole batch of a static batch."""
    if decode:
        return case.batch, case.context
    return (case.batch if case.mode == "static" else 1), case.isl


def case_request(case: Case, *, decode: bool, performance_models: tuple[str, ...] = ("analytic",)) -> Request:
    batch, length = point_of(case, decode)
    return step_request(group_of(case, decode), batch=batch, length=length, performance_models=performance_models)


class Prices:
    """Step times by (group, point) and model, with the run time of each path."""

    def __init__(self):
        self.table: dict[tuple[Group, tuple[int, int]], dict[str, StepTime]] = {}
        self.timings_s: dict[str, float] = defaultdict(float)
        self.counts: dict[str, int] = defaultdict(int)

    def of(self, case: Case, decode: bool) -> dict[str, StepTime]:
        return self.table.get((group_of(case, decode), point_of(case, decode)), {})


def price(cases: list[Case], models: tuple[str, ...] = ("analytic",), baseline: bool = True) -> Prices:
    """Every distinct step of the predictable ``cases``: the decode step of each, and for
    aggregated runs the prefill of one prompt too (the steady-state TPOT and the TTFT need it)."""
    points: dict[Group, set[tuple[int, int]]] = defaultdict(set)
    for c in cases:
        if not c.predictable:
            continue
        for decode in phases(c):
            points[group_of(c, decode)].add(point_of(c, decode))
    prices = Prices()
    for group, pts in sorted(points.items(), key=lambda kv: repr(kv[0])):
        _price_group(prices, group, sorted(pts), models, baseline)
    return prices


def _price_group(prices: Prices, group: Group, points: list[tuple[int, int]], models: tuple[str, ...],
                 baseline: bool) -> None:
    out = {p: {} for p in points}
    wanted = list(models) + ([BASELINE] if baseline else [])
    if "profiling" in models:
        try:
            dev = get_device(group.device)
            make_model("profiling", dev, None, None, engines.resolve(group.engine, dev, group.engine_options))
        except (UserError, SpecError) as e:
            for p in points:
                out[p]["profiling"] = StepTime(None, reason=f"profiling: {e}")
            wanted.remove("profiling")
    closed = [m for m in wanted if m in ("analytic", BASELINE)]
    if group.decode and group.layout.pp == 1 and closed:
        t0 = time.perf_counter()
        rest = _closed_form(group, points, closed, out)
        prices.timings_s["closed form"] += time.perf_counter() - t0
        prices.counts["closed-form points"] += len(points) - len(rest)
    t0 = time.perf_counter()
    for p in points:
        need = [m for m in wanted if m not in out[p]]
        if need:
            out[p].update(_simulate(group, p, need))
            prices.counts["simulated points"] += 1
    prices.timings_s["simulate"] += time.perf_counter() - t0
    for p in points:
        prices.table[(group, p)] = out[p]


def _closed_form(group: Group, points, models: list[str], out: dict) -> list[tuple[int, int]]:
    """Price the points where the symbolic capture is exact; return the others."""
    proto = step_request(group, batch=2, length=2)
    model = proto.model
    layout = group.layout
    rank = replace(model, data=par.rank_config(model.data, layout)) if not layout.trivial else model
    exact = [p for p in points if p[0] >= 2 and p[1] >= 2]
    if not exact:
        return list(points)
    cap, _ = cache.symbolic_capture(rank, dtype=proto.dtype, decode=True, context=True, reroll=proto.reroll)
    exact = [p for p in exact if cache.valid_at(cap, {dim("B"): p[0], dim("C"): p[1]})]
    if not exact:
        return list(points)
    profile = proto.profile()
    cap = par.parallelize(cap, layout, model.data, profile.exchange(proto.device.name))
    quant = quantization.resolve(proto)
    tied = bool(model.data.get("tie_word_embeddings"))
    layers = range(int(model.data["num_hidden_layers"]))
    _, wbytes = memory.weights(cap, quant.plan, None if layout.trivial else
                               lambda name: par.param_share(name, cap, layout, layers, True, True, tied))
    why = unfit(wbytes, proto)
    if why:
        for p in points:
            out[p].update({m: StepTime(None, reason=why) for m in models})
        return []
    applied = engines.apply(profile, cap, decode=True, device=proto.device.name,
                            hidden_size=int(model.data["hidden_size"]))
    mesh = proto.mesh()
    # the engine decides some things by size (the all-reduce algorithm, CUDA graph or eager
    # launches): points that decide alike share one lowering, its sizes symbolic
    parts: dict[tuple, list[tuple[int, int]]] = defaultdict(list)
    for p in exact:
        parts[decisions(profile, proto, p[0])].append(p)
    for part in parts.values():
        rep = part[0]
        low = lower(applied.capture, quantize=quant.plan, model_dtype=proto.dtype,
                    kv_dtype=quant.kv_override,
                    name=model.name, plan=applied.plan, engine=profile.name,
                    decide_at={dim("B"): rep[0], dim("C"): rep[1]}, moe_routing=proto.moe_routing)
        launch = engines.launch_for(profile, decode=True, tokens=rep[0], device=proto.device)
        launch_model = LaunchModel(launch.mode, launch.host_interval_s)
        unpriced = int(sum(low.unknown.values()))
        cols = {"B": np.array([p[0] for p in part], dtype=float), "C": np.array([p[1] for p in part], dtype=float)}
        times = {}
        for name in models:
            pm = DatasheetRoofline(proto.device, mesh) if name == BASELINE else \
                make_model(name, proto.device, None, mesh, profile)
            r = rollup(low.graph, pm, launch_model)
            names = [s.name for s in r.free_symbols]
            if not set(names) <= set(cols):
                return list(points)  # a closed form in more than B and C: every point is simulated instead
            times[name] = np.broadcast_to(r.lambdify(names)(*(cols[n] for n in names)), (len(part),))
        for name, seconds in times.items():
            for p, sec in zip(part, seconds):
                out[p][name] = StepTime(float(sec), "closed form", unpriced=unpriced)
    return [p for p in points if p not in set(exact)]


def unfit(weights_bytes: int, req: Request) -> str | None:
    """Why a row's step cannot have run as it states it: its weights alone exceed one device's
    memory at its layout (a result file that names fewer devices than ran it); None where they fit."""
    capacity = int(req.device.hbm_capacity_bytes)
    if weights_bytes <= capacity:
        return None
    return (f"refused by perfcast: the weights need {weights_bytes / 1e9:.1f} GB per device at the row's layout "
            f"({req.layout.describe()}), more than {req.device.name}'s {capacity / 1e9:.0f} GB: the row cannot have "
            f"run as it states")


def decisions(profile, req: Request, tokens: int, decode: bool = True) -> tuple:
    """What the engine decides by size for a step of ``tokens`` tokens on one device (a decode
    step: its sequences): its launch mode and its all-reduce choices (messages of tokens × hidden
    in the model dtype). Two steps with equal tuples share one lowering."""
    hidden = int(req.model.data["hidden_size"])
    launch = engines.launch_for(profile, decode=decode, tokens=tokens, device=req.device)
    nbytes = tokens * hidden * int(itemsize(req.dtype))
    return (launch.mode, engines.size_decisions(profile, tokens=tokens, nbytes=nbytes))


def _simulate(group: Group, p: tuple[int, int], models: list[str]) -> dict[str, StepTime]:
    perfcast_models = tuple(m for m in models if m != BASELINE)
    req = step_request(group, batch=p[0], length=p[1], performance_models=perfcast_models or ("analytic",))
    try:
        result = simulate(req)
    except (UserError, SpecError) as e:
        return {m: StepTime(None, reason=f"refused by perfcast: {e}") for m in models}
    why = unfit(result.memory.weights_bytes, req)
    if why:
        return {m: StepTime(None, reason=why) for m in models}
    how = f"simulate ({result.capture_source})"
    unpriced = int(sum(result.lowered.unknown.values()))
    out = {}
    for m in perfcast_models:
        shares = result.evaluations[m].provenance_shares()
        measured = sum(v for k, v in shares.items() if k in (Provenance.MEASURED.value, Provenance.INTERPOLATED.value))
        out[m] = StepTime(result.step_time_s(m), how, measured_share=measured if m == "profiling" else None,
                          unpriced=unpriced)
    if BASELINE in models:
        pm = DatasheetRoofline(req.device, req.mesh())
        graph = result.lowered.graph
        stages = [rollup(g, pm).evaluate({}).time_s for g in graph.ops] if req.layout.pp > 1 else None
        one_pass = rollup(graph, pm).evaluate({}).time_s if stages is None else 0.0
        out[BASELINE] = StepTime(pipeline_time_s(one_pass, stages, req.micro_batches), how, unpriced=unpriced)
    return out
