"""The closed form of disaggregated serving: a prefill pool of x instances and a decode pool of y.

Prefill instances run prefill-only batches; a request's KV moves to a decode instance
(``kv_transfer_s``, priced by the caller on the topology) and decodes there (Zhong et al. 2024,
"DistServe", §3; Patel et al. 2024, "Splitwise"). Each pool is a set of identical servers fed by
the pool's router (:data:`.queueing.ROUTERS`: round robin, each instance taking every x-th or y-th arrival,
or the least loaded instance; the waits by :func:`.queueing.split_wait`). The prefill instance is a
server of service ``1 / μ_p`` (full batches), the decode instance a batch of ``d`` sequences with
``d`` solving Little's law
``d = (λ / y) · (osl − 1) · TPOT(d)``. :func:`choose_ratio` enumerates the splits of a number of
instances, each in closed form (DistServe §4.2 searches the same space by simulation).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from functools import cached_property, lru_cache

from perfcast.ir import UserError
from perfcast.serving.brent import brentq
from perfcast.serving.meanfield import (
    _NOTES, _RTOL, _XTOL, EngineConfig, Workload, _lerp, _meets, _Model,
)
from perfcast.serving.queueing import check_router, split_wait, wait_tail
from perfcast.serving.types import SLO, ServingResult, StepCost, Summary


@dataclass(frozen=True)
class Pool:
    """``instances`` engine instances of one pool, each priced by ``step`` under ``engine``
    (its ``devices`` per instance, its own KV capacity and limits)."""

    step: StepCost
    engine: EngineConfig
    instances: int = 1
    router: str = "round_robin"   # how requests reach the pool's instances (:data:`.queueing.ROUTERS`)

    def __post_init__(self):
        if self.instances < 1:
            raise UserError(f"a pool of {self.instances} instances: needs at least 1")
        check_router(self.router)


@dataclass(frozen=True)
class _Pools:
    """The per-instance figures of both pools for one workload (none depends on the rate or on
    a pool's instance count: :func:`_pools` keeps one per pair of engines and lengths, its memo
    serving every rate a root search tries and every split)."""

    pre: _Model
    dec: _Model
    steps: dict = field(default_factory=dict, compare=False, repr=False)   # decode step by sequences

    @cached_property
    def mu_prefill(self) -> float:
        """One prefill instance's saturated requests/s: full batches of ``q`` prompts."""
        q = self.pre.prefill_batch_max
        return q / self.pre.prefill_batch_s(q)

    def decode_rate(self, d: float) -> float:
        """One decode instance's requests/s holding ``d`` sequences: ``d E / ((osl − 1) τ(d))``."""
        return d * self.dec.e / ((self.dec.load.osl - 1) * self.tau(d))

    def tau(self, d: float) -> float:
        return _lerp(self._decode_s, max(d, 1.0))

    def _decode_s(self, n: int) -> float:
        s = self.steps.get(n)
        if s is None:
            s = self.steps[n] = self.dec.decode_s(n)
        return s

    @cached_property
    def mu_decode(self) -> float:
        return self.decode_rate(self.dec.cap)


def _pools(prefill: Pool, decode: Pool, load: Workload, draft: StepCost | None) -> _Pools:
    return _pair(prefill.step, prefill.engine, decode.step, decode.engine, load.isl, load.osl, load.prefix_hit_rate,
                 draft)


@lru_cache(maxsize=256)
def _pair(pre_step: StepCost, pre_engine: EngineConfig, dec_step: StepCost, dec_engine: EngineConfig, isl: int,
          osl: int, hit: float, draft: StepCost | None) -> _Pools:
    lengths = Workload(isl, osl, prefix_hit_rate=hit)
    return _Pools(_Model(pre_step, replace(pre_engine, policy="sglang"), lengths),
                  _Model(dec_step, replace(dec_engine, policy="sglang"), lengths, draft))


def sustainable_rate(prefill: Pool, decode: Pool, load: Workload, *, draft: StepCost | None = None) -> float:
    """The saturated requests/s of the split: ``min(x μ_prefill, y μ_decode)``."""
    return _capacity(_pools(prefill, decode, load, draft), prefill.instances, decode.instances)


def disaggregated(prefill: Pool, decode: Pool, load: Workload, kv_transfer_s: float, *,
                  draft: StepCost | None = None, slo: SLO | None = None) -> ServingResult:
    """Poisson arrivals at ``load.rate_per_s``. ``TTFT = W_prefill + S_prefill + kv_transfer_s +
    W_decode``: the prefill pool's wait behind its router (each instance a server of ``μ_prefill``:
    :func:`.queueing.split_wait`), its batch of ``b = clamp(λ/x · P(1), 1, q)``
    prompts (those arriving during one prompt's prefill), the transfer, and the wait for a slot
    in the decode batch behind the decode pool's router (each instance ``B_max`` slots, each turning
    over at ``μ_decode / B_max``). ``TPOT = τ(d) / E``."""
    if load.rate_per_s is None or kv_transfer_s < 0.0:
        raise UserError("a disaggregated point needs a rate and a non-negative KV transfer time")
    p, lam = _pools(prefill, decode, load, draft), load.rate_per_s
    devices = prefill.instances * prefill.engine.devices + decode.instances * decode.engine.devices
    f = _figures(p, prefill, decode, lam, kv_transfer_s)
    if f is None:
        return _unstable(p, _capacity(p, prefill.instances, decode.instances), lam, devices)
    d, ttft, tpot = f
    rho_p, rho_d = lam / (prefill.instances * p.mu_prefill), lam / (decode.instances * p.mu_decode)
    notes = (f"disaggregated {prefill.instances}P{decode.instances}D at λ = {lam:.6g}/s: prefill ρ = {rho_p:.4g}, "
             f"decode ρ = {rho_d:.4g}, {d:.4g} sequences per decode instance",
             f"waits behind the {prefill.router.replace('_', ' ')} router (queueing.split_wait); TTFT percentiles: "
             "the prefill wait's exponential tail; the decode wait enters at its mean")
    return _result(p, lam, d, ttft, tpot, devices, notes, slo)


def _capacity(p: _Pools, x: int, y: int) -> float:
    return min(x * p.mu_prefill, y * p.mu_decode)


def _figures(p: _Pools, prefill: Pool, decode: Pool, lam: float,
             kv_transfer_s: float) -> tuple[float, Summary, float] | None:
    """``(d, TTFT, TPOT)`` of the ``x`` prefill and ``y`` decode instances at ``lam`` requests/s,
    None when ``lam`` is not below what they sustain."""
    x, y = prefill.instances, decode.instances
    if lam >= _capacity(p, x, y):
        return None
    lam_d = lam / y
    d = brentq(lambda n: p.decode_rate(n) - lam_d, 0.0, p.dec.cap, xtol=_XTOL, rtol=_RTOL)
    pre = p.pre
    b = min(max(lam / x * pre.at(pre.prefill_batch_s, 1), 1.0), pre.prefill_batch_max)
    service, tpot = _lerp(lambda n: pre.at(pre.prefill_batch_s, n), b), p.tau(d) / p.dec.e
    rho_p = lam / (x * p.mu_prefill)
    base = service + kv_transfer_s + split_wait(decode.router, lam, p.mu_decode / p.dec.cap, y, p.dec.cap)
    return d, wait_tail(base, split_wait(prefill.router, lam, p.mu_prefill, x), rho_p), tpot


def _result(p: _Pools, lam: float, d: float, ttft: Summary, tpot: float, devices: int,
            notes: tuple[str, ...], slo: SLO | None) -> ServingResult:
    tail = (p.dec.load.osl - 1) * tpot
    e2e = Summary(ttft.mean + tail, ttft.p50 + tail, ttft.p90 + tail, ttft.p99 + tail)
    flat = Summary(tpot, tpot, tpot, tpot)
    good = (lam if _meets(slo, ttft.mean, tpot, e2e.mean) else 0.0) if slo else None
    osl = p.dec.load.osl
    return ServingResult(
        tier="closed form", ttft_s=ttft, tpot_s=flat, itl_s=flat, e2e_s=e2e, output_tokens_per_s=lam * osl,
        output_tokens_per_s_per_device=lam * osl / devices, output_tokens_per_s_per_user=1.0 / tpot,
        requests_per_s=lam, devices=devices, kv_capacity_tokens=p.dec.engine.kv_capacity_tokens,
        kv_peak_tokens=min(p.dec.engine.kv_capacity_tokens, math.ceil(d * (p.dec.load.isl + osl))),
        preemptions=0, requests=0, goodput_requests_per_s=good, mean_batch=d,
        notes=_NOTES + notes + ("goodput: the mean latencies against the SLO",))


def _unstable(p: _Pools, rate: float, lam: float, devices: int) -> ServingResult:
    osl = p.dec.load.osl
    return ServingResult(
        tier="closed form", ttft_s=None, tpot_s=None, itl_s=None, e2e_s=None, output_tokens_per_s=rate * osl,
        output_tokens_per_s_per_device=rate * osl / devices, output_tokens_per_s_per_user=p.dec.e / p.tau(p.dec.cap),
        requests_per_s=rate, devices=devices, kv_capacity_tokens=p.dec.engine.kv_capacity_tokens,
        kv_peak_tokens=min(p.dec.engine.kv_capacity_tokens, p.dec.cap * (p.dec.load.isl + osl)),
        preemptions=0, requests=0, stable=False, sustainable_rate=rate, mean_batch=float(p.dec.cap),
        notes=_NOTES + (f"unstable: λ = {lam:.6g}/s ≥ sustainable {rate:.6g}/s",))


@dataclass(frozen=True)
class Split:
    """One x/y split: the highest rate it serves within the SLOs, and what that is per device."""

    prefill_instances: int
    decode_instances: int
    devices: int
    rate_per_s: float
    output_tokens_per_s_per_device: float


def best_rate(prefill: Pool, decode: Pool, load: Workload, kv_transfer_s: float, slo: SLO | None,
               draft: StepCost | None) -> float:
    """The supremum of stable rates meeting ``slo`` (mean latencies rise with the rate): the
    sustainable rate without SLOs or when they hold up to it, else the root of the SLO margin."""
    top = sustainable_rate(prefill, decode, load, draft=draft)
    if slo is None:
        return top

    p = _pools(prefill, decode, load, draft)

    def margin(lam: float) -> float:
        _, ttft, tpot = _figures(p, prefill, decode, lam, kv_transfer_s)
        got = ((slo.ttft_s, ttft.mean), (slo.tpot_s, tpot), (slo.e2e_s, ttft.mean + (load.osl - 1) * tpot))
        return max((v / b - 1.0 for b, v in got if b is not None), default=-1.0)

    hi, lo = top * (1.0 - 1e-9), top * 1e-9
    if margin(hi) <= 0.0:
        return top
    if margin(lo) > 0.0:
        return 0.0
    return brentq(margin, lo, hi, xtol=1e-12 * top, rtol=_RTOL)


def choose_ratio(instances: int, prefill: Pool, decode: Pool, load: Workload, kv_transfer_s: float, *,
                 slo: SLO | None = None, draft: StepCost | None = None) -> tuple[Split, tuple[Split, ...]]:
    """Every split ``x + y = instances`` (x, y ≥ 1) priced in closed form; the best maximises
    output tokens/s per device at the highest rate meeting ``slo`` (ties: fewer prefill
    instances). Returns the best split and all of them, by x."""
    if instances < 2:
        raise UserError(f"{instances} instances: a disaggregated split needs at least 2")
    splits = []
    for x in range(1, instances):
        pre, dec = replace(prefill, instances=x), replace(decode, instances=instances - x)
        devices = x * pre.engine.devices + dec.instances * dec.engine.devices
        rate = best_rate(pre, dec, load, kv_transfer_s, slo, draft)
        splits.append(Split(x, dec.instances, devices, rate, rate * load.osl / devices))
    best = max(splits, key=lambda s: (s.output_tokens_per_s_per_device, -s.prefill_instances))
    return best, tuple(splits)
