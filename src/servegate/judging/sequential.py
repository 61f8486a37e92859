"""Group-sequential boundaries: how decisive a look must be when the gate looks again.

The gate looks at its samples after every repetition while a row is open, up to its
cap. Splitting the error rate evenly over the looks (Bonferroni) holds whatever the
looks, but it makes every look — the last one too — as strict as a test at
``level / looks``: with 8 looks a 1 % miss rate is tested at 0.125 % each time, and the
gate needs about a third more samples to decide anything. The looks are not
independent (each one holds the samples of the one before), and group-sequential
boundaries use that: an error-spending function (Lan and DeMets) says how much of the
level may be spent by the information seen so far, and each look's critical value is
the one that spends exactly that much, given that the earlier looks did not stop.

The spending function is Hwang, Shih and DeCani's, ``level * (1 - exp(-g t)) / (1 -
exp(-g))`` at information fraction ``t``. ``g = -4`` (the default) spends like O'Brien
and Fleming's boundaries: an early look stops only on overwhelming evidence (a release
that is clearly unchanged or clearly slower), and the last look is tested at nearly the
whole level, so the cap costs little over a fixed-size test.

The critical values come from the standard recursive numerical integration of the
canonical joint distribution (Armitage, McPherson and Rowe; Jennison and Turnbull,
*Group Sequential Methods*, ch. 19): the z statistic at look ``j`` is a Brownian motion
in information time, ``Z_j = S_j / sqrt(I_j)``. Why it is written here: the maintained
implementations are R packages (gsDesign, rpact) or parts of larger platforms; the
recursion is 30 lines of numpy on a grid, and ``tests/judging/test_sequential.py`` checks
it against the known single-look and Pocock values and against a simulation.

Each boundary is one-sided and non-binding: the FAIL test and the PASS test are
computed apart, so stopping on one never lowers the other's guarantee.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import lru_cache
from statistics import NormalDist
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported where a boundary is computed: see _boundaries
    import numpy as np

#: the spending function's shape: -4 spends like O'Brien-Fleming, 1 like Pocock
GAMMA = -4.0
_N = NormalDist()
#: grid points per standard deviation of the integration
_STEP = 1 / 24


def spent(level: float, t: float, gamma: float = GAMMA) -> float:
    """The error that may be spent by information fraction ``t`` (0..1)."""
    t = min(max(t, 0.0), 1.0)
    if gamma == 0:
        return level * t
    return level * (1 - math.exp(-gamma * t)) / (1 - math.exp(-gamma))


def boundaries(info: Sequence[float], level: float, gamma: float = GAMMA) -> list[float]:
    """Upper critical values of ``Z_j`` at each look, for looks at information ``info``
    (increasing; the last is the planned maximum) and a one-sided ``level``. Only the
    information fractions matter; they are taken to the nearest 0.005, which moves a
    boundary by far less than the samples' own uncertainty and lets a gate's many looks
    share one computation."""
    if not info:
        return []
    last = info[-1]
    fractions = tuple(max(round(i / last / 0.005) * 0.005, 0.005) for i in info)
    return list(_boundaries(fractions, round(level, 12), gamma))


@lru_cache(maxsize=4096)
def _boundaries(info: tuple[float, ...], level: float, gamma: float) -> tuple[float, ...]:
    # NumPy is imported here, not with the module: every command that imports the gate
    # would pay its import (a few hundred ms of CPU) to run no gate at all
    import numpy as np

    if not info:
        return ()
    total = info[-1]
    out: list[float] = []
    grid = np.arange(-9.0, 9.0 + _STEP, _STEP)
    dens: np.ndarray | None = None  # density of Z on the continuation region
    before = 0.0  # error spent at earlier looks
    prev_i = 0.0
    for i in info:
        target = spent(level, i / total, gamma) - before
        if dens is None:
            dens = np.exp(-(grid**2) / 2) / math.sqrt(2 * math.pi)
        else:
            dens = _step(dens, grid, out[-1], prev_i, i)
        c = _critical(dens, grid, target)
        out.append(c)
        before += _upper_mass(dens, grid, c)
        prev_i = i
    return tuple(out)


def _step(dens: np.ndarray, grid: np.ndarray, c_prev: float, i0: float, i1: float) -> np.ndarray:
    """Density of Z at information ``i1`` for paths that stayed below ``c_prev`` at ``i0``."""
    import numpy as np

    keep = grid <= c_prev
    if i1 <= i0:  # no new information: the same statistic
        return np.where(keep, dens, 0.0)
    u = grid[keep]
    w = dens[keep] * _STEP
    r = math.sqrt(i0 / i1)
    sd = math.sqrt((i1 - i0) / i1)
    z = (grid[:, None] - r * u[None, :]) / sd
    return np.asarray((np.exp(-(z**2) / 2) / (sd * math.sqrt(2 * math.pi))) @ w)


def _tails(dens: np.ndarray) -> np.ndarray:
    """``tails[k]``: the mass at and beyond ``grid[k]`` (trapezoid rule)."""
    import numpy as np

    return np.asarray((np.cumsum(dens[::-1])[::-1] - dens / 2) * _STEP)


def _upper_mass(dens: np.ndarray, grid: np.ndarray, c: float) -> float:
    import numpy as np

    tail = _tails(dens)
    k = int(np.searchsorted(grid, c))
    if k <= 0:
        return float(tail[0])
    if k >= len(grid):
        return 0.0
    frac = (grid[k] - c) / _STEP  # linear between the grid points around c
    return float(tail[k] + frac * (tail[k - 1] - tail[k]))


def _critical(dens: np.ndarray, grid: np.ndarray, target: float) -> float:
    """The ``c`` whose upper tail mass under ``dens`` is ``target`` (linear between grid
    points); a look that may spend nothing gets a boundary no path crosses."""
    import numpy as np

    if target <= 0:
        return math.inf
    tail = _tails(dens)
    k = int(np.searchsorted(-tail, -target))  # first grid point whose tail <= target
    if k <= 0:
        return float(grid[0])
    if k >= len(grid):
        return float(grid[-1])
    hi, lo = tail[k - 1], tail[k]
    frac = 0.0 if hi == lo else (hi - target) / (hi - lo)
    return float(grid[k - 1] + frac * _STEP)


def nominal(c: float) -> float:
    """The one-sided nominal level of critical value ``c`` (turned into a t quantile
    where the variance is estimated)."""
    if math.isinf(c):
        return 0.0
    return 1 - _N.cdf(c)
