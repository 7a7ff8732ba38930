"""What one device holds for serving: weights, the activations of the largest step, and the KV
cache sized from what is left, as each engine sizes it."""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache

from perfcast.inference.textgen import simulate
from perfcast.serving import step_cache
from perfcast.serving.step import Deployment


@dataclass(frozen=True)
class Memory:
    """One device's memory as the engine sizes its KV cache: weights, the activation peak of its
    largest step, the KV bytes per token (every layer, one device's share)."""

    capacity_bytes: int
    weights_bytes: int
    activation_bytes: int
    kv_bytes_per_token: int


@lru_cache(maxsize=1024)
def memory_of(deployment: Deployment, max_tokens: int) -> Memory:
    """The memory report of a prefill of ``max_tokens`` tokens in one sequence (the engines size
    their activation workspace by their largest step: vLLM ``profile_run`` with
    ``max_num_batched_tokens``, TensorRT-LLM's ``max_num_tokens`` warm-up); kept in the step
    cache (:mod:`perfcast.serving.step_cache`)."""
    req = replace(deployment.request(decode=False, batch=1, length=max(2, max_tokens)),
                  performance_models=("analytic",))

    def report() -> Memory:
        mem = simulate(req).memory
        return Memory(int(mem.capacity_bytes), int(mem.weights_bytes), int(mem.activation_peak_bytes),
                      int(mem.kv_cache_bytes_per_token))

    return step_cache.remembered(step_cache.key_of("memory", deployment, req, max_tokens), report,
                                 lambda m: [m.capacity_bytes, m.weights_bytes, m.activation_bytes,
                                            m.kv_bytes_per_token],
                                 lambda v: Memory(*(int(x) for x in v)))


def kv_capacity_tokens(mem: Memory, fraction: float, basis: str, block: int) -> int:
    """KV-cache tokens one device holds, in whole blocks of ``block`` tokens:

    - ``basis: total`` — vLLM ``gpu_memory_utilization`` (vllm/v1/worker/gpu_worker.py
      ``determine_available_memory``: utilisation × total − weights − the profiled activation
      peak), SGLang ``mem_fraction_static`` (model_runner.py ``profile_max_num_token``: the
      fraction of total for weights and KV);
    - ``basis: free`` — TensorRT-LLM ``free_gpu_memory_fraction`` of the memory left after the
      weights and the warm-up's activations (tensorrt_llm/_torch/pyexecutor/_util.py
      ``KvCacheCreator``)."""
    if basis == "total":
        free = fraction * mem.capacity_bytes - mem.weights_bytes - mem.activation_bytes
    elif basis == "static":
        free = fraction * mem.capacity_bytes - mem.weights_bytes
    else:
        free = fraction * (mem.capacity_bytes - mem.weights_bytes - mem.activation_bytes)
    tokens = int(max(0.0, free) // max(1, mem.kv_bytes_per_token))
    return tokens // block * block

