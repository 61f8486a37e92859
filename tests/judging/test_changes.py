"""Change points in a release history: found at the release where the level moved,
and no more often than the false-alarm level where it did not."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

import pytest
from scipy import stats as sps  # type: ignore[import-untyped]

from servegate.judging import changes


def test_a_change_point_is_found_at_the_release_where_the_level_moved() -> None:
    series = [100, 101, 99, 100.5, 92, 93, 91.5, 92.5]
    found = changes.change_points(series)
    assert [s.index for s in found] == [4]
    assert found[0].before == pytest.approx(100.1, abs=0.1)
    assert found[0].change == pytest.approx(-0.078, abs=0.002)
    assert found[0].pvalue < 0.05
    twice = [100, 100.8, 99.4, 100.2, 90, 90.6, 89.5, 90.3, 100.1, 99.6, 100.4, 99.9]
    assert [s.index for s in changes.change_points(twice)] == [4, 8]
    assert changes.change_points([100, 101, 99, 100.5, 100.2, 99.7, 100.4, 99.9]) == []
    assert changes.change_points([100, 90, 91]) == []  # too short to hold one


def pooled_t(a: Sequence[float], b: Sequence[float]) -> float:
    ma, mb = sum(a) / len(a), sum(b) / len(b)
    ss = sum((x - ma) ** 2 for x in a) + sum((x - mb) ** 2 for x in b)
    return abs(ma - mb) / math.sqrt(ss / (len(a) + len(b) - 2) * (1 / len(a) + 1 / len(b)))


def test_change_points_of_an_unchanged_history_stay_at_the_level() -> None:
    """Ten releases of one level, 1 % scatter: a change point in at most about 5 % of
    histories. A t-test at the best split taken at face value (the scan over splits
    ignored) would show one several times as often."""
    rng = random.Random(2)
    runs, found, naive = 1000, 0, 0
    critical = float(sps.t.ppf(0.975, 8))  # two-sided 5 % with 10 points
    for _ in range(runs):
        series = [100 * math.exp(rng.gauss(0, 0.01)) for _ in range(10)]
        found += bool(changes.change_points(series))
        logs = [math.log(v) for v in series]
        naive += max(pooled_t(logs[:k], logs[k:]) for k in range(2, 9)) > critical
    assert found / runs <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / runs)
    assert naive / runs > 0.15
