"""The group-sequential boundaries against values computed another way: a single look
is the normal quantile, two looks of a linear spending function are solved with
scipy's bivariate normal, and the gate's own spending over several uneven looks holds
its level in a simulation of the looks."""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np
import pytest
from scipy import optimize, stats  # type: ignore[import-untyped]

from servegate.judging import sequential

Z = NormalDist()


@pytest.mark.parametrize("level", [0.05, 0.01, 0.0025])
def test_one_look_is_the_normal_quantile(level: float) -> None:
    (c,) = sequential.boundaries([1.0], level)
    assert c == pytest.approx(Z.inv_cdf(1 - level), abs=2e-3)
    assert sequential.nominal(c) == pytest.approx(level, rel=0.02)


def test_two_looks_of_a_linear_spending_match_the_bivariate_normal() -> None:
    """Spending ``level * t`` at t = 1/2 and 1: the first boundary spends half the
    level; the second is the ``c`` with P(Z1 < b1, Z2 > c) = level / 2, where the two
    looks' statistics correlate by sqrt(1/2)."""
    level = 0.025
    b1, b2 = sequential.boundaries([1.0, 2.0], level, gamma=0.0)
    assert b1 == pytest.approx(Z.inv_cdf(1 - level / 2), abs=2e-3)
    joint = stats.multivariate_normal(mean=[0, 0], cov=[[1, math.sqrt(0.5)], [math.sqrt(0.5), 1]])

    def excess(c: float) -> float:
        stay_then_cross = Z.cdf(b1) - float(joint.cdf([b1, c]))
        return stay_then_cross - level / 2

    want = optimize.brentq(excess, 1.0, 4.0)
    assert b2 == pytest.approx(want, abs=5e-3)


def test_the_gate_s_spending_holds_its_level_over_uneven_looks() -> None:
    """The looks the gate takes (information growing unevenly, as samples arrive): under
    no difference, a path crosses some boundary with probability ``level``, and by each
    look no more than the spending function allows."""
    info = [3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 12.0]
    level = 0.05
    bounds = sequential.boundaries(info, level)
    rng = np.random.default_rng(7)
    runs = 200_000
    steps = np.diff([0.0, *info])
    paths = np.cumsum(rng.normal(size=(runs, len(info))) * np.sqrt(steps), axis=1)
    z = paths / np.sqrt(info)
    crossed = np.maximum.accumulate(z > np.array(bounds), axis=1)
    by_look = crossed.mean(axis=0)
    se = math.sqrt(level * (1 - level) / runs)
    assert by_look[-1] == pytest.approx(level, abs=4 * se)
    for j, i in enumerate(info):
        assert by_look[j] <= sequential.spent(level, i / info[-1]) + 4 * se
    # like O'Brien and Fleming: the first look is strict, the last nearly the whole level
    assert bounds[0] > bounds[-1] > Z.inv_cdf(1 - level)
    assert sequential.nominal(bounds[-1]) > 0.6 * level
