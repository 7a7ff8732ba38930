"""Launch configurations of a searched deployment: the engine's own command and config files, and
the plain deployment YAML ``perfcast serve --deployment FILE`` reads back.

Only flags the engines document, each with its source:

- vLLM (``vllm serve``, https://docs.vllm.ai/en/latest/configuration/engine_args.html):
  ``--tensor-parallel-size``, ``--pipeline-parallel-size``, ``--data-parallel-size``,
  ``--enable-expert-parallel``, ``--max-num-seqs``, ``--max-num-batched-tokens``,
  ``--enable-chunked-prefill`` / ``--no-enable-chunked-prefill``, ``--gpu-memory-utilization``,
  ``--kv-cache-dtype``, ``--quantization``, ``--max-model-len``, the environment variable
  ``VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8=1`` (``--engine-option moe_mxfp4_activations=mxfp8``:
  vllm/envs.py, read by vllm/model_executor/layers/quantization/mxfp4.py); disaggregated prefill with
  ``--kv-transfer-config`` and the NIXL connector
  (https://docs.vllm.ai/en/latest/features/nixl_connector_usage.html). vLLM's expert parallelism
  spans every rank of the instance (EP = TP × DP) or is off.
- SGLang (``python -m sglang.launch_server``,
  https://docs.sglang.io/advanced_features/server_arguments.html): ``--tp-size``, ``--pp-size``, ``--dp-size``,
  ``--enable-dp-attention``, ``--ep-size``, ``--moe-a2a-backend`` (``--engine-option moe_a2a_backend``, on an
  attention-DP instance), ``--max-running-requests``, ``--chunked-prefill-size``,
  ``--mem-fraction-static``, ``--kv-cache-dtype``, ``--quantization``, ``--context-length``,
  ``--disaggregation-mode prefill|decode``; pipeline stages with ``--pp-size`` (python/sglang/srt/
  server_args.py ``--pipeline-parallel-size/--pp-size``; SGLang's pipeline-parallelism guide,
  https://mintlify.com/sgl-project/sglang/distributed/pipeline-parallelism).
- TensorRT-LLM (``trtllm-serve``, https://nvidia.github.io/TensorRT-LLM/commands/trtllm-serve.html):
  ``--backend pytorch``, ``--tp_size``, ``--pp_size``, ``--ep_size``, ``--max_batch_size``,
  ``--max_num_tokens``, ``--max_seq_len``, ``--kv_cache_free_gpu_memory_fraction``,
  ``--extra_llm_api_options FILE`` (LLM API keys ``enable_attention_dp``,
  ``enable_chunked_prefill``, ``kv_cache_config.dtype``, ``cuda_graph_config``, ``moe_config.backend``
  (``--engine-option moe_backend``: tensorrt_llm/llmapi/llm_args.py MoeConfig), the environment
  variable ``TRTLLM_FORCE_COMM_METHOD`` (``--engine-option moe_exchange``:
  tensorrt_llm/_torch/modules/fused_moe/communication/communication_factory.py),
  ``cache_transceiver_config`` for disaggregated serving:
  https://nvidia.github.io/TensorRT-LLM/advanced/disaggregated-service.html). Its attention data
  parallelism runs attention with one rank per request batch (TP 1 inside attention); the
  quantization is the checkpoint's (no flag).

A layout an engine cannot express is not written for it: the file list says why instead.
"""

from __future__ import annotations

import shlex

from perfcast.capture.parallel import Layout
from perfcast.engines import exchange_options
from perfcast.ir import routing
from perfcast.search.optimize import Point, SearchSpec
from perfcast.search.space import parse_variant
from perfcast.serving.scheduler import deployment_scheduler

KV_DTYPES = {"vllm": {"fp8": "fp8", "bf16": "auto", "fp16": "auto", "int8": None},
             "sglang": {"fp8": "fp8_e4m3", "bf16": "auto", "fp16": "auto", "int8": None},
             "trtllm": {"fp8": "fp8", "bf16": "auto", "fp16": "auto", "int8": "int8"}}


def deployment_yaml(spec: SearchSpec, p: Point) -> dict:
    """The plain deployment file of ``p`` (:class:`perfcast.serving.deployment_file.DeploymentFile`)."""
    c, s = p.candidate, p.scheduler or {}
    device, what_if = parse_variant(c.device)
    doc = {"perfcast_deployment": 1, "model": spec.model, "device": device, "engine": s.get("engine") or spec.engine,
           "dtype": spec.dtype, "quantize": c.quantize, "kv_cache_dtype": spec.kv_dtype, "mode": c.mode,
           "layout": _layout(c.layout), "instances": c.replicas if c.mode == "agg" else c.decode_instances,
           "max_batch_size": c.batch, "max_num_tokens": s.get("max_num_tokens"),
           "chunked_prefill": s.get("chunked_prefill"),
           "workload": {"isl": spec.isl, "osl": spec.osl}}
    if what_if:
        doc["what_if"] = dict(what_if)
    if spec.engine_options:
        doc["engine_options"] = dict(spec.engine_options)
    if spec.moe_routing != routing.DEFAULT:
        doc["moe_routing"] = spec.moe_routing
    if c.mode == "agg":
        doc["workload"]["concurrency"] = c.concurrency
    else:
        doc["disagg"] = {"prefill_layout": _layout(c.prefill_layout), "prefill_instances": c.prefill_instances,
                         "decode_instances": c.decode_instances}
        doc["workload"]["request_rate"] = p.closed_form.requests_per_s
    return doc


def _layout(lay: Layout) -> dict:
    return {"tp": lay.tp, "ep": lay.ep, "dp": lay.dp, "pp": lay.pp, "attention_dp": lay.attention_dp}


def _repo(model: str) -> str:
    """The checkpoint to serve: the catalog entry's Hugging Face repository, else the config's folder."""
    from pathlib import Path

    from perfcast.models import load_model_config

    cfg = load_model_config(model)
    return cfg.source.get("hf_repo") or str(Path(cfg.path).parent)


def _memory_fraction(engine: str, device: str, model: str) -> float:
    from perfcast.serving.step import Deployment

    return deployment_scheduler(Deployment(model, device, engine)).memory_fraction


def launch_files(spec: SearchSpec, p: Point) -> tuple[dict[str, str], list[str]]:
    """``({file name: text}, notes)``: the engine's launch script (and its config file), for the
    engine ``p`` was priced with; notes say what the engine cannot express or what the user sets."""
    c, s = p.candidate, p.scheduler or {}
    engine = s.get("engine") or spec.engine or "trtllm"
    if parse_variant(c.device)[1]:
        return {}, [f"{c.device} is a hardware what-if, not a part one can launch on"]
    repo, frac = _repo(spec.model), _memory_fraction(engine, c.device, spec.model)
    roles = [("serve", c.layout, c.batch)] if c.mode == "agg" else \
        [("prefill", c.prefill_layout, None), ("decode", c.layout, c.batch)]
    files, notes, lines = {}, [], ["#!/bin/sh", f"# perfcast optimize: {c.describe()} ({engine}); "
                                                f"{'replicas' if c.mode == 'agg' else 'instances'} as below"]
    for role, lay, batch in roles:
        count = c.replicas if c.mode == "agg" else (c.prefill_instances if role == "prefill" else c.decode_instances)
        why = _inexpressible(engine, lay)
        if why:
            return {}, [f"{engine} cannot run {lay.describe()}: {why}"]
        argv, extra = _command(engine, repo, lay, batch, s, spec, frac, role if c.mode == "disagg" else None)
        if extra is not None:
            name = f"extra-llm-api-config-{role}.yml"
            files[name] = extra
            argv += ["--extra_llm_api_options", name]
        lines.append(f"# {role}: {count} × this instance ({lay.num_devices} {c.device} each)")
        lines.append(shlex.join(argv))
    if c.mode == "disagg":
        notes.append({"vllm": "disaggregated: put a proxy in front that sends each request to a prefill instance "
                              "and then to a decode one (vLLM's disaggregated-serving examples)",
                      "sglang": "disaggregated: start the router with `python -m sglang_router.launch_router "
                                "--pd-disaggregation --prefill URL --decode URL`",
                      "trtllm": "disaggregated: list the instances as context_servers and generation_servers in a "
                                "`trtllm-serve disaggregated -c FILE` config"}[engine])
    if c.quantize and engine == "trtllm":
        notes.append(f"quantization {c.quantize}: trtllm-serve takes it from the checkpoint — serve a "
                     f"{c.quantize} checkpoint (e.g. produced by NVIDIA ModelOpt)")
    files["launch.sh"] = "\n".join(lines) + "\n"
    return files, notes


#: ``--engine-option moe_exchange`` as TensorRT-LLM's environment forces it (communication_factory.py
#: ``_create_forced_method``: NVLINK_ONE_SIDED, the all-to-all it tries first; ALLGATHER)
FORCE_COMM = {"all_to_all": "NVLINK_ONE_SIDED", "gather": "ALLGATHER"}


def _inexpressible(engine: str, lay: Layout) -> str | None:
    if engine == "vllm" and lay.ep > 1 and lay.ep != lay.moe_group:
        return f"vLLM's expert parallelism spans every rank of the instance (ep {lay.moe_group}) or is off; ep {lay.ep}"
    if engine == "trtllm" and lay.attention_dp and lay.tp > 1:
        return "TensorRT-LLM's attention data parallelism runs attention on one rank per batch (tp 1 per rank)"
    return None


def _command(engine: str, repo: str, lay: Layout, batch: int | None, s: dict, spec: SearchSpec, frac: float,
             role: str | None) -> tuple[list[str], str | None]:
    kv = KV_DTYPES[engine].get(spec.kv_dtype) if spec.kv_dtype else None
    seq = spec.isl + spec.osl
    tokens, chunked = s.get("max_num_tokens"), s.get("chunked_prefill")
    if engine == "vllm":
        env = (["VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8=1"]
               if dict(spec.engine_options).get("moe_mxfp4_activations") == "mxfp8" else [])
        argv = [*env, "vllm", "serve", repo, "--tensor-parallel-size", str(lay.tp)]
        if lay.pp > 1:
            argv += ["--pipeline-parallel-size", str(lay.pp)]
        if lay.dp > 1:
            argv += ["--data-parallel-size", str(lay.dp)]
        if lay.ep > 1:
            argv += ["--enable-expert-parallel"]
        if batch:
            argv += ["--max-num-seqs", str(batch)]
        if tokens:
            argv += ["--max-num-batched-tokens", str(tokens)]
        if chunked is not None:
            argv += ["--enable-chunked-prefill" if chunked else "--no-enable-chunked-prefill"]
        argv += ["--gpu-memory-utilization", f"{frac:g}", "--max-model-len", str(seq)]
        if kv:
            argv += ["--kv-cache-dtype", kv]
        if dict(spec.engine_options).get("allreduce_rms_fusion") == "off":  # priced without it: launched without it
            argv += ["--compilation-config", '{"pass_config": {"fuse_allreduce_rms": false}}']
        if role:
            argv += ["--kv-transfer-config", '{"kv_connector":"NixlConnector","kv_role":"kv_both"}']
        return argv, None
    if engine == "sglang":
        argv = ["python", "-m", "sglang.launch_server", "--model-path", repo, "--tp-size", str(lay.tp * lay.dp)]
        if lay.pp > 1:
            argv += ["--pp-size", str(lay.pp)]
        if lay.dp > 1:
            argv += ["--dp-size", str(lay.dp)] + (["--enable-dp-attention"] if lay.attention_dp else [])
        if lay.ep > 1:
            argv += ["--ep-size", str(lay.ep)]
        a2a = dict(exchange_options(spec.engine_options, lay)).get("moe_a2a_backend")  # as the candidate was priced
        if a2a and a2a != "none":
            argv += ["--moe-a2a-backend", a2a]
        if batch:
            argv += ["--max-running-requests", str(batch * lay.dp)]
        if tokens:
            argv += ["--chunked-prefill-size", str(tokens)]
        argv += ["--mem-fraction-static", f"{frac:g}", "--context-length", str(seq)]
        if kv:
            argv += ["--kv-cache-dtype", kv]
        if role:
            argv += ["--disaggregation-mode", role]
        return argv, None
    force = dict(spec.engine_options).get("moe_exchange", "auto")
    env = [f"TRTLLM_FORCE_COMM_METHOD={FORCE_COMM[force]}"] if lay.attention_dp and force != "auto" else []
    argv = [*env, "trtllm-serve", repo, "--backend", "pytorch", "--tp_size", str(lay.tp * lay.dp)]
    if lay.pp > 1:
        argv += ["--pp_size", str(lay.pp)]
    if lay.ep > 1:
        argv += ["--ep_size", str(lay.ep)]
    if batch:
        argv += ["--max_batch_size", str(batch)]
    if tokens:
        argv += ["--max_num_tokens", str(tokens)]
    argv += ["--max_seq_len", str(seq), "--kv_cache_free_gpu_memory_fraction", f"{frac:g}"]
    extra = []
    if lay.attention_dp:
        extra.append("enable_attention_dp: true")
    if chunked:
        extra.append("enable_chunked_prefill: true")
    if kv:
        extra += ["kv_cache_config:", f"  dtype: {kv}"]
    if batch:
        extra += ["cuda_graph_config:", f"  max_batch_size: {batch}", "  enable_padding: true"]
    if role:
        extra += ["cache_transceiver_config:", "  backend: DEFAULT"]
    moe = dict(spec.engine_options).get("moe_backend")
    if moe:
        extra += ["moe_config:", f"  backend: {moe}"]
    return argv, ("\n".join(extra) + "\n") if extra else None
