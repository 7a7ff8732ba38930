"""The one place where perfcast creates SymPy symbols.

Design dimensions (batch, sequence lengths, head sizes, tile sizes, mesh-axis sizes) are
positive integers; hardware parameters (bandwidths, peak rates, latencies) are positive reals.
Creating every symbol here, with its assumptions, means two parts of the program that both
say ``dim("B")`` get the very same object, so expressions built independently combine and
cancel (``T_q/q_blk * q_blk == T_q``).
"""

from __future__ import annotations

from functools import lru_cache

import sympy

#: Canonical design dimensions and what they mean (used in help texts and docs).
DIMENSIONS: dict[str, str] = {
    "B": "batch (sequences)",
    "H": "attention heads",
    "H_kv": "key/value heads",
    "S": "new tokens per sequence",
    "C": "tokens already in each sequence's KV cache (context)",
    "T_q": "query length",
    "T_kv": "key/value (context) length",
    "hd_qk": "query/key head dimension",
    "hd_v": "value head dimension",
    "q_blk": "query tile size",
    "kv_blk": "key/value tile size",
    "M": "GEMM rows",
    "N": "GEMM columns",
    "K": "GEMM contraction size",
}

#: Hardware parameters that can be kept symbolic, so that sensitivities are derivatives.
HARDWARE: dict[str, str] = {
    "matrix_flops_per_s": "peak matrix-unit FLOP/s for the leaf's dtype",
    "vector_flops_per_s": "peak vector-unit FLOP/s",
    "hbm_bandwidth_bytes_per_s": "HBM bandwidth",
    "onchip_bandwidth_bytes_per_s": "on-chip memory bandwidth",
    "kernel_static_latency_s": "fixed cost of one kernel launch",
}


@lru_cache(maxsize=None)
def dim(name: str) -> sympy.Symbol:
    """A design dimension: a positive integer symbol."""
    if not name.isidentifier():
        raise ValueError(f"dimension name {name!r} is not an identifier")
    return sympy.Symbol(name, integer=True, positive=True)


def dims(names: str) -> tuple[sympy.Symbol, ...]:
    """Several dimensions from a space-separated string: ``B, H = dims("B H")``."""
    return tuple(dim(n) for n in names.split())


@lru_cache(maxsize=None)
def hw(name: str) -> sympy.Symbol:
    """A hardware parameter: a positive real symbol."""
    if name not in HARDWARE:
        raise ValueError(f"unknown hardware parameter {name!r}; known: {', '.join(HARDWARE)}")
    return sympy.Symbol(name, positive=True)


#: Results a formula may be written in (e.g. a control rate derived from a step's time).
RESULTS: dict[str, str] = {
    "time_s": "the priced time of a kernel or step, in seconds",
}


@lru_cache(maxsize=None)
def result(name: str) -> sympy.Symbol:
    """A priced result: a positive real symbol."""
    if name not in RESULTS:
        raise ValueError(f"unknown result {name!r}; known: {', '.join(RESULTS)}")
    return sympy.Symbol(name, positive=True)


def is_integer_symbol(s: sympy.Symbol) -> bool:
    return bool(s.is_integer)
