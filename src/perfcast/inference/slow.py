"""The slow roll-up at one design point, set beside the fast one: what ``perfcast kernel`` and
``perfcast text-generate`` both report with ``--rollup slow|both``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from perfcast.ir import Op, UserError
from perfcast.rollup.slow import SlowResult, SlowRollup


@dataclass(frozen=True)
class SlowComparison:
    """The slow roll-up's schedule and the fast roll-up's time of the same op tree at the same
    point (fast ≥ slow ≥ the resource bound, :mod:`perfcast.rollup.slow`)."""

    slow: SlowResult
    fast_time_s: float

    def as_dict(self) -> dict:
        """The schedule's figures, with the fast time and both bounds in seconds."""
        return {**self.slow.as_dict(), "fast_time_s": self.fast_time_s,
                "resource_bound_time_s": self.slow.resource_bound_time_s, "serial_time_s": self.slow.serial_time_s}


def schedule(model, device, op: Op, point: Mapping[str, float], launch_time_s: float) -> SlowResult:
    """Schedule ``op`` priced by ``model`` on ``device`` at ``point``, with the fast roll-up's
    launch latency (``launch_time_s``) added in series."""
    try:
        return SlowRollup(model, device).run(op, point, launch_time_s)
    except ValueError as e:  # an op tree the scheduler cannot take (a symbol left free, a bad table)
        raise UserError(f"--rollup slow: {e}") from None
