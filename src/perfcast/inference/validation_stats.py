"""Statistics of relative errors, and the populations ``perfcast validate`` reports on."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from perfcast.inference.silicon import Case


@dataclass(frozen=True)
class Stats:
    """Of signed relative errors: count, median and 90th percentile of |error| (NumPy's
    linear interpolation), and the signed median (the bias: > 0 over-predicts)."""

    n: int
    median_abs: float
    p90_abs: float
    signed_median: float

    def as_dict(self) -> dict:
        return {"n": self.n, "median_abs": self.median_abs, "p90_abs": self.p90_abs,
                "signed_median": self.signed_median}


def stats(errors) -> Stats | None:
    e = np.asarray([x for x in errors if x is not None and math.isfinite(x)], dtype=float)
    if e.size == 0:
        return None
    a = np.abs(e)
    return Stats(int(e.size), float(np.median(a)), float(np.percentile(a, 90)), float(np.median(e)))


@dataclass(frozen=True)
class Population:
    name: str
    ids: frozenset[str]
    description: str = ""
    key: str = ""  # the name --population takes (named populations only)


def by_key(cases: list[Case]) -> list[Population]:
    """One population per (system, model family, backend, mode)."""
    groups: dict[tuple, set[str]] = {}
    for c in cases:
        groups.setdefault((c.system, c.family, c.backend, c.mode), set()).add(c.id)
    return [Population(" / ".join(k), frozenset(v)) for k, v in sorted(groups.items())]


def llama_8b_h100_trtllm(cases: list[Case]) -> Population:
    ids = {c.id for c in cases if c.model_path == "meta-llama/Llama-3.1-8B-Instruct"
           and c.system == "h100_sxm" and c.backend == "trtllm"}
    return Population("Llama-3.1-8B / H100 / TRT-LLM", frozenset(ids),
                      "model_path meta-llama/Llama-3.1-8B-Instruct, system h100_sxm, backend trtllm",
                      "llama-3.1-8b-h100-trtllm")


def stratified(cases: list[Case], seed: int = 0, per_group: int = 6) -> Population:
    """At most ``per_group`` rows per (system, model_path, backend, mode): the groups in sorted
    order, each drawing its rows with one ``numpy.random.default_rng(seed)`` (a permutation of
    the group's rows in file order, first ``per_group`` kept)."""
    groups: dict[tuple, list[str]] = {}
    for c in cases:
        groups.setdefault((c.system, c.model_path, c.backend, c.mode), []).append(c.id)
    rng = np.random.default_rng(seed)
    ids: set[str] = set()
    for key in sorted(groups):
        rows = groups[key]
        ids.update(rows[i] for i in rng.permutation(len(rows))[:per_group])
    return Population(f"stratified sample (seed {seed})", frozenset(ids),
                      f"at most {per_group} rows per system, model_path, backend, mode; "
                      f"numpy.random.default_rng({seed})", "stratified")


