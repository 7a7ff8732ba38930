"""A deployment as a plain YAML file: what ``perfcast optimize --save-dir`` writes for each chosen
deployment and ``perfcast serve --deployment FILE`` reads back (docs/design/search.md).

Every key is checked as a whole before anything is built (one line per problem, the file
named): the model, the device, the engine, the model and KV dtypes, the quantization, one engine
instance's layout, the engine limits it was priced with, the number of instances, and for a
disaggregated deployment the prefill pool's layout and instance counts; ``workload`` records
the load it was chosen for (isl, osl, concurrency), which ``serve`` takes as its defaults.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field

from perfcast.hardware.spec import _Strict
from perfcast.inputs import load_yaml
from perfcast.inputs.limits import MAX_DEVICES, MAX_SEQUENCES, MAX_TOKENS
from perfcast.ir.routing import DEFAULT as DEFAULT_ROUTING
from perfcast.ir.routing import ROUTINGS

#: The file's layout version (bumped when a key changes meaning).
VERSION = 1


class LayoutEntry(_Strict):
    tp: int = Field(1, ge=1, le=MAX_DEVICES)
    ep: int = Field(1, ge=1, le=MAX_DEVICES)
    dp: int = Field(1, ge=1, le=MAX_DEVICES)
    pp: int = Field(1, ge=1, le=MAX_DEVICES)
    attention_dp: bool = False


class DisaggEntry(_Strict):
    prefill_layout: LayoutEntry
    prefill_instances: int = Field(ge=1, le=MAX_DEVICES)
    decode_instances: int = Field(ge=1, le=MAX_DEVICES)


class WorkloadEntry(_Strict):
    isl: int = Field(ge=1, le=MAX_TOKENS)
    osl: int = Field(ge=1, le=MAX_TOKENS)
    concurrency: int | None = Field(None, ge=1, le=MAX_SEQUENCES)
    request_rate: float | None = Field(None, gt=0, le=1e9)


class DeploymentFile(_Strict):
    """The deployment file's keys (``perfcast schema`` does not list it: it is YAML, not a report)."""

    perfcast_deployment: Literal[1] = VERSION
    model: str = Field(min_length=1)
    device: str = Field(min_length=1)
    engine: Literal["trtllm", "vllm", "sglang"]
    engine_options: dict[str, str] | None = None  # as --engine-option NAME=VALUE (e.g. moe_backend: TRTLLM)
    dtype: Literal["bf16", "fp16"] = "bf16"
    quantize: str | None = None
    kv_cache_dtype: Literal["bf16", "fp16", "fp8", "int8"] | None = None
    moe_routing: Literal[ROUTINGS] = DEFAULT_ROUTING  # as --moe-routing (perfcast.ir.routing)
    mode: Literal["agg", "disagg"] = "agg"
    layout: LayoutEntry = LayoutEntry()
    instances: int = Field(1, ge=1, le=MAX_DEVICES)
    max_batch_size: int | None = Field(None, ge=1, le=MAX_SEQUENCES)
    max_num_tokens: int | None = Field(None, ge=1, le=MAX_TOKENS)
    chunked_prefill: bool | None = None
    disagg: DisaggEntry | None = None
    workload: WorkloadEntry | None = None
    what_if: dict[Literal["hbm_bandwidth", "matrix_rate", "link_bandwidth"], float] | None = None


def read_deployment(path: str | Path) -> DeploymentFile:
    """The deployment file at ``path``, checked whole; a problem is a one-line UserError naming it."""
    from perfcast.hardware.spec import parse_spec
    from perfcast.ir import UserError

    spec = parse_spec(DeploymentFile, Path(path), load_yaml(path))
    if spec.mode == "disagg" and spec.disagg is None:
        raise UserError(f"{path}: mode disagg needs a 'disagg' section (prefill_layout, prefill_instances, "
                        f"decode_instances)")
    if spec.what_if and any(not 0 < v < 1e6 for v in spec.what_if.values()):
        raise UserError(f"{path}: what_if: each multiplier must be positive and below 1e6")
    if spec.mode == "agg" and spec.disagg is not None:
        raise UserError(f"{path}: a 'disagg' section with mode agg; set mode: disagg or drop the section")
    return spec
