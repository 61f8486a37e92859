"""The statistics of the gate: a bootstrap interval of the ratio of medians.

Why a bootstrap of the median ratio and not Mann-Whitney U: the gate's question is
"is the candidate worse than the baseline by more than the tolerance?", an effect
size; the bootstrap answers with an interval directly comparable with the tolerance.
Mann-Whitney tests "any difference at all" and, with the 3 vs 3 trials a release can
afford at 128K, its smallest possible two-sided p-value is 0.1 — it could never
reject at 5 %. The resampling is seeded, so the same samples give the same verdict.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Sequence


def median_ratio_interval(
    base: Sequence[float],
    cand: Sequence[float],
    confidence: float = 0.90,
    resamples: int = 4000,
    seed: int = 20261202,
) -> tuple[float, float, float]:
    """(point, low, high) of median(cand) / median(base), percentile bootstrap."""
    if not base or not cand:
        raise ValueError("both sides need samples")
    mb = statistics.median(base)
    point = statistics.median(cand) / mb
    rng = random.Random(seed)
    ratios = []
    nb, nc = len(base), len(cand)
    for _ in range(resamples):
        b = statistics.median(rng.choices(base, k=nb))
        c = statistics.median(rng.choices(cand, k=nc))
        if b:
            ratios.append(c / b)
    ratios.sort()
    alpha = (1 - confidence) / 2
    lo = ratios[int(alpha * (len(ratios) - 1))]
    hi = ratios[int((1 - alpha) * (len(ratios) - 1))]
    return point, lo, hi
