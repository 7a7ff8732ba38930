"""aiconfigurator's measured tables → perfcast kernel types, one converter per source table.

Data only (none of aiconfigurator's code is used): the parquet tables of ``aiconfigurator-core``
0.12.0 (NVIDIA, Apache-2.0), ``systems/data/<system>/<op>/<framework>/<version>/<table>.parquet``.
Their ``latency`` column is in milliseconds; every timing was taken by replaying the kernel in a
CUDA graph (``collector/helper.py``, ``benchmark_with_power``) unless a converter says otherwise.

Each converter turns a source table into rows keyed on the features a perfcast leaf has
(:mod:`perfcast.perf.features`), so that the leaf selects them, and states in ``selection``
which rows it kept and how each column was derived. Its output still carries the source
``kernel_source`` (the kernel each row timed): :func:`convert` keeps one source per key
(:data:`KERNEL_PREFERENCE`), maps dtype names (:data:`DTYPES`) and converts ms to µs.
"""

from __future__ import annotations

from perfcast.db.write import Kernel, finish
from perfcast.ir import UserError, itemsize

#: aiconfigurator dtype names → perfcast's. Block-scaled FP8 keeps a name of its own (``fp8`` is
#: per-tensor scaled FP8); ``fp4`` is NVFP4 (E2M1 values, an E4M3 scale per 16); weight-only
#: formats are named by weight and activation width (``int4_wo`` → ``w4a16``); ``sq``
#: (SmoothQuant, int8 weights and activations) is perfcast's ``int8`` (``--quantize w8a8``);
#: the MXFP4 expert formats keep their source names. Rows of any other name are dropped and
#: listed in MANIFEST.yaml.
DTYPES = {"bfloat16": "bf16", "float16": "fp16", "half": "fp16", "float32": "fp32", "float": "fp32",
          "fp8": "fp8", "fp8_block": "fp8_block", "nvfp4": "fp4", "int8": "int8", "sq": "int8",
          "int8_wo": "w8a16", "int4_wo": "w4a16", "w4a16_mxfp4": "w4a16_mxfp4",
          "w4a8_mxfp4_mxfp8": "w4a8_mxfp4_mxfp8"}

ATTENTION = ("batch", "heads", "kv_heads", "q_len", "kv_len", "head_dim", "v_head_dim", "window",
             "dtype", "kv_dtype")
GROUPED = ("tokens", "hidden", "inter", "experts", "top_k", "moe_tp", "moe_ep", "routing", "dtype")
COMM = ("devices", "dtype", "bytes")

#: Where one key was measured by several kernels, the one kept: the framework's default.
#: SGLang on Blackwell runs its ``trtllm_mha`` backend for standard attention by default (SGLang
#: ``python/sglang/srt/server_args.py``, ``_get_default_attn_backend``: Hopper → fa3, SM100 →
#: trtllm_mha); its B200 tables also time triton and flashinfer for part of those shapes.
KERNEL_PREFERENCE = {("sglang", "ContextAttention"): ("trtllm_mha",),
                     ("sglang", "GenerationAttention"): ("trtllm_mha",)}

#: DeepSeek-V3 MLA widths every MLA table was measured at (aiconfigurator
#: ``collector/trtllm/collect_mla.py`` and ``collector/sglang/collect_mla.py``: kv_lora_rank 512,
#: qk_rope_head_dim 64, qk_nope_head_dim 128, v_head_dim 128).
MLA_RANK, MLA_ROPE, MLA_NOPE, MLA_V = 512, 64, 128, 128

#: The form each MLA kernel source runs a phase in: ``expanded`` — the latent is expanded to
#: per-head K/V (heads = kv_heads, head_dim nope + rope = 192, v 128), as perfcast's prefill leaf;
#: ``absorbed`` — W_UK/W_UV absorbed, one latent KV head (head_dim rank + rope = 576, v 512), as
#: perfcast's decode leaf (``shared_kv``). TensorRT-LLM (``default``) and SGLang's Blackwell
#: ``trtllm_mla`` backend run prefill expanded; SGLang's Hopper FlashAttention MLA path times
#: both phases absorbed (the collectors above; the H200 context rows take about 3× TensorRT-LLM's
#: at 128 heads, as the 1088- vs 320-wide products per score predict).
MLA_FORMS = {"default": {"context": "expanded", "generation": "absorbed"},
             "trtllm_mla": {"context": "expanded", "generation": "absorbed"},
             "flash_attention": {"context": "absorbed", "generation": "absorbed"}}


def gemm(df, framework):
    k = Kernel("MatMul", ("M", "K", "N", "dtype"), ("M", "N", "K"),
               selection="every row; m, n, k -> M, N, K (output M x N, reduction K); gemm_dtype -> dtype "
                         "(bfloat16 bf16, fp8 per-tensor fp8, fp8_block block-scaled fp8_block, nvfp4 fp4, "
                         "int8_wo w8a16, int4_wo w4a16, sq int8)")
    return [(k, df.assign(M=df.m, N=df.n, K=df.k, dtype=df.gemm_dtype))]


def attention(df, framework, decode: bool):
    name = "GenerationAttention" if decode else "ContextAttention"
    k = Kernel(name, ATTENTION, ("batch", "kv_len") if decode else ("batch",),
               {"kv_len": "sqrt"} if decode else {})
    k.comment = ("decode: q_len is always 1, so a prefill leaf (q_len > 1) never matches" if decode else
                 "prefill: q_len == kv_len in every row, so lengths are exact-match only (1-D\n"
                 "interpolation along one length would need rows with the other length fixed)")
    how = ("q_len = 1 (one new token per sequence), kv_len = isl + step" if decode else
           "q_len = isl, kv_len = isl + step (step is 0: no cached prefix)")
    k.selection = (f"beam_width 1 (beam search rows dropped: no perfcast leaf has beams); {how}; num_heads -> "
                   "heads, num_key_value_heads -> kv_heads, v_head_dim = head_dim, window_size -> window "
                   "(0 = full), attn_dtype -> dtype, kv_cache_dtype -> kv_dtype")
    if "window_size" not in df.columns:  # older collectors timed full attention only
        k.selection += "; no window_size column: every row is full attention (window 0)"
        df = df.assign(window_size=0)
    k.counts["dropped_beam_search"] = int((df.beam_width != 1).sum())
    df = df[df.beam_width == 1]
    return [(k, df.assign(batch=df.batch_size, heads=df.num_heads, kv_heads=df.num_key_value_heads,
                          q_len=1 if decode else df.isl, kv_len=df.isl + df.step, v_head_dim=df.head_dim,
                          window=df.window_size, dtype=df.attn_dtype, kv_dtype=df.kv_cache_dtype))]


def mla(df, framework, decode: bool):
    """MLA attention rows as attention features (and ``shared_kv``), in the form the row's kernel
    ran (:data:`MLA_FORMS`); ``num_heads`` is already per device (the collectors log
    ``num_heads // tp_size``), so ``tp_size`` is dropped and rows of one per-device width
    measured under two splits merge."""
    phase = "generation" if decode else "context"
    unknown = sorted(set(df.kernel_source) - set(MLA_FORMS))
    if unknown:
        raise UserError(f"MLA kernel source {', '.join(unknown)}: no known MLA form (expected one of "
                        f"{', '.join(MLA_FORMS)})")
    absorbed = df.kernel_source.map(lambda s: MLA_FORMS[s][phase] == "absorbed")
    name = "GenerationMLA" if decode else "ContextMLA"
    k = Kernel(name, (*ATTENTION, "shared_kv"), ("batch", "kv_len") if decode else ("batch",),
               {"kv_len": "sqrt"} if decode else {},
               comment="DeepSeek MLA (kv_lora_rank 512, rope 64): "
                       + ("absorbed decode over the latent cache" if decode else "prefill"))
    k.selection = (f"q_len = {'1' if decode else 'isl'}, kv_len = isl + step; num_heads (per device) -> heads; "
                   "absorbed rows: kv_heads 1, head_dim 576, v_head_dim 512, shared_kv 1; expanded rows: "
                   "kv_heads = heads, head_dim 192, v_head_dim 128, shared_kv 0 (form per kernel source: "
                   + ", ".join(f"{s} {f[phase]}" for s, f in MLA_FORMS.items()) + "); window 0; mla_dtype -> "
                   "dtype, kv_cache_dtype -> kv_dtype; tp_size dropped (heads are per device)")
    wide, narrow = MLA_RANK + MLA_ROPE, MLA_NOPE + MLA_ROPE
    return [(k, df.assign(batch=df.batch_size, heads=df.num_heads, q_len=1 if decode else df.isl,
                          kv_len=df.isl + df.step, kv_heads=df.num_heads.where(~absorbed, 1),
                          head_dim=absorbed.map({True: wide, False: narrow}),
                          v_head_dim=absorbed.map({True: MLA_RANK, False: MLA_V}), window=0,
                          shared_kv=absorbed.astype(int), dtype=df.mla_dtype, kv_dtype=df.kv_cache_dtype))]


def moe(df, framework):
    """Gated MoE rows at every ``moe_tp_size`` × ``moe_ep_size`` and token distribution.

    What a row times — aiconfigurator's collectors (TensorRT-LLM: ``collector/trtllm/
    collect_moe.py``, ``run_moe_torch``; routing from ``balanced_logits`` / ``power_law_logits``
    in ``collector/helper.py``): one GPU builds the fused MoE module as rank 0 of a
    ``moe_tp × moe_ep`` split — experts ``[0, E/moe_ep)``, ``inter_size/moe_tp`` of each one's
    intermediate — and its timed forward gets ``num_tokens`` tokens, each routed to ``topk`` of
    all E experts, with no communication: the rank computes the token-expert pairs that land on
    its experts (``num_tokens·topk/moe_ep`` under balanced routing). ``num_tokens`` is thus the
    MoE input on one rank — every token of the MoE group (``src/aiconfigurator/sdk/operations/
    moe.py``: ``MoE.query`` asks for ``x · attention_dp_size`` tokens).

    perfcast's keys describe the device's work: ``tokens`` = num_tokens; ``inter`` =
    ``inter_size / moe_tp`` (the width its GEMMs run at); ``experts`` = E (global); ``routing``
    = the token distribution (``balanced``, or power-law skews ``power_law_<alpha>``).
    TensorRT-LLM's optional min-latency MoE path (``moe_torch_flow_min_latency``, a separate view
    in aiconfigurator) is a kernel type of its own, ``GroupedMatMulMinLatency``."""
    spec = dict(keys=GROUPED, axes=("tokens",))
    what = ("gated kernels; num_tokens -> tokens (the MoE input on one rank: every token of the group, routed "
            "over all experts), hidden_size -> hidden, inter_size / moe_tp_size -> inter (per expert, per "
            "device), num_experts -> experts (global), topk -> top_k, moe_tp_size -> moe_tp, moe_ep_size -> "
            "moe_ep, distribution -> routing, moe_dtype -> dtype. A row times rank 0 of the split: experts "
            "[0, E/moe_ep), inter_size/moe_tp of each, and the token-expert pairs routing sends them "
            "(aiconfigurator collector/trtllm/collect_moe.py, run_moe_torch; src/aiconfigurator/sdk/"
            "operations/moe.py, MoE.query)")
    gated = ~df.kernel_source.str.contains("nongated")
    split = df.inter_size % df.moe_tp_size == 0
    fast = df.kernel_source.str.endswith("_min_latency")
    out = []
    for kernel, rows in ((Kernel("GroupedMatMul", **spec, selection="every distribution, every split, " + what),
                          df[gated & split & ~fast]),
                         (Kernel("GroupedMatMulMinLatency", **spec, selection="kernel_source "
                                 "moe_torch_flow_min_latency (TensorRT-LLM's min-latency MoE mode) only; " + what,
                                 comment="TensorRT-LLM's optional min-latency MoE mode: map it from an engine\n"
                                         "profile that enables it"), df[gated & split & fast])):
        kernel.counts.update(dropped_nongated=int((~gated).sum()), dropped_inter_not_split=int((gated & ~split).sum()))
        if len(rows) or kernel.name == "GroupedMatMul":
            out.append((kernel, grouped_columns(rows, rows.distribution)))
    return out


def grouped_columns(rows, routing):
    """A MoE table's rows with the ``GroupedMatMul`` keys (:data:`GROUPED`), ``routing`` the token distribution."""
    return rows.assign(tokens=rows.num_tokens, hidden=rows.hidden_size, inter=rows.inter_size // rows.moe_tp_size,
                       experts=rows.num_experts, top_k=rows.topk, moe_tp=rows.moe_tp_size, moe_ep=rows.moe_ep_size,
                       routing=routing, dtype=rows.moe_dtype)


#: the keys of a Gated DeltaNet kernel (the shape of the scan and of each sequence's state)
GDN = ("batch", "seq_len", "k_heads", "v_heads", "head_k", "head_v", "decode", "dtype")


def gdn(df, framework):
    """Qwen3.5 / Qwen3-Next Gated DeltaNet rows: the gated delta rule over ``batch`` sequences of
    ``seq_len`` new tokens each — the chunked scan in prefill (``GatedDeltaRule``: FLA's
    ``chunk_gated_delta_rule``, vLLM's FlashInfer kernel on Hopper and Blackwell), the one-token
    recurrence in decode (``GatedDeltaRuleDecode``: ``fused_recurrent_gated_delta_rule``, the
    packed-decode variant in vLLM and SGLang). What a row times (aiconfigurator
    ``collector/{sglang,vllm,trtllm}/collect_gdn.py``): bf16 q, k, v (``dtype = torch.bfloat16``),
    fp32 gates and state, the sequences packed varlen; the head counts are per device (the
    collector sweeps each model's heads divided by TP). The same tables' causal-conv1d rows
    (``causal_conv1d_fn`` / ``causal_conv1d_update``) are not kept: perfcast prices that
    memory-bound kernel by its bytes."""
    how = ("batch_size -> batch, seq_len (new tokens per sequence; 1 in decode), num_k_heads -> k_heads, "
           "num_v_heads -> v_heads, head_k_dim -> head_k, head_v_dim -> head_v (heads per device), decode 0 "
           "(context) or 1 (generation: a one-token prefill runs the chunked kernel, not this one), dtype bf16 "
           "(the collectors' activations; the state is fp32)")
    scan = df.kernel_source.str.startswith("chunk_gated_delta_rule")
    step = df.kernel_source.str.startswith("fused_recurrent_gated_delta_rule")
    conv = df.kernel_source.str.startswith("causal_conv1d")
    out = []
    for name, rows, what in (("GatedDeltaRule", df[scan & (df.phase == "context")],
                              "context rows of the chunked scan (kernel_source chunk_gated_delta_rule*)"),
                             ("GatedDeltaRuleDecode", df[step & (df.phase == "generation")],
                              "generation rows of the recurrence (kernel_source fused_recurrent_gated_delta_rule*)")):
        k = Kernel(name, GDN, ("batch", "seq_len") if name == "GatedDeltaRule" else ("batch",),
                   selection=f"{what}; {how}",
                   comment="Gated DeltaNet " + ("chunked prefill scan" if name == "GatedDeltaRule" else
                                                "one-token decode recurrence"))
        k.counts["dropped_causal_conv1d"] = int((conv & (df.phase == ("context" if name == "GatedDeltaRule"
                                                                       else "generation"))).sum())
        out.append((k, rows.assign(batch=rows.batch_size, k_heads=rows.num_k_heads, v_heads=rows.num_v_heads,
                                   head_k=rows.head_k_dim, head_v=rows.head_v_dim,
                                   decode=int(name == "GatedDeltaRuleDecode"), dtype="bfloat16")))
    return out


#: the keys of a sparse-MLA prefill kernel: ``batch`` sequences of ``seq_len`` new tokens over ``past``
#: cached ones, each query attending ``topk`` selected latent entries with ``heads`` query heads
SPARSE_MLA = ("batch", "seq_len", "past", "heads", "topk", "head_dim", "v_head_dim", "dtype")
#: GLM-5's DSA geometry, the one the sparse tables were measured at (aiconfigurator
#: ``collector/sglang/glm5_dsa_sparse_modules.py``, ``_glm5_sparse_config`` from zai-org/GLM-5's
#: config.json: index_topk 2048, kv_lora_rank 512 + qk_rope_head_dim 64 = d_qk 576, d_v 512)
DSA_TOPK, DSA_D_QK, DSA_D_V = 2048, 576, 512
#: the device names of the tables' Hopper (SM90) rows; every other device the tables hold is SM100 or later
HOPPER_DEVICES = ("H100", "H200", "H20", "H800")


def kernel_heads(device: str, native: int) -> int:
    """The query heads ``flash_mla_sparse_fwd`` ran with in a row of the sparse tables: the model's
    own on SM90, 128 (padded) on SM100 and later — the collector's ``q_heads = 128 if sm_major >= 10
    else native_heads`` (``_bench_glm5_dsa_attn``), as SGLang's NSA backend pads a rank's heads for
    FlashMLA's sparse kernels (64 on SM90, 128 on SM100+)."""
    if not device.startswith("NVIDIA "):
        raise UserError(f"sparse-MLA table: device {device!r} is not an NVIDIA GPU (no FlashMLA head padding known)")
    return native if any(h in device for h in HOPPER_DEVICES) else max(native, 128)


def sparse_mla(df, framework):
    """GLM-5's DSA sparse attention as SGLang runs its prefill: ``flash_mla_sparse_fwd`` (FlashMLA's
    token-sparse prefill kernel) over ``batch`` sequences of ``isl`` new tokens with ``step`` cached
    ones, every query reading the ``index_topk`` latent entries its indexer selected (the
    production top-k transform always hands the kernel ``topk`` columns, -1 past a short context).
    What a row times (aiconfigurator ``collector/sglang/glm5_dsa_sparse_modules.py``,
    ``_bench_glm5_dsa_attn``): bf16 q (M = batch·isl tokens, 64 heads on SM90, 128 on SM100+) and
    bf16 latent KV of d_qk 576, d_v 512, replayed in a CUDA graph. Only the prefill rows (isl > 1)
    are kept, ``SparseMLAPrefill``: SGLang decodes DSA with other kernels (FlashAttention-3 for a
    bf16 cache on Hopper, TensorRT-LLM's on Blackwell, FlashMLA's KV-cache kernel for an fp8 cache;
    ``server_args.py`` ``_set_default_nsa_backends``), so the tables' one-token rows time no
    engine's default decode."""
    how = ("batch_size -> batch, isl -> seq_len (new tokens per sequence), step -> past (cached tokens), "
           "heads = the heads the kernel ran (num_heads on SM90, 128 on SM100+: aic_tables.kernel_heads), "
           f"topk {DSA_TOPK}, head_dim {DSA_D_QK}, v_head_dim {DSA_D_V} (GLM-5's index_topk and latent widths), "
           "dtype bf16 (mla_dtype: the kernel's q and KV)")
    prefill = df[df.isl > 1]
    k = Kernel("SparseMLAPrefill", SPARSE_MLA, ("batch", "seq_len"),
               selection=f"rows with isl > 1 (kernel_source flash_mla_sparse_fwd); {how}",
               comment="DSA sparse attention, FlashMLA's token-sparse prefill kernel (GLM-5 geometry)")
    k.counts["dropped_decode_rows"] = int((df.isl <= 1).sum())
    heads = [kernel_heads(str(d), int(n)) for d, n in zip(prefill.device, prefill.num_heads)]
    return [(k, prefill.assign(batch=prefill.batch_size, seq_len=prefill.isl, past=prefill.step, heads=heads,
                               topk=DSA_TOPK, head_dim=DSA_D_QK, v_head_dim=DSA_D_V, dtype=prefill.mla_dtype))]


def quantize(df, framework, op: str):
    """FP8 activation quantization over an m × k operand: ``scale_matrix`` times the static
    quantize (read bf16, write fp8: a memory-bound elementwise kernel); ``compute_scale`` is the
    dynamic quantize's extra time for the scale (TensorRT-LLM ``collector/trtllm/
    collect_computescale.py``: dynamic minus static latency, clipped at 0 — those zero rows are
    the dropped non-positive ones). Keyed as an elementwise leaf whose output is the m × k fp8
    tensor: shape ``MxK``, dtype = quant_dtype."""
    name = {"scale_matrix": "ScaleMatrix", "compute_scale": "ComputeScale"}[op]
    k = Kernel(name, ("shape", "dtype"), selection="every row; shape = 'm x k', quant_dtype -> dtype (the "
               "output's; the input is bf16)" + ("; latency = dynamic - static quantize, a derived "
                                                 "difference: rows at 0 (the dynamic quantize no slower than "
                                                 "the static one) drop as non-positive"
                                                 if op == "compute_scale" else ""),
               comment=("FP8 quantize of an m x k bf16 operand (static scale)" if op == "scale_matrix" else
                        "the dynamic FP8 quantize's scale computation (dynamic - static)"))
    return [(k, df.assign(shape=df.m.astype(str) + "x" + df.k.astype(str), dtype=df.quant_dtype))]


def with_fp8_static(tables: list, framework: str) -> None:
    """TensorRT-LLM's per-tensor FP8 GEMM with a *static* activation scale, derived in place into
    ``MatMul`` as dtype ``fp8_static``: the measured ``fp8`` row minus ``ComputeScale`` at the
    same m × k. aiconfigurator's collector times the fp8 Linear without an ``input_scale``, so
    TensorRT-LLM's FP8QDQ method runs its dynamic quantization and the row includes the scale
    computation (``collector/trtllm/collect_gemm.py``: "the collected fp8 GEMM includes the
    compute-scale overhead. AIC derives fp8_static at query time by subtracting that overhead");
    a checkpoint that ships its activation scales (ModelOpt FP8) skips it. Rows whose m × k has
    no ComputeScale row, or whose difference is not positive, are not derived (counted). Other
    frameworks' FP8 tables are left as measured."""
    if framework != "trtllm":
        return
    found = {k.name: (i, k, df) for i, (k, df) in enumerate(tables)}
    if "MatMul" not in found or "ComputeScale" not in found:
        return
    i, mk, mm = found["MatMul"]
    _, cs_kernel, cs = found["ComputeScale"]
    fp8 = mm[mm.dtype == "fp8"]
    cs = cs[cs.dtype == "fp8"]
    if not len(fp8) or not len(cs):
        return
    import pandas as pd

    m_k = cs["shape"].str.split("x", expand=True).astype("int64")
    scale = pd.DataFrame({"M": m_k[0].to_numpy(), "K": m_k[1].to_numpy(), "scale_us": cs.latency_us.to_numpy()})
    sub = fp8[["M", "K"]].astype("int64").merge(scale, on=["M", "K"], how="left")["scale_us"].to_numpy()
    derived = fp8.assign(dtype="fp8_static", latency_us=fp8.latency_us.to_numpy() - sub,
                         **({"kernel_source": "derived"} if "kernel_source" in fp8.columns else {}))
    matched = ~pd.isna(sub)
    keep = matched & (derived.latency_us.to_numpy() > 0)
    mk.counts["fp8_static_derived"] = int(keep.sum())
    mk.counts["fp8_static_no_compute_scale"] = int((~matched).sum())
    mk.counts["fp8_static_not_positive"] = int((matched & ~keep).sum())
    mk.counts["rows"] += int(keep.sum())
    mk.provenance.setdefault("kernel_sources", {})["derived"] = int(keep.sum())
    mk.selection += ("; fp8_static (derived, TensorRT-LLM): the fp8 row minus ComputeScale at the same m x k "
                     f"({cs_kernel.source}): the static-activation-scale GEMM, as aiconfigurator derives it")
    out = pd.concat([mm, derived[keep]], ignore_index=True).sort_values(list(mk.keys), kind="stable")
    tables[i] = (mk, out[mm.columns].reset_index(drop=True))


def nccl(df, op_name: str, kernel_name: str, source: str):
    """NCCL rows of one collective: bytes = message_size (elements) × dtype size."""
    k = Kernel(kernel_name, COMM, ("bytes",), source=source,
               selection=f"op_name {op_name}; num_gpus -> devices, nccl_dtype -> dtype, "
                         "bytes = message_size (an element count) x dtype size")
    rows = df[df.op_name == op_name]
    k.counts["rows_read"] = len(rows)
    size = rows.nccl_dtype.map(DTYPES).map(lambda d: float(itemsize(d)) if isinstance(d, str) else 0.0)
    nbytes = (rows.message_size * size).round().astype("int64")  # unknown dtypes drop later
    return k, rows.assign(devices=rows.num_gpus, dtype=rows.nccl_dtype, bytes=nbytes)


def one_kernel_per_key(df, kernel: Kernel, framework: str):
    """Where several kernel sources measured one key, keep the preferred one's rows
    (:data:`KERNEL_PREFERENCE`), counting the rest; a collision with no preference stated is an
    error, so new data never mixes two kernels silently."""
    keys = list(kernel.keys)
    sources = df.groupby(keys, sort=False)["kernel_source"].transform("nunique")
    kernel.counts["superseded_other_kernel"] = 0
    if not (sources > 1).any():
        return df
    order = KERNEL_PREFERENCE.get((framework, kernel.name), ())
    rank = df.kernel_source.map(lambda s: order.index(s) if s in order else len(order))
    best = rank.groupby([df[c] for c in keys], sort=False).transform("min")
    clash = (sources > 1) & (best == len(order))
    if clash.any():
        names = sorted(set(df.kernel_source[sources > 1]))
        raise UserError(f"{kernel.name}: {int(clash.sum())} rows share keys across kernel sources "
                        f"{', '.join(names)} and no preference is stated for {framework}")
    keep = (sources == 1) | (rank == best)
    kernel.counts["superseded_other_kernel"] = int((~keep).sum())
    kernel.provenance["preferred_kernel_source"] = list(order)
    return df[keep]


def convert(kernel: Kernel, df, framework: str, dtypes: set[str] | None):
    """Map dtypes (dropping unknown ones and, if given, those outside ``dtypes``), ms → µs, one
    kernel source per key, then :func:`~perfcast.db.write.finish`."""
    kernel.counts["rows_selected"] = len(df)
    dcols = [c for c in ("dtype", "kv_dtype") if c in kernel.keys]
    source, df = df, df.assign(**{c: df[c].map(DTYPES) for c in dcols}, latency_us=df.latency.astype(float) * 1000.0)
    known = df[dcols].notna().all(axis=1)
    kernel.counts["dropped_unknown_dtype"] = int((~known).sum())
    kernel.unknown_dtypes = sorted({str(v) for c in dcols for v in source[c][~known] if v not in DTYPES})
    df = df[known]
    if dtypes is not None:
        keep = df[dcols].isin(dtypes).all(axis=1)
        kernel.counts["dropped_dtype_filter"] = int((~keep).sum())
        df = df[keep]
    if "kernel_source" not in df.columns:
        df = df.assign(kernel_source="unnamed")
    df = one_kernel_per_key(df, kernel, framework)
    return finish(df, kernel)
