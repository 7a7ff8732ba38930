"""Kernel class of DeepSeek sparse attention (GLM-5, DeepSeek-V3.2): the token-sparse MLA prefill
kernel, fitted on aiconfigurator-core 0.12.0's measured ``glm5_dsa_attn_module`` tables
(:func:`perfcast.db.aic_tables.sparse_mla`; docs/design/calibration.md, "DSA sparse attention").
Registered in :data:`perfcast.perf.kernel_classes.CLASSES` like the others.

FlashMLA's sparse prefill kernel (deepseek-ai/FlashMLA ``flash_mla_sparse_fwd``, which SGLang's
NSA backend and vLLM run for DSA prefill) serves a fixed tile of query heads per CTA and takes only
multiples of it: a rank's heads are padded to 64 on SM90 and to 128 on SM100 and later before the
call (SGLang ``nsa_backend.py``; the same padding in FlashInfer's SGLang-baseline test,
``required_padding = 128 if device_sm_major >= 10 else 64``). Under tensor parallelism a rank
holds few heads — GLM-5's 64 over TP 8 is 8 — and runs the whole tile: the kernel's work does not
shrink with TP. Every query also walks all ``topk`` index slots, masking the ones past a short
context (the top-k transform fills them with -1): the measured time grows with the tokens and not
with the context (H200, 64 heads: 0.48 ms for 1,024 tokens and 3.96 ms for 8,192, the same at
32,768 tokens of past).
"""

from __future__ import annotations

import sympy

from perfcast.perf.kernel_classes import KernelClass, _ceil, _min, _register
from perfcast.perf.kernel_fit import KernelWork

DSA_KEYS = ("batch", "seq_len", "past", "heads", "topk", "head_dim", "v_head_dim", "dtype")
#: the kernel's q, KV and output are bf16 (the collector's tensors; SGLang dequantizes an fp8
#: cache's selected entries first); its indices int32
ACT_BYTES, INDEX_BYTES = 2, 4
#: FlashMLA's sparse kernels' query-head tile: 64 on SM90, 128 on SM100 and later (module docstring)
HEAD_TILE_SM90, HEAD_TILE_SM100 = 64, 128


def head_tile(device) -> dict:
    """The device's FlashMLA head tile as a shape entry (empty for a device without a CUDA compute
    capability of 9.0 or later, whose kernels pad nothing perfcast knows of)."""
    cc = device.spec.datasheet.compute_capability
    major = int(cc.split(".", 1)[0]) if cc else 0
    if major < 9:
        return {}
    return {"head_tile": HEAD_TILE_SM90 if major == 9 else HEAD_TILE_SM100}


def sparse_prefill_work(s, units: int) -> KernelWork:
    """``batch`` sequences of ``seq_len`` new tokens, each query attending ``topk`` selected latent
    entries with the rank's heads padded to the device's tile (a measured row states the heads the
    kernel ran: :func:`perfcast.db.aic_tables.kernel_heads`): 2·(d_qk + d_v) FLOPs per head and
    slot; HBM: q, the output and the indices once, and each sequence's distinct selected entries,
    at most min(past + S, S·topk), read once."""
    b, n, past, h, k, d, dv = (s[x] for x in ("batch", "seq_len", "past", "heads", "topk", "head_dim", "v_head_dim"))
    tile = s.get("head_tile")
    heads = _ceil(h / tile) * tile if tile else h
    tokens = b * n
    read = b * _min(past + n, n * k) * d * ACT_BYTES
    return KernelWork(flops=2 * tokens * heads * k * (d + dv),
                      bytes=tokens * heads * (d + dv) * ACT_BYTES + tokens * k * INDEX_BYTES + read,
                      axes={"tokens": tokens, "context": past + n})


def sparse_runs(s):
    """Whether the engine runs the sparse kernel for this prefill: SGLang attends a batch whose
    longest context is at most ``index_topk`` tokens densely instead (``MHA_ONE_SHOT``, FlashAttention
    over the decompressed heads: nothing to select; ``SGLANG_NSA_PREFILL_DENSE_ATTN_KV_LEN_THRESHOLD``,
    set to the model's ``index_topk`` in ``server_args.py``), and the sparse kernel above it."""
    context = sympy.sympify(s["past"]) + s["seq_len"]
    return sympy.StrictGreaterThan(context, s["topk"])


DSA_SPARSE_PREFILL = _register(KernelClass(
    "dsa.sparse_prefill", DSA_KEYS, lambda s: str(s["dtype"]), sparse_prefill_work, lambda v: v,
    ("tokens", "context"), device_shape=head_tile, applies=sparse_runs,
    otherwise="dense attention at or below topk cached tokens (SGLang's MHA_ONE_SHOT; the sparse kernel, "
              "dsa.sparse_prefill, runs above), priced by its roofline"))


def dsa_shape(leaf) -> tuple[KernelClass, dict] | None:
    """A ``sparse_attention`` leaf's class and shape in prefill (q (B, H, S, d_qk), v (…, d_v)); a
    one-token step is not this kernel's (module docstring of :func:`perfcast.db.aic_tables.sparse_mla`)."""
    q, v = leaf.inputs[0], leaf.inputs[2]
    b, h, n, d = q.shape
    if n == 1:
        return None
    return DSA_SPARSE_PREFILL, {"batch": b, "seq_len": n, "past": leaf.attr("past"), "heads": h,
                                "topk": leaf.attr("topk"), "head_dim": d, "v_head_dim": v.shape[-1], "dtype": q.dtype}
