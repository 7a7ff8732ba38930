"""A simulation's timeline for Perfetto / chrome://tracing (the JSON trace event format:
"Trace Event Format", Google, 2016 — complete events ``ph: X`` and counters ``ph: C``, times in µs).

One process per engine instance, named and in order; a thread per request, named, holding its
phases (queued, prefill, decode; disaggregated, also transfer queued and transfer on the decode
instance) as spans; counters of the step's batch size and the KV tokens in use. :class:`SimTraces` joins the
instances of a disaggregated deployment ("prefill 0", "decode 1", …) into one timeline."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

US = 1e6


@dataclass
class SimTrace:
    """Events gathered during one simulation (``instance``: the engine instance's number)."""

    instance: int = 0
    name: str = ""                                 # the process's name ("engine N" if empty)
    spans: list = field(default_factory=list)      # (request, phase, start_s, end_s)
    counters: list = field(default_factory=list)   # (t_s, batch, kv_tokens, prefills, start_s) of each step

    def request(self, i: int, send: float, scheduled: float, first: float, finish: float) -> None:
        for phase, a, b in (("queued", send, scheduled), ("prefill", scheduled, first), ("decode", first, finish)):
            if not (math.isnan(a) or math.isnan(b)) and b >= a:
                self.spans.append((int(i), phase, float(a), float(b)))

    def counter(self, t: float, batch: int, kv_tokens: int, prefills: int = 0, start: float | None = None) -> None:
        """The step (or run of identical decode steps) from ``start`` to ``t``: ``batch``
        sequences, ``prefills`` of them prefill chunks (the rest decoding); ``kv_tokens`` in the KV
        cache after it."""
        self.counters.append((float(t), int(batch), int(kv_tokens), int(prefills),
                              float(t if start is None else start)))

    def events(self, pid: int | None = None) -> list[dict]:
        """The instance's events as process ``pid`` (default: its ``instance``): its name and place
        among the processes, a named thread per request, the spans and the counters."""
        pid = self.instance if pid is None else pid
        out = [{"name": "process_name", "ph": "M", "pid": pid, "args": {"name": self.name or f"engine {pid}"}},
               {"name": "process_sort_index", "ph": "M", "pid": pid, "args": {"sort_index": pid}}]
        out += [{"name": "thread_name", "ph": "M", "pid": pid, "tid": i + 1, "args": {"name": f"request {i}"}}
                for i in sorted({span[0] for span in self.spans})]
        for i, phase, a, b in self.spans:
            out.append({"name": phase, "cat": "request", "ph": "X", "pid": pid, "tid": i + 1,
                        "ts": a * US, "dur": (b - a) * US, "args": {"request": i}})
        for t, batch, kv, _, _ in self.counters:
            out.append({"name": "batch", "ph": "C", "pid": pid, "ts": t * US, "args": {"sequences": batch}})
            out.append({"name": "kv", "ph": "C", "pid": pid, "ts": t * US, "args": {"tokens": kv}})
        return out

    def to_chrome(self, path: str | Path) -> Path:
        """Write the trace as JSON (``{"traceEvents": [...]}``) that Perfetto opens."""
        return _write(self.events(), path)


@dataclass
class SimTraces:
    """Several engine instances' traces in one timeline (a disaggregated deployment's pools)."""

    traces: tuple[SimTrace, ...]

    def by_name(self, name: str) -> SimTrace:
        return next(t for t in self.traces if t.name == name)

    def events(self) -> list[dict]:
        """Each instance a process of its own, numbered in order (prefill pool, then decode pool)."""
        return [e for pid, t in enumerate(self.traces) for e in t.events(pid)]

    def to_chrome(self, path: str | Path) -> Path:
        return _write(self.events(), path)


def _write(events: list[dict], path: str | Path) -> Path:
    p = Path(path)
    p.write_text(json.dumps({"traceEvents": events, "displayTimeUnit": "ms"}))
    return p
