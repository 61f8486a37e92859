"""The statistics of the gate: the geometric-mean ratio of two releases' rates.

A gate row compares the candidate's samples of one metric with the baseline's. On log
rates (a rate's noise is multiplicative) the estimate is the difference of the means,
``d = mean(log c) - mean(log b)``, i.e. the log of the geometric-mean ratio, turned so
that ``d > 0`` is better. Its standard error is Welch's (unequal variances), plus the
box's restart-to-restart offset when one was measured (``servegate bench noise``): the
baseline and the candidate always run in different service starts, and no number of
trials inside one start averages that offset away; spreading a side's repetitions over
``k`` starts divides its share of the offset's variance by ``k`` (:func:`plan_starts`).

``tolerance`` is the smallest loss the gate must catch. With ``T = log(1 - tolerance)``
and the midpoint ``M = T / 2``:

- **FAIL** when ``d < M`` *and* a one-sided Welch t-test rejects "no loss" at level
  ``alpha`` (the upper bound of ``d`` is below 0);
- **PASS** when ``d >= M`` *and* the lower bound of ``d`` at level ``beta`` is at or above
  ``T`` (a loss of the tolerance is excluded);
- otherwise **INCONCLUSIVE**: the gate measures again, up to its cap. A row still open
  at the cap had no significant loss: policy ``evidence`` PASSes it and says which
  loss these samples could have resolved — unless the estimate itself is a loss beyond
  the tolerance (``d < T``): then it stays INCONCLUSIVE and the release is rolled back
  (scattered samples are no evidence that a large loss is absent); ``fail`` and
  ``pass`` decide flatly.

``alpha`` (false alarms, default 5 % per check) is split over the check's deciding rows
and over the looks a sequential gate takes; ``beta`` (misses, default 1 %) over the looks
(Bonferroni: conservative, and it holds whatever the looks). So an unchanged release
FAILs a check with probability at most ``alpha``, however noisy the box; a loss of the
tolerance is caught with probability ``1 - beta`` once the repetitions suffice for the
box's noise: :func:`plan` says how many, :func:`resolvable` which tolerance a box
resolves at a given count.

Why not the bootstrap of the median ratio used before: with 3 vs 3 trials its interval
is a fixed rank rule (``[min C / max B, max C / min B]``), and a row FAILed only when the
whole interval lay below ``1 - tolerance``, so a loss of exactly the tolerance was caught
half the time. ``benchmarks/gate_power.py --simulate`` measures the rule here.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from scipy.special import fdtrc, stdtrit  # type: ignore[import-untyped]


@dataclass(frozen=True)
class Comparison:
    """Candidate vs baseline on log rates; ``d > 0`` is better."""

    d: float
    se: float
    df: float
    n_base: int
    n_cand: int
    #: each side's own log SD (its scatter within the run; 0 when not measured)
    sd_base: float = 0.0
    sd_cand: float = 0.0
    #: the variance the candidate's scatter may add to the baseline's without being
    #: erratic: the restart offset's, when its samples come from several service starts
    spread: float = 0.0

    @property
    def ratio(self) -> float:
        """The geometric-mean ratio, turned so that > 1 is better."""
        return math.exp(self.d)

    def upper(self, alpha: float) -> float:
        """One-sided upper bound of ``d`` at level ``alpha``."""
        return self.d + t_quantile(1 - alpha, self.df) * self.se

    def lower(self, beta: float) -> float:
        """One-sided lower bound of ``d`` at level ``beta``."""
        return self.d - t_quantile(1 - beta, self.df) * self.se


def t_quantile(p: float, df: float) -> float:
    if math.isinf(df):
        return float(statistics.NormalDist().inv_cdf(p))
    return float(stdtrit(df, p))


def _logs(values: Sequence[float]) -> list[float]:
    return [math.log(v) for v in values if v > 0]


def _mean_var(xs: Sequence[float]) -> tuple[float, float]:
    """Mean and sample variance in floats (``statistics`` is exact, and slow)."""
    mean = math.fsum(xs) / len(xs)
    return mean, math.fsum((x - mean) ** 2 for x in xs) / (len(xs) - 1)


def compare(
    base: Sequence[float],
    cand: Sequence[float],
    lower_is_better: bool = False,
    offset: float = 0.0,
    starts: tuple[int, int] = (1, 1),
) -> Comparison | None:
    """Welch on log rates; None when either side has fewer than two positive samples.

    ``offset``: the SD of a service start's log offset (the box's restart-to-restart
    noise); a side measured over ``k`` service starts (``starts``: baseline, candidate)
    carries ``offset**2 / k`` of it, so it adds ``offset**2 * (1/kb + 1/kc)`` to the
    variance of ``d``."""
    lb, lc = _logs(base), _logs(cand)
    if len(lb) < 2 or len(lc) < 2:
        return None
    (mb, vb), (mc, vc) = _mean_var(lb), _mean_var(lc)
    vb_raw, vc_raw = vb, vc
    d = mb - mc if lower_is_better else mc - mb
    vb, vc = vb / len(lb), vc / len(lc)
    within = vb + vc
    if within > 0:
        df = within**2 / (vb**2 / (len(lb) - 1) + vc**2 / (len(lc) - 1))
    else:
        df = math.inf  # identical samples: only the offset (if any) is uncertain
    kb, kc = (max(k, 1) for k in starts)
    se = math.sqrt(within + offset**2 * (1 / kb + 1 / kc))
    if se == 0:
        se = 1e-12  # two exactly repeated sample sets: any loss at all is decisive
    spread = offset**2 if kc > 1 else 0.0
    return Comparison(d, se, df, len(lb), len(lc), math.sqrt(vb_raw), math.sqrt(vc_raw), spread)


def more_scattered(c: Comparison, alpha: float, at_least: float = 2.0) -> float | None:
    """The candidate's scatter over the baseline's (a ratio of log SDs) when it is both
    at least ``at_least`` and significant (a one-sided F test of the variances at level
    ``alpha``); None otherwise. An unchanged release on an unchanged box scatters like its
    baseline; one that serves some requests far slower and others faster scatters more,
    whatever its mean. A candidate spread over several service starts may add the
    restart offset's variance (``spread``) to the baseline's."""
    if c.n_base < 2 or c.n_cand < 2 or c.sd_cand == 0:
        return None
    allowed = c.sd_base**2 + c.spread
    if allowed == 0:
        return math.inf
    ratio = c.sd_cand / math.sqrt(allowed)
    if ratio < at_least:
        return None
    p = float(fdtrc(c.n_cand - 1, c.n_base - 1, ratio**2))
    return ratio if p < alpha else None


@dataclass(frozen=True)
class Levels:
    """Error rates of one row at one look."""

    alpha: float
    beta: float

    @classmethod
    def split(cls, false_alarm: float, miss: float, rows: int, looks: int) -> Levels:
        return cls(false_alarm / max(rows, 1) / max(looks, 1), miss / max(looks, 1))


def midpoint(tolerance: float) -> float:
    """``M``: half the log of the tolerated ratio."""
    return math.log(1 - tolerance) / 2


def decide(c: Comparison, tolerance: float, levels: Levels) -> str | None:
    """``FAIL``, ``PASS``, or None while the evidence is not decisive."""
    m, t = midpoint(tolerance), math.log(1 - tolerance)
    if c.d < m and c.upper(levels.alpha) < 0:
        return "FAIL"
    if c.d >= m and c.lower(levels.beta) >= t:
        return "PASS"
    return None


def _z(levels: Levels, df: float = math.inf) -> float:
    return max(t_quantile(1 - levels.alpha, df), t_quantile(1 - levels.beta, df))


def _se(cv: float, offset: float, n: int, starts: int = 1) -> float:
    return math.sqrt(2 * cv**2 / max(n, 1) + 2 * offset**2 / max(starts, 1))


def plan(
    cv: float,
    offset: float,
    tolerance: float,
    false_alarm: float,
    miss: float,
    rows: int,
    reps: int,
    cap: int,
    starts: int = 1,
) -> int | None:
    """Repetitions a side (from ``reps``, one more a look) at which a sequential gate on a
    box with within-run ``cv`` and restart ``offset`` (both as log SDs), each side spread
    over ``starts`` service starts, resolves ``tolerance`` at the given error rates; None:
    not within ``cap``."""
    for n in range(max(2, reps, starts), cap + 1):
        levels = Levels.split(false_alarm, miss, rows, n - reps + 1)
        if _se(cv, offset, n, starts) * _z(levels, 2 * n - 2) <= abs(midpoint(tolerance)):
            return n
    return None


def plan_starts(
    cv: float,
    offset: float,
    tolerance: float,
    false_alarm: float,
    miss: float,
    rows: int,
    reps: int,
    cap: int,
    max_starts: int,
) -> tuple[int, int] | None:
    """(repetitions, service starts) a side that resolve ``tolerance``: the fewest starts
    first (a restart costs a model load; a repetition, one request), then the fewest
    repetitions; None when no split within ``cap`` and ``max_starts`` resolves it. The
    restart offset is what only more starts average away."""
    for k in range(1, max(1, max_starts) + 1):
        n = plan(cv, offset, tolerance, false_alarm, miss, rows, reps, cap, k)
        if n is not None:
            return n, k
    return None


def resolvable(cv: float, offset: float, levels: Levels, n: int, starts: int = 1) -> float:
    """The smallest tolerance a gate resolves with ``n`` repetitions a side over
    ``starts`` service starts."""
    return 1 - math.exp(-2 * _z(levels, 2 * n - 2) * _se(cv, offset, n, starts))


def resolution(c: Comparison, levels: Levels) -> float:
    """The smallest tolerance these samples resolve (from their own standard error)."""
    return 1 - math.exp(-2 * _z(levels, c.df) * c.se)


def log_sd(values: Sequence[float]) -> float:
    """The SD of the log of positive values (about the CV for small noise); 0 for < 2."""
    logs = _logs(values)
    return statistics.stdev(logs) if len(logs) >= 2 else 0.0


def gm(values: Sequence[float]) -> float:
    logs = _logs(values)
    return math.exp(statistics.fmean(logs)) if logs else 0.0
