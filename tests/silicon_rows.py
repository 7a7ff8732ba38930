"""A silicon-sample row built in a test: every column of the sample, a measured InferenceX run of
Llama-3.1-70B FP8 on four H200s by default, mapped as ``perfcast validate`` maps it."""

from __future__ import annotations

from perfcast.inference import silicon

ROW = {"id": "r", "backend": "trtllm", "backend_version": "", "model_path": "meta-llama/Llama-3.1-70B",
       "system": "h200_sxm", "precision": "fp8", "mode": "agg", "isl": "1024", "osl": "1024",
       "gemm_quant_mode": "fp8", "moe_quant_mode": "", "batch_size": "32", "tp_size": "4", "pp_size": "1",
       "attention_dp_size": "1", "moe_tp_size": "1", "moe_ep_size": "1", "silicon_ttft_ms": "500",
       "silicon_tpot_ms": "15", "concurrency": "32", "benchmark": "inferencex"}


def case(**over) -> silicon.Case:
    row = {**ROW, **over}
    for col in silicon.COLUMNS:
        row.setdefault(col, "")
    return silicon.map_row(row)
