"""The kernel catalog (DSL kernels with default design points)."""

from perfcast.kernels import deepseek_moe as _deepseek_moe  # noqa: F401  (registers)
from perfcast.kernels import flash_attention as _flash_attention  # noqa: F401  (registers)
from perfcast.kernels import modulo_reference as _modulo_reference  # noqa: F401  (registers)
from perfcast.kernels import pi0 as _pi0  # noqa: F401  (registers)
from perfcast.kernels.registry import TIME, Figure, KernelSpec, catalog, get_kernel, kernel

__all__ = ["TIME", "Figure", "KernelSpec", "catalog", "get_kernel", "kernel"]
