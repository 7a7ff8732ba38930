"""Cut the small real slices of aiconfigurator-core 0.12.0's tables the tests import.

The tests never need the package: ``tests/fixtures/aiconfigurator/`` holds a few rows of each
table kind the importer converts, copied verbatim (every column) from the package's parquet
files as CSV, laid out like ``systems/data/``; ``tests/test_db_shipped.py`` turns them back into
parquet, imports them and checks the result against the shipped databases.

Run: ``python tools/slice_aiconfigurator.py --aic-root PATH/aiconfigurator_core``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

OUT = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "aiconfigurator"

#: (table path under systems/data, pandas query selecting the rows)
SLICES = (
    ("h200_sxm/gemm/trtllm/1.3.0rc20/gemm_perf.parquet", "n == 4096 and k == 4096 and m in (1, 8, 16, 4096)"),
    ("b200_sxm/gemm/trtllm/1.3.0rc20/gemm_perf.parquet", "n == 4096 and k == 4096 and m in (8, 16)"),
    ("a100_sxm/gemm/trtllm/1.0.0/gemm_perf.parquet", "n == 4096 and k == 4096 and m in (8, 16)"),
    ("h200_sxm/attention/trtllm/1.3.0rc20/context_attention_perf.parquet",
     "num_heads == 32 and num_key_value_heads == 8 and head_dim == 128 and window_size == 0 and batch_size in (1, 2) "
     "and isl in (1024, 2048)"),
    ("h200_sxm/attention/trtllm/1.3.0rc20/generation_attention_perf.parquet",
     "num_heads == 32 and num_key_value_heads == 8 and head_dim == 128 and window_size == 0 and batch_size in (8, 16) "
     "and step in (1023, 2047)"),
    ("h200_sxm/mla/trtllm/1.3.0rc20/context_mla_perf.parquet", "num_heads == 16 and batch_size in (1, 2) and isl in (1024, 2048)"),
    ("h200_sxm/mla/trtllm/1.3.0rc20/generation_mla_perf.parquet",
     "num_heads == 16 and batch_size in (32, 64) and step in (4095, 8191)"),
    ("h200_sxm/moe/trtllm/1.3.0rc20/moe_perf.parquet",
     "hidden_size == 2048 and inter_size == 768 and num_experts == 128 and topk == 8 and num_tokens in (128, 256) "
     "and moe_ep_size == 4 and moe_tp_size == 1"),
    ("h200_sxm/moe/trtllm/1.3.0rc20/moe_perf.parquet",
     "kernel_source == 'moe_torch_flow_nongated' and num_tokens == 256 and moe_ep_size == 1 and moe_tp_size == 1 "
     "and distribution == 'balanced'"),
    ("h200_sxm/moe/trtllm/1.3.0rc20/moe_perf.parquet",
     "moe_dtype == 'w4a16_mxfp4' and num_tokens == 256 and moe_tp_size == 1 and distribution == 'balanced'"),
    ("h200_sxm/comm/trtllm/1.3.0rc20/custom_allreduce_perf.parquet", "num_gpus == 8 and message_size <= 65536"),
    ("h200_sxm/quantize/trtllm/1.3.0rc20/scale_matrix_perf.parquet", "k == 4096 and m in (1, 16, 4096)"),
    ("h200_sxm/quantize/trtllm/1.3.0rc20/computescale_perf.parquet", "k == 4096 and m in (1, 16, 4096)"),
    ("h200_sxm/comm/nccl/2.29.2/nccl_perf.parquet", "num_gpus == 8 and message_size <= 65536"),
    ("b200_sxm/moe/trtllm/1.3.0rc20/moe_perf.parquet",
     "hidden_size == 7168 and inter_size == 2048 and num_experts == 256 and num_tokens in (64, 128) "
     "and moe_ep_size == 8 and moe_tp_size == 1 and moe_dtype == 'nvfp4' and distribution == 'balanced'"),
    ("b200_sxm/attention/trtllm/1.3.0rc20/context_attention_perf.parquet",
     "num_heads == 32 and num_key_value_heads == 8 and head_dim == 128 and window_size == 0 and batch_size == 1 "
     "and isl == 1024"),
    ("b200_sxm/attention/trtllm/1.3.0rc20/generation_attention_perf.parquet",
     "num_heads == 32 and num_key_value_heads == 8 and head_dim == 128 and window_size == 0 and batch_size == 8 "
     "and step == 1023"),
    ("a100_sxm/attention/trtllm/1.0.0/context_attention_perf.parquet",
     "num_heads == 32 and num_key_value_heads == 8 and head_dim == 128 and batch_size == 1 and isl == 1024"),
    ("a100_sxm/attention/trtllm/1.0.0/generation_attention_perf.parquet",
     "num_heads == 32 and num_key_value_heads == 8 and head_dim == 128 and batch_size == 8 and step == 1023"),
    ("h200_sxm/gemm/vllm/0.24.0/gemm_perf.parquet", "n == 4096 and k == 4096 and m in (8, 16)"),
    ("h200_sxm/attention/vllm/0.24.0/context_attention_perf.parquet",
     "num_heads == 32 and num_key_value_heads == 8 and head_dim == 128 and window_size == 0 and batch_size == 1 "
     "and isl in (1024, 2048)"),
    ("h200_sxm/attention/vllm/0.24.0/generation_attention_perf.parquet",
     "num_heads == 32 and num_key_value_heads == 8 and head_dim == 128 and window_size == 0 and batch_size == 8 "
     "and step in (1023, 2047)"),
    ("h200_sxm/comm/vllm/0.24.0/custom_allreduce_perf.parquet", "num_gpus == 8 and message_size <= 65536"),
    ("h200_sxm/gemm/sglang/0.5.14/gemm_perf.parquet", "n == 4096 and k == 4096 and m in (8, 16)"),
    ("h200_sxm/attention/sglang/0.5.14/context_attention_perf.parquet",
     "num_heads == 32 and num_key_value_heads == 8 and head_dim == 128 and window_size == 0 and batch_size == 1 "
     "and isl in (1024, 2048)"),
    ("h200_sxm/attention/sglang/0.5.14/generation_attention_perf.parquet",
     "num_heads == 32 and num_key_value_heads == 8 and head_dim == 128 and window_size == 0 and batch_size == 8 "
     "and step in (1023, 2047)"),
    ("h200_sxm/mla/sglang/0.5.14/context_mla_perf.parquet", "num_heads == 16 and batch_size == 1 and isl in (1024, 2048)"),
    ("b200_sxm/attention/sglang/0.5.14/context_attention_perf.parquet",
     "num_heads == 4 and num_key_value_heads == 1 and head_dim == 128 and window_size == 0 and batch_size == 2 "
     "and isl in (12288, 16384) and attn_dtype == 'bfloat16' and kv_cache_dtype == 'bfloat16'"),
    ("b200_sxm/gemm/sglang/0.5.14/gemm_perf.parquet", "n == 4096 and k == 4096 and m == 16"),
    ("b200_sxm/attention/sglang/0.5.14/generation_attention_perf.parquet",
     "num_heads == 32 and num_key_value_heads == 8 and head_dim == 128 and window_size == 0 and batch_size == 8 "
     "and step == 1023"),
)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--aic-root", type=Path, required=True, help="the aiconfigurator_core package directory")
    args = p.parse_args()
    frames: dict[str, list] = {}
    for rel, query in SLICES:
        frames.setdefault(rel, []).append(pd.read_parquet(args.aic_root / "systems" / "data" / rel).query(query))
    for rel, parts in frames.items():
        path = OUT / rel.replace(".parquet", ".csv")
        path.parent.mkdir(parents=True, exist_ok=True)
        pd.concat(parts).drop_duplicates().to_csv(path, index=False, lineterminator="\n")
        print(f"{path.relative_to(OUT)}: {sum(len(x) for x in parts)} rows")


if __name__ == "__main__":
    main()
