"""Engine profiles as data: what TensorRT-LLM, vLLM, SGLang, vLLM-Ascend, XLA and PyTorch eager
run for a captured Hugging Face step — the kernels (rewrite rules over the captured ops), their
launch mode per phase, and the profiling database each goes with. See docs/design/engines.md."""

from perfcast.engines.apply import (Applied, apply, check_exchange, check_options, compatible, engines_for,
                                   exchange_options, merged_options, resolve, rotate, size_decisions, with_options)
from perfcast.engines.launch import iteration_gap, launch_for, with_cuda_graphs
from perfcast.engines.roles import ROLES, assign
from perfcast.engines.spec import EngineProfile, engine_names, get_engine, load_profile_file

__all__ = ["Applied", "apply", "check_exchange", "check_options", "compatible", "engines_for", "exchange_options",
           "merged_options", "resolve",
           "with_options", "rotate", "size_decisions", "launch_for", "with_cuda_graphs", "iteration_gap", "ROLES",
           "assign",
           "EngineProfile", "engine_names", "get_engine", "load_profile_file"]
