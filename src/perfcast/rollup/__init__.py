"""Roll-ups: from a priced op tree to totals (fast: closed form; overlap transforms on it)."""

from perfcast.rollup.fast import Evaluation, FastRollup, LaunchModel, LeafTotal, rollup
from perfcast.rollup.guard import GuardError, check_grid, check_point, check_values
from perfcast.rollup.overlap import ORDER as OVERLAPS
from perfcast.rollup.overlap import OverlapRollup, overlap
from perfcast.rollup.overlap_account import OverlapEvaluation

__all__ = ["Evaluation", "FastRollup", "LaunchModel", "LeafTotal", "rollup", "GuardError", "check_grid",
           "check_point", "check_values", "OVERLAPS", "OverlapEvaluation", "OverlapRollup", "overlap"]
