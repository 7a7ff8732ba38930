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
    unrolled, in capture order, on one track per performance model — and a second track for the
    kernels the engine runs on its second stream, from where the block's main-stream kernels start
    (:mod:`perfcast.rollup.streams`; the roll-up's time for the block is at least the longer side)."""
    events, pid = [], 1
    for tid, (name, r) in enumerate(result.rollups.items(), start=1):
        times = {id(lt.leaf): (row["time_s"] + row.get("launch_s", 0.0)) / float(lt.trips)
                 for lt, row in zip(r.leaves, result.evaluations[name].leaves.values())}
        mode, aux_tid = r.launch_model.mode, tid + len(result.rollups)
        clock, aux = [0.0], [None]  # aux: the second stream's clock while a block's sides run

        def streamed(op) -> bool:
            return isinstance(op, Leaf) and op.attr("stream_join") is not None \
                and mode in str(op.attr("stream_launch") or "").split(",")

        def emit(op, layer: str | None):
            if isinstance(op, Leaf):
                if streamed(op) and aux[0] is None:
                    aux[0] = clock[0]
                elif not streamed(op) and aux[0] is not None:  # the join: both streams done
                    clock[0], aux[0] = max(clock[0], aux[0]), None
                on_aux = streamed(op) and op.attr("stream") == "aux"
                dur = times[id(op)] * 1e6
                events.append({"name": str(op.attr("kernel") or op_name(op)), "cat": op.kind, "ph": "X",
                               "ts": aux[0] if on_aux else clock[0], "dur": dur, "pid": pid,
                               "tid": aux_tid if on_aux else tid,
                               "args": {"module": op.attr("module"), "layer": layer, "op": op_name(op)}})
                if on_aux:
                    aux[0] += dur
                else:
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
        if any(e["tid"] == aux_tid for e in events):
            events.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": aux_tid,
                           "args": {"name": f"{result.request.device.name} ({name}, second stream)"}})
    write_trace(events, path, "ms")
