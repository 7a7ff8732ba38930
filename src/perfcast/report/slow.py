"""Reports of the slow roll-up: its comparison with the fast roll-up, the gap per loop, and the
modulo schedule as a Perfetto/Chrome trace (one track per resource)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from perfcast.inference.slow import SlowComparison
from perfcast.report.document import write_trace
from perfcast.report.format import integer, seconds
from perfcast.rollup.slow import SlowResult


def gap_lines(slow: SlowResult) -> list[str]:
    """Why each loop takes what it takes: II, what set it, and what the overlap saved."""
    out = []
    for x in slow.loops:
        saved = x.serial_cycles - x.cycles
        out.append(f"{x.path}: n = {x.n:,}, II = {x.ii:,} cycles (ResMII {x.res_mii:,}, RecMII {x.rec_mii:,}; "
                   f"set by {x.limiter}); {integer(x.cycles)} cycles vs {integer(x.serial_cycles)} serial"
                   + (f" — overlap saves {saved / x.serial_cycles:.1%}" if x.serial_cycles and saved > 0 else ""))
    return out


def render(console: Console, cmp: SlowComparison) -> None:
    slow = cmp.slow
    t = Table(title="Roll-ups", title_justify="left")
    for col in ("fast (serial, closed form)", "slow (modulo schedule)", "resource bound", "cycles", "clock"):
        t.add_column(col, justify="right")
    t.add_row(seconds(cmp.fast_time_s), seconds(slow.time_s), seconds(slow.resource_bound_time_s),
              integer(slow.cycles), f"{slow.clock_hz / 1e9:.3g} GHz")
    console.print(t)
    for line in gap_lines(slow):
        console.print(f"  {line}", highlight=False, markup=False)


def chrome_trace(slow: SlowResult, path: str, title: str) -> None:
    """The schedule in Trace Event Format: one track per resource, an event per reservation
    (loops show their first iterations), times in µs at the device clock."""
    tracks: dict[str, int] = {}
    events = []
    us = 1e6 / slow.clock_hz
    for name, resource, start, cycles in slow.events:
        if not cycles:
            continue
        tid = tracks.setdefault(resource, len(tracks) + 1)
        events.append({"name": name, "cat": resource, "ph": "X", "ts": start * us, "dur": cycles * us,
                       "pid": 1, "tid": tid})
    for resource, tid in tracks.items():
        events.append({"name": "thread_name", "ph": "M", "pid": 1, "tid": tid, "args": {"name": resource}})
    events.append({"name": "process_name", "ph": "M", "pid": 1, "args": {"name": f"{title} (modulo schedule)"}})
    write_trace(events, path, "ns")
