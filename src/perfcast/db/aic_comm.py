"""aiconfigurator's measured kernels of the engines' own communication → perfcast kernel types: the
engines' own all-reduce, DeepEP's low-latency all-to-all and the expert compute DeepEP feeds (NCCL's
tables stay with :mod:`perfcast.db.aic_tables`, which says what every converter does and how a row is
kept)."""

from __future__ import annotations

from perfcast.db.aic_tables import COMM, DTYPES, GROUPED, grouped_columns
from perfcast.db.write import Kernel
from perfcast.ir import itemsize


def custom_allreduce(df, framework):
    """The engine's own all-reduce, keyed like the NCCL tables. ``message_size`` is an element
    count (``collector/collect_all_reduce.py`` allocates ``message_size`` elements of
    ``allreduce_dtype``), so bytes = message_size × element size. TensorRT-LLM's rows time its
    ``AllReduce`` op under strategy AUTO (one-shot / two-shot / NCCL chosen per size) captured in
    a CUDA graph interleaved with a small GEMM whose own graph is subtracted; vLLM's and SGLang's
    time ``tensor_model_parallel_all_reduce`` (the custom all-reduce, falling back where the
    engine does) replayed in a CUDA graph (``*_graph``) and called eagerly (``*_eager``, host
    dispatch included): the eager rows are ``CustomAllReduceEager``."""
    eager = df.kernel_source.str.endswith("_eager")
    how = ("num_gpus -> devices, allreduce_dtype -> dtype, bytes = message_size (an element count) x "
           "dtype size; ")
    out = []
    for name, rows, what in (("CustomAllReduce", df[~eager], "CUDA-graph rows (kernel_source without _eager)"),
                             ("CustomAllReduceEager", df[eager], "eager rows (kernel_source *_eager)")):
        if name == "CustomAllReduceEager" and not len(rows):
            continue
        k = Kernel(name, COMM, ("bytes",), selection=how + what,
                   comment=f"the engine's own all-reduce ({'eager' if 'Eager' in name else 'CUDA graph'}), "
                           "within one node")
        size = rows.allreduce_dtype.map(DTYPES).map(lambda d: float(itemsize(d)) if isinstance(d, str) else 0.0)
        out.append((k, rows.assign(devices=rows.num_gpus, dtype=rows.allreduce_dtype,
                                   bytes=(rows.message_size * size).round().astype("int64"))))
    return out


#: the keys of DeepEP's low-latency dispatch and combine: the ranks of the exchange, the dtype on the
#: wire (the dispatch casts to FP8, the combine sends bf16), a rank's tokens and their top-k copies, the
#: hidden width, the routed experts
DEEPEP = ("devices", "dtype", "tokens", "top_k", "hidden", "experts")
#: GPUs of one node the DeepEP collector runs over ("full node: 4 on GB200, 8 on B200/H200",
#: ai-dynamo/aiconfigurator collector/wideep/sglang/collect_deepep_ll.py): a GB200 / GB300 node is
#: one 4-GPU compute tray of the NVL72 rack
DEEPEP_NODE_GPUS = {"GB200": 4, "GB300": 4}


def deepep_low_latency(df, framework):
    """DeepEP's low-latency (decode) dispatch and combine, one row per phase. What a row times —
    aiconfigurator's collector (``collector/wideep/sglang/collect_deepep_ll.py``, DeepEP's own
    ``test_low_latency.py``): every GPU of one node is a rank of one EP group; each rank dispatches
    ``num_token`` tokens, every one to its ``num_topk`` experts drawn at random over ``num_experts``
    (one copy per selected expert, FP8 with its 1×128 scales: ``use_fp8=True``), and combines the
    expert outputs back in bf16; the dispatch and combine kernels are timed apart (``bench_kineto``)
    with SGLang's receive capacity of 128 tokens a rank (``SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK``).

    perfcast's keys: ``devices`` = the node's GPUs (:data:`DEEPEP_NODE_GPUS`, else 8: the table does
    not state them); ``dtype`` = what the phase sends (``fp8`` dispatch, ``bf16`` combine);
    ``tokens`` = num_token (a rank's); ``top_k``, ``hidden``, ``experts``; latency = the phase's
    ``*_avg_t_us``."""
    gpus = df.device.map(lambda d: next((n for k, n in DEEPEP_NODE_GPUS.items() if k in str(d)), 8))
    k = Kernel("DeepEPLowLatency", DEEPEP, ("tokens",),
               selection="every row, twice: the dispatch (dtype fp8, dispatch_avg_t_us) and the combine (dtype "
                         "bfloat16, combine_avg_t_us); num_token -> tokens (a rank's), num_topk -> top_k, "
                         "hidden_size -> hidden, num_experts -> experts, devices = the node's GPUs (4 on GB200 "
                         "and GB300, else 8: collector/wideep/sglang/collect_deepep_ll.py runs on every GPU of "
                         "one node)",
               comment="DeepEP low-latency dispatch / combine (an engine's MoE all-to-all in decode): map it\n"
                       "from an engine profile that runs DeepEP")
    base = df.assign(devices=gpus, tokens=df.num_token, top_k=df.num_topk, hidden=df.hidden_size,
                     experts=df.num_experts)
    import pandas as pd

    rows = pd.concat([base.assign(dtype="fp8", latency=base.dispatch_avg_t_us / 1000.0),
                      base.assign(dtype="bfloat16", latency=base.combine_avg_t_us / 1000.0)], ignore_index=True)
    return [(k, rows)]


def moe_deepep(df, framework):
    """SGLang's expert compute behind DeepEP's low-latency dispatch (``DeepEPMoE.run_moe_core``: DeepGEMM's
    masked grouped GEMM over the rank's experts, block-scaled FP8), one rank of a ``moe_ep_size`` group on
    one GPU (aiconfigurator ``collector/wideep/sglang/collect_deepep_moe.py``, decode cases: 1-128 tokens a
    rank, the dispatch buffers holding 128). ``num_tokens`` is the group's tokens (a rank's times the EP
    size), as the other MoE tables count them; ``uniform`` gives every local expert the same share
    (``num_tokens · topk / num_experts``, or one token each to ``num_tokens · topk`` experts when that is
    below one): perfcast's ``balanced`` routing. Keyed like ``GroupedMatMul``."""
    k = Kernel("GroupedMatMulDeepEP", GROUPED, ("tokens",),
               selection="every row; num_tokens -> tokens (the MoE group's: a rank's decode batch x moe_ep_size), "
                         "hidden_size -> hidden, inter_size / moe_tp_size -> inter, num_experts -> experts, topk -> "
                         "top_k, moe_tp_size -> moe_tp, moe_ep_size -> moe_ep, distribution -> routing (uniform -> "
                         "balanced: every local expert the same share), moe_dtype -> dtype",
               comment="SGLang's DeepEP MoE expert compute (masked grouped GEMM) in decode: map it from an engine\n"
                       "profile that runs DeepEP")
    return [(k, grouped_columns(df, df.distribution.where(df.distribution != "uniform", "balanced")))]
