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
                  dtype: str | None = None, engine: str = "eager", repeats: int = 10, device=None,
                  timing: str = "events", rotate_bytes: int | None = None, progress=None) -> Path:
    """Capture and lower ``model`` (a :class:`perfcast.models.ModelConfig`) for one step exactly
    as ``perfcast text-generate --engine ENGINE`` does, time its distinct kernels and write/merge
    the database under ``out``. Returns the database directory (the one to pass as
    ``--profiling-database``). The default engine, ``eager``, is what this collector runs
    faithfully: one torch kernel per captured op.

    ``dtype`` defaults to bf16 on a CUDA device and fp32 on a CPU (what each runs well);
    ``timing`` and ``rotate_bytes`` are the collector's options
    (:class:`perfcast.profiler.collect.Options`); ``progress(done, total, line)`` is called after
    each kernel is timed (:func:`perfcast.profiler.collect.collect`)."""
    import re

    from perfcast import engines
    from perfcast.capture import lower
    from perfcast.inference.textgen import Request, step_capture
    from perfcast.profiler.collect import TIMINGS, Options, collect, manifest, write
    from perfcast.profiler.timing import backend

    if not re.fullmatch(r"[a-z0-9][a-z0-9.-]*", device_name):
        raise UserError(f"--device-name {device_name!r}: use lower-case letters, digits, '.' and '-'")
    if repeats < 1:
        raise UserError(f"--repeats must be at least 1 (got {repeats})")
    bk = backend(str(device) if device is not None else _default_device(), flag="--torch-device")
    dtype = dtype or ("bf16" if bk.kind == "cuda" else "fp32")
    if dtype not in ("fp32", "bf16", "fp16"):
        raise UserError(f"--dtype {dtype!r}: expected fp32, bf16 or fp16")
    profile = engines.get_engine(engine)
    if timing not in TIMINGS:
        raise UserError(f"--timing {timing!r}: expected one of {', '.join(TIMINGS)}")
    if timing == "graph" and not bk.graphs:
        raise UserError(f"--timing graph: needs a CUDA device (the kernels run on {bk.kind})")
    if rotate_bytes is not None and rotate_bytes < 0:
        raise UserError(f"--rotate-bytes must be non-negative (got {rotate_bytes})")
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
    opts = Options(repeats=repeats, timing=timing, rotate_bytes=rotate_bytes)
    measured = collect(low.graph, device=bk.device, opts=opts, progress=progress)
    run = {"model": model.name, "num_queries": num_queries, "query_length": query_length,
           "context_length": context_length, "decode": decode, "dtype": dtype, "engine": engine,
           "timing": timing, "kernels": sum(len(r) for r in measured.rows.values())}
    return write(measured, out, device_name, manifest(device_name, bk.device, opts, [run]))


def _default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"
