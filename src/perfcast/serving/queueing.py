"""Queueing approximations the closed form uses for waits: Pollaczek–Khinchine for M/D/1,
Allen–Cunneen for M/D/c and for a pool's instances behind a router, and the exponential tail of a
queue's wait for percentiles."""

from __future__ import annotations

import math

import numpy as np

from perfcast.ir.errors import UserError
from perfcast.serving.types import Summary

#: How requests are spread over a pool's instances (:func:`split_wait`; the disaggregated
#: simulation's routers, :mod:`.disagg`)
ROUTERS = ("round_robin", "least_loaded")


def check_router(router: str) -> None:
    if router not in ROUTERS:
        raise UserError(f"--router: expected one of {', '.join(ROUTERS)}, got {router!r}")

#: 48-point Gauss–Legendre nodes and weights on [−1, 1] (:func:`balance_hold_steps`)
_GAUSS = np.polynomial.legendre.leggauss(48)


def md1_wait(rho: float, mu: float) -> float:
    """Pollaczek–Khinchine mean wait of M/D/1 with service ``1 / mu``: ``ρ / (2 μ (1 − ρ))``."""
    return rho / (2.0 * mu * (1.0 - rho))


def mdc_wait(lam: float, mu_slot: float, c: int) -> float:
    """Mean wait of M/D/c by the Allen–Cunneen approximation, half the M/M/c wait:
    ``W ≈ C(c, a) / (c μ − λ) · (1 + c_s²) / 2`` with ``c_s² = 0``, ``a = λ / μ``, and the Erlang C
    probability from the Erlang B recursion ``B_k = a B_{k−1} / (k + a B_{k−1})`` (Allen 1990,
    Probability, Statistics and Queueing Theory, §6; Gross & Harris, Fundamentals of Queueing
    Theory, §2.3)."""
    a, b = lam / mu_slot, 1.0
    for k in range(1, c + 1):
        b = a * b / (k + a * b)
    erlang_c = c * b / (c - a * (1.0 - b))
    return erlang_c / (c * mu_slot - lam) / 2.0


def split_wait(router: str, lam: float, mu_slot: float, instances: int, slots: int = 1) -> float:
    """Mean wait at a pool of ``instances`` identical instances of ``slots`` deterministic slots
    each (``mu_slot`` requests/s a slot), fed ``lam`` Poisson requests/s by ``router``:

    - ``round_robin`` (TensorRT-LLM's ``RoundRobinRouter``, the default): each instance takes
      every ``instances``-th arrival, Erlang interarrival times of squared coefficient of variation
      ``c_a² = 1 / instances`` (a sum of that many exponentials), and Allen–Cunneen's G/G/c wait
      ``W ≈ W_M/M/c · (c_a² + c_s²) / 2`` with ``c_s² = 0`` is the M/D/c wait times ``c_a²``
      (:func:`mdc_wait`; Allen 1990, §6) — a random split would leave each instance Poisson;
    - ``least_loaded`` (join the shortest queue: its ``LoadBalancingRouter``, fewest requests in
      flight): no instance idles while another holds a queue, approximated by one queue for the
      pool, M/D/(instances · slots) — the least wait any routing reaches (Winston 1977, "Optimality
      of the shortest line discipline", J. Appl. Prob. 14)."""
    if router == "least_loaded":
        return mdc_wait(lam, mu_slot, instances * slots)
    return mdc_wait(lam / instances, mu_slot, slots) / instances


def wait_tail(base: float, wait: float, rho: float) -> Summary:
    """TTFT percentiles with the queueing wait's exponential tail: ``P(W > t) = ρ · exp(−ρ t / E[W])``
    (P(W > 0) = ρ for M/G/1; the exponential tail is Kingman's heavy-traffic approximation,
    Kingman 1962, "On queues in heavy traffic", J. R. Stat. Soc. B 24)."""
    def q(p: float) -> float:
        return 0.0 if wait == 0.0 or 1.0 - p >= rho else wait / rho * math.log(rho / (1.0 - p))
    return Summary(base + wait, base + q(0.5), base + q(0.9), base + q(0.99))


def share_within(slack: float, wait: float, rho: float) -> float:
    """``P(W ≤ slack)`` under :func:`wait_tail`'s distribution."""
    if slack < 0.0:
        return 0.0
    return 1.0 if wait == 0.0 else 1.0 - rho * math.exp(-rho * slack / wait)


def balance_hold_steps(rate: float, ranks: int, wait_iters: int, timeout_iters: int) -> float:
    """Mean steps a prompt is held by TensorRT-LLM's attention-DP balance
    (``PyExecutor._balance_adp_requests``; docs/design/serving.md "Attention-DP ranks step
    together"). Its counter runs from each release: prompts wait until every one of the ``ranks``
    ranks has one — at most ``timeout_iters`` steps (``τ``) — and, when every rank has one in time,
    ``wait_iters`` steps (``w``) more. Each rank's prompts arrive at ``rate`` per step (``r``,
    Poisson); rank ``k``'s first at ``T_k``, every rank's at ``T = max T_k``, ``P(T ≤ t) = F(t) =
    (1 − e^{−rt})^R``. At time ``t`` of a cycle still waiting, rank ``k`` holds on average
    ``E[N_k(t) 1{T > t}] = rt (1 − (1 − e^{−rt})^{R−1})`` prompts, so a cycle's summed hold is
    ``∫₀^τ R r t (1 − (1 − e^{−rt})^{R−1}) dt`` plus, when ``T ≤ τ``, ``w`` steps for the prompts
    then held (``E[N(T) 1{T ≤ τ}] = R r E[min(T, τ)] − R r τ (1 − (1 − e^{−rτ})^{R−1})``, Wald's
    identity) and ``R r w² / 2`` for those arriving during them; it takes in ``R r E[L]`` prompts,
    ``E[L] = E[min(T, τ)] + w F(τ)`` (Wald). The hold is their ratio (renewal-reward: Ross 1996,
    Stochastic Processes, §3.6). Integrals by 48-point Gauss–Legendre; as ``r → 0``, ``τ / 2``."""
    tau, big_r = float(timeout_iters), ranks
    if rate <= 0.0:
        return tau / 2.0
    x, wgt = _GAUSS
    t, wgt = (x + 1.0) * tau / 2.0, wgt * tau / 2.0
    miss = -np.expm1(-rate * t)                               # P(T_k ≤ t)
    e_min = float(np.dot(wgt, 1.0 - miss ** big_r))            # E[min(T, τ)]
    held = float(np.dot(wgt, big_r * rate * t * (1.0 - miss ** (big_r - 1))))
    miss_tau = -math.expm1(-rate * tau)
    done = miss_tau ** big_r                                   # F(τ)
    at_ready = big_r * rate * (e_min - tau * (1.0 - miss_tau ** (big_r - 1)))
    held += wait_iters * at_ready + done * big_r * rate * wait_iters ** 2 / 2.0
    cycle = e_min + wait_iters * done
    return held / (big_r * rate * cycle) if cycle > 0.0 else 0.0
