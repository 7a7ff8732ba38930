"""Timing backends: one measuring code path for a CUDA GPU and for the CPU.

- :class:`CudaBackend` — device time between two ``torch.cuda.Event`` records around ``calls``
  back-to-back calls, after warm-up, one synchronisation per sample. The events are recorded on
  the stream the work runs on, so a sample is the stream's time from the first launch to the
  last kernel's end: for eager code that includes the gaps in which the GPU waits for the host
  to launch the next kernel (the launch-bound regime of small kernels), which is what an eager
  step costs. :meth:`CudaBackend.capture` records the calls once into a ``torch.cuda.CUDAGraph``
  (warmed up on a side stream first, as the PyTorch CUDA-graph documentation prescribes) and
  returns its replay: a replay launches the whole graph at once, so timing it gives the device
  time without host launches. :meth:`CudaBackend.trace` lists every kernel of one call with
  ``torch.profiler`` (CUPTI): name, device duration, and the aten op that launched it.
- :class:`CpuBackend` — ``time.perf_counter`` around each call (CPU ops run synchronously, so
  wall time is the op's time); no graphs; its trace lists the aten ops that do the work.

``calls`` > 1 amortises the event pair and, on a GPU, the launch latency of the first call; the
profiling collector (:mod:`perfcast.profiler.collect`) uses it for kernels of a few microseconds.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from perfcast.capture import FREE
from perfcast.ir import UserError

#: aten ops that launch no kernel and do no work, beyond the lowering's free views (``FREE``).
NO_WORK = FREE | {"resolve_conj", "resolve_neg", "result_type", "resize_", "to", "lift_fresh_copy",
                  "is_nonzero", "_has_compatible_shallow_copy_type", "record_stream", "narrow", "detach_",
                  "unsqueeze_", "squeeze_", "transpose_", "t_", "as_strided_", "set_", "view_as_real",
                  "view_as_complex"}


class GraphUnavailable(Exception):
    """A step or kernel that cannot be timed as a CUDA-graph replay, and why."""


@dataclass(frozen=True)
class KernelRecord:
    """One kernel of a traced call: its name, the aten op that launched it (``aten::mm``; None
    when the profiler links it to none), that op's input shapes, its duration in µs."""

    name: str
    op: str | None
    shapes: tuple[tuple[int, ...], ...]
    duration_us: float


def _shapes(event) -> tuple[tuple[int, ...], ...]:
    out = []
    for s in getattr(event, "input_shapes", None) or ():
        out.append(tuple(int(d) for d in s) if isinstance(s, (list, tuple)) else ())
    return tuple(out)


def _device(event) -> str:
    kind = getattr(event, "device_type", None)
    return getattr(kind, "name", str(kind).rsplit(".", 1)[-1])


def op_packet(name: str) -> str:
    """``aten::mm`` → ``mm``; other names unchanged."""
    return name.split("::", 1)[1] if "::" in name else name


# CUPTI's overhead activities, which Kineto puts on the device's timeline beside the kernels:
# no device work — "Command Buffer Full" is the host waiting for room in the launch queue. Names
# as pytorch/kineto libkineto/src/cupti_strings.cpp overheadKindString() spells them.
CUPTI_OVERHEAD = frozenset({"Unknown", "Driver Compiler", "Buffer Flush", "Instrumentation", "Resource",
                            "Runtime Triggered Module Loading", "Lazy Function Loading",
                            "Command Buffer Full", "Activity Buffer Request", "UVM Activity Initialization"})


def device_kernels(events) -> list[KernelRecord]:
    """The kernels of a CUDA trace (``profile.events()``), each with the op that launched it.

    A device event's ``linked_correlation_id`` is the id of the frontend CPU op (one whose own
    link is 0) active at its launch — the innermost aten op, e.g. ``aten::mm`` under
    ``aten::linear``; torch.profiler attaches kernels to ops by the same ids
    (``torch/autograd/profiler.py``, ``_parse_kineto_results``). A kernel linked to no op (a
    graph replay, a library's own launch) has ``op`` None. Where device events carry no link
    (older torch), the kernels are read from the ops' own ``kernels`` lists instead. CUPTI's
    overhead activities (:data:`CUPTI_OVERHEAD`) are not kernels and are left out."""
    device = [e for e in events if _device(e) == "CUDA" and str(e.name) not in CUPTI_OVERHEAD]
    if device and all(hasattr(d, "linked_correlation_id") for d in device):
        ops = {e.id: e for e in events if _device(e) == "CPU" and not getattr(e, "linked_correlation_id", 0)}
        out = []
        for d in device:
            owner = ops.get(d.linked_correlation_id)
            out.append(KernelRecord(str(d.name), str(owner.name) if owner is not None else None,
                                    _shapes(owner) if owner is not None else (), float(d.time_range.elapsed_us())))
        return out
    listed = [KernelRecord(str(k.name), str(e.name), _shapes(e), float(k.duration))
              for e in events if _device(e) == "CPU" and not getattr(e, "is_legacy", False)
              for k in getattr(e, "kernels", None) or ()]
    return listed or [KernelRecord(str(d.name), None, (), float(d.time_range.elapsed_us())) for d in device]


def cpu_ops(events) -> list[KernelRecord]:
    """The aten ops of a CPU trace that do work: each op none of whose descendants does work
    (``aten::mm`` rather than ``aten::linear``; views and no-ops — :data:`NO_WORK` — are free)."""

    def works(e) -> bool:
        return str(e.name).startswith("aten::") and op_packet(str(e.name)) not in NO_WORK

    def busy_below(e) -> bool:
        return any(works(c) or busy_below(c) for c in getattr(e, "cpu_children", ()) or ())

    return [KernelRecord(str(e.name), str(e.name), _shapes(e), float(e.time_range.elapsed_us()))
            for e in events if _device(e) == "CPU" and works(e) and not busy_below(e)]


class Backend:
    """What both backends share: sampling until ``repeats`` samples and ``min_time_s``."""

    kind = "?"
    graphs = False

    def __init__(self, device):
        import torch

        self.torch = torch
        self.device = torch.device(device)

    def sync(self) -> None:
        """Wait for the device's queued work (nothing to wait for on the CPU)."""

    def _sample(self, fn: Callable, calls: int) -> float:
        raise NotImplementedError

    def time(self, fn: Callable, *, before: Callable | None = None, warmup: int = 3, repeats: int = 10,
             min_time_s: float = 0.0, max_samples: int = 1000, calls: int = 1) -> list[float]:
        """Seconds per call of ``fn``: one sample per ``calls`` calls, ``before`` (a reset) run
        before each sample and outside it. At least ``repeats`` samples; more while less than
        ``min_time_s`` has passed, up to ``max_samples``."""
        with self.torch.no_grad():
            for _ in range(warmup):
                if before:
                    before()
                fn()
            self.sync()
            samples: list[float] = []
            start = time.perf_counter()
            while len(samples) < repeats or (time.perf_counter() - start < min_time_s
                                             and len(samples) < max_samples):
                if before:
                    before()
                samples.append(self._sample(fn, calls))
        return samples

    def capture(self, fn: Callable, *, before: Callable | None = None, calls: int = 1, warmup: int = 3) -> Callable:
        raise GraphUnavailable(f"{self.kind}: no graphs on this device")

    def trace(self, fn: Callable, *, before: Callable | None = None) -> list[KernelRecord]:
        raise NotImplementedError

    def describe(self) -> dict:
        raise NotImplementedError


class CpuBackend(Backend):
    kind = "cpu"

    def _sample(self, fn, calls):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        return (time.perf_counter() - t0) / calls

    def trace(self, fn, *, before=None):
        from torch.profiler import ProfilerActivity, profile

        if before:
            before()
        with self.torch.no_grad(), profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
            fn()
        return cpu_ops(prof.events())

    @property
    def name(self) -> str:
        import platform

        return f"cpu ({platform.processor() or platform.machine()}, {self.torch.get_num_threads()} threads)"

    def describe(self) -> dict:
        return {"name": self.name, "kind": "cpu", "torch": str(self.torch.__version__),
                "threads": self.torch.get_num_threads()}


class CudaBackend(Backend):
    kind = "cuda"
    graphs = True

    def __init__(self, device):
        super().__init__(device)
        if self.device.type == "cuda" and self.device.index is not None:
            # events and streams belong to the current device: make it the one measured
            self.torch.cuda.set_device(self.device)

    def sync(self):
        self.torch.cuda.synchronize(self.device)

    def _sample(self, fn, calls):
        cuda = self.torch.cuda
        a, b = cuda.Event(enable_timing=True), cuda.Event(enable_timing=True)
        a.record()
        for _ in range(calls):
            fn()
        b.record()
        b.synchronize()
        return a.elapsed_time(b) / 1e3 / calls  # elapsed_time is in ms

    def capture(self, fn, *, before=None, calls=1, warmup=3):
        """The replay of a CUDA graph holding ``calls`` calls of ``fn``. ``before`` runs before
        the warm-up calls and before the capture (it is not part of the graph)."""
        torch = self.torch
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.no_grad(), torch.cuda.stream(side):
            for _ in range(warmup):
                if before:
                    before()
                fn()
        torch.cuda.current_stream(self.device).wait_stream(side)
        self.sync()
        if before:
            before()
            self.sync()
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.no_grad(), torch.cuda.graph(graph):
                outputs = [fn() for _ in range(calls)]
        except Exception as e:  # the capture's own error says what broke it
            raise GraphUnavailable(f"capture failed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from None
        self.sync()

        def replay():
            graph.replay()

        replay.graph, replay.outputs = graph, outputs  # keep the graph and its pool alive
        return replay

    def trace(self, fn, *, before=None):
        from torch.profiler import ProfilerActivity, profile

        if before:
            before()
        self.sync()
        with self.torch.no_grad(), profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
                                           record_shapes=True) as prof:
            fn()
            self.sync()
        return device_kernels(prof.events())

    @property
    def name(self) -> str:
        return self.torch.cuda.get_device_name(self.device)

    @property
    def l2_bytes(self) -> int:
        return int(getattr(self.torch.cuda.get_device_properties(self.device), "L2_cache_size", 0))

    def describe(self) -> dict:
        p = self.torch.cuda.get_device_properties(self.device)
        return {"name": self.name, "kind": "cuda", "torch": str(self.torch.__version__),
                "cuda": self.torch.version.cuda, "capability": f"{p.major}.{p.minor}",
                "multiprocessors": p.multi_processor_count, "memory_bytes": int(p.total_memory),
                "l2_cache_bytes": self.l2_bytes}


def backend(device: str, flag: str = "--device") -> Backend:
    """The backend for a torch device string (``cuda``, ``cuda:1``, ``cpu``); a CUDA device on a
    machine without one is a one-line UserError naming ``flag``."""
    import torch

    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise UserError(f"{flag} {device!r}: {str(e).splitlines()[0]}") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise UserError(f"{flag} {device}: CUDA is not available on this machine "
                            f"(torch {torch.__version__}); use {flag} cpu")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise UserError(f"{flag} {device}: this machine has {torch.cuda.device_count()} CUDA device(s)")
        return CudaBackend(dev)
    if dev.type == "cpu":
        return CpuBackend(dev)
    raise UserError(f"{flag} {device}: expected cuda, cuda:N or cpu")
