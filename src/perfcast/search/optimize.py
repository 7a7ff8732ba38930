"""``perfcast optimize``: the best deployment of a model under TTFT and TPOT objectives.

The application in one place (the CLI parses flags, the report formats). Every candidate of the
space (:mod:`perfcast.search.space`) is

1. **screened** by the closed form (:func:`perfcast.serving.meanfield.closed_loop` through
   :func:`perfcast.serving.serve.serve`, tier ``closed-form``): each engine instance rank's batch
   full — ``batch`` clients per rank in a closed loop, the operating point aiconfigurator and
   InferenceMAX sweep — with the engine's scheduler and its KV cache sized from the memory
   model; each deployment's step model is compiled once for all its batch limits. Disaggregated
   candidates are screened by :mod:`perfcast.search.disagg`; the screening's units of work
   (:func:`groups_of`) run here or on Ray (:mod:`perfcast.search.executor`), with one result;
2. **placed**: the Pareto front of output tokens/s per device against tokens/s per user over every
   candidate that fits (:func:`perfcast.search.pareto.front`), and the candidates meeting the
   SLOs on their mean TTFT and TPOT;
3. **confirmed** by the event simulation (tier ``simulation``): the front and the ``confirm``
   best candidates under the SLOs are served again, request by request, and the best deployment is
   the one with the most output tokens/s per device whose *simulated* mean TTFT and TPOT meet the
   SLOs (ties: the most tokens/s per user).

Nothing is dropped silently: a candidate the model cannot take, one that does not fit, one the
serving layer does not model, one that cannot be priced and one missing the SLOs are each counted
under their reason, and listed with it in ``--save-dir``.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

from perfcast.capture.parallel import Layout, experts_of
from perfcast.ir import UserError, routing
from perfcast.models import load_model_config
from perfcast.search import pareto
from perfcast.search.space import BATCHES, Candidate, layouts, parse_variant
from perfcast.serving.scheduler import deployment_scheduler
from perfcast.serving.serve import DoesNotFit, ServeSpec, serve
from perfcast.serving.step import Deployment
from perfcast.serving.types import SLO, ServingResult
from perfcast.serving.workload import Lengths, Workload

#: Why a candidate is not a deployment to take, in the order reports list them.
REASONS = {
    "invalid_layout": "invalid layout (the model cannot be split so)",
    "does_not_fit": "does not fit (weights and KV cache of a full batch exceed the devices' memory)",
    "not_modelled": "not modelled (a pipeline-parallel pool in disaggregated serving)",
    "no_data": "cannot be priced (no data or no model for a part)",
    "slo": "misses the SLOs (closed form)",
}
MODES = ("agg", "disagg")


@dataclass(frozen=True)
class SearchSpec:
    """Everything ``perfcast optimize`` searches, plain and hashable."""

    model: str
    devices: tuple[str, ...]
    total_devices: int
    isl: int
    osl: int
    slo: SLO
    engine: str | None = None
    engine_options: tuple[tuple[str, str], ...] = ()  # --engine-option, for every candidate
    modes: tuple[str, ...] = ("agg",)
    quantize: tuple[str | None, ...] = (None,)
    batches: tuple[int, ...] = BATCHES
    sizes: tuple[int, ...] | None = None
    max_num_tokens: int | None = None
    token_budgets: tuple[int, ...] = ()  # step token budgets searched (each a candidate); () : max_num_tokens alone
    dtype: str = "bf16"
    kv_dtype: str | None = None
    moe_routing: str = routing.DEFAULT  # --moe-routing (perfcast.ir.routing)
    performance_model: str = "analytic"
    confirm: int = 4                     # best closed-form candidates under the SLOs simulated, beside the front
    requests_per_client: int = 4         # simulated requests per client (warm-up: the first round)
    simulate_all: bool = False           # every priced candidate simulated, not only the front and the best
    seed: int = 0

    def __post_init__(self):
        if not self.devices:
            raise UserError("--devices: name at least one device")
        if self.total_devices < 1:
            raise UserError(f"--total-devices {self.total_devices}: must be at least 1")
        for m in self.modes:
            if m not in MODES:
                raise UserError(f"--serving-mode {m!r}: expected agg, disagg or both")
        if self.osl < 2:
            raise UserError(f"--osl {self.osl}: the search needs at least 2 output tokens (TPOT is the gap "
                            f"between them)")
        if not self.batches or min(self.batches) < 1:
            raise UserError("--batch-sizes: give positive batch limits")
        if self.token_budgets and (self.max_num_tokens is not None or min(self.token_budgets) < 1):
            raise UserError("--max-num-tokens: give one budget, or several to search, each positive")
        if self.engine_options:
            object.__setattr__(self, "engine_options", _checked_options(self))
        if self.moe_routing != routing.DEFAULT:  # refused for a model without routed experts
            routing.check(self.moe_routing, experts_of(load_model_config(self.model).data), self.model)

    @property
    def budgets(self) -> tuple[int | None, ...]:
        """The token budgets each layout and batch limit is tried with, the largest first (one
        step model compiled for the largest serves the rest); (None,): the single budget."""
        return tuple(sorted(set(self.token_budgets), reverse=True)) or (None,)

    def budget(self, c) -> int | None:
        """Candidate ``c``'s step token budget (None: the engine's)."""
        return c.max_num_tokens if c.max_num_tokens is not None else self.max_num_tokens


def _checked_options(spec: SearchSpec) -> tuple[tuple[str, str], ...]:
    """``--engine-option`` as the engine names its values (what the deployment files and launch
    configs write); one that cannot apply to every candidate is one line: a MoE backend for a
    model without routed experts, or a value one of the searched devices does not run."""
    from perfcast.engines import check_options, resolve
    from perfcast.hardware import get_device

    check_options(spec.engine_options, load_model_config(spec.model))
    for d in spec.devices:
        try:
            profile = resolve(spec.engine, get_device(parse_variant(d)[0]), spec.engine_options)
        except UserError as e:
            raise UserError(f"{e}; drop it from --devices or drop the option") from None
    return tuple((k, profile.options[k].value) for k, _ in spec.engine_options)


@dataclass
class Point:
    """One evaluated candidate: ``status`` ``ok`` (fits and meets the SLOs in closed form) or a
    key of :data:`REASONS`; the closed form's figures where it was priced, the simulation's where
    it was confirmed. Figures are the deployment's (every replica)."""

    candidate: Candidate
    status: str
    reason: str | None = None
    closed_form: ServingResult | None = None
    simulation: ServingResult | None = None
    kv_capacity_tokens: int | None = None
    step_source: str | None = None
    on_front: bool = False
    scheduler: dict | None = None      # the engine settings it was priced with (decode side when disaggregated)

    @property
    def priced(self) -> bool:
        return self.closed_form is not None

    def figures(self, tier: str = "closed form") -> dict | None:
        r = self.closed_form if tier == "closed form" else self.simulation
        if r is None or not r.stable or r.ttft_s is None or r.tpot_s is None:
            return None
        c = self.candidate
        scale = c.replicas if c.mode == "agg" else 1
        return {"ttft_s": r.ttft_s.mean, "tpot_s": r.tpot_s.mean, "e2e_s": r.e2e_s.mean if r.e2e_s else None,
                "output_tokens_per_s": r.output_tokens_per_s * scale,
                "output_tokens_per_s_per_device": r.output_tokens_per_s * scale / c.devices,
                "output_tokens_per_s_per_user": r.output_tokens_per_s_per_user,
                "requests_per_s": r.requests_per_s * scale}


@dataclass
class SearchResult:
    spec: SearchSpec
    points: list[Point]
    front: list[Point]
    best: Point | None
    runners_up: list[Point]
    rejected: dict[str, int]
    timings_s: dict[str, float]
    notes: tuple[str, ...] = field(default_factory=tuple)
    executor: str = "local"
    workers: int = 1

    @property
    def candidates_evaluated(self) -> int:
        return len(self.points)

    @property
    def confirmed(self) -> list[Point]:
        return [p for p in self.points if p.simulation is not None]


def meets(slo: SLO, fig: dict | None) -> bool:
    """Mean TTFT and TPOT within the objectives (None: no bound)."""
    if fig is None:
        return False
    return all(b is None or v <= b for b, v in ((slo.ttft_s, fig["ttft_s"]), (slo.tpot_s, fig["tpot_s"]),
                                               (slo.e2e_s, fig["e2e_s"])))


def deployment_for(spec: SearchSpec, device: str, quantize: str | None, layout: Layout) -> Deployment:
    """``device`` may be a what-if variant (:func:`perfcast.search.space.variant`)."""
    name, what_if = parse_variant(device)
    return Deployment(spec.model, name, spec.engine, layout, spec.dtype, quantize, spec.kv_dtype,
                      performance_model=spec.performance_model, what_if=what_if, engine_options=spec.engine_options,
                      moe_routing=spec.moe_routing)


def _chunked(spec: SearchSpec, dep: Deployment, budget: int | None) -> bool | None:
    """Chunked prefill where the engine's default cannot take the prompt whole: an engine that
    does not chunk by default (TensorRT-LLM: ``enable_chunked_prefill`` off) refuses a prompt
    longer than its token budget, so the search turns chunking on for it, as a user would (and as
    the deployment's ``scheduler`` settings say); None keeps the engine's default."""
    sched = deployment_scheduler(dep, max_num_tokens=budget)
    return True if not sched.chunked_prefill and spec.isl > sched.max_num_tokens else None


def _serve_spec(spec: SearchSpec, dep: Deployment, c: Candidate, tier: str) -> ServeSpec:
    clients = c.batch * dep.layout.dp   # one instance's clients: every rank's batch full
    work = Workload(Lengths("fixed", spec.isl), Lengths("fixed", spec.osl),
                    num_requests=clients * (spec.requests_per_client if tier == "simulation" else 1),
                    concurrency=clients, seed=spec.seed)
    return ServeSpec(dep, work, max_batch_size=c.batch, max_num_tokens=spec.budget(c),
                     chunked_prefill=_chunked(spec, dep, spec.budget(c)), slo=spec.slo, tier=tier)


def _agg(spec: SearchSpec, device: str, quantize: str | None, layout: Layout) -> list[Point]:
    """The batch limits of one instance layout, replicated over the budget, in closed form."""
    cands = [Candidate("agg", device, quantize, layout, b, spec.total_devices // layout.num_devices, max_num_tokens=t)
             for b in sorted(set(spec.batches), reverse=True)   # the largest first: one compile serves all
             for t in spec.budgets]
    dep = deployment_for(spec, device, quantize, layout)
    try:
        dep.request(decode=True, batch=2, length=2).validate()
    except UserError as e:
        return [Point(c, "invalid_layout", str(e)) for c in cands]
    out = []
    for c in cands:
        rep, refused = priced(c, lambda: serve(_serve_spec(spec, dep, c, "closed-form")))
        refused = refused or short_of_kv(spec, c, rep.kv.capacity_tokens, "the KV cache")
        if refused:
            out.append(refused)
            continue
        p = Point(c, "ok", closed_form=rep.results["closed form"], kv_capacity_tokens=rep.kv.capacity_tokens,
                  step_source=rep.step_source, scheduler=_settings(rep.scheduler))
        if not meets(spec.slo, p.figures()):
            p.status, p.reason = "slo", _slo_miss(spec.slo, p.figures())
        out.append(p)
    return out


def priced(c: Candidate, price) -> tuple[object, Point | None]:
    """``(price(), None)``, or ``(None, c rejected)`` when the serving layer refuses it: no room
    for a KV cache (``does_not_fit``) or anything else it cannot price (``no_data``)."""
    try:
        return price(), None
    except DoesNotFit as e:
        return None, Point(c, "does_not_fit", str(e))
    except UserError as e:
        return None, Point(c, "no_data", str(e))


def short_of_kv(spec: SearchSpec, c: Candidate, capacity: int, what: str) -> Point | None:
    """``c`` rejected as not fitting when ``what`` (one rank's KV cache) cannot hold its batch of
    requests at full length (``isl + osl`` each, as guaranteed-no-evict admission reserves)."""
    need = c.batch * (spec.isl + spec.osl)
    if capacity >= need:
        return None
    return Point(c, "does_not_fit", f"{what} holds {capacity:,} tokens per rank, {need:,} needed for {c.batch} "
                                    f"requests at full length", kv_capacity_tokens=capacity)


def _settings(sched) -> dict:
    return {"engine": sched.engine, "max_batch_size": sched.max_num_seqs, "max_num_tokens": sched.max_num_tokens,
            "chunked_prefill": sched.chunked_prefill}


def _slo_miss(slo: SLO, fig: dict | None) -> str:
    if fig is None:
        return "unstable at its own batch"
    miss = [f"{name} {v * 1e3:.4g} ms > {b * 1e3:.4g} ms" for name, b, v in
            (("TTFT", slo.ttft_s, fig["ttft_s"]), ("TPOT", slo.tpot_s, fig["tpot_s"]),
             ("E2E", slo.e2e_s, fig["e2e_s"])) if b is not None and v > b]
    return "; ".join(miss)


def _confirm(spec: SearchSpec, p: Point) -> None:
    c = p.candidate
    dep = deployment_for(spec, c.device, c.quantize, c.layout)
    if c.mode == "agg":
        rep = serve(_serve_spec(spec, dep, c, "simulation"))
    else:
        from perfcast.search.disagg import disagg_spec

        rep = serve(disagg_spec(spec, dep, deployment_for(spec, c.device, c.quantize, c.prefill_layout), c,
                                p.closed_form.requests_per_s, "simulation"))
    p.simulation = rep.results["simulation"]


def groups_of(spec: SearchSpec) -> list[tuple]:
    """The screening's units of work, in a fixed order: ``("agg", device, quantize, layout)`` —
    one deployment's sweep of batch limits — and ``("disagg", device, quantize, layouts)``."""
    lays = tuple(layouts(load_model_config(spec.model).data, spec.total_devices, spec.sizes))
    out = []
    for d in spec.devices:
        for q in spec.quantize:
            if "agg" in spec.modes:
                out += [("agg", d, q, lay) for lay in lays]
            if "disagg" in spec.modes:
                out.append(("disagg", d, q, lays))
    return out


def screen_group(task: tuple) -> list[Point]:
    """One group's points (a top-level function: a Ray task runs it in a worker)."""
    spec, (mode, d, q, what) = task
    if mode == "agg":
        return _agg(spec, d, q, what)
    from perfcast.search.disagg import screen

    return screen(spec, d, q, list(what))


def optimize(spec: SearchSpec, progress=None, jobs: int | None = None, executor=None) -> SearchResult:
    """Screen every candidate, place the front, confirm it by simulation, choose the best.
    ``progress(done, total, what)`` is called after each group (a progress bar's hook); ``jobs``:
    processes for the screening (two at most) and the confirming simulations (default: the CPUs
    this process may use);
    ``executor``: where the screening runs (:mod:`perfcast.search.executor`; default: here)."""
    from perfcast.search.executor import LocalExecutor
    from perfcast.search.screening import screen

    executor = executor or LocalExecutor()
    groups = groups_of(spec)
    t0 = time.perf_counter()   # (the order of the groups, and the screening on two cores: screening.py)
    by_group = screen(spec, groups, screen_group, executor, jobs, progress)
    points = [p for i in range(len(groups)) for p in by_group[i]]   # the group order, however they finished
    t1 = time.perf_counter()
    front, best, runners_up, notes = select(points, spec.slo, spec.confirm,
                                            lambda todo: _confirm_all(spec, todo, jobs, executor),
                                            every=spec.simulate_all)
    t2 = time.perf_counter()
    rejected = {k: sum(1 for p in points if p.status == k) for k in REASONS}
    return SearchResult(spec, points, front, best, runners_up, rejected,
                        {"screen": t1 - t0, "confirm": t2 - t1, "total": t2 - t0}, tuple(notes),
                        executor=executor.name, workers=executor.workers)


def _confirm_all(spec: SearchSpec, todo: list[Point], jobs: int | None, executor=None) -> None:
    """Every point's simulation: on the search's Ray cluster when it has one (a Ray driver is not
    forked), else in ``jobs`` forked processes (each inherits the compiled step models; the longest
    first; the attention rows computed here and there kept for the next process). The simulations
    are deterministic, so the split does not change a figure."""
    from perfcast.serving.forked import forked_map

    args = [(spec, p.candidate, p.closed_form) for p in todo]
    runs = (executor.imap(_simulated, args) if executor is not None and executor.name != "local"
            else forked_map(_simulated, args, jobs, size=lambda i: todo[i].candidate.concurrency, rows=True))
    for i, sim in runs:
        todo[i].simulation = sim


def _simulated(args) -> ServingResult:
    spec, c, closed = args
    p = Point(c, "ok", closed_form=closed)
    _confirm(spec, p)
    return p.simulation


def select(points: list[Point], slo: SLO, confirm: int, simulate, every: bool = False) \
        -> tuple[list[Point], Point | None, list[Point], list[str]]:
    """The decision over screened points, whatever priced them: the Pareto front of every priced
    point (tokens/s per device against tokens/s per user, :func:`perfcast.search.pareto.front`),
    then ``simulate(points)`` (which sets each ``point.simulation``) on the front and on the ``confirm``
    best points meeting ``slo`` in closed form; the best is the simulated point with the most
    tokens/s per device whose simulated means meet ``slo`` (ties: tokens/s per user), the next
    four the runners-up; ``every``: every priced point is simulated (the slow, thorough search).
    Returns (front, best, runners-up, notes)."""
    priced = [p for p in points if p.figures() is not None]
    figs = [p.figures() for p in priced]
    idx = pareto.front([f["output_tokens_per_s_per_device"] for f in figs],
                       [f["output_tokens_per_s_per_user"] for f in figs])
    front = [priced[i] for i in idx]
    for p in front:
        p.on_front = True
    ok = sorted((p for p in priced if p.status == "ok"), key=_rank_key("closed form"), reverse=True)
    chosen = {id(p): p for p in (priced if every else front + ok[:confirm])}
    simulate(list(chosen.values()))
    good = sorted((p for p in chosen.values() if meets(slo, p.figures("simulation"))),
                  key=_rank_key("simulation"), reverse=True)
    notes = []
    if ok and not good:
        notes.append(f"{len(ok)} candidate(s) meet the SLOs in closed form, but none of the {len(chosen)} "
                     f"simulated does")
    return front, good[0] if good else None, good[1:5], notes


def _rank_key(tier: str):
    def key(p: Point):
        f = p.figures(tier)
        return (f["output_tokens_per_s_per_device"], f["output_tokens_per_s_per_user"]) if f else (-math.inf, -math.inf)
    return key
