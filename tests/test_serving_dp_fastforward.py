"""Coupled attention-DP ranks fast-forwarded together (perfcast.serving.sim_dp, `_Coupled._fast_forward`)
is an optimisation only: every figure equals the one of the same run with every rank stepped through
its scheduler — all three engines, open and closed loops, tight KV caches, batch limits, both
balancers, SGLang's take-in interval and TensorRT-LLM's attention-DP balance."""

import dataclasses
import random

from perfcast.serving import sim_dp
from perfcast.serving.scheduler import scheduler_config
from perfcast.serving.sim_dp import simulate_coupled
from perfcast.serving.types import AffineStep
from perfcast.serving.workload import Lengths, Workload

from test_serving_fastforward import _same


def _cases(n: int, seed: int = 11) -> list[dict]:
    rnd = random.Random(seed)
    out = []
    for k in range(n):
        engine = rnd.choice(["vllm", "sglang", "trtllm"])
        isl = rnd.choice([Lengths("fixed", rnd.choice([50, 300, 1000])), Lengths("uniform", 20, 800)])
        osl = rnd.choice([Lengths("fixed", rnd.choice([2, 10, 60, 200])), Lengths("uniform", 2, 150)])
        load = ({"rate": rnd.choice([5.0, 30.0, 200.0]), "cv": rnd.choice([1.0, 2.0])} if rnd.random() < 0.5
                else {"concurrency": rnd.choice([1, 4, 32, 96])})
        out.append(dict(engine=engine, ranks=rnd.choice([2, 3, 4]),
                        workload=Workload(isl, osl, num_requests=rnd.choice([40, 150]), seed=k, **load),
                        max_batch_size=rnd.choice([None, 4, 16, 64]), kv=rnd.choice([3000, 20000, 500000]),
                        step=AffineStep(rnd.choice([0.002, 0.01]), rnd.choice([1e-5, 1e-4]), rnd.choice([0.0, 1e-8])),
                        recv=rnd.choice([None, 3]) if engine == "sglang" else None,
                        balance=rnd.choice([None, (0, 5), (2, 60)]) if engine == "trtllm" else None,
                        dp=rnd.choice(["round_robin", "least_loaded"])))
    return out


def _run(c: dict) -> dict:
    s = scheduler_config(c["engine"], max_batch_size=c["max_batch_size"], max_num_tokens=2048, chunked_prefill=True,
                         recv_interval=c["recv"], adp_balance=c["balance"])
    s = dataclasses.replace(s, dp_balance=c["dp"])
    r, _ = simulate_coupled(c["step"], s.kv_cache(c["kv"]), s, c["workload"], c["ranks"])
    return dataclasses.asdict(r)


def test_the_coupled_fast_forward_changes_no_figure(monkeypatch):
    cases = _cases(80)
    fast = [_run(c) for c in cases]
    monkeypatch.setattr(sim_dp._Coupled, "_fast_forward", lambda *a, **k: None)
    for c, f in zip(cases, fast):
        _same(f, _run(c), f"{c['engine']} × {c['ranks']} {c['workload']}")


def test_the_coupled_fast_forward_is_taken(monkeypatch):
    """A closed loop of fixed lengths decodes in long runs: most steps are fast-forwarded."""
    sched = scheduler_config("trtllm")
    w = Workload(Lengths("fixed", 512), Lengths("fixed", 200), num_requests=400, concurrency=64)
    calls = []
    real = sim_dp._Coupled._step
    monkeypatch.setattr(sim_dp._Coupled, "_step", lambda self, t: calls.append(t) or real(self, t))
    r, _ = simulate_coupled(AffineStep(0.005, 2e-5, 1e-8), sched.kv_cache(1_000_000), sched, w, 4)
    assert r.steps > 10 * len(calls)
