"""How far the two tiers are apart, and where: the event simulation and the closed form on one
grid of engines, loads and length spreads (docs/design/serving.md, "The two tiers side by side";
``tests/test_serving_agreement.py`` recomputes the table the doc prints).

The step is a hand-checkable affine one (:class:`perfcast.serving.types.AffineStep`: 8 ms + 20 µs
per token + 2 ns per attended key — the shape of an 8B model's step on one H100), so the table
isolates the tiers' own assumptions from the step model's.
"""

from __future__ import annotations

from dataclasses import dataclass

from perfcast.serving import meanfield
from perfcast.serving.scheduler import scheduler_config
from perfcast.serving.sim import simulate
from perfcast.serving.types import AffineStep
from perfcast.serving.workload import Lengths, Workload

STEP = AffineStep(fixed_s=0.008, per_token_s=20e-6, per_context_s=2e-9)
KV_TOKENS = 400_000
ENGINES = ("vllm", "sglang", "trtllm")
LOADS = (("closed", 4), ("closed", 32), ("closed", 128), ("open", 0.5), ("open", 0.9))
SPREADS = ("fixed", "uniform ±20 %")


@dataclass(frozen=True)
class Row:
    engine: str
    load: str
    lengths: str
    ttft: float    # simulation ÷ closed form, means
    tpot: float
    throughput: float


def _lengths(spread: str, n: int) -> Lengths:
    return Lengths("fixed", n) if spread == "fixed" else Lengths("uniform", int(n * 0.8), int(n * 1.2))


def row(engine: str, kind: str, value: float, spread: str, isl: int = 1024, osl: int = 128) -> Row:
    sched = scheduler_config(engine, max_batch_size=256)
    kv = sched.kv_cache(KV_TOKENS)
    cfg = meanfield.EngineConfig.of(sched, kv.capacity_tokens)
    if kind == "closed":
        load = meanfield.Workload(isl, osl, concurrency=int(value))
        w = Workload(_lengths(spread, isl), _lengths(spread, osl), num_requests=int(value) * 12,
                     concurrency=int(value), seed=1)
        label = f"closed loop C={int(value)}"
    else:  # a share of the closed form's saturated rate
        sat = meanfield.max_load(STEP, cfg, meanfield.Workload(isl, osl)).requests_per_s
        load = meanfield.Workload(isl, osl, rate_per_s=value * sat)
        w = Workload(_lengths(spread, isl), _lengths(spread, osl), num_requests=1500, rate=value * sat, seed=1)
        label = f"open loop ρ={value:g}"
    a, _ = simulate(STEP, kv, sched, w)
    b = meanfield.solve(STEP, cfg, load)
    return Row(engine, label, spread, a.ttft_s.mean / b.ttft_s.mean, a.tpot_s.mean / b.tpot_s.mean,
               a.output_tokens_per_s / b.output_tokens_per_s)


def table() -> list[Row]:
    return [row(e, kind, v, s) for e in ENGINES for kind, v in LOADS for s in SPREADS]


def markdown(rows: list[Row]) -> str:
    head = ("| engine | load | lengths | TTFT | TPOT | output tokens/s |\n"
            "|---|---|---|---|---|---|\n")
    return head + "".join(f"| {r.engine} | {r.load} | {r.lengths} | {r.ttft:.2f} | {r.tpot:.2f} | "
                          f"{r.throughput:.2f} |\n" for r in rows)


if __name__ == "__main__":  # prints the doc's table
    print(markdown(table()), end="")
