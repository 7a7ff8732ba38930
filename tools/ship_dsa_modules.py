"""Ship a seeded sample of aiconfigurator's measured DSA attention-module tables as validation data.

aiconfigurator-core 0.12.0 times one layer's whole DeepSeek-sparse-attention module under SGLang
0.5.14 on each NVIDIA system it ships (``systems/data/<system>/sparse_attention/sglang/0.5.14/
dsa_{generation,context}_module_perf.parquet``; collector ``collector/sglang/collect_mla_module.py``:
the layer's ``self_attn`` forward with the fused q_a / kv_a projection replaced by a random
latent, on one GPU with the heads of one tensor-parallel rank — no all-reduce — decode replayed
as a CUDA graph, prefill (extend) run eagerly). ``benchmarks/dsa_module_accuracy.py`` prices the
same modules; nothing is fitted to them.

Kept: the two DSA models of perfcast's catalog (GLM-5-FP8's and DeepSeek-V3.2's FP8 checkpoints,
block-scaled GEMMs), the full module (not GLM-5.2's skip-indexer variant), TP 4 and 8, both KV-cache
dtypes; at most ``--per-group`` rows per (system, phase, model, KV dtype, TP), drawn with
``numpy.random.default_rng(0)``. Usage::

    .venv/bin/python tools/ship_dsa_modules.py --aic-root PATH/aiconfigurator_core
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "src" / "perfcast" / "data" / "validation" / "dsa_modules.csv"
#: the NVIDIA systems whose sparse-attention tables hold SGLang's DSA modules
SYSTEMS = ("h100_sxm", "h200_sxm", "b200_sxm", "gb200", "b300_sxm", "gb300")
MODELS = {"zai-org/GLM-5-FP8": "glm-5-fp8", "deepseek-ai/DeepSeek-V3.2": "deepseek-v3.2"}
KV = {"bfloat16": "bf16", "fp8": "fp8"}
VERSION = "0.5.14"
#: the row's system folder, its table (dsa_generation_module_perf: decode, dsa_context_module_perf:
#: prefill) and the model path are in device, phase and model (MANIFEST.yaml, dsa_modules)
COLUMNS = ["device", "phase", "model", "kv_dtype", "tp", "heads", "batch", "new_tokens", "past", "kernel_source",
           "latency_ms"]


def sample(g: pd.DataFrame, per_group: int, rng: np.random.Generator) -> pd.DataFrame:
    """At most ``per_group`` rows of one group, drawn with ``rng`` from the rows sorted by batch, isl,
    step and kernel source (the order the draw is reproducible in)."""
    g = g.sort_values(["batch_size", "isl", "step", "kernel_source"]).reset_index(drop=True)
    return g.iloc[np.sort(rng.choice(len(g), size=min(per_group, len(g)), replace=False))]


def module_tables(aic: Path, path_of):
    """(perfcast device, phase — decode or prefill —, aiconfigurator's table) of every system's generation
    and context module table, ``path_of(system, phase)`` its path under ``aic``."""
    from perfcast.inference.silicon import tables

    devices = tables()["systems"]   # aiconfigurator system -> perfcast device, as the validation maps them
    for system in SYSTEMS:
        for phase in ("generation", "context"):
            yield (devices[system]["device"], "decode" if phase == "generation" else "prefill",
                   pd.read_parquet(aic / path_of(system, phase)))


def rows(aic: Path, per_group: int) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    out = []
    path = "systems/data/{}/sparse_attention/sglang/" + VERSION + "/dsa_{}_module_perf.parquet"
    for device, phase, t in module_tables(aic, path.format):
        t = t[t.op_name.str.endswith("_module") & t.model.isin(MODELS) & t.tp_size.isin([4, 8])
              & (t.gemm_type == "fp8_block")]
        for key, g in t.groupby(["model", "kv_cache_dtype", "tp_size"], sort=True):
            for r in sample(g, per_group, rng).itertuples():
                out.append((device, phase, MODELS[r.model], KV[r.kv_cache_dtype], int(r.tp_size), int(r.num_heads),
                            int(r.batch_size), 1 if phase == "decode" else int(r.isl), int(r.step), r.kernel_source,
                            float(r.latency)))
    return pd.DataFrame(out, columns=COLUMNS)


def ship(argv, description: str, rows_of, out: Path, per_group: int) -> int:
    """The command line of a module-table shipper: ``--aic-root`` (the aiconfigurator_core folder) and
    ``--per-group``; writes ``rows_of(aic_root, per_group)`` to ``out`` and prints its sha256."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--aic-root", required=True, type=Path, help="the aiconfigurator_core package folder")
    p.add_argument("--per-group", type=int, default=per_group)
    a = p.parse_args(argv)
    if not (a.aic_root / "systems" / "data").is_dir():
        print(f"--aic-root {a.aic_root}: no systems/data folder (expected aiconfigurator_core from "
              f"aiconfigurator-core 0.12.0)", file=sys.stderr)
        return 2
    d = rows_of(a.aic_root, a.per_group)
    d.to_csv(out, index=False, float_format="%.6g")
    print(f"{out.relative_to(ROOT)}: {len(d)} rows, sha256 {hashlib.sha256(out.read_bytes()).hexdigest()}")
    return 0


def main(argv=None) -> int:
    return ship(argv, __doc__.splitlines()[0], rows, OUT, 50)


if __name__ == "__main__":
    sys.exit(main())
