"""The statistics of the gate: the geometric-mean ratio of two releases' rates.

A gate row compares the candidate's samples of one metric with the baseline's. On log
rates (a rate's noise is multiplicative) the estimate is the difference of the means,
``d = mean(log c) - mean(log b)``, i.e. the log of the geometric-mean ratio, turned so
that ``d > 0`` is better. Its standard error is Welch's (unequal variances), plus the
box's restart-to-restart offset (``servegate bench noise`` and the gate's own starts;
the degrees of freedom of its estimate enter the t quantile, Welch-Satterthwaite): the
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
from fractions import Fraction


def stdtrit(df: float, p: float) -> float:
    """Student's t quantile (scipy.special's, imported on first use: every command that
    imports the gate would otherwise pay scipy's import, about a second of CPU)."""
    from scipy.special import stdtrit as quantile  # type: ignore[import-untyped]

    return float(quantile(df, p))


def fdtrc(df_num: float, df_den: float, f: float) -> float:
    """The F distribution's upper tail (scipy.special's, imported on first use)."""
    from scipy.special import fdtrc as tail

    return float(tail(df_num, df_den, f))


def chdtri(df: float, p: float) -> float:
    """The chi-squared quantile of upper tail ``p`` (scipy.special's, imported on first use)."""
    from scipy.special import chdtri as quantile

    return float(quantile(df, p))


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
    #: the service starts each side's samples came from
    starts: tuple[int, int] = (1, 1)
    #: each side's within-start share of Var(d) (the part more samples shrink)
    var_within: tuple[float, float] = (0.0, 0.0)
    #: the degrees of freedom of ``sd_base`` and ``sd_cand`` (0: n - 1)
    sd_df: tuple[int, int] = (0, 0)

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
    return stdtrit(df, p)


def _logs(values: Sequence[float]) -> list[float]:
    return [math.log(v) for v in values if v > 0]


def _mean_var(xs: Sequence[float]) -> tuple[float, float]:
    """Mean and sample variance in floats (``statistics`` is exact, and slow)."""
    mean = math.fsum(xs) / len(xs)
    return mean, math.fsum((x - mean) ** 2 for x in xs) / (len(xs) - 1)


def _blocks(logs: Sequence[float], blocks: Sequence[int] | None) -> list[list[float]]:
    """The samples of each service start, in order of first appearance."""
    if blocks is None or len(blocks) != len(logs):
        return [list(logs)]
    out: dict[int, list[float]] = {}
    for x, b in zip(logs, blocks, strict=True):
        out.setdefault(b, []).append(x)
    return list(out.values())


@dataclass(frozen=True)
class SideStats:
    """One side's log samples, by service start: the estimate is the mean of the starts'
    means (each start weighs the same, so a start's offset enters as ``offset² / k``)."""

    mean: float
    #: the pooled within-start variance and its degrees of freedom
    within: float
    df: int
    #: Var(mean) = within * factor + offset² / starts
    factor: float
    starts: int
    n: int
    #: the variance of the starts' means (0 with one start)
    between: float

    @classmethod
    def of(cls, logs: Sequence[float], blocks: Sequence[int] | None = None) -> SideStats:
        groups = [g for g in _blocks(logs, blocks) if g]
        means = [math.fsum(g) / len(g) for g in groups]
        k, n = len(groups), sum(len(g) for g in groups)
        ss = math.fsum((x - m) ** 2 for g, m in zip(groups, means, strict=True) for x in g)
        df = n - k
        factor = math.fsum(1 / len(g) for g in groups) / k**2
        between = _mean_var(means)[1] if k >= 2 else 0.0
        # one sample a start: no within-start scatter of its own (df 0); its starts'
        # scatter is the offset's evidence, with the pooled within-start variance
        within = ss / df if df > 0 else 0.0
        return cls(math.fsum(means) / k, within, df, factor, k, n, between)

    @property
    def sd(self) -> float:
        """The side's log SD: within its starts, or (one sample a start) across them."""
        return math.sqrt(self.within if self.df > 0 else self.between)

    @property
    def sd_df(self) -> int:
        return self.df if self.df > 0 else self.starts - 1

    def own_offset(self, within: float | None = None) -> tuple[int, float, float] | None:
        """(df, variance of a start's mean, its within-start part) from this side's own
        starts: evidence on the restart offset (None with fewer than two starts).
        ``within``: the pooled within-start variance (else the side's own; a side of one
        sample a start has none, and gives no evidence without it)."""
        w = within if within is not None else (self.within if self.df > 0 else None)
        if self.starts < 2 or w is None:
            return None
        return self.starts - 1, self.between, w * self.factor * self.starts


def offset_point(sources: Sequence[tuple[int, float, float]]) -> tuple[float, float, float]:
    """The restart offset's point estimate (a log SD) from independent sets of service
    starts, each ``(df, variance of a start's mean, the within-start part of it)``: the
    pooled between-start variance less its within-start part (at least 0); with the
    pooled variance of a start's mean and the degrees of freedom that say how well it is
    known (:func:`compare`'s ``offset_evidence``): the sets' own where they agree, fewer
    where one set's starts scatter far more than the rest (Satterthwaite's effective
    degrees of freedom of a weighted sum of variances)."""
    df = sum(s[0] for s in sources)
    if df < 1:
        raise ValueError("no two starts: nothing estimates the offset")
    between = math.fsum(d * b for d, b, _ in sources) / df
    within = math.fsum(d * w for d, _, w in sources) / df
    # Var(pooled) = 2 sum(d b_true²) / df²; b² overstates b_true² by (d + 2) / d
    spread = math.fsum(d * b * b * d / (d + 2) for d, b, _ in sources)
    eff = between * between * df * df / spread if spread > 0 else float(df)
    return math.sqrt(max(0.0, between - within)), between, min(float(df), eff)


def offset_differs(
    own: Sequence[tuple[int, float, float]], others: Sequence[tuple[int, float, float]]
) -> float:
    """The one-sided p-value that a row's own service starts scatter more than the
    restart offset the other rows' starts estimate allows (an F test of the row's
    between-start variance against its own within-start part plus the others' offset);
    1.0 where either side has no two starts."""
    if sum(s[0] for s in own) < 1 or sum(s[0] for s in others) < 1:
        return 1.0
    _, between, df_own = offset_point(own)
    within = math.fsum(d * w for d, _, w in own) / sum(d for d, _, _ in own)
    offset, _, df_others = offset_point(others)
    expected = within + offset**2
    if expected <= 0:
        return 0.0 if between > 0 else 1.0
    return fdtrc(df_own, df_others, between / expected)


def compare(
    base: Sequence[float],
    cand: Sequence[float],
    lower_is_better: bool = False,
    offset: float = 0.0,
    starts: tuple[int, int] = (1, 1),
    blocks: tuple[Sequence[int] | None, Sequence[int] | None] = (None, None),
    prior: tuple[int, float] | None = None,
    offset_evidence: tuple[float, float] | None = None,
) -> Comparison | None:
    """Welch on log rates; None when either side has fewer than two positive samples.

    ``offset``: the SD of a service start's log offset (the box's restart-to-restart
    noise); a side measured over ``k`` service starts carries ``offset**2 / k`` of it.
    ``blocks`` (baseline, candidate): the service start of each sample; a side's estimate
    is then the mean of its starts' means and its within variance is pooled within the
    starts. Without them ``starts`` says how many starts a side's samples came from.
    ``prior``: the box's within-start log variance from ``bench noise`` (degrees of
    freedom, variance), pooled with both sides'.
    ``offset_evidence`` (variance of a start's mean, its degrees of freedom): ``offset``
    is a point estimate from that many service starts' worth of freedom, and the t test's
    degrees of freedom are Welch-Satterthwaite's over the within-start part and it (the
    uncertainty of a measured offset is paid in the t quantile, not by inflating it)."""
    lb, lc = _logs(base), _logs(cand)
    if len(lb) < 2 or len(lc) < 2:
        return None
    bb = blocks[0] if blocks[0] is not None and len(blocks[0]) == len(base) else None
    bc = blocks[1] if blocks[1] is not None and len(blocks[1]) == len(cand) else None
    sb = SideStats.of(lb, [b for b, v in zip(bb, base, strict=True) if v > 0] if bb else None)
    sc = SideStats.of(lc, [b for b, v in zip(bc, cand, strict=True) if v > 0] if bc else None)
    d = sb.mean - sc.mean if lower_is_better else sc.mean - sb.mean
    # the box's within-start variance, pooled over both sides and the noise record: an
    # unchanged release scatters like its baseline (one that scatters more only widens
    # the interval, and :func:`more_scattered` names it); a three-sample baseline alone
    # would leave the t test two degrees of freedom. A side measured one sample a start
    # ("whole") has no within-start scatter of its own: its starts' scatter is the
    # offset and the within-start noise together, so its mean's variance is that scatter
    # over its starts, with its own degrees of freedom (a t test on start means), and no
    # offset is added on top. Only a given offset (taken as known), with a within-start
    # variance measured elsewhere, models it instead.
    given = offset_evidence is None and offset > 0
    ss = sb.within * sb.df + sc.within * sc.df + (prior[0] * prior[1] if prior else 0.0)
    df_w = sb.df + sc.df + (prior[0] if prior else 0)
    # a given offset models a whole side only where a within-start variance is known
    modelled = given and df_w > 0
    whole = tuple(not modelled and s.df == 0 and s.starts >= 2 for s in (sb, sc))
    pooled = ss / df_w if df_w > 0 else 0.0
    vb, vc = (s.between / s.starts if w else pooled * s.factor
              for s, w in zip((sb, sc), whole, strict=True))  # fmt: skip
    kb = sb.starts if bb else max(starts[0], 1)
    kc = sc.starts if bc else max(starts[1], 1)
    g = (0.0 if whole[0] else 1 / kb) + (0.0 if whole[1] else 1 / kc)
    within = vb + vc
    se = math.sqrt(within + offset**2 * g)
    # Welch-Satterthwaite over the parts: the pooled within-start variance, each whole
    # side's scatter, and a measured offset's evidence; never more than they hold
    shared = math.fsum(v for v, w in zip((vb, vc), whole, strict=True) if not w)
    parts = shared**2 / df_w if shared > 0 else 0.0
    most = float(df_w) if shared > 0 else 0.0
    for v, w, side in zip((vb, vc), whole, (sb, sc), strict=True):
        if w and v > 0:
            parts, most = parts + v**2 / (side.starts - 1), most + side.starts - 1
    if offset_evidence is not None and offset_evidence[1] > 0 and g > 0:
        parts += (offset_evidence[0] * g) ** 2 / offset_evidence[1]
        most += offset_evidence[1]
    elif given and g > 0:
        most = math.inf  # a given offset is taken as known
    df = max(1.0, min(most, se**4 / parts)) if parts > 0 else math.inf
    if se == 0:
        se = 1e-12  # two exactly repeated sample sets: any loss at all is decisive
    spread = offset**2 if kc > 1 else 0.0
    return Comparison(
        d, se, df, len(lb), len(lc), sb.sd, sc.sd, spread,
        (kb, kc), (vb, vc), (sb.sd_df, sc.sd_df),
    )  # fmt: skip


def tail_p(slow_cand: int, n_cand: int, slow_base: int, n_base: int) -> float:
    """One-sided Fisher exact test: the probability of at least ``slow_cand`` far-slow
    trials on the candidate if both sides shared one rate (a hypergeometric tail)."""
    total, slow = n_cand + n_base, slow_cand + slow_base
    if slow_cand == 0 or total == 0:
        return 1.0
    hi = min(slow, n_cand)
    # whole numbers throughout: the counts of a load point of a few hundred requests are
    # beyond a float (math.comb(1200, 600) has 360 digits)
    ways = sum(math.comb(slow, x) * math.comb(total - slow, n_cand - x)
               for x in range(slow_cand, hi + 1))  # fmt: skip
    return min(1.0, float(Fraction(ways, math.comb(total, n_cand))))


#: a sample farther than this many robust SDs from its side's median is an outlier ...
OUTLIER_Z = 5.0
#: ... and at least this far (log: about 12 %): ordinary scatter is never one
OUTLIER_MIN = 0.12
#: the robust SD is never taken below this (log): identical samples flag nothing small
OUTLIER_FLOOR = 0.005
#: a side needs this many samples for its median to mean anything
OUTLIER_SIDE = 4


def outliers(base: Sequence[float], cand: Sequence[float]) -> tuple[list[int], list[int]]:
    """Indices of the samples far from their side's bulk: more than :data:`OUTLIER_Z`
    robust SDs and more than :data:`OUTLIER_MIN` from the bulk's centre. A side's bulk is
    the tightest strict majority of its log samples (half of them plus one), its centre
    their median: two bursts in four samples move a side's median to the middle of
    nowhere, never the tightest three. The robust SD is the median absolute deviation of
    both sides' samples from their own centres, pooled. A side needs
    :data:`OUTLIER_SIDE` samples for a bulk to mean anything, and only a minority of a
    side is ever set apart: a side whose far samples are half of it or more has no bulk
    and is judged whole. Both directions count; :func:`servegate.judging.verdict` tells
    the slow ones apart."""
    sides = [_logs_all(base), _logs_all(cand)]
    resid: list[list[float]] = []
    for logs in sides:
        centre = _bulk_centre(logs)
        resid.append([0.0] * len(logs) if centre is None else [x - centre for x in logs])
    pooled = [abs(r) for rs in resid for r in rs if math.isfinite(r)]
    if not pooled:
        return [], []
    scale = max(1.4826 * statistics.median(pooled), OUTLIER_FLOOR)
    cut = max(OUTLIER_Z * scale, OUTLIER_MIN)
    flagged = []
    for rs in resid:
        far = [i for i, r in enumerate(rs) if abs(r) > cut]
        flagged.append(far if 2 * len(far) < len(rs) else [])
    return flagged[0], flagged[1]


def _bulk_centre(logs: Sequence[float]) -> float | None:
    """The median of the tightest strict majority of a side's finite log samples; None
    with fewer than :data:`OUTLIER_SIDE` of them."""
    xs = sorted(x for x in logs if math.isfinite(x))
    if len(xs) < OUTLIER_SIDE:
        return None
    m = len(xs) // 2 + 1
    start = min(range(len(xs) - m + 1), key=lambda i: (xs[i + m - 1] - xs[i], i))
    return statistics.median(xs[start : start + m])


def _logs_all(values: Sequence[float]) -> list[float]:
    """log of each value, position kept (not a number: nan)."""
    return [math.log(v) if v > 0 and math.isfinite(v) else math.nan for v in values]


def more_scattered(
    c: Comparison, alpha: float, at_least: float = 2.0, box: float = 0.0
) -> float | None:
    """The candidate's scatter over the baseline's (a ratio of log SDs) when it is both
    at least ``at_least`` and significant (a one-sided F test of the variances at level
    ``alpha``); None otherwise. An unchanged release on an unchanged box scatters like its
    baseline; one that serves some requests far slower and others faster scatters more,
    whatever its mean. A candidate spread over several service starts may add the
    restart offset's variance (``spread``) to the baseline's, and one measured while the
    box itself scattered may add that (``box``: the log variance of the reference
    workload beside its groups). A real box's scatter changes from one run to the next
    (log SD 0.009 in one run of an unchanged demo release, 0.19 in the next, its
    reference scattering 0.13): without ``box`` an unchanged release measured in a noisy
    minute reads as erratic. An erratic release scatters while the box stays steady."""
    if c.n_base < 2 or c.n_cand < 2 or c.sd_cand == 0:
        return None
    allowed = c.sd_base**2 + c.spread + box
    if allowed == 0:
        return math.inf
    ratio = c.sd_cand / math.sqrt(allowed)
    if ratio < at_least:
        return None
    df_b, df_c = (d or n - 1 for d, n in zip(c.sd_df, (c.n_base, c.n_cand), strict=True))
    p = fdtrc(df_c, df_b, ratio**2)
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


def _final_level(level: float, schedule: Sequence[float]) -> float:
    """The nominal level of the last look's group-sequential boundary for looks whose
    variances are ``schedule`` (the last one the cap's)."""
    from servegate.judging import sequential

    if len(schedule) <= 1:
        return level
    info = [1 / max(v, 1e-18) for v in schedule]
    return sequential.nominal(sequential.boundaries(info, level)[-1])


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
    prior_df: int = 0,
) -> int | None:
    """Repetitions a side at which a gate on a box with within-run ``cv`` and restart
    ``offset`` (both log SDs), each side spread over ``starts`` service starts, lets an
    unchanged release PASS every row with probability ``1 - false_alarm`` while a loss of
    ``tolerance`` PASSes a row at most ``miss`` (the last look's group-sequential
    boundary over looks from ``reps``); None: not within ``cap``."""
    for n in range(max(2, reps, starts), cap + 1):
        if _resolved(cv, offset, false_alarm, miss, rows, reps, n, starts, prior_df) <= tolerance:
            return n
    return None


def _resolved(
    cv: float, offset: float, false_alarm: float, miss: float, rows: int, reps: int, n: int,
    starts: int, prior_df: int = 0,
) -> float:  # fmt: skip
    """The smallest loss a gate that ends at ``n`` a side tells from none at these rates."""
    schedule = [_se(cv, offset, m, starts) ** 2 for m in range(min(reps, n), n + 1)]
    # one repetition a start: a t test on the starts' means (no within-start part)
    df = 2 * (starts - 1) if n == starts else max(2 * (n - starts), 1) + prior_df
    z_pass = t_quantile(1 - _final_level(miss, schedule), df)
    z_power = t_quantile(1 - false_alarm / 2 / max(rows, 1), math.inf)
    return 1 - math.exp(-(z_pass + z_power) * _se(cv, offset, n, starts))


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
    prior_df: int = 0,
) -> tuple[int, int] | None:
    """(repetitions, service starts) a side that resolve ``tolerance``: the fewest starts
    first (a restart costs a model load; a repetition, one request), then the fewest
    repetitions; None when no split within ``cap`` and ``max_starts`` resolves it. The
    restart offset is what only more starts average away."""
    for k in range(1, max(1, max_starts) + 1):
        n = plan(cv, offset, tolerance, false_alarm, miss, rows, reps, cap, k, prior_df)
        if n is not None:
            return n, k
    return None


def resolvable(
    cv: float, offset: float, levels: Levels, n: int, starts: int = 1, prior_df: int = 0
) -> float:
    """The smallest tolerance a gate of ``n`` repetitions a side over ``starts`` service
    starts resolves: an unchanged release PASSes a row with probability ``1 -
    levels.alpha`` and a loss of it PASSes at most ``levels.beta``."""
    return _resolved(cv, offset, 2 * levels.alpha, levels.beta, 1, n, n, starts, prior_df)


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
