"""Numbers of an overlap roll-up at one design point: what each transform hid, where."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import sympy

#: Transforms that assume two micro-batches (their blocks are split only where that pays).
MICRO_BATCH = frozenset({"a2a-experts", "comm-overlap"})


@dataclass(frozen=True)
class SiteAccount:
    """One loop or block a transform rewrote: ``executions`` of it, their total time before and
    after, the time hidden; the leaves whose work it hides (``moved``) and what hides them."""

    path: str
    executions: float
    before_s: float
    after_s: float
    hidden_s: float
    moved: tuple[str, ...]
    under: tuple[str, ...]
    prefetched_bytes: float | None = None  # weight-prefetch: staged per iteration, of…
    weight_bytes: float | None = None  # …the weight bytes one iteration reads


@dataclass(frozen=True)
class StepAccount:
    """One transform, applied after those before it: the time after it and the time it hid
    (the drop from the previous step), whether it is in effect at the point, and its sites."""

    name: str
    time_s: float
    hidden_s: float
    applied: bool
    sites: tuple[SiteAccount, ...]
    note: str | None = None


@dataclass(frozen=True)
class OverlapEvaluation:
    point: dict[str, float]
    before_s: float  # the fast roll-up: every leaf after the one before
    after_s: float
    bound_s: float  # max over resources of their busy time, plus launches: no overlap beats it
    micro_batches: int  # 2 when the graph runs as two micro-batches at this point
    steps: tuple[StepAccount, ...]

    @property
    def hidden_s(self) -> float:
        return self.before_s - self.after_s

    def as_dict(self) -> dict:
        return {"transforms": [s.name for s in self.steps], "before_s": self.before_s,
                "after_s": self.after_s, "hidden_s": self.hidden_s, "bound_s": self.bound_s,
                "micro_batches": self.micro_batches,
                "steps": [{**asdict(s), "sites": [asdict(x) for x in s.sites]} for s in self.steps]}


def _s(t: float) -> str:
    return f"{t * 1e6:.4g} µs" if t < 1e-3 else f"{t * 1e3:.4g} ms"


def account(ov, values) -> OverlapEvaluation:
    """Evaluate an :class:`~perfcast.rollup.overlap.OverlapRollup` at ``values`` (guarded)."""
    point = ov.base.exact_point(values)

    def num(e) -> float:
        return float(ov.base.model.realize(sympy.sympify(e).xreplace(point)))

    before = prev = num(ov.before_s)
    steps, split_any = [], False
    for st in ov.steps:
        unsplit = num(st.unsplit)
        split = None if st.split is None else num(st.split)
        variant = split is not None and split < unsplit
        split_any = variant
        after = split if variant else unsplit
        sites = []
        for x in st.sites[variant]:
            n = num(x.trips)
            b, a = n * num(x.before), n * num(x.after)
            sites.append(SiteAccount("/".join(x.path), n, b, a, b - a, x.moved, x.under,
                                     None if x.prefetched_bytes is None else num(x.prefetched_bytes),
                                     None if x.weight_bytes is None else num(x.weight_bytes)))
        note = None
        if st.name in MICRO_BATCH and split is not None and not variant and st.sites[True]:
            note = (f"not applied: as two micro-batches the graph would take {_s(split)} against "
                    f"{_s(unsplit)} (each weight read and each kernel launched twice)")
        elif not sites:
            note = "nothing to rewrite: no site in this graph"
        steps.append(StepAccount(st.name, after, prev - after, bool(sites), tuple(sites), note))
        prev = after
    return OverlapEvaluation({s.name: float(v) for s, v in point.items()}, before, prev,
                             num(ov.bound_s), 2 if split_any else 1, tuple(steps))
