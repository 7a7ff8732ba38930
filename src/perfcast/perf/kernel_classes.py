"""Kernel classes: which calibrated fit prices a leaf, and the work it does in that fit's terms.

One rule per class, registered by name. A rule reads a *shape* — the columns a profiling
database keys that kernel on (``M``/``N``/``K`` for a GEMM, ``batch``/``heads``/``kv_len`` …
for attention; the same names :mod:`perfcast.perf.features` reads off a leaf) — and gives the
:class:`~perfcast.perf.kernel_fit.KernelWork` the fitted form prices. The same rule serves both
sides: fitting reads shapes from measured rows (NumPy columns), pricing reads them off a leaf
(SymPy expressions, symbolic sizes allowed), so a fit is always applied to the quantities it was
fitted on.

Byte counts: each kernel reads its inputs and writes its outputs once (what the measured kernels
do: tiled GEMMs and fused attention keep their intermediates on chip). Serial-work counts use the
device's ``compute_units`` (SMs).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import sympy

from perfcast.ir import itemsize
from perfcast.ir.registry import Registry
from perfcast.ir.routing import active_experts
from perfcast.ir.rules import attended_pairs
from perfcast.perf.kernel_fit import KernelWork

Shape = dict[str, object]


def _symbolic(*xs) -> bool:
    return any(isinstance(x, sympy.Basic) and not x.is_number for x in xs)


def _ceil(x):
    return sympy.ceiling(x) if isinstance(x, sympy.Basic) else np.ceil(x)


def _floor(x):
    return sympy.floor(x) if isinstance(x, sympy.Basic) else np.floor(x)


def _min(a, b):
    return sympy.Min(a, b) if _symbolic(a, b) else np.minimum(a, b)


def _max(a, b):
    return sympy.Max(a, b) if _symbolic(a, b) else np.maximum(a, b)


#: residual cells span a factor of 4 on each axis unless a class says otherwise
CELL_LOG2 = 2.0


@dataclass(frozen=True)
class KernelClass:
    """``variant(shape)`` names the fit within the class (the dtype, e.g. ``bf16``); ``work(shape,
    units)`` the priced quantities; ``rate_dtype(variant)`` the datasheet matrix rate the compute
    term is a fraction of (None: a memory-only kernel)."""

    name: str
    keys: tuple[str, ...]
    variant: Callable[[Shape], str]
    work: Callable[[Shape, int], KernelWork]
    rate_dtype: Callable[[str], str | None]
    residual_axes: tuple[str, str] | None
    bandwidth: str = "hbm"  # the datasheet bandwidth the memory term is a fraction of: hbm | link
    min_cell: int = 3  # rows a residual cell needs for its median (sparse sweeps need fewer)
    #: each residual axis's cell width (octaves) and where its first cell starts below the
    #: smallest measured value (octaves): a factor of 4 from that value by default
    cells: tuple[tuple[float, float], tuple[float, float]] = ((CELL_LOG2, 0.0), (CELL_LOG2, 0.0))
    #: the class whose fits price a format this one has no fit of (labelled derived)
    fallback: str | None = None
    #: (format, formats of this class's own fits that price it, in order; derived), before the fallback
    siblings: tuple[tuple[str, tuple[str, ...]], ...] = ()
    #: the priced device's facts the work depends on, added to a leaf's shape when it is priced (a
    #: measured row states its own: the kernel's head tile, for instance)
    device_shape: Callable[[object], Shape] | None = None
    #: where the engine runs this kernel at all: a condition on the shape (True, False or a SymPy
    #: relation); elsewhere the leaf keeps its roofline price, and ``otherwise`` (a note) says why
    applies: Callable[[Shape], object] | None = None
    otherwise: str = ""

    def bandwidth_of(self, device) -> float | None:
        """HBM bandwidth, or for a collective class one device's links summed (per direction, the first
        link type: NVLink on the GPUs); None for a device without links."""
        sheet = device.spec.datasheet
        if self.bandwidth == "link":
            links = list(sheet.links.values())
            return float(links[0].bandwidth_bytes_per_s * links[0].count) if links else None
        return float(sheet.hbm_bandwidth_bytes_per_s)


CLASSES: Registry[KernelClass] = Registry("kernel class")


def _register(cls: KernelClass) -> KernelClass:
    CLASSES.register(cls.name)(cls)
    return cls


# GEMM ---------------------------------------------------------------------------------------
#: bytes per element of (activation, weight, output) by GEMM format — what a measured row of the
#: format reads and writes, and so what its fit was made with. Block-scaled FP8 carries one fp32
#: scale per 128×128 weight block and per 128 activation elements (DeepSeek-V3 report §3.3.2),
#: NVFP4 one fp8 scale per 16 elements (NVIDIA, "Introducing NVFP4", 2025): both well under 4 %
#: of the element bytes. A captured leaf states its own operand dtypes (scales included, see
#: perfcast.ir.dtypes), and its work is counted in those (``bytes_per_element``).
GEMM_BYTES = {
    "bf16": (2, 2, 2), "fp16": (2, 2, 2), "fp32": (4, 4, 4),
    "fp8": (1, 1, 2), "fp8_block": (1 + 4 / 128, 1 + 4 / 128**2, 2), "int8": (1, 1, 2),
    # per-tensor FP8 with the activation scale given (a static-scale checkpoint): the same
    # operands, no scale computation (perfcast.db.aic_tables.with_fp8_static); NVFP4
    "fp8_static": (1, 1, 2), "fp4": (0.5 + 1 / 16, 0.5 + 1 / 16, 2),
    # weight-only: 4- or 8-bit weights (one fp16 scale per 128-element group) dequantized inside
    # the GEMM, 16-bit activations and math
    "w4a16": (2, 0.5 + 2 / 128, 2), "w8a16": (2, 1 + 2 / 128, 2),
    # NVFP4 weights on a device without FP4 tensor cores: widened to bf16 inside the GEMM
    # (vLLM marlin_utils_fp4.py, the Marlin NVFP4 path below SM100)
    "w4a16_nvfp4": (2, 0.5 + 1 / 16, 2),
    # OCP microscaling: one 8-bit exponent scale per 32 elements (OCP MX Formats Specification
    # v1.0, §5): MXFP4 weights with bf16 activations, or with MXFP8 activations
    "w4a16_mxfp4": (2, 0.5 + 1 / 32, 2), "w4a8_mxfp4_mxfp8": (1 + 1 / 32, 0.5 + 1 / 32, 2),
}
GEMM_RATE = {"bf16": "bf16", "fp16": "fp16", "fp32": "tf32", "fp8": "fp8", "fp8_block": "fp8", "fp8_static": "fp8",
             "int8": "int8", "fp4": "fp4", "w4a16": "bf16", "w8a16": "bf16", "w4a16_nvfp4": "bf16",
             "w4a16_mxfp4": "bf16", "w4a8_mxfp4_mxfp8": "fp8"}
#: Where a device has no fit for a format, the nearest fit whose kernel does the same work prices it — with
#: the format's own bytes and rate, labelled derived: a weight-only GEMM widens its weights and multiplies
#: in bf16 (another weight-only kernel, else the bf16 GEMM); block-scaled FP8 is an FP8 GEMM with per-block
#: scaling in its main loop; W8A8 int8 and FP8 run the same 8-bit tensor-core rate on Hopper (NVIDIA H100
#: datasheet: 1,979 TOPS / TFLOPS dense); an FP8 GEMM with a static activation scale is the FP8 GEMM
#: without the scale computation, priced as the (dynamic) FP8 GEMM where a device lacks it: an upper bound.
NEAREST = {
    "w4a16_nvfp4": ("w4a16_mxfp4", "w4a16", "bf16"), "w4a16_mxfp4": ("w4a16", "bf16"),
    "w4a16": ("w4a16_mxfp4", "bf16"), "w8a16": ("bf16",), "fp8_block": ("fp8",), "int8": ("fp8",),
    "fp8_static": ("fp8",), "w4a8_mxfp4_mxfp8": ("w4a16_mxfp4",),
}
#: GEMM formats whose table rows are derived from other measurements, not measured: a price
#: read from them is labelled derived, and the kernel-accuracy benchmark leaves them out
DERIVED_ROWS = {"fp8_static": "the fp8 GEMM's row less ComputeScale at its m x k "
                              "(perfcast.db.aic_tables.with_fp8_static)"}
#: output tile the wave count assumes: CUTLASS/cuBLAS Hopper GEMMs tile the output in
#: 128×128 blocks for all but the smallest problems (NVIDIA CUTLASS 3.x, "Efficient GEMM").
TILE = 128


def _element_bytes(s: Shape):
    """(activation, weight, output) bytes per element: the leaf's own, else the format's."""
    return s.get("bytes_per_element") or GEMM_BYTES[str(s["dtype"])]


def gemm_work(s: Shape, units: int) -> KernelWork:
    m, n, k = s["M"], s["N"], s["K"]
    a, w, o = _element_bytes(s)
    tiles = _ceil(m / TILE) * _ceil(n / TILE)
    return KernelWork(flops=2 * m * n * k, bytes=m * k * a + k * n * w + m * n * o,
                      items={"wave": k * _ceil(tiles / units)}, axes={"M": m, "NK": n * k})


GEMM = _register(KernelClass("gemm", ("M", "N", "K", "dtype"), lambda s: str(s["dtype"]), gemm_work, lambda v: GEMM_RATE[v], ("M", "NK")))


# Attention -----------------------------------------------------------------------------------
ATTENTION_KEYS = ("batch", "heads", "kv_heads", "q_len", "kv_len", "head_dim", "v_head_dim", "window", "dtype", "kv_dtype")
#: Decode attention runs one of two kernel families (TensorRT-LLM docs, "XQA optimization": XQA serves
#: MQA/GQA generation; cpp/tensorrt_llm/kernels/decoderMaskedMultiheadAttention): grouped-query heads (2 to
#: 32 query heads per KV head) run XQA, one CTA per (sequence, KV head) serving the whole group; plain
#: multi-head attention and wider groups run the masked multi-head kernel, one CTA per (sequence, query
#: head). The measured tables show it as two per-CTA costs (H200, 2,048 sequences of 2 tokens: about 36-45
#: ns per (sequence, KV head) for groups 2-32, about 10 ns per (sequence, query head) at group 1 and above
#: 32), and, within a group, a smaller cost per query head (about 1.3 ns with an fp8 cache).
XQA_GROUPS = (2, 32)
#: most KV splits a decode kernel uses for one CTA's sequence (flash-decoding's split-KV)
MAX_SPLITS = 64


def _attention_variant(s: Shape) -> str:
    dt, kv = str(s["dtype"]), str(s["kv_dtype"])
    return dt if kv == dt else f"{dt}+{kv}kv"


def _bytes(dtype) -> float:
    return float(itemsize(str(dtype)))


def context_work(s: Shape, units: int) -> KernelWork:
    b, h, hk, q, kv = s["batch"], s["heads"], s["kv_heads"], s["q_len"], s["kv_len"]
    d, dv, ab, kb = s["head_dim"], s["v_head_dim"], _bytes(s["dtype"]), _bytes(s["kv_dtype"])
    if s.get("causal", True) is False:  # a vision encoder's: every query attends to every key
        pairs = q * kv
    else:
        pairs = attended_pairs(q, kv - q, True, s.get("window") or 0) if _symbolic(q, kv) else \
            _pairs_numeric(q, kv, s.get("window"))
    return KernelWork(flops=2 * b * h * pairs * (d + dv),
                      bytes=b * q * h * (d + dv) * ab + b * hk * kv * (d + dv) * kb,
                      items={"cta": b * h * _ceil(q / TILE)}, axes={"tokens": b * q, "kv_len": kv})


def _pairs_numeric(q, kv, window):
    q, kv = np.asarray(q, dtype=float), np.asarray(kv, dtype=float)
    past = kv - q
    full = q * past + q * (q + 1) / 2
    if window is None or not np.any(window):
        return full
    w = np.where(np.asarray(window) > 0, np.asarray(window, dtype=float), np.inf)
    capped = np.clip(w - past, 0, q)
    return np.where(np.isinf(w), full, capped * past + capped * (capped + 1) / 2 + (q - capped) * w)


def generation_work(s: Shape, units: int) -> KernelWork:
    """One new token per sequence over its cache, or over the last ``window`` tokens of a
    sliding-window layer (as measured: docs/design/calibration.md, "Sliding-window decode")."""
    b, h, hk, kv, w = s["batch"], s["heads"], s["kv_heads"], s["kv_len"], s.get("window")
    if isinstance(w, np.ndarray):
        kv = np.where(w > 0, np.minimum(kv, w), kv)
    elif w:
        kv = _min(kv, w)
    d, dv, ab, kb = s["head_dim"], s["v_head_dim"], _bytes(s["dtype"]), _bytes(s["kv_dtype"])
    group = h / hk
    xqa = (group >= XQA_GROUPS[0]) & (group <= XQA_GROUPS[1]) if isinstance(group, np.ndarray) else \
        XQA_GROUPS[0] <= group <= XQA_GROUPS[1]
    zero = 0 * b
    xqa_ctas = np.where(xqa, b * hk, zero) if isinstance(xqa, np.ndarray) else (b * hk if xqa else zero)
    mmha_ctas = np.where(xqa, zero, b * h) if isinstance(xqa, np.ndarray) else (zero if xqa else b * h)
    splits = _min(_max(_floor(units / (xqa_ctas + mmha_ctas)), 1), MAX_SPLITS)
    # each family has its own fixed cost: a count of one for the kernel that runs
    one = zero + 1
    return KernelWork(flops=2 * b * h * kv * (d + dv),
                      bytes=b * hk * kv * (d + dv) * kb + b * h * (d + dv) * ab,
                      items={"xqa": xqa_ctas, "mmha": mmha_ctas, "heads": b * h, "chain": kv / splits,
                             "mmha_kernel": np.where(xqa, zero, one) if isinstance(xqa, np.ndarray) else
                             (zero if xqa else one)},
                      axes={"sequences": b * hk, "kv_len": kv})


def _phase_rate(v: str) -> str:
    return v.split("+", 1)[0]


CONTEXT = _register(KernelClass("attention.context", ATTENTION_KEYS, _attention_variant, context_work,
                                _phase_rate, ("tokens", "kv_len")))
GENERATION = _register(KernelClass("attention.generation", ATTENTION_KEYS, _attention_variant,
                                   generation_work, _phase_rate, ("sequences", "kv_len")))


# Routed experts ------------------------------------------------------------------------------
MOE_KEYS = ("tokens", "hidden", "inter", "experts", "top_k", "moe_tp", "moe_ep", "dtype")


def moe_work(s: Shape, units: int) -> KernelWork:
    """A gated MoE layer on one device: ``tokens·top_k/moe_ep`` token-expert pairs through gate+up
    (2·hidden·inter) and down (inter·hidden) GEMMs; weights of the experts that receive tokens
    read once (as many as the shape's ``routing`` reaches, balanced — the tables' — when it names
    none: :mod:`perfcast.ir.routing`; or given ``pairs`` and ``active``: benchmarks/moe_routing.py)."""
    t, hid, inter, e, k, ep = (s[x] for x in ("tokens", "hidden", "inter", "experts", "top_k", "moe_ep"))
    a, w, _ = _element_bytes(s)
    pairs = s["pairs"] if "pairs" in s else t * k / ep
    active = s["active"] if "active" in s else active_experts(e / ep, t, k, e, s.get("routing"))
    return KernelWork(flops=2 * pairs * 3 * hid * inter,
                      bytes=active * 3 * hid * inter * w + t * hid * (a + 2),
                      items={"experts": active, "wave": _ceil(pairs / TILE) * hid},
                      axes={"tokens": t, "weights": e / ep * 3 * hid * inter})


MOE = _register(KernelClass("moe", MOE_KEYS, lambda s: str(s["dtype"]), moe_work,
                            lambda v: GEMM_RATE[v], ("tokens", "weights")))
#: TensorRT-LLM's TRTLLM MoE backend (``moe_config.backend: TRTLLM``, TRTLLMGenFusedMoE: routing, FC1 with the gated
#: activation, FC2 and finalize in the trtllm-gen runner, Blackwell only): the same work, its own kernels and so its
#: own fits (aiconfigurator's ``moe_torch_flow_min_latency`` rows, table ``GroupedMatMulMinLatency``). Its unmeasured
#: block-FP8 runner takes this class's NVFP4 fit at its own bytes and rate (derived): the kernel family carries over
#: better than the format (docs/design/engines.md, "Engine options"); other formats take the default backend's.
MOE_TRTLLM_GEN = _register(KernelClass("moe.trtllm_gen", MOE_KEYS, lambda s: str(s["dtype"]), moe_work,
                                       lambda v: GEMM_RATE[v], ("tokens", "weights"), fallback="moe",
                                       siblings=(("fp8_block", ("fp4",)),)))

#: SGLang's expert compute behind DeepEP's low-latency dispatch (``--moe-a2a-backend deepep``, decode: DeepGEMM's
#: masked grouped GEMM over the rank's experts, ``DeepEPMoE.run_moe_core``): the same work, its own kernels and
#: fits (aiconfigurator's ``deepepmoe`` rows, table ``GroupedMatMulDeepEP``, block-scaled FP8 only). NVFP4 experts,
#: which SGLang's recipes run with FlashInfer's CuTe DSL masked GEMM (no table), take its block-FP8 fit at their own
#: bytes and rate (derived): the masked kernel family carries over better than the gather path's NVFP4 kernel, which
#: takes every token of the group; any other format takes ``moe``'s
MOE_DEEPEP = _register(KernelClass("moe.deepep", MOE_KEYS, lambda s: str(s["dtype"]), moe_work,
                                   lambda v: GEMM_RATE[v], ("tokens", "weights"), fallback="moe",
                                   siblings=(("fp4", ("fp8_block",)),)))

# Latent (MLA) attention -----------------------------------------------------------------------
#: FlashMLA's decode kernel serves 64 query heads of one sequence per CTA (deepseek-ai/FlashMLA, flash_mla_with_kvcache:
#: block_size_m 64 over heads); TensorRT-LLM's MLA decode follows it.
MLA_HEADS_PER_CTA = 64


def mla_generation_work(s: Shape, units: int) -> KernelWork:
    """Absorbed MLA decode: every query head reads the one latent cache row per token (``head_dim``
    = kv_lora_rank + rope wide; values its first ``v_head_dim`` columns): it is read once per sequence."""
    b, h, kv = s["batch"], s["heads"], s["kv_len"]
    d, dv, ab, kb = s["head_dim"], s["v_head_dim"], _bytes(s["dtype"]), _bytes(s["kv_dtype"])
    cta = b * _ceil(h / MLA_HEADS_PER_CTA)
    splits = _min(_max(_floor(units / cta), 1), MAX_SPLITS)
    return KernelWork(flops=2 * b * h * kv * (d + dv), bytes=b * kv * d * kb + b * h * (d + dv) * ab,
                      items={"cta": cta, "chain": kv / splits}, axes={"sequences": b, "kv_len": kv})


MLA_CONTEXT = _register(KernelClass("mla.context", ATTENTION_KEYS, _attention_variant, context_work,
                                    _phase_rate, ("tokens", "kv_len")))
MLA_GENERATION = _register(KernelClass("mla.generation", ATTENTION_KEYS, _attention_variant,
                                       mla_generation_work, _phase_rate, ("sequences", "kv_len")))


# Memory-bound kernels ------------------------------------------------------------------------
def vector_work(s: Shape, units: int) -> KernelWork:
    """Elementwise, normalisation, copy and reduction kernels: their HBM bytes, nothing else."""
    return KernelWork(flops=0, bytes=s["bytes"])


VECTOR = _register(KernelClass("vector", ("bytes",), lambda s: "any", vector_work, lambda v: None, None))
#: leaf kinds that run as memory-bound kernels (ir/rules.py kernel-level kinds)
VECTOR_KINDS = frozenset({"elementwise", "copy", "memset", "reduction", "softmax", "norm", "topk",
                          "gather", "scatter", "fused"})


# The engines' own all-reduce -----------------------------------------------------------------
def allreduce_work(s: Shape, units: int) -> KernelWork:
    """One-shot/two-shot all-reduce inside an NVLink domain: ``2(n−1)/n`` of the message over each
    device's links (the nccl-tests bus factor), and ``n − 1`` peer exchanges of latency."""
    n, nbytes = s["devices"], s["bytes"]
    return KernelWork(flops=0, bytes=nbytes * 2 * (n - 1) / n, items={"peers": n - 1},
                      axes={"bytes": nbytes, "devices": n})


#: the tables sweep one axis (bytes, powers of 2) at a few group sizes (2, 4, 8): two rows per residual cell
#: of a factor 4 in bytes, and one cell per group size, centred on it — the engines switch strategy
#: (one-shot, two-shot, NCCL) at message sizes that depend on the group size (TensorRT-LLM's AUTO strategy:
#: cpp/tensorrt_llm/common/customAllReduceUtils.h, by message size and world size), a bend the smooth form
#: cannot follow and a cell shared by two group sizes averages away
ALLREDUCE = _register(KernelClass("allreduce", ("devices", "dtype", "bytes"), lambda s: "any",
                                  allreduce_work, lambda v: None, ("bytes", "devices"), bandwidth="link",
                                  min_cell=2, cells=((2.0, 0.0), (1.0, 0.5))))
#: collective leaf ops priced by the engine's measured all-reduce (an engine profile names its
#: one-shot/two-shot kernels so; the profiling databases map the same names)
CUSTOM_ALLREDUCE_OPS = frozenset({"custom_all_reduce", "custom_all_reduce_eager"})


# DeepEP's low-latency all-to-all -----------------------------------------------------------------
def deepep_selection_bytes(dtype: str, hidden):
    """Bytes DeepEP's low-latency kernels move per selected expert of a token: the dispatch one FP8
    row with its 1×128 fp32 scales and 16 bytes of routing metadata, the combine one bf16 row (the
    bandwidth deepseek-ai/DeepEP ``tests/test_low_latency.py`` reports: ``num_fp8_bytes = hidden +
    hidden / 128 * 4 + 16``, ``num_bf16_bytes = hidden * 2``)."""
    return hidden + hidden / 128 * 4 + 16 if dtype == "fp8" else hidden * itemsize(dtype)


def moe_a2a_work(s: Shape, units: int) -> KernelWork:
    """One rank's dispatch (or combine) of its tokens' top-k copies: every selected expert gets its
    own copy (DeepEP's low-latency mode does not de-duplicate by rank), and the copies for the
    ``(n − 1)/n`` of the experts on other ranks cross NVLink (random routing over ``n`` ranks)."""
    tokens, top_k, hidden, n = s["tokens"], s["top_k"], s["hidden"], s["devices"]
    return KernelWork(flops=0, bytes=tokens * top_k * (n - 1) / n * deepep_selection_bytes(str(s["dtype"]), hidden),
                      axes={"tokens": tokens, "top_k": top_k})


#: the tables sweep a rank's tokens (powers of 2 up to 1,024) at the MoE models' top-k (1-22): one-octave cells
#: on the top-k, centred on the values measured. Its residual holds what the bytes alone do not: a copy per
#: selected expert costs more at a small top-k (k-fold by shape on GB200: 10.3 → 4.9 % median for the combine,
#: 12.7 → 7.6 % for the dispatch, against the same form's residual on tokens × hidden width)
MOE_A2A = _register(KernelClass("moe_a2a", ("devices", "dtype", "tokens", "top_k", "hidden"),
                                lambda s: str(s["dtype"]), moe_a2a_work, lambda v: None, ("tokens", "top_k"),
                                bandwidth="link", min_cell=2, cells=((2.0, 0.0), (1.0, 0.5))))
#: the collective leaf op an engine profile names for DeepEP's low-latency exchange
DEEPEP_LL_OP = "deepep_low_latency"


# The classes of the sequence mixers beyond attention live in their own modules (they import this one),
# registered here
import perfcast.perf.kernel_classes_dsa  # noqa: E402,F401
import perfcast.perf.kernel_classes_gdn  # noqa: E402,F401
