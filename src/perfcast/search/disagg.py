"""The disaggregated half of ``perfcast optimize``'s space: a prefill pool of one instance layout,
a decode pool of another with a batch limit, and every split of the budget between them, screened
by the disaggregated closed form at the highest request rate meeting the SLOs
(:func:`perfcast.serving.meanfield_disagg.best_rate`), the KV transfer priced on the device's
topology (docs/design/search.md)."""

from __future__ import annotations

from dataclasses import replace
from itertools import product

from perfcast.capture.parallel import Layout
from perfcast.ir import UserError
from perfcast.search.optimize import (REASONS, Point, SearchSpec, _chunked, _settings, _slo_miss, deployment_for,
                                      meets, priced, short_of_kv)
from perfcast.search.space import Candidate
from perfcast.serving.serve import Disagg, ServeSpec
from perfcast.serving.step import Deployment
from perfcast.serving.workload import Lengths, Workload


def disagg_spec(spec: SearchSpec, dec: Deployment, pre: Deployment, c: Candidate, rate: float,
                 tier: str) -> ServeSpec:
    """Open loop at ``rate`` requests/s onto ``c.prefill_instances`` prefill and
    ``c.decode_instances`` decode instances (the simulation: enough requests for every decode
    rank to fill its batch ``requests_per_client / 2`` times over — an open loop has no
    synchronised first round to wash out, its warm-up is the first 10 %)."""
    rounds = max(1, spec.requests_per_client // 2)
    n = max(200, rounds * c.batch * dec.layout.dp * max(1, c.decode_instances))
    work = Workload(Lengths("fixed", spec.isl), Lengths("fixed", spec.osl), num_requests=n, rate=rate, seed=spec.seed)
    return ServeSpec(dec, work, max_batch_size=c.batch, max_num_tokens=spec.budget(c),
                     chunked_prefill=_chunked(spec, pre, spec.budget(c)), slo=spec.slo, tier=tier,
                     disagg=Disagg(pre, max(1, c.prefill_instances), max(1, c.decode_instances)))


def _splits(budget: int, pre: int, dec: int) -> list[tuple[int, int]]:
    """Every x prefill and y decode instances (x, y ≥ 1) filling the budget exactly."""
    return [((budget - y * dec) // pre, y) for y in range(1, budget // dec + 1)
            if budget - y * dec >= pre and (budget - y * dec) % pre == 0]


def _usable(spec: SearchSpec, device: str, quantize: str | None, lay: Layout) -> str | None:
    """Why one pool's layout cannot serve (None: it can): pipeline stages (not paired here:
    ``perfcast serve --disagg`` prices such a pool, the search does not enumerate them), or a split
    the model cannot take."""
    if lay.pp > 1:
        return "not_modelled"
    try:
        deployment_for(spec, device, quantize, lay).request(decode=True, batch=2, length=2).validate()
    except UserError:
        return "invalid_layout"
    return None


def screen(spec: SearchSpec, device: str, quantize: str | None, lays: list[Layout]) -> list[Point]:
    """Disaggregated candidates: a prefill pool of one layout, a decode pool of another with a
    batch limit, and every split of the budget between them, each at the highest request rate
    whose mean TTFT and TPOT meet the SLOs in closed form
    (:func:`perfcast.serving.meanfield_disagg.best_rate`), the KV transfer priced on the device's
    topology. A layout the serving layer cannot run as a pool is counted once per batch limit (and
    not at all when the aggregated search counted it already), not once per pairing."""
    from perfcast.serving import meanfield_disagg as mfd
    from perfcast.serving.serve import mean_load
    from perfcast.serving.serve_disagg import pools_of

    out = []
    bad = {lay: _usable(spec, device, quantize, lay) for lay in lays}
    for lay, why in bad.items():
        if why and not (why == "not_modelled" and "agg" in spec.modes):  # counted once, not per pairing
            out += [Point(Candidate("disagg", device, quantize, lay, b, prefill_layout=lay, prefill_instances=1,
                                    decode_instances=1, max_num_tokens=t), why,
                          f"{lay.describe()} as a pool — {REASONS[why]}")
                    for b in sorted(set(spec.batches), reverse=True) for t in spec.budgets]
    good = [lay for lay in lays if not bad[lay]]
    for dl in good:
        for b, t, pl in product(sorted(set(spec.batches), reverse=True), spec.budgets, good):
            nominal = Candidate("disagg", device, quantize, dl, b, prefill_layout=pl, prefill_instances=1,
                                decode_instances=1, max_num_tokens=t)
            splits = _splits(spec.total_devices, pl.num_devices, dl.num_devices)
            if not splits:
                continue   # the pair does not fill the budget: not a candidate
            dec, pre = deployment_for(spec, device, quantize, dl), deployment_for(spec, device, quantize, pl)
            probe = disagg_spec(spec, dec, pre, nominal, 1.0, "closed-form")
            pools, refused = priced(nominal, lambda: pools_of(probe))
            kv = pools.decode[4] if pools else None
            refused = refused or short_of_kv(spec, nominal, kv.capacity_tokens, "the decode KV cache")
            if refused:
                out.append(refused)
                continue
            load = mean_load(probe.workload)
            for x, y in splits:
                c = Candidate("disagg", device, quantize, dl, b, prefill_layout=pl, prefill_instances=x,
                              decode_instances=y, max_num_tokens=t)
                pre_pool = replace(pools.pre_pool, instances=x * pl.dp)
                dec_pool = replace(pools.dec_pool, instances=y * dl.dp)
                kv_s = pools.transfer(spec.isl, x, y).seconds
                rate = mfd.best_rate(pre_pool, dec_pool, load, kv_s, spec.slo, None)
                if rate <= 0.0:
                    out.append(Point(c, "slo", "no request rate meets the SLOs (closed form)",
                                     kv_capacity_tokens=kv.capacity_tokens))
                    continue
                r = mfd.disaggregated(pre_pool, dec_pool, replace(load, rate_per_s=rate * (1 - 1e-6)), kv_s)
                p = Point(c, "ok", closed_form=r, kv_capacity_tokens=kv.capacity_tokens,
                          step_source=pools.decode[2].source, scheduler=_settings(pools.decode[1]))
                if not meets(spec.slo, p.figures()):
                    p.status, p.reason = "slo", _slo_miss(spec.slo, p.figures())
                out.append(p)
    return out
