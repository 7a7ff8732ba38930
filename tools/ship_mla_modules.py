"""Ship a seeded sample of aiconfigurator's measured MLA attention-module tables (TensorRT-LLM) as validation data.

aiconfigurator-core 0.12.0 times one layer's whole multi-head latent attention module of DeepSeek-V3
under TensorRT-LLM 1.3.0rc20 on each NVIDIA system it ships (``systems/data/<system>/mla/trtllm/
1.3.0rc20/mla_{generation,context}_module_perf.parquet``; collector ``collector/trtllm/
collect_mla_module.py``: TensorRT-LLM's own ``DeepseekV3DecoderLayer`` attention built with dummy
weights on one GPU, ``attn_module.forward`` — the fused q_a / kv_a projection, the latent norms, q_b,
RoPE and the KV-cache write, the W_UK / W_UV products, the attention, o_proj — with the heads of one
tensor-parallel rank and no all-reduce, timed as a CUDA-graph replay by ``benchmark_with_power``).
``benchmarks/mla_module_accuracy.py`` prices the same modules; nothing is fitted to them.

Kept: 16, 32, 64 and 128 heads (tensor parallelism 8, 4, 2, 1 of DeepSeek-V3's 128), every GEMM type
(bf16, block-scaled FP8, NVFP4) and both KV-cache dtypes; at most ``--per-group`` rows per (system,
phase, GEMM type, KV dtype, heads), drawn with ``numpy.random.default_rng(0)`` as the DSA sample is
(``tools/ship_dsa_modules.py``). aiconfigurator's vLLM module tables are not shipped: that collector
builds vLLM's attention module without the ``torch.compile`` pass a served model runs, so its
element-wise ops launch one by one where the served model fuses them. Usage::

    .venv/bin/python tools/ship_mla_modules.py --aic-root PATH/aiconfigurator_core
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd

from ship_dsa_modules import KV, module_tables, sample, ship

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "src" / "perfcast" / "data" / "validation" / "mla_modules.csv"
VERSION = "1.3.0rc20"
HEADS = (16, 32, 64, 128)
GEMM = {"bfloat16": "bf16", "fp8_block": "fp8_block", "nvfp4": "nvfp4"}
COLUMNS = ["device", "phase", "model", "gemm", "kv_dtype", "tp", "heads", "batch", "new_tokens", "past",
           "latency_ms"]


def rows(aic: Path, per_group: int) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    out = []
    path = "systems/data/{}/mla/trtllm/" + VERSION + "/mla_{}_module_perf.parquet"
    for device, phase, t in module_tables(aic, path.format):
        t = t[t.op_name.str.endswith("_module") & (t.model == "deepseek-ai/DeepSeek-V3") & t.num_heads.isin(HEADS)
              & t.gemm_type.isin(GEMM) & (t.tp_size == 1)].assign(kernel_source="")
        for (gemm, kv, heads), g in t.groupby(["gemm_type", "kv_cache_dtype", "num_heads"], sort=True):
            for r in sample(g, per_group, rng).itertuples():
                out.append((device, phase, "deepseek-v3", GEMM[gemm], KV[kv], 128 // int(heads), int(heads),
                            int(r.batch_size), 1 if phase == "decode" else int(r.isl), int(r.step), float(r.latency)))
    return pd.DataFrame(out, columns=COLUMNS)


def main(argv=None) -> int:
    return ship(argv, __doc__.splitlines()[0], rows, OUT, 20)


if __name__ == "__main__":
    sys.exit(main())
