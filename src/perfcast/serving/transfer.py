"""The KV-cache transfer of disaggregated serving, priced on the topology.

When a prefill instance has written a prompt's KV cache, the decode instance pulls it before the
request's first decode step (TensorRT-LLM ``tensorrt_llm/_torch/pyexecutor/kv_cache_transceiver.py``
over UCX or NIXL; vLLM's ``NixlConnector``; SGLang's ``disaggregation/mooncake``): every prefill
device sends its shard of the cache (its layers and KV heads) to the decode devices that hold
those layers and heads, all shards at once. The transfer takes the tier that joins the two pools
— the node's NVLink when both pools fit in one NVLink domain, the scale-out network (InfiniBand,
RoCE) otherwise — and one device's shard crosses that tier at the device's bandwidth there:

    t = latency + bytes per device / (links per device × link bandwidth × efficiency)

The efficiency is the tier's measured NCCL ``all_gather`` bandwidth efficiency (simple protocol:
bulk copies) where the topology is calibrated, 1 otherwise (the datasheet; the result says which).
"""

from __future__ import annotations

from dataclasses import dataclass

from perfcast.hardware.topology import Topology


@dataclass(frozen=True)
class Transfer:
    """One request's KV transfer: its seconds, the tier it crossed, and how it was priced."""

    seconds: float
    tier: str
    bytes_per_device: float
    bandwidth_bytes_per_s: float
    source: str


def pool_tier(topology: Topology, prefill_devices: int, decode_devices: int):
    """The innermost tier that holds both pools, devices numbered prefill first then decode
    (a cluster manager packs a deployment's pools next to each other)."""
    total, inner = prefill_devices + decode_devices, 1
    for tier in topology.tiers:
        inner *= tier.size
        if total <= inner:
            return tier
    return topology.tiers[-1]


def kv_transfer(topology: Topology, *, kv_bytes_per_token: float, tokens: int, prefill_devices: int,
                decode_devices: int) -> Transfer:
    """The transfer of ``tokens`` tokens' KV cache. ``kv_bytes_per_token``: one prefill device's
    share (every layer it holds); the busier side (fewer devices) sets the pace."""
    tier = pool_tier(topology, prefill_devices, decode_devices)
    total_bytes = kv_bytes_per_token * prefill_devices * tokens
    per_device = total_bytes / min(prefill_devices, decode_devices)
    calibration = [c for c in tier.calibrated("all_gather") if c.protocol in (None, "simple")]
    efficiency = float(calibration[0].bandwidth_efficiency) if calibration and tier.calibration else 1.0
    bandwidth = tier.links_per_device * float(tier.link_bandwidth_bytes_per_s) * efficiency
    how = (f"{tier.name}: {tier.links_per_device} links × {float(tier.link_bandwidth_bytes_per_s) / 1e9:g} GB/s"
           + (f" × {efficiency:.3g} (NCCL all_gather efficiency measured on this tier)"
              if efficiency != 1.0 else " (datasheet, no calibration on this tier)"))
    return Transfer(float(tier.link_latency_s) + per_device / bandwidth, tier.name, per_device, bandwidth, how)
