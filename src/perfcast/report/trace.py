"""The Chrome trace (Trace Event Format) of a text-generation step: its kernels in order, or
with the slow roll-up its modulo schedule (:func:`perfcast.report.slow.chrome_trace`)."""

from __future__ import annotations

from perfcast.ir import Graph, Leaf, Loop
from perfcast.report import slow as slow_report
from perfcast.report.document import write_trace
from perfcast.report.textgen import op_name


def step_trace(result, path: str) -> None:
    """The step's schedule under its first performance model when the slow roll-up ran, else
    its kernels (:func:`chrome_trace`)."""
    if result.slow:
        slow_report.chrome_trace(next(iter(result.slow.values())), path, result.request.model.name)
    else:
        chrome_trace(result, path)


def chrome_trace(result, path: str) -> None:
    """Trace Event Format (Perfetto/chrome://tracing): one complete event per kernel, loops
    unrolled, in capture order, on one track per performance model."""
    events, pid = [], 1
    for tid, (name, r) in enumerate(result.rollups.items(), start=1):
        times = {id(lt.leaf): (row["time_s"] + row.get("launch_s", 0.0)) / float(lt.trips)
                 for lt, row in zip(r.leaves, result.evaluations[name].leaves.values())}
        clock = [0.0]

        def emit(op, layer: str | None):
            if isinstance(op, Leaf):
                dur = times[id(op)] * 1e6
                events.append({"name": str(op.attr("kernel") or op_name(op)), "cat": op.kind, "ph": "X",
                               "ts": clock[0], "dur": dur, "pid": pid, "tid": tid,
                               "args": {"module": op.attr("module"), "layer": layer, "op": op_name(op)}})
                clock[0] += dur
            elif isinstance(op, Loop):
                for i in range(int(op.n_iter)):
                    for child in op.body.ops:
                        emit(child, f"{op.name}[{i}]")
            elif isinstance(op, Graph):
                for child in op.ops:
                    emit(child, layer)

        emit(r.op, None)
        events.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid,
                       "args": {"name": f"{result.request.device.name} ({name})"}})
    write_trace(events, path, "ms")
