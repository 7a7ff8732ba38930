"""Profiling-database collector: measure the kernels a captured model needs on the local torch
device (CPU, or CUDA when present) and write them in the format
:class:`perfcast.perf.profiling.ProfilingDataSource` reads.

Importing this package needs no torch; :func:`profile_model` and the collector import it when
they run.
"""

from __future__ import annotations

from pathlib import Path

from perfcast.ir import UserError

__all__ = ["profile_model"]


def profile_model(model, out: str | Path, device_name: str, *, num_queries: int = 1,
                  query_length: int = 128, context_length: int = 0, decode: bool = False,
                  dtype: str = "fp32", engine: str = "eager", repeats: int = 10, device=None,
                  progress=None) -> Path:
    """Capture and lower ``model`` (a :class:`perfcast.models.ModelConfig`) for one step exactly
    as ``perfcast text-generate --engine ENGINE`` does, time its distinct kernels and write/merge
    the database under ``out``. Returns the database directory (the one to pass as
    ``--profiling-database``). The default engine, ``eager``, is what this collector runs
    faithfully: one torch kernel per captured op."""
    import re

    from perfcast import engines
    from perfcast.capture import lower
    from perfcast.inference.textgen import Request, step_capture
    from perfcast.profiler.collect import Options, collect, manifest, write

    if not re.fullmatch(r"[a-z0-9][a-z0-9.-]*", device_name):
        raise UserError(f"--device-name {device_name!r}: use lower-case letters, digits, '.' and '-'")
    if repeats < 1:
        raise UserError(f"--repeats must be at least 1 (got {repeats})")
    if dtype not in ("fp32", "bf16", "fp16"):
        raise UserError(f"--dtype {dtype!r}: expected fp32, bf16 or fp16")
    profile = engines.get_engine(engine)
    req = Request(model=model, device=None, num_queries=num_queries, query_length=query_length,
                  context_length=context_length, decode=decode, dtype=dtype, engine=engine)
    for flag, v in (("--num-queries", num_queries), ("--query-length", query_length)):
        if v < 1:
            raise UserError(f"{flag} must be at least 1 (got {v})")
    if context_length < 0 or (decode and context_length < 1):
        raise UserError("--context-length must be ≥ 0, and ≥ 1 with --decode")
    cap, at, _ = step_capture(req)
    applied = engines.apply(profile, cap, decode=decode, device=device_name, hidden_size=int(model.data["hidden_size"]))
    low = lower(applied.capture, model_dtype=dtype, point=at, name=model.name, plan=applied.plan, engine=profile.name)
    opts = Options(repeats=repeats)
    measured = collect(low.graph, device=device, opts=opts, progress=progress)
    run = {"model": model.name, "num_queries": num_queries, "query_length": query_length,
           "context_length": context_length, "decode": decode, "dtype": dtype, "engine": engine,
           "kernels": sum(len(r) for r in measured.rows.values())}
    return write(measured, out, device_name, manifest(device_name, device, opts, [run]))
