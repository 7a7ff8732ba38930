"""The launch mode of a step under an engine profile: CUDA-graph replay up to the engine's
largest captured graph, eager launches (with the host's per-launch time) otherwise, or one
compiled program (XLA). The roll-up prices it (:class:`perfcast.rollup.LaunchModel`)."""

from __future__ import annotations

from dataclasses import dataclass

import sympy

from perfcast.engines.spec import EngineProfile
from perfcast.hardware.device import exact
from perfcast.ir import UserError


@dataclass(frozen=True)
class Launch:
    mode: str  # cuda_graph | eager | compiled
    host_interval_s: sympy.Expr
    description: str  # one line for the report
    host_source: str = ""


def with_cuda_graphs(profile: EngineProfile, sequences: int, device) -> EngineProfile:
    """``profile`` with its decode CUDA graphs captured up to ``sequences`` (0: none, every decode
    step eager) — the user's launch setting: TensorRT-LLM ``cuda_graph_config.max_batch_size`` (or
    the largest of its ``batch_sizes``), SGLang ``--cuda-graph-max-bs``, vLLM
    ``max_cudagraph_capture_size``; one line for an engine that captures no decode graphs, or no
    host launch interval to price eager steps with."""
    flag = f"--cuda-graph-max-batch-size {sequences}"
    mode = profile.launch.decode
    if mode.mode != "cuda_graph":
        raise UserError(f"{flag}: engine {profile.name} launches its decode steps {mode.mode}, not as CUDA graphs")
    if sequences == 0 and device.spec.vendor not in profile.launch.host_launch_interval_s:
        raise UserError(f"{flag}: engine {profile.name} has no host launch interval for {device.spec.vendor} "
                        f"devices to price eager decode steps with")
    source = f"{flag} (the deployment's own launch setting)"
    decode = (mode.model_copy(update={"mode": "eager", "max_tokens": None, "max_tokens_by_device": {},
                                      "sources": [source]}) if sequences == 0 else
              mode.model_copy(update={"max_tokens": sequences, "max_tokens_by_device": {}, "sources": [source]}))
    return profile.model_copy(update={"launch": profile.launch.model_copy(update={"decode": decode})})


def launch_for(profile: EngineProfile, *, decode: bool, tokens: int, device) -> Launch:
    """``tokens``: the step's tokens on one device (a decode step: its sequences)."""
    phase = "decode" if decode else "prefill"
    mode = getattr(profile.launch, phase)
    limit = mode.capture_limit(device.name)
    zero = sympy.Integer(0)
    if mode.mode == "cuda_graph" and (limit is None or tokens <= limit):
        return Launch("cuda_graph", zero, f"{phase}: CUDA-graph replay, no host launch per kernel"
                      + (f" (graphs captured up to {limit} tokens)" if limit else ""))
    if mode.mode == "compiled":
        return Launch("compiled", zero, f"{phase}: one compiled program per step, no host launch per kernel")
    host = profile.launch.host_launch_interval_s[device.spec.vendor]
    why = f" ({tokens} tokens > the largest captured graph, {limit})" if mode.mode == "cuda_graph" else ""
    scale = device.spec.datasheet.host_issue_scale
    value, source = _on_host(host, device)
    on_host = "" if scale is None else f" ({scale:g} × the engine's {host.value_s * 1e6:g} µs on {device.name}'s host)"
    return Launch("eager", value, f"{phase}: eager launches{why}; each kernel costs max(its GPU time, "
                  f"launches × {float(value) * 1e6:g} µs host launch interval{on_host})", source)


@dataclass(frozen=True)
class IterationGap:
    value_s: float
    source: str


def iteration_gap(profile: EngineProfile, device) -> IterationGap | None:
    """The GPU idle time the engine's loop adds to each decode step on ``device`` (its datasheet's
    ``host_issue_scale`` for a host slower at running the Python loop), or None where the profile
    states no figure for the device's vendor (none modelled)."""
    gap = profile.launch.iteration_gap_s.get(device.spec.vendor)
    if gap is None:
        return None
    value, source = _on_host(gap, device)
    return IterationGap(float(value), source)


def _on_host(figure, device) -> tuple[sympy.Expr, str]:
    """A profile's host figure on ``device``'s host, with its source: × the datasheet's
    ``host_issue_scale`` where the host runs a Python loop slower than the x86 hosts measured."""
    base, scale = exact(figure.value_s), device.spec.datasheet.host_issue_scale
    if scale is None:
        return base, figure.source
    return base * exact(scale), (f"{figure.source}; × {scale:g} on {device.name}'s host "
                                 f"({device.name}.yaml datasheet.host_issue_scale)")
