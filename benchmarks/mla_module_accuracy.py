"""DeepSeek-V3's multi-head latent attention, one layer's whole module, priced by perfcast against
TensorRT-LLM's measurements.

aiconfigurator-core 0.12.0 times one layer's MLA module (``attn_module.forward`` of TensorRT-LLM
1.3.0rc20's DeepSeek-V3 attention: the fused q_a / kv_a projection, the latent norms, q_b, RoPE and the
KV-cache write, the W_UK / W_UV products, the attention, o_proj) on six NVIDIA systems, with the heads of
one tensor-parallel rank on one GPU and every shape replayed as a CUDA graph —
``src/perfcast/data/validation/mla_modules.csv``, a seeded sample (``tools/ship_mla_modules.py``;
MANIFEST.yaml ``mla_modules``). perfcast prices the same module from its own lowering of the model: the
leaves of one layer's ``self_attn`` under the trtllm engine profile at the rank's tensor parallelism
(128 / heads), less the all-reduce (one GPU), at the row's GEMM quantization (bf16: ``--quantize
none``; block-scaled FP8: the checkpoint's own; NVFP4: ``--quantize fp4``) and KV-cache dtype, as the
kernels' time with their launch latency (a graph replay). Nothing is fitted to these rows; the same-run
baseline is the naive datasheet roofline of the same leaves.

    python benchmarks/mla_module_accuracy.py [--device gb200 ...] [--json]
"""

from __future__ import annotations

import sys
from importlib import resources
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from dsa_module_accuracy import PRICINGS, _all, figures, price, run  # noqa: E402

#: the row's GEMM type → perfcast's --quantize of deepseek-v3 ("": the checkpoint's own block-scaled FP8)
QUANTIZE = {"bf16": "none", "fp8_block": "", "nvfp4": "fp4"}


def shipped() -> pd.DataFrame:
    return pd.read_csv(str(resources.files("perfcast.data") / "validation" / "mla_modules.csv"))


def priced(rows: pd.DataFrame, pricing: str) -> pd.DataFrame:
    """The rows with perfcast's price of each module (``price_s``, a CUDA-graph replay) and its error."""
    p = price(rows.assign(quantize=rows.gemm.map(QUANTIZE)), pricing, engine="trtllm", stubbed=frozenset(),
              graphed=True)
    return p.assign(err=p.price_s / (p.latency_ms * 1e-3) - 1)


def summary(rows: pd.DataFrame) -> dict:
    """Figures per pricing by phase, by device, by GEMM type, by KV-cache dtype, by heads and by batch."""
    doc = {"rows": int(len(rows)), "pricings": {}}
    for pricing in PRICINGS:
        doc["pricings"][pricing] = figures(priced(rows, pricing), (
            ("phase", ["phase"]), ("device", ["phase", "device"]), ("gemm", ["phase", "gemm"]),
            ("kv_dtype", ["phase", "kv_dtype"]), ("heads", ["phase", "heads"]), ("batch", ["phase", "batch"])))
    return doc


TABLES = (("phase", "phase"), ("device", "phase / device"), ("gemm", "phase / GEMM type"),
          ("kv_dtype", "phase / KV-cache dtype"), ("heads", "phase / heads per rank"), ("batch", "phase / batch"))


def main(argv=None) -> int:
    return run(argv, __doc__.split("\n")[0], shipped(), summary, TABLES,
               "MLA module (one layer) vs TensorRT-LLM 1.3.0rc20's measurements", _all)


if __name__ == "__main__":
    sys.exit(main())
