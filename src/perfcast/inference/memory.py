"""Memory per device for one serving step: weights, KV cache, peak activations, reserved.

- Weights: every parameter once (tied embeddings once), each matmul weight in the format its
  quantization stores it in, scales and zero points included (:mod:`perfcast.capture.quant`:
  the checkpoint's or ``--quantize``'s; embeddings, norms, biases and routers in the model dtype).
- KV cache: what the step's attention reads after writing the new tokens — per layer, sequences
  × KV heads × cached tokens (capped by a sliding window) × bytes per entry.
- Activations: live ranges over the captured op sequence (a tensor lives from the op that
  produces it to the last op that reads it; views share their base's storage); the peak is the
  largest sum of live tensors. Layers run one after another, so one pass per layer kind covers it.
- Reserved: the share of device memory a serving engine leaves unused (vLLM's
  ``gpu_memory_utilization`` defaults to 0.9: 10 % reserved).
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy

from perfcast.capture.lower import FREE, Lowered
from perfcast.capture.quant import QuantPlan, param_format
from perfcast.capture.types import Capture, storage_roots
from perfcast.ir import Leaf, itemsize, walk
from perfcast.capture.mixer_kinds import KINDS as MIXER_KINDS
from perfcast.ir.rules import attended_keys, cache_entry_bytes
from perfcast.ir.rules_mixers import cache_bytes


@dataclass(frozen=True)
class MemoryReport:
    capacity_bytes: int
    weights_bytes: int
    kv_cache_bytes: int
    kv_cache_bytes_per_token: int
    activation_peak_bytes: int
    reserved_bytes: int
    parameters: int

    @property
    def used_bytes(self) -> int:
        return self.weights_bytes + self.kv_cache_bytes + self.activation_peak_bytes + self.reserved_bytes

    @property
    def free_bytes(self) -> int:
        """What is left when the step fits; 0 when it does not (then :attr:`shortfall_bytes`)."""
        return max(0, self.capacity_bytes - self.used_bytes)

    @property
    def shortfall_bytes(self) -> int:
        """What is missing when the step does not fit; 0 when it does."""
        return max(0, self.used_bytes - self.capacity_bytes)

    @property
    def fits(self) -> bool:
        return self.used_bytes <= self.capacity_bytes

    def as_dict(self) -> dict:
        return {"capacity_bytes": self.capacity_bytes, "weights_bytes": self.weights_bytes,
                "kv_cache_bytes": self.kv_cache_bytes,
                "kv_cache_bytes_per_token": self.kv_cache_bytes_per_token,
                "activation_peak_bytes": self.activation_peak_bytes,
                "reserved_bytes": self.reserved_bytes, "free_bytes": self.free_bytes,
                "fits": self.fits, "shortfall_bytes": self.shortfall_bytes,
                "parameters": self.parameters}


def weights(capture: Capture, plan: QuantPlan | None, share=None) -> tuple[int, int]:
    """(parameter count, weight bytes) on one device; ``share(name)`` is the fraction of each
    parameter the device holds (a parallel plan's: 0 for another pipeline stage's layers, 1/ep
    for stacked experts), all of it by default. Every layer's parameters are resolved by their
    own names, so a checkpoint that quantizes layers differently is counted exactly."""
    count, total = 0, sympy.Integer(0)
    for name, meta in capture.params.items():
        n = meta.numel * (share(name) if share else 1)
        count += int(sympy.ceiling(n))
        fmt = param_format(plan, capture, name)
        total += n * itemsize(fmt.weight if fmt is not None else meta.dtype)
    return count, int(sympy.ceiling(total))


def kv_cache(lowered: Lowered, point: dict) -> tuple[int, int]:
    """(KV cache bytes at the point, bytes per cached token without windows)."""
    total, per_token = sympy.Integer(0), sympy.Integer(0)
    for v in walk(lowered.graph):
        leaf = v.op
        if isinstance(leaf, Leaf) and leaf.kind in MIXER_KINDS:  # sparse-attention caches, recurrent states
            token, sequence, seqs, cached = cache_bytes(leaf)
            total += v.trips * seqs * (cached * token + sequence)
            per_token += v.trips * token
            continue
        if not isinstance(leaf, Leaf) or leaf.kind != "attention":
            continue
        q = leaf.inputs[0]
        entry = cache_entry_bytes(leaf.inputs, dict(leaf.attrs))
        total += v.trips * q.shape[0] * attended_keys(q.shape[2], leaf.attr("past"), leaf.attr("window")) * entry
        per_token += v.trips * entry
    return int(sympy.sympify(total).subs(point)), int(sympy.sympify(per_token).subs(point))


def activation_peak(capture: Capture, point: dict | None = None) -> int:
    """Peak bytes of live non-parameter tensors over the captured op sequence (a symbolic
    capture is evaluated at ``point``, dim → value)."""
    records = capture.records
    root = storage_roots(records, FREE)
    size: dict[int, int] = {}
    last: dict[int, int] = {}
    for i, r in enumerate(records):
        for t in (*r.inputs, *r.outputs):
            if not t.is_param:
                size.setdefault(root[t.uid], int(capture.at(t.numel * itemsize(t.dtype), point)))
                last[root[t.uid]] = i
    live, peak, born = 0, 0, set()
    ends: dict[int, list[int]] = {}
    for uid, i in last.items():
        ends.setdefault(i, []).append(uid)
    for i, r in enumerate(records):
        for t in (*r.inputs, *r.outputs):
            if t.is_param:
                continue
            rid = root[t.uid]
            if rid not in born:
                born.add(rid)
                live += size[rid]
        peak = max(peak, live)
        for rid in ends.get(i, ()):
            live -= size[rid]
    return peak

