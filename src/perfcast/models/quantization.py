"""Quantization as a checkpoint states it: which linear layers are stored in which format.

A :class:`Scheme` is one storage format — the weights' type with their scales
(:func:`perfcast.ir.dtypes.itemsize` counts them), the type the activations are quantized to
when the format quantizes them, and the two GEMM kernel formats that can run it: the one that
multiplies in the narrow types (``kernel``, on a device with a matrix rate for the activation
type) and the weight-only one that widens the weights inside the GEMM (``weight_only``,
anywhere). The kernel formats are the keys of the calibrated kernel classes and the measured
tables (:data:`perfcast.perf.kernel_classes.GEMM_BYTES`).

A :class:`Quantization` maps each linear layer — by its module path and its module group
(attention, mlp, experts, router, lm_head) — to a scheme or to none (kept in the model dtype).
It is read from a checkpoint's config (:mod:`perfcast.models.quant_configs`) or made by
``--quantize`` (:func:`from_flag`); routers are never quantized (vLLM builds every MoE router
as an unquantized ``ReplicatedLinear(..., quant_config=None)``: vllm/model_executor/models/
deepseek_v2.py, qwen3_moe.py, gpt_oss.py, v0.11), embeddings are lookups, not GEMMs.
"""

from __future__ import annotations

import fnmatch
import functools
import re
from dataclasses import dataclass, field, replace

from perfcast.ir import UserError
from perfcast.ir.dtypes import element

#: Module groups the report lists, in order.
GROUPS = ("attention", "mlp", "experts", "router", "lm_head")
#: Groups ``--quantize GROUP=SCHEME`` may name (routers stay in the model dtype).
FLAG_GROUPS = ("attention", "mlp", "experts", "lm_head")


@dataclass(frozen=True)
class EngineKernel:
    """A kernel an engine picks for a storage format: under ``engine``, where the device
    multiplies ``needs``, for linears of ``groups`` (empty: every group) and, if ``option`` is
    given, with that engine option (name, value) set, it quantizes activations to ``activation``
    and runs the GEMM format ``kernel``."""

    engine: str
    needs: str
    activation: str
    kernel: str
    groups: tuple[str, ...] = ()
    option: tuple[str, str] | None = None

    def applies(self, native: frozenset[str], engine: str | None, group: str | None, options) -> bool:
        return (self.engine == engine and self.needs in native and (not self.groups or group in self.groups)
                and (self.option is None or self.option in options))


@dataclass(frozen=True)
class Scheme:
    name: str
    weight: str  # storage dtype of the weights, scales included
    activation: str | None  # dtype the kernel quantizes activations to; None: weight-only
    kernel: str | None  # GEMM format when the device multiplies in the activation's type
    weight_only: str  # GEMM format that dequantizes the weights inside the kernel
    detail: str
    engine_kernels: tuple[EngineKernel, ...] = ()  # kernels engines pick for this format, first match wins

    def execution(self, native: frozenset[str], engine: str | None = None, group: str | None = None,
                  options: tuple[tuple[str, str], ...] = ()) -> tuple[str, str | None]:
        """(GEMM format, the activation dtype it multiplies in; None: weight-only, in the model
        dtype) on a device whose matrix units take the dtypes ``native``, under ``engine`` with
        its ``options`` (name, value) set, for a linear of module ``group``."""
        for k in self.engine_kernels:
            if k.applies(native, engine, group, options):
                return k.kernel, k.activation
        if self.activation is not None and self.kernel and element(self.activation) in native:
            return self.kernel, self.activation
        return self.weight_only, None


def fp8(activations: bool = True, per: str = "tensor", static: bool = False) -> Scheme:
    """FP8 E4M3 weights with one scale per tensor or per output channel, and (W8A8) activations
    with a per-tensor or per-token scale: one FP8 GEMM whose epilogue applies scalar or vector
    scales (vLLM csrc/quantization/cutlass_w8a8 scaled_mm, TensorRT-LLM FP8 / FP8_PER_CHANNEL_PER_TOKEN).

    ``static``: the checkpoint ships the activations' per-tensor scale (ModelOpt FP8 writes an
    ``input_scale`` per linear; ``activation_scheme: static``). TensorRT-LLM then quantizes with
    that scale instead of computing one per call (tensorrt_llm/_torch/modules/linear.py,
    FP8QDQLinearMethod.apply: ``static_quantize_e4m3_per_tensor`` with the module's input_scale,
    ``quantize_e4m3_per_tensor`` — dynamic — where loading found none and set it to None), which
    its GEMM format ``fp8_static`` prices (:func:`perfcast.db.aic_tables.with_fp8_static`) for
    the dense linears; the fused MoE keeps its own FP8 table. The other engines' FP8 tables were
    measured with dynamic scales and price both."""
    scale = ", static scale" if static and activations and per == "tensor" else ""
    return Scheme("fp8", "fp8", "fp8" if activations else None, "fp8", "w8a16",
                  f"FP8 E4M3 weights (scale per {per})" + (f", FP8 activations{scale}" if activations
                                                             else ", 16-bit activations"),
                  engine_kernels=(EngineKernel("trtllm", "fp8", "fp8", "fp8_static", ("attention", "mlp", "lm_head")),)
                  if scale else ())


def fp8_block(block: tuple[int, int] = (128, 128)) -> Scheme:
    """Block-scaled FP8: one fp32 scale per ``block`` of weights and per 1 × block[1] tile of
    activations, quantized on the fly (DeepSeek-V3 report arXiv:2412.19437 §3.3.2; vLLM
    Fp8LinearMethod with weight_block_size, TensorRT-LLM FP8_BLOCK_SCALES)."""
    n, k = block
    return Scheme("fp8_block", f"fp8+fp32/{n * k}", f"fp8+fp32/{k}", "fp8_block", "w8a16",
                  f"FP8 E4M3, one fp32 scale per {n}×{k} weight block and per 1×{k} activation tile")


def int8() -> Scheme:
    """W8A8 int8 (SmoothQuant-style): per-channel weight and per-token activation scales."""
    return Scheme("w8a8", "int8", "int8", "int8", "w8a16", "INT8 weights (scale per channel), INT8 activations")


def int8_weight_only(group: int | None = None, zero: bool = False, scale: str = "fp16") -> Scheme:
    return Scheme("w8a16", _grouped("int8", group, scale, zero), None, None, "w8a16",
                  "INT8 weights" + _group_text(group, scale, zero) + ", 16-bit activations")


def int4(group: int | None = 128, zero: bool = False, scale: str = "fp16") -> Scheme:
    """4-bit integer weights widened to 16 bits inside the GEMM (AWQ/GPTQ/compressed-tensors
    W4A16: vLLM Marlin, TensorRT-LLM WeightOnlyQuantMatmul)."""
    return Scheme("w4a16", _grouped("int4", group, scale, zero), None, None, "w4a16",
                  "INT4 weights" + _group_text(group, scale, zero) + ", 16-bit activations")


def nvfp4(activations: bool = True) -> Scheme:
    """NVFP4: E2M1 with one E4M3 scale per 16 elements and an fp32 scale per tensor (NVIDIA
    Technical Blog, "Introducing NVFP4", 2025). On Blackwell FP4 × FP4 tensor cores; elsewhere
    weight-only, dequantized in the GEMM (vLLM's Marlin NVFP4 path for devices below SM100:
    vllm/model_executor/layers/quantization/utils/marlin_utils_fp4.py, used by ModelOptNvFp4)."""
    return Scheme("nvfp4", "fp4+fp8/16", "fp4+fp8/16" if activations else None,
                  "fp4" if activations else None, "w4a16_nvfp4",
                  "NVFP4 (E2M1, one E4M3 scale per 16)" + (" weights and activations" if activations else
                                                          " weights, 16-bit activations"))


def mxfp4(activations: str | None = None) -> Scheme:
    """MXFP4: E2M1 with one E8M0 scale per 32 (OCP MX v1.0 §5). gpt-oss's checkpoint states no
    activation quantization: weight-only with bf16 activations (TensorRT-LLM W4A16_MXFP4 MoE,
    also on SM90; vLLM's Marlin / triton_kernels MXFP4 MoE); ``mxfp8`` activations take
    Blackwell's MXFP4 × MXFP8 MoE kernel (TensorRT-LLM W4A8_MXFP4_MXFP8; vLLM's FlashInfer
    TRT-LLM-gen MoE with ``--engine-option moe_mxfp4_activations=mxfp8``)."""
    if activations == "mxfp8":
        return Scheme("mxfp4", "fp4+e8m0/32", "fp8+e8m0/32", "w4a8_mxfp4_mxfp8", "w4a16_mxfp4",
                      "MXFP4 weights (E2M1, one E8M0 scale per 32), MXFP8 activations")
    # TensorRT-LLM quantizes the activations of an MXFP4 checkpoint to MXFP8 on SM ≥ 100 (its
    # default MoE backends) and runs W4A16_MXFP4 below (tensorrt_llm/_torch/model_config.py
    # ModelConfig.get_mxfp4_quant_algo): the FP4 tensor cores are what SM ≥ 100 adds. vLLM keeps
    # bf16 activations on SM100 (SM100_FI_MXFP4_BF16) unless VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8=1
    # selects SM100_FI_MXFP4_MXFP8_TRTLLM (vllm/model_executor/layers/quantization/mxfp4.py
    # get_mxfp4_backend): its experts only
    return Scheme("mxfp4", "fp4+e8m0/32", None, None, "w4a16_mxfp4",
                  "MXFP4 weights (E2M1, one E8M0 scale per 32), 16-bit activations",
                  engine_kernels=(EngineKernel("trtllm", "fp4", "fp8+e8m0/32", "w4a8_mxfp4_mxfp8"),
                                  EngineKernel("vllm", "fp4", "fp8+e8m0/32", "w4a8_mxfp4_mxfp8", ("experts",),
                                               ("moe_mxfp4_activations", "mxfp8"))))


def _grouped(elem: str, group: int | None, scale: str, zero: bool) -> str:
    if not group:
        return elem  # per-channel scales: not a per-element cost
    return f"{elem}+{scale}/{group}" + (f"+{elem}/{group}" if zero else "")


def _group_text(group, scale, zero) -> str:
    if not group:
        return " (scale per channel)"
    return f" (one {scale} scale{' and zero point' if zero else ''} per {group})"


#: ``--quantize`` schemes (one name each).
FLAG_SCHEMES = {
    "fp8": fp8(static=True), "fp8_dynamic": fp8(), "fp8_block": fp8_block(), "w8a8": int8(), "w8a16": int8_weight_only(),
    "w4a16": int4(), "fp4": nvfp4(), "mxfp4": mxfp4(),
}


@dataclass(frozen=True)
class Rule:
    """Linear layers matching ``pattern`` (in the checkpoint's own syntax, see :func:`matches`)
    take ``scheme`` (None: kept in the model dtype)."""

    pattern: str
    scheme: Scheme | None
    syntax: str = "hf"  # hf | glob | compressed-tensors


@dataclass(frozen=True)
class Quantization:
    """How a model's linear layers are stored. ``default``: the scheme of a quantizable linear
    no rule names; ``rules``: first match wins; ``groups``: whole groups set by ``--quantize
    GROUP=SCHEME`` (they win over everything); ``lm_head``: whether the default reaches the
    logits GEMM (only where the method says so). ``kv_cache``: the KV-cache dtype stated."""

    method: str
    source: str
    default: Scheme | None = None
    rules: tuple[Rule, ...] = ()
    lm_head: bool = False
    kv_cache: str | None = None
    groups: tuple[tuple[str, Scheme | None], ...] = ()
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def quantized(self) -> bool:
        return self.default is not None or any(s for _, s in self.groups) or any(r.scheme for r in self.rules)

    def scheme(self, module: str, group: str) -> Scheme | None:
        """The scheme of the linear ``module`` of ``group`` (None: the model dtype)."""
        if group == "router":
            return None
        for g, s in self.groups:
            if g == group:
                return s
        names = candidates(module, group)
        for rule in self.rules:
            if any(matches(rule.pattern, n, rule.syntax) for n in names):
                return rule.scheme
        if group == "lm_head" and not self.lm_head:
            return None
        return self.default

    def with_groups(self, groups: dict[str, Scheme | None], source: str) -> "Quantization":
        return replace(self, groups=tuple({**dict(self.groups), **groups}.items()),
                       method=f"{self.method} with {source}" if self.quantized else source,
                       source=f"{self.source}; {source}" if self.quantized else source)


def candidates(module: str, group: str) -> tuple[str, ...]:
    """The checkpoint module names a captured module stands for: stacked experts stand for every
    expert's projections (checkpoints name them ``experts.N.gate_proj`` …, Mixtral ``w1/w2/w3``),
    MLA's absorbed per-head GEMMs for ``kv_b_proj``, whose weight they multiply by."""
    if group == "experts":
        return (module, *(f"{module}.0.{p}" for p in ("gate_proj", "up_proj", "down_proj", "w1", "w2", "w3")))
    if group == "attention" and module.endswith("self_attn"):
        return (module, f"{module}.kv_b_proj")
    return (module,)


def matches(pattern: str, module: str, syntax: str = "hf") -> bool:
    """Whether a checkpoint's exclusion/target ``pattern`` names ``module``:

    - ``hf`` (transformers 5.24 quantizers_utils.should_convert_module): a regex matched from
      the start up to a module boundary, or a suffix of the name;
    - ``glob`` (ModelOpt ``exclude_modules``, read with fnmatch as vLLM's modelopt.py does);
    - ``compressed-tensors``: ``re:``-prefixed regexes (``re.match``), else an exact module
      name or a suffix of it; the class name ``Linear`` names every linear layer.
    """
    if syntax == "glob":
        return fnmatch.fnmatchcase(module, pattern) or module == pattern.rstrip("*").rstrip(".")
    if syntax == "compressed-tensors":
        if pattern.startswith("re:"):
            regex = _regex(pattern[3:])
            if regex is None:
                raise UserError(f"quantization ignore pattern {pattern!r}: not a regular expression")
            return regex.match(module) is not None
        return pattern == "Linear" or module == pattern or module.endswith("." + pattern)
    regex = _regex(rf"(?:{pattern})(?:(?<=\.)|(?=\.|$))")
    if regex is None:
        return module == pattern or module.startswith(pattern + ".")
    return regex.match(module) is not None or module.endswith(pattern)


@functools.lru_cache(maxsize=None)
def _regex(pattern: str) -> re.Pattern | None:
    """``pattern`` compiled once (None: not a regex). A checkpoint can list more patterns than
    ``re``'s own cache keeps (GLM-5-FP8's ``modules_to_not_convert`` names 712 modules, past its
    512), which would recompile every one for every module a capture quantizes."""
    try:
        return re.compile(pattern)
    except re.error:
        return None


def group_of(module: str, *, experts: bool = False) -> str:
    """The module group of a linear layer from its path (Hugging Face decoders share the
    naming: ``model.layers.N.self_attn.q_proj``, ``…mlp.gate``, ``…mlp.experts``, ``lm_head``).
    ``experts``: the layer is the stacked routed experts."""
    last = module.rsplit(".", 1)[-1]
    if module == "lm_head" or last == "lm_head":
        return "lm_head"
    if experts:
        return "experts"
    if last in ("gate", "router") and re.search(r"\.(mlp|block_sparse_moe|feed_forward)\.", module + "."):
        return "router"
    if re.search(r"\.(self_attn|attention|attn)(\.|$)", module):
        return "attention"
    return "mlp"


def none(source: str) -> Quantization:
    return Quantization("none", source)


def from_flag(text: str, base: Quantization | None = None) -> Quantization:
    """``--quantize SCHEME`` (every linear but routers and lm_head, replacing the checkpoint's),
    ``--quantize none`` (the model dtype throughout) or ``--quantize GROUP=SCHEME[,…]`` (those
    groups only; the others as ``base``, the checkpoint's, says)."""
    text = text.strip()
    known = ", ".join(("none", *FLAG_SCHEMES))
    if "=" not in text:
        if text == "none":
            return none("--quantize none")
        if text not in FLAG_SCHEMES:
            raise UserError(f"--quantize {text!r}: expected one of {known}, or GROUP=SCHEME[,GROUP=SCHEME] "
                            f"with GROUP in {', '.join(FLAG_GROUPS)}")
        s = FLAG_SCHEMES[text]
        return Quantization(f"--quantize {text}", f"--quantize {text}", default=s)
    groups: dict[str, Scheme | None] = {}
    for part in text.split(","):
        g, _, name = part.partition("=")
        g, name = g.strip(), name.strip()
        if g not in FLAG_GROUPS:
            raise UserError(f"--quantize {text!r}: unknown group {g!r} (expected {', '.join(FLAG_GROUPS)})")
        if name != "none" and name not in FLAG_SCHEMES:
            raise UserError(f"--quantize {text!r}: {g}={name!r}: expected one of {known}")
        if g in groups:
            raise UserError(f"--quantize {text!r}: group {g} given twice")
        groups[g] = None if name == "none" else FLAG_SCHEMES[name]
    return (base or none("checkpoint unquantized")).with_groups(groups, f"--quantize {text}")
