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
    kernels the engine runs on its second stream, placed so that their block ends where the roll-up
    prices it (:mod:`perfcast.rollup.streams`): the aux kernels end with the block."""
    events, pid = [], 1
    for tid, (name, r) in enumerate(result.rollups.items(), start=1):
        ev = result.evaluations[name]
        times = {id(lt.leaf): (row["time_s"] + row.get("launch_s", 0.0)) / float(lt.trips)
                 for lt, row in zip(r.leaves, ev.leaves.values())}
        hides = {join: s for (join, _), s in ev.stream_blocks_s.items()}
        aux_tid = tid + len(result.rollups)
        clock, block = [0.0], {}  # block: the two-stream block under way (its aux kernels)

        def close():
            if block:  # the join: the block takes its sides' sum less what the second stream hides
                aux_s = sum(dur for _, dur in block["aux"])
                end = clock[0] + aux_s - hides[block["join"]] * 1e6
                ts = end - aux_s
                for e, dur in block["aux"]:
                    e["ts"], ts = ts, ts + dur
                clock[0] = end
                block.clear()

        def emit(op, layer: str | None):
            if isinstance(op, Leaf):
                join = op.attr("stream_join") if op.attr("stream_join") in hides else None
                if join != block.get("join"):
                    close()
                    if join is not None:
                        block.update(join=join, aux=[])
                on_aux = join is not None and op.attr("stream") == "aux"
                dur = times[id(op)] * 1e6
                e = {"name": str(op.attr("kernel") or op_name(op)), "cat": op.kind, "ph": "X", "ts": clock[0],
                     "dur": dur, "pid": pid, "tid": aux_tid if on_aux else tid,
                     "args": {"module": op.attr("module"), "layer": layer, "op": op_name(op)}}
                events.append(e)
                if on_aux:
                    block["aux"].append((e, dur))
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
        close()
        events.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid,
                       "args": {"name": f"{result.request.device.name} ({name})"}})
        if any(e["tid"] == aux_tid for e in events):
            events.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": aux_tid,
                           "args": {"name": f"{result.request.device.name} ({name}, second stream)"}})
    write_trace(events, path, "ms")
