"""Price one op through exactly the path a captured model takes: the op runs on fake tensors
under the recording dispatch mode, the record is lowered by the same table, and each
performance model prices the resulting leaf."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

from perfcast.capture import Capture, lower
from perfcast.hardware import Device
from perfcast.inference.textgen import make_model
from perfcast.inputs import excerpt
from perfcast.inputs.limits import MAX_ELEMENTS
from perfcast.ir import UserError
from perfcast.perf import EmpiricalPerformanceModel
from perfcast.rollup import rollup


@dataclass(frozen=True)
class OpRequest:
    op: str
    shapes: tuple[tuple[int, ...], ...]
    dtype: str = "bf16"
    args: tuple = ()


def parse_shapes(text: str, where: str) -> tuple[tuple[int, ...], ...]:
    """``4096x4096;4096x14336`` → ((4096, 4096), (4096, 14336)); every dim at least 1 (an empty
    tensor prices nothing) and at most MAX_ELEMENTS elements in a tensor."""
    try:
        shapes = tuple(tuple(int(d) for d in s.strip().split("x")) for s in text.split(";") if s.strip())
    except ValueError:
        raise UserError(f"{where}: shapes {excerpt(text)}: expected dims like 4096x4096;4096x14336") from None
    if not shapes:
        raise UserError(f"{where}: shapes {excerpt(text)}: expected dims like 4096x4096;4096x14336")
    for shape in shapes:
        if min(shape) < 1 or math.prod(shape) > MAX_ELEMENTS:
            raise UserError(f"{where}: shape {excerpt('x'.join(map(str, shape)))}: expected dims of at least 1 "
                            f"and at most 2**63 - 1 elements (torch counts them in int64)")
    return shapes


def _resolve(op: str):
    import torch

    name = op.removeprefix("torch.ops.").replace("::", ".")
    parts = name.split(".")
    if len(parts) == 1:
        parts = ["aten", parts[0]]
    namespace, packet = parts[0], parts[1]
    overload = parts[2] if len(parts) > 2 else "default"
    try:
        return getattr(getattr(getattr(torch.ops, namespace), packet), overload)
    except (AttributeError, RuntimeError):
        raise UserError(f"unknown op {op!r} (expected e.g. mm, aten.mm.default, aten.mul.Tensor)") from None


def price(req: OpRequest, device: Device, models: tuple[str, ...], database: str | None = None,
          engine: str | None = None) -> dict:
    """The op as one kernel under ``engine`` (default: the device's): the engine's calibrated
    kernel fits (analytic) or its measured tables (profiling) price it, and its time is the
    kernel's own — the fixed time of a launch included, the host's launch interval not."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    import perfcast.capture.ops  # noqa: F401  (registers perfcast.* ops)
    from perfcast.capture.build import TORCH_DTYPES
    from perfcast.capture.record import Recorder

    fn = _resolve(req.op)
    if req.dtype not in TORCH_DTYPES:
        raise UserError(f"--dtype {req.dtype!r}: expected one of {', '.join(TORCH_DTYPES)}")
    fake = FakeTensorMode()
    recorder = Recorder()
    quiet = logging.getLogger("torch._subclasses.fake_tensor")
    level, quiet.level = quiet.level, logging.CRITICAL  # bad shapes are reported in one line below
    try:
        with fake:
            tensors = [torch.empty(s, dtype=TORCH_DTYPES[req.dtype]) for s in req.shapes]
            with recorder:
                fn(*tensors, *req.args)
    except (RuntimeError, TypeError, ValueError, IndexError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UserError(f"{req.op} on shapes {list(req.shapes)}: {first}") from None
    finally:
        quiet.setLevel(level)
    low = lower(Capture(recorder.records, [], {}, set()), fusion=False)
    from perfcast import engines

    profile = engines.resolve(engine, device) if engine is not None or device.spec.default_engine else None
    out = {"op": req.op, "shapes": [list(s) for s in req.shapes], "dtype": req.dtype,
           "engine": profile.name if profile is not None else None,
           "performance_models": {}, "unknown_ops": [op for (op, _), _n in low.unknown.items()]}
    for name in models:
        model = make_model(name, device, database, None, profile)
        assumed = model.notes if isinstance(model, EmpiricalPerformanceModel) else ()
        r = rollup(low.graph, model)
        ev = r.evaluate({})
        leaves = list(ev.leaves.values())
        out["performance_models"][name] = {
            "time_s": ev.time_s,
            "source": ",".join(sorted({row["source"] for row in leaves})) or "none",
            "bound": leaves[0]["limiter"] if len(leaves) == 1 else ",".join(row["limiter"] for row in leaves),
            "notes": [*assumed, *sorted({n for lt in r.leaves for n in lt.result.notes})],
        }
    return out
