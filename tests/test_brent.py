"""perfcast.serving.brent.brentq is SciPy's brentq written in Python: the same root, bit for bit,
and the same refusals, on random functions and brackets — values of every magnitude (products of
two ends underflow below 1e-162, so the sign test must not multiply), steps, kinks, flat stretches,
short iteration budgets."""

import math
import random

import pytest
from scipy.optimize import brentq as scipy_brentq

from perfcast.serving.brent import brentq


def _function(rnd: random.Random):
    r0, r1 = rnd.uniform(-3, 3), rnd.uniform(-3, 3)
    scale = 10 ** rnd.uniform(-250, 250) if rnd.random() < 0.3 else 10 ** rnd.uniform(-5, 5)
    return rnd.choice([
        lambda x: scale * (x - r0),
        lambda x: scale * ((x - r0) ** 3 + r1 * (x - r0)),
        lambda x: scale * (math.tanh(5 * (x - r0)) + 0.1 * r1 * (x - r0)),
        lambda x: scale * (math.exp(x) - math.exp(r0)),
        lambda x: scale * ((x - r0) if x < r0 else 1e-3 * (x - r0) ** 0.5),
        lambda x: scale * (1.0 if x > r0 else -1.0),
        lambda x: scale * (x - r0) * (x - r0 - 1e-9) * (x + 10),
    ])


def _outcome(solver, f, a, b, **kw):
    try:
        return ("root", solver(f, a, b, **kw))
    except (ValueError, RuntimeError) as e:
        return (type(e).__name__,)


@pytest.mark.parametrize("seed", range(4))
def test_same_roots_as_scipy(seed):
    rnd = random.Random(seed)
    for _ in range(2000):
        f = _function(rnd)
        a, b = rnd.uniform(-5, 5), rnd.uniform(-5, 5)
        kw = {"xtol": 10 ** rnd.uniform(-15, -3), "rtol": rnd.choice([1e-15, 8.9e-16, 1e-10, 1e-6]),
              "maxiter": rnd.choice([3, 10, 100])}
        ours, theirs = _outcome(brentq, f, a, b, **kw), _outcome(scipy_brentq, f, a, b, **kw)
        assert ours[0] == theirs[0], (a, b, kw)
        if ours[0] == "root":
            assert math.copysign(1.0, ours[1]) == math.copysign(1.0, theirs[1]) and ours[1] == theirs[1]


def test_refusals():
    with pytest.raises(ValueError, match="different signs"):
        brentq(lambda x: x * x + 1, -1.0, 1.0)
    with pytest.raises(ValueError, match="NaN"):
        brentq(lambda x: math.nan, -1.0, 1.0)
    with pytest.raises(ValueError, match="rtol too small"):
        brentq(lambda x: x, -1.0, 1.0, rtol=1e-17)
    with pytest.raises(RuntimeError, match="converge"):
        brentq(lambda x: x - 0.3, -1.0, 1.0, xtol=1e-300, maxiter=2)
    assert brentq(lambda x: x, 0.0, 1.0) == 0.0
