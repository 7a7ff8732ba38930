"""Kernel classes of Gated DeltaNet (Qwen3.5, Qwen3-Next): the gated delta rule's chunked scan in
prefill and its one-token recurrence in decode, fitted on aiconfigurator-core 0.12.0's measured
``gdn_perf`` tables (:func:`perfcast.db.aic_tables.gdn`; docs/design/calibration.md, "Gated
DeltaNet"). Registered in :data:`perfcast.perf.kernel_classes.CLASSES` like the others.

The chunked scan (Yang et al., "Parallelizing Linear Transformers with the Delta Rule over
Sequence Length", arXiv:2406.06484, §3.3; FLA ``chunk_gated_delta_rule``, chunk 64) is not a
throughput kernel at serving sizes: its inter-chunk recurrence (FLA ``chunk_gated_delta_rule_fwd_h``,
grid (d_v / BV, sequences × value heads)) walks a sequence's chunks one after another, so a
sequence of S tokens costs ⌈S/64⌉ dependent steps, in waves of as many (sequence, head) programs
as the device has SMs. On B200 at Qwen3.5-397B's TP-8 heads the measured scan takes 57 µs at 1,024
tokens and 329 µs at 8,192 (vLLM 0.24.0 table) where its FLOPs and bytes take a few microseconds.
"""

from __future__ import annotations

from perfcast.ir.rules_mixers import GDN_CHUNK
from perfcast.perf.kernel_classes import KernelClass, _ceil, _register
from perfcast.perf.kernel_fit import KernelWork

GDN_KEYS = ("batch", "seq_len", "k_heads", "v_heads", "head_k", "head_v", "dtype")
#: the scan's activations (q, k, v and the output) are 16-bit; its gates and state fp32 (the
#: collectors' tensors, aiconfigurator ``collector/sglang/collect_gdn.py``; Qwen3.5's
#: ``mamba_ssm_dtype`` float32)
ACT_BYTES, STATE_BYTES = 2, 4


def chunked_work(s, units: int) -> KernelWork:
    """The chunked scan over ``batch`` sequences of ``seq_len`` tokens: the matrix FLOPs of
    :func:`perfcast.ir.rules_mixers._gated_delta_rule`; HBM: q, k, v, the output and the fp32
    gates once, the chunk states FLA hands from its recurrence to its output kernel (bf16,
    written and read) and the final state; serial work: ⌈S/64⌉ chunk steps per wave of
    (sequence, value head) programs."""
    b, n, hk, hv, dk, dv = (s[x] for x in ("batch", "seq_len", "k_heads", "v_heads", "head_k", "head_v"))
    tokens, chunks = b * n, _ceil(n / GDN_CHUNK)
    io = tokens * (2 * hk * dk + 2 * hv * dv) * ACT_BYTES + tokens * hv * 2 * STATE_BYTES
    states = 2 * b * hv * chunks * dk * dv * ACT_BYTES + b * hv * dk * dv * STATE_BYTES
    return KernelWork(flops=tokens * hv * (2 * GDN_CHUNK * (3 * dk + 2 * dv) + 6 * dk * dv), bytes=io + states,
                      items={"steps": chunks * _ceil(b * hv / units), "heads": b * hv},
                      axes={"tokens": tokens, "seq_len": n})


def recurrent_work(s, units: int) -> KernelWork:
    """One token per sequence through the recurrence: each (sequence, value head) state read and
    written in fp32, q, k, v and the output once; one program per (sequence, value head)."""
    b, hk, hv, dk, dv = (s[x] for x in ("batch", "k_heads", "v_heads", "head_k", "head_v"))
    return KernelWork(flops=0, bytes=2 * b * hv * dk * dv * STATE_BYTES + b * (2 * hk * dk + 2 * hv * dv) * ACT_BYTES,
                      items={"heads": b * hv}, axes={"sequences": b, "state": hv * dk * dv})


GDN_CHUNKED = _register(KernelClass("gdn.chunked", GDN_KEYS, lambda s: str(s["dtype"]), chunked_work,
                                    lambda v: v, ("tokens", "seq_len")))
GDN_RECURRENT = _register(KernelClass("gdn.recurrent", GDN_KEYS, lambda s: str(s["dtype"]), recurrent_work,
                                      lambda v: None, ("sequences", "state")))


def gdn_shape(leaf) -> tuple[KernelClass, dict]:
    """A ``gated_delta_rule`` leaf's class and shape: q/k (B, S, H_k, d_k), v (B, S, H_v, d_v)."""
    q, k, v = leaf.inputs[:3]
    b, n, hv, dv = v.shape
    return (GDN_RECURRENT if leaf.attr("decode") else GDN_CHUNKED), {
        "batch": b, "seq_len": n, "k_heads": k.shape[2], "v_heads": hv, "head_k": k.shape[3], "head_v": dv,
        "dtype": leaf.dtype}
