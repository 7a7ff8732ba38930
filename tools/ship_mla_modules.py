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

import argparse
import hashlib
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from ship_dsa_modules import KV, SYSTEMS, sample

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "src" / "perfcast" / "data" / "validation" / "mla_modules.csv"
VERSION = "1.3.0rc20"
HEADS = (16, 32, 64, 128)
GEMM = {"bfloat16": "bf16", "fp8_block": "fp8_block", "nvfp4": "nvfp4"}
COLUMNS = ["device", "phase", "model", "gemm", "kv_dtype", "tp", "heads", "batch", "new_tokens", "past",
           "latency_ms"]


def rows(aic: Path, per_group: int) -> pd.DataFrame:
    from perfcast.inference.silicon import tables

    devices = tables()["systems"]   # aiconfigurator system -> perfcast device, as the validation maps them
    rng = np.random.default_rng(0)
    out = []
    for system in SYSTEMS:
        device = devices[system]["device"]
        for phase in ("generation", "context"):
            t = pd.read_parquet(aic / f"systems/data/{system}/mla/trtllm/{VERSION}/mla_{phase}_module_perf.parquet")
            t = t[(t.op_name == f"mla_{phase}_module") & (t.model == "deepseek-ai/DeepSeek-V3")
                  & t.num_heads.isin(HEADS) & t.gemm_type.isin(GEMM) & (t.tp_size == 1)].assign(kernel_source="")
            for (gemm, kv, heads), g in t.groupby(["gemm_type", "kv_cache_dtype", "num_heads"], sort=True):
                for r in sample(g, per_group, rng).itertuples():
                    out.append((device, "decode" if phase == "generation" else "prefill", "deepseek-v3",
                                GEMM[gemm], KV[kv], 128 // int(heads), int(heads), int(r.batch_size),
                                1 if phase == "generation" else int(r.isl), int(r.step), float(r.latency)))
    return pd.DataFrame(out, columns=COLUMNS)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--aic-root", required=True, type=Path, help="the aiconfigurator_core package folder")
    p.add_argument("--per-group", type=int, default=20)
    a = p.parse_args(argv)
    if not (a.aic_root / "systems" / "data").is_dir():
        print(f"--aic-root {a.aic_root}: no systems/data folder (expected aiconfigurator_core from "
              f"aiconfigurator-core 0.12.0)", file=sys.stderr)
        return 2
    d = rows(a.aic_root, a.per_group)
    d.to_csv(OUT, index=False, float_format="%.6g")
    print(f"{OUT.relative_to(ROOT)}: {len(d)} rows, sha256 {hashlib.sha256(OUT.read_bytes()).hexdigest()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
