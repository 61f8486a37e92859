"""Change points: the releases where the level of a metric shifted.

Circular binary segmentation (Olshen et al., 2004) of a metric's release-by-release
geometric means (their logs, oldest first), for ``release history`` and ``servegate
report`` (:func:`servegate.judging.trend.shifts`). In a segment, every arc of releases (at
least :data:`MIN_SEGMENT` long, leaving pieces of at least that many) is compared with
the rest by a pooled two-sample ``t``; the arc with the largest ``|t|`` is the
candidate: one change point when it touches an end of the segment, two when it lies
inside (a level that dropped and came back, a regression and its fix, which a single
split cannot see). Its p-value is the chance that a segment of that length without any
shift reaches that maximum ``|t|``: the maximum over the arcs of an i.i.d. normal series
is location- and scale-free, so its distribution depends on the length alone, simulated
once per length with a fixed seed. A candidate below ``alpha`` is kept and each piece is
searched again. The scan is in the p-value, so an unchanged history shows a change point
with probability ``alpha``; a plain t-test at the best split shows one several times as
often. A shift at the newest release alone is no change point yet (one release is not a
level): the trend check judges it.

**Why not Apache Otava** (e-divisive means, formerly Hunter): apache-otava 0.8.0 does not
install beside servegate. On Python below 3.14 it pins ``numpy==2.2.0.*`` and
``scipy<1.17`` (servegate is tested with numpy 2.4.6 and scipy 1.17.1, constraints.txt),
pins ``ruamel-yaml==0.18.16`` (ansible-lint here runs on 0.19.1), and requires
google-cloud-bigquery, pg8000 and slack-sdk for its importers and notifiers whichever one
uses. Its e-divisive significance test permutes the series, and a permutation test of a
release history (5 to 20 points) cannot reach 5 % for a clean shift with fewer than
about four releases on each side; its t-test variant takes the p-value of the best split
as if the split had been chosen in advance.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported in the functions that compute: see change_points
    import numpy as np
    import numpy.typing as npt

#: releases on each side of a change point (a shift at the newest release alone is the
#: trend check's to judge, not a change point yet)
MIN_SEGMENT = 2
#: series simulated per length for the p-values
SIMULATIONS = 4_000


@dataclass(frozen=True)
class Shift:
    """A change point: the level of a series moved at ``index`` (the first point of the
    new level)."""

    index: int
    #: the geometric means of the segments before and after
    before: float
    after: float
    #: the chance of a maximum ``|t|`` this large in a segment without a shift
    pvalue: float

    @property
    def change(self) -> float:
        return self.after / self.before - 1


def change_points(
    series: Sequence[float], *, alpha: float = 0.05, min_segment: int = MIN_SEGMENT
) -> list[Shift]:
    """Where the level of ``series`` (positive values, oldest first: a metric's
    release-by-release geometric means) shifted: circular binary segmentation (the
    module's docstring says how). [] for a series too short to hold a change point
    (fewer than ``2 * min_segment`` points) or not all positive."""
    # NumPy is imported where it computes, not with the module: every command that
    # imports the gate would pay its import to draw no trend at all
    import numpy as np

    if len(series) < 2 * min_segment or not all(math.isfinite(v) and v > 0 for v in series):
        return []
    logs = np.log(np.asarray(series, dtype=np.float64))
    found: list[tuple[int, float]] = []
    todo = [(0, len(logs))]
    while todo:
        start, stop = todo.pop()
        if stop - start < 2 * min_segment:
            continue
        (i, j), stat = _best_arc(logs[start:stop], min_segment)
        p = _pvalue(stat, stop - start, min_segment)
        if p >= alpha:
            continue
        cuts = [c for c in (i, j) if 0 < c < stop - start]
        found += [(start + c, p) for c in cuts]
        edges = [start, *(start + c for c in cuts), stop]
        todo += list(itertools.pairwise(edges))
    found.sort()
    edges = [0, *(i for i, _ in found), len(logs)]
    means = [math.exp(float(np.mean(logs[a:b]))) for a, b in itertools.pairwise(edges)]
    return [Shift(index, means[k], means[k + 1], p) for k, (index, p) in enumerate(found)]


@functools.lru_cache(maxsize=256)
def _arcs(n: int, min_segment: int) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.intp]]:
    """Every arc ``[i, j)`` of a series of ``n`` that leaves pieces of at least
    ``min_segment`` points: the arc, and what lies before and after it (unless empty)."""
    import numpy as np

    pairs = [
        (i, j)
        for i in range(0, n - min_segment + 1)
        for j in range(i + min_segment, n + 1)
        if (i == 0 or i >= min_segment)
        and (j == n or n - j >= min_segment)
        and (i, j) != (0, n)
        and n - (j - i) >= min_segment
    ]
    return np.array([i for i, _ in pairs], dtype=np.intp), np.array(
        [j for _, j in pairs], dtype=np.intp
    )


def _abs_t(x: npt.NDArray[np.float64], min_segment: int) -> npt.NDArray[np.float64]:
    """Pooled two-sample ``|t|`` of every arc of each row of ``x`` against the rest of
    the row (columns: the arcs of :func:`_arcs`)."""
    import numpy as np

    n = x.shape[-1]
    i, j = _arcs(n, min_segment)
    x = x - x.mean(axis=-1, keepdims=True)
    zero = np.zeros((*x.shape[:-1], 1))
    c1 = np.concatenate([zero, np.cumsum(x, axis=-1)], axis=-1)
    c2 = np.concatenate([zero, np.cumsum(x * x, axis=-1)], axis=-1)
    k = (j - i).astype(np.float64)
    s1, q1 = c1[..., j] - c1[..., i], c2[..., j] - c2[..., i]
    s2, q2 = c1[..., -1:] - s1, c2[..., -1:] - q1
    m1, m2 = s1 / k, s2 / (n - k)
    ss = np.maximum((q1 - s1 * m1) + (q2 - s2 * m2), 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.abs(m2 - m1) / np.sqrt(ss / (n - 2) * (1 / k + 1 / (n - k)))
    return np.where(np.isnan(t), 0.0, t)


def _best_arc(x: npt.NDArray[np.float64], min_segment: int) -> tuple[tuple[int, int], float]:
    import numpy as np

    t = _abs_t(x[np.newaxis, :], min_segment)[0]
    best = int(np.argmax(t))
    i, j = _arcs(len(x), min_segment)
    return (int(i[best]), int(j[best])), float(t[best])


def _pvalue(stat: float, n: int, min_segment: int) -> float:
    import numpy as np

    null = _null(n, min_segment)
    beyond = len(null) - int(np.searchsorted(null, stat, side="left"))
    return (1 + beyond) / (1 + len(null))


@functools.lru_cache(maxsize=256)
def _null(n: int, min_segment: int) -> npt.NDArray[np.float64]:
    """The maximum ``|t|`` over the arcs of i.i.d. normal series of length ``n``, sorted
    (simulated with a fixed seed: the same answer every time)."""
    import numpy as np

    rng = np.random.default_rng(20_250_000 + 1_000 * n + min_segment)
    per = max(1, 1_000_000 // max(len(_arcs(n, min_segment)[0]), 1))
    chunks = []
    for done in range(0, SIMULATIONS, per):
        x = rng.standard_normal((min(per, SIMULATIONS - done), n))
        chunks.append(_abs_t(x, min_segment).max(axis=-1))
    return np.sort(np.concatenate(chunks))
