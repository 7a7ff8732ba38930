"""Roll-ups: from a priced op tree to totals (fast: closed form)."""

from perfcast.rollup.fast import Evaluation, FastRollup, LeafTotal, rollup
from perfcast.rollup.guard import GuardError, check_grid, check_point, check_values

__all__ = ["Evaluation", "FastRollup", "LeafTotal", "rollup", "GuardError", "check_grid",
           "check_point", "check_values"]
