"""``perfcast recommend``: the fewest devices (or the lowest cost) that serve a target load under
the SLOs (docs/design/search.md, "Recommend").

Every aggregated instance layout and batch limit of :mod:`perfcast.search.space` on each device
type is sized for the target:

- **a request rate** ``R``: one instance's capacity is the highest Poisson rate whose closed-form
  mean TTFT and TPOT meet the SLOs (:func:`perfcast.serving.meanfield.open_loop`, bisected below
  the instance's saturated rate — its TTFT rises with the rate); the deployment needs
  ``⌈R / capacity⌉`` instances;
- **a concurrency** ``C``: one instance holds its batch limit of clients in closed loop when that
  point meets the SLOs (the screen of ``perfcast optimize``); the deployment needs
  ``⌈C / batch⌉`` instances.

The candidates are ranked by devices (``--objective devices``; ties: cost, then headroom) or by
cost per hour (``--objective cost``: device-hours × the price table's rate; a device without a
price is refused there, never guessed). The best is confirmed by the event simulation at the
target load over its instances; if the simulation misses the SLOs the next is tried. Cost per
million output tokens = cost per hour ÷ (output tokens per hour ÷ 10⁶).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from scipy.optimize import brentq

from perfcast.ir import UserError
from perfcast.search.optimize import Point, SearchSpec, _agg, deployment_for, meets
from perfcast.search.space import layouts
from perfcast.serving.serve import ServeSpec, serve
from perfcast.serving.types import SLO, ServingResult
from perfcast.serving.workload import Lengths, Workload

OBJECTIVES = ("devices", "cost")
#: The shipped price table.
PRICES = "cloud-on-demand"


@dataclass(frozen=True)
class PriceTable:
    name: str
    currency: str
    prices: dict
    source: str

    def of(self, device: str) -> float | None:
        return self.prices.get(device)


def price_table(path: str | None = None) -> PriceTable:
    """The shipped price table, or the user's (``--price-file``: the same keys)."""
    from importlib import resources

    from perfcast.inputs import load_yaml

    where = path or str(resources.files("perfcast.data") / "prices" / f"{PRICES}.yaml")
    data = load_yaml(where)
    if not isinstance(data, dict) or not isinstance(data.get("prices"), dict):
        raise UserError(f"{where}: expected a mapping with 'prices: {{device: price per device-hour}}'")
    bad = [k for k, v in data["prices"].items()
           if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < 1e6]
    if bad:
        raise UserError(f"{where}: prices.{bad[0]}: expected a positive price per device-hour below 1e6")
    return PriceTable(str(data.get("name", Path(where).stem)), str(data.get("currency", "USD")),
                      {str(k): float(v) for k, v in data["prices"].items()}, str(data.get("source", where)))


@dataclass(frozen=True)
class Target:
    """The load to serve: ``rate`` requests/s (Poisson) or ``concurrency`` clients (closed loop)."""

    rate: float | None = None
    concurrency: int | None = None

    def __post_init__(self):
        if (self.rate is None) == (self.concurrency is None):
            raise UserError("give one target: --request-rate R or --concurrency C")


@dataclass
class Option:
    """One layout and batch limit sized for the target."""

    point: Point
    instances: int
    capacity: float               # per instance: requests/s (rate target) or clients (concurrency target)
    devices: int
    cost_per_hour: float | None
    output_tokens_per_s: float
    simulation: ServingResult | None = None

    @property
    def cost_per_million_tokens(self) -> float | None:
        if self.cost_per_hour is None or self.output_tokens_per_s <= 0:
            return None
        return self.cost_per_hour / (self.output_tokens_per_s * 3600 / 1e6)

    @property
    def headroom(self) -> float:
        """Capacity over the load (≥ 1)."""
        return self.instances * self.capacity


@dataclass
class Recommendation:
    spec: SearchSpec
    target: Target
    objective: str
    prices: PriceTable
    best: Option | None
    options: list[Option]          # every sized option, best first
    rejected: dict[str, int]
    timings_s: dict[str, float]
    notes: tuple[str, ...] = field(default_factory=tuple)


def _rate_capacity(spec: SearchSpec, p: Point) -> float:
    """One instance's highest rate meeting the SLOs in closed form (0: none)."""
    c = p.candidate
    dep = deployment_for(spec, c.device, c.quantize, c.layout)

    def at(rate: float) -> ServingResult:
        w = Workload(Lengths("fixed", spec.isl), Lengths("fixed", spec.osl), num_requests=1000, rate=rate)
        return serve(ServeSpec(dep, w, max_batch_size=c.batch, max_num_tokens=spec.budget(c),
                               chunked_prefill=p.scheduler["chunked_prefill"] if p.scheduler else None,
                               tier="closed-form")).results["closed form"]

    top = at(1e9).sustainable_rate or 0.0     # far beyond: the instance's saturated rate

    def margin(rate: float) -> float:
        r = at(rate)
        if not r.stable:
            return 1.0
        got = ((spec.slo.ttft_s, r.ttft_s.mean), (spec.slo.tpot_s, r.tpot_s.mean))
        return max((v / b - 1.0 for b, v in got if b is not None), default=-1.0)

    hi, lo = top * (1 - 1e-6), top * 1e-6
    if top <= 0 or margin(lo) > 0:
        return 0.0
    if margin(hi) <= 0:
        return hi
    return brentq(margin, lo, hi, xtol=1e-9 * top)


def recommend(spec: SearchSpec, target: Target, *, objective: str = "devices", prices: PriceTable | None = None,
              max_devices: int = 1 << 16, progress=None) -> Recommendation:
    if objective not in OBJECTIVES:
        raise UserError(f"--objective {objective!r}: expected devices or cost")
    prices = prices or price_table()
    if objective == "cost":
        unpriced = [d for d in spec.devices if prices.of(d) is None]
        if unpriced:
            raise UserError(f"--objective cost: no price for {', '.join(unpriced)} in {prices.name}; give "
                            f"--price-file FILE with them (keys: prices: {{device: price per device-hour}})")
    from perfcast.models import load_model_config

    cfg = load_model_config(spec.model).data
    t0 = time.perf_counter()
    points, lays = [], layouts(cfg, spec.total_devices, spec.sizes)
    for i, (d, q, lay) in enumerate((d, q, lay) for d in spec.devices for q in spec.quantize for lay in lays):
        points += _agg(replace(spec, total_devices=lay.num_devices), d, q, lay)  # one instance each
        if progress is not None:
            progress(i + 1, len(spec.devices) * len(spec.quantize) * len(lays), f"{d} {lay.describe()}")
    options = []
    for p in points:
        if p.status != "ok":
            continue
        c = p.candidate
        if target.rate is not None:
            cap = _rate_capacity(spec, p)
            if cap <= 0:
                p.status, p.reason = "slo", "no request rate meets the SLOs (closed form)"
                continue
            n = math.ceil(target.rate / cap - 1e-9)
            tokens = target.rate * spec.osl
        else:
            cap = c.batch * c.layout.dp
            n = math.ceil(target.concurrency / cap)
            # one instance's closed-form throughput at its full batch, scaled to the clients it gets
            tokens = p.figures()["output_tokens_per_s"] * target.concurrency / cap
        devices = n * c.layout.num_devices
        if devices > max_devices:
            continue
        price = prices.of(c.device)
        options.append(Option(p, n, cap, devices, None if price is None else price * devices, tokens))
    t1 = time.perf_counter()

    def key(o: Option):
        cost = o.cost_per_hour if o.cost_per_hour is not None else math.inf
        first = (o.devices, cost) if objective == "devices" else (cost, o.devices)
        return (*first, -o.headroom)

    options.sort(key=key)
    best, notes = None, []
    for o in options[:8]:
        o.simulation = _simulate(spec, target, o)
        if _sim_meets(spec.slo, o.simulation):
            best = o
            break
        notes.append(f"{o.point.candidate.short()} × {o.instances}: meets the SLOs in closed form, not in the "
                     f"simulation")
    rejected = {k: sum(1 for p in points if p.status == k) for k in
                ("invalid_layout", "does_not_fit", "not_modelled", "no_data", "slo")}
    if max_devices < (1 << 16):
        rejected["over_max_devices"] = sum(1 for p in points if p.status == "ok") - len(options)
    return Recommendation(spec, target, objective, prices, best, options, rejected,
                          {"size": t1 - t0, "confirm": time.perf_counter() - t1, "total": time.perf_counter() - t0},
                          tuple(notes))


def _sim_meets(slo: SLO, r: ServingResult) -> bool:
    if not r.stable or r.ttft_s is None:
        return False
    return meets(slo, {"ttft_s": r.ttft_s.mean, "tpot_s": r.tpot_s.mean, "e2e_s": r.e2e_s.mean})


def _simulate(spec: SearchSpec, target: Target, o: Option) -> ServingResult:
    """The target load over the option's instances (each an engine of its own, the load split
    evenly: the instances are folded into data-parallel ranks unless the layout has attention DP,
    when one instance is served with its share)."""
    c = o.point.candidate
    lay = c.layout
    fold = not lay.attention_dp
    layout = replace(lay, dp=lay.dp * o.instances) if fold else lay
    share = 1 if fold else o.instances
    dep = deployment_for(spec, c.device, c.quantize, layout)
    if target.rate is not None:
        n = max(400, 4 * c.batch * layout.dp)
        w = Workload(Lengths("fixed", spec.isl), Lengths("fixed", spec.osl), num_requests=n,
                     rate=target.rate / share, seed=spec.seed)
    else:
        conc = math.ceil(target.concurrency / share)
        conc = conc if conc % layout.dp == 0 else conc + layout.dp - conc % layout.dp  # split evenly over the ranks
        w = Workload(Lengths("fixed", spec.isl), Lengths("fixed", spec.osl), num_requests=4 * conc,
                     concurrency=conc, seed=spec.seed)
    sched = o.point.scheduler or {}
    r = serve(ServeSpec(dep, w, max_batch_size=c.batch, max_num_tokens=spec.budget(c),
                        chunked_prefill=sched.get("chunked_prefill"), tier="simulation")).results["simulation"]
    return r


def describe(o: Option) -> str:
    c = o.point.candidate
    return f"{o.instances} × ({c.layout.describe()}) on {c.device}, batch {c.batch}" + (
        f", {c.quantize}" if c.quantize else "")
