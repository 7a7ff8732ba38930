"""``perfcast serve --disagg``: prefill and decode pools, the KV transfer priced on the topology.

The decode pool runs the serve spec's deployment, the prefill pool its own
(:class:`perfcast.serving.serve.Disagg`). Both pools' devices are placed on the deployment's
topology (the device's shipped node, grown to the devices needed), prefill devices first, and a
request's KV cache crosses the tier that joins them (:func:`perfcast.serving.transfer.kv_transfer`).
With ``auto_instances`` the split of that many instances is chosen by the closed form
(:func:`perfcast.serving.meanfield_disagg.choose_ratio`: the most output tokens/s per device at the
highest rate within the SLOs) and then simulated.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from perfcast.hardware.topology import resolve_topology
from perfcast.inference.textgen import default_topology
from perfcast.ir import UserError
from perfcast.serving import meanfield_disagg as mfd
from perfcast.serving.disagg import PoolSpec, simulate_disagg
from perfcast.serving.scheduler import deployment_scheduler
from perfcast.serving.step import compile_step
from perfcast.serving.transfer import kv_transfer


@dataclass(frozen=True)
class Pools:
    """Both pools of a disaggregated spec, compiled: each side's deployment, scheduler, step model,
    memory and KV cache, the closed form's view of one instance of each (``instances`` from the
    spec), and the KV transfer of ``tokens`` between them on a topology of ``x`` prefill and ``y``
    decode instances."""

    prefill: tuple
    decode: tuple
    pre_pool: mfd.Pool
    dec_pool: mfd.Pool
    transfer: object


def pools_of(spec) -> Pools:
    """The pools of ``spec`` (its ``disagg`` set), compiled once; :func:`serve_disagg` and the
    deployment search (:mod:`perfcast.search.optimize`) both start here."""
    from perfcast.serving.serve import _kv_cache, _max_tokens, _rank_devices, engine_config

    d = spec.disagg
    pools = {}
    for role, dep in (("prefill", d.prefill), ("decode", spec.deployment)):
        # an instance of dp ranks is dp engine instances of its tp × pp devices (the load split
        # evenly over the ranks, as in aggregated serving)
        batch = d.prefill_max_batch_size if role == "prefill" else spec.max_batch_size
        sched = deployment_scheduler(dep, max_batch_size=batch, max_num_tokens=spec.max_num_tokens,
                                     chunked_prefill=spec.chunked_prefill, memory_fraction=spec.memory_fraction,
                                     micro_batches=dep.layout.pp, max_prefill_tokens=spec.max_prefill_tokens)
        k = spec.speculative.k if spec.speculative and role == "decode" else 0
        step = compile_step(dep, max_tokens=_max_tokens(sched, spec.workload, k))
        mem, kv = _kv_cache(replace(spec, deployment=dep), sched, step)
        pools[role] = (dep, sched, step, mem, kv)
    (pdep, psched, pstep, pmem, pkv), (ddep, dsched, dstep, _, dkv) = pools["prefill"], pools["decode"]
    kv_bytes = (pmem.kv_bytes_per_token if pmem else pkv.bytes_per_token)
    if not kv_bytes:
        raise UserError("--disagg with --kv-capacity: the KV transfer needs the KV bytes per token of the memory "
                        "model; drop --kv-capacity")
    topo_of = _topology(spec.deployment)

    def transfer(tokens: int, x: int, y: int):
        return kv_transfer(topo_of(x * _rank_devices(pdep) + y * _rank_devices(ddep)), kv_bytes_per_token=kv_bytes,
                           tokens=int(tokens), prefill_devices=_rank_devices(pdep), decode_devices=_rank_devices(ddep))

    x, y = d.prefill_instances * pdep.layout.dp, d.decode_instances * ddep.layout.dp
    pre_pool = mfd.Pool(pstep, engine_config(replace(spec, speculative=None), psched, pkv, pdep), x, d.router)
    dec_pool = mfd.Pool(dstep, engine_config(spec, dsched, dkv, ddep), y, d.router)
    return Pools(pools["prefill"], pools["decode"], pre_pool, dec_pool, transfer)


def serve_disagg(spec):
    from perfcast.serving.serve import ServeReport, _rank_devices, launch_note, mean_load, pipeline_note, unpriced_note

    d = spec.disagg
    p = pools_of(spec)
    (pdep, psched, pstep, _, pkv), (ddep, dsched, dstep, dmem, dkv) = p.prefill, p.decode
    pre_pool, dec_pool, transfer = p.pre_pool, p.dec_pool, p.transfer
    x, y, chosen = pre_pool.instances, dec_pool.instances, None
    isl_mean = round(spec.workload.input_len.mean)
    if d.auto_instances is not None:
        load = mean_load(spec.workload)
        if load.rate_per_s is None:
            raise UserError("--disagg auto: the split is chosen for a request rate; give --request-rate")
        best, splits = mfd.choose_ratio(d.auto_instances, pre_pool, dec_pool, load,
                                        transfer(isl_mean, 1, d.auto_instances - 1).seconds, slo=spec.slo,
                                        draft=spec.speculative.draft_step if spec.speculative else None)
        if pdep.layout.dp > 1 or ddep.layout.dp > 1:
            raise UserError("--disagg auto with --dp-size: choose the split of single-rank instances")
        x, y = best.prefill_instances, best.decode_instances
        chosen = [{"prefill_instances": s.prefill_instances, "decode_instances": s.decode_instances,
                   "devices": s.devices, "requests_per_s": s.rate_per_s,
                   "output_tokens_per_s_per_device": s.output_tokens_per_s_per_device} for s in splits]
    pre_pool, dec_pool = replace(pre_pool, instances=x), replace(dec_pool, instances=y)
    one = transfer(isl_mean, x, y)
    results, trace = {}, None
    if spec.tier in ("simulation", "both"):
        r, trace = simulate_disagg(PoolSpec(pstep, pkv, psched, x, _rank_devices(pdep)),
                                   PoolSpec(dstep, dkv, dsched, y, _rank_devices(ddep)), spec.workload,
                                   transfer_s=lambda n: transfer(n, x, y).seconds, speculative=spec.speculative,
                                   slo=spec.slo, trace=spec.trace, router=d.router)
        results["simulation"] = r
    if spec.tier in ("closed-form", "both"):
        load = mean_load(spec.workload)
        if load.rate_per_s is None:
            if spec.tier == "closed-form":
                raise UserError("--tier closed-form with --disagg: the disaggregated closed form takes a request "
                                "rate (--request-rate)")
        else:
            results["closed form"] = mfd.disaggregated(pre_pool, dec_pool, load, one.seconds, slo=spec.slo,
                                                       draft=spec.speculative.draft_step if spec.speculative else None)
    info = {"prefill_instances": x, "decode_instances": y, "prefill_devices_per_instance": _rank_devices(pdep),
            "decode_devices_per_instance": _rank_devices(ddep), "router": d.router,
            "kv_transfer": {"seconds_at_mean_input": one.seconds, "tier": one.tier,
                            "bytes_per_device": one.bytes_per_device, "bandwidth_bytes_per_s": one.bandwidth_bytes_per_s,
                            "source": one.source},
            "prefill_kv_capacity_tokens": pkv.capacity_tokens, "splits": chosen}
    notes = (f"disaggregated: {x} prefill instance(s) of {pdep.layout.describe()} → {y} decode instance(s) of "
             f"{ddep.layout.describe()}; KV transfer {one.seconds * 1e3:.3f} ms at the mean input over {one.source}",
             *(n for n in (launch_note(pstep, "prefill pool's ", decode=False),
                           launch_note(dstep, "decode pool's ", prefill=False),
                           unpriced_note(pstep, "prefill pool's "), unpriced_note(dstep, "decode pool's "),
                           pipeline_note(psched, "prefill pool's "), pipeline_note(dsched, "decode pool's ")) if n))
    return ServeReport(spec, dsched, dkv, dmem, 1, dstep.source, results, trace, notes, info)


def _topology(dep):
    """A function of the device count: the deployment's topology with room for them."""
    base = resolve_topology(dep.topology) if dep.topology else default_topology(dep.device)
    return lambda n: base.with_devices(n)
