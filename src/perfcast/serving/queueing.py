"""Queueing approximations the closed form uses for waits: Pollaczek–Khinchine for M/D/1,
Allen–Cunneen for M/D/c, and the exponential tail of a queue's wait for percentiles."""

from __future__ import annotations

import math

from perfcast.serving.types import Summary


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
