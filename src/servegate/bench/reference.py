"""The reference workload: how fast the box is right now, whatever release it serves.

A bench measures it right before and right after every group, while the server is idle:
a fixed set of float64 matrix products through NumPy's BLAS, on all the cores BLAS
uses (as a CPU engine's kernels do). Its rate (GFLOP/s) moves when the box moves — a
neighbour taking a core, a throttled CPU, a noisy VM host — and never because of the
release. The gate compares the rates beside the baseline's groups with those beside
the candidate's: a change beyond ``gate.drift`` is a change of the machine, answered
INCONCLUSIVE instead of a verdict on the release (:mod:`servegate.bench.verdict`).

Written here rather than taken from a benchmark suite because it must be small,
deterministic in its work (the same FLOPs every time), take about a tenth of a second,
and run inside the bench process between two requests; NumPy's matmul is the well-kept
piece it stands on. On a GPU box it sees host contention, not GPU clocks.
"""

from __future__ import annotations

import time

import numpy as np

SIZE = 320
PRODUCTS = 3
BLOCKS = 6


def rate() -> float:
    """GFLOP/s the box gives the reference products now: the second-best of a few short
    blocks. A block a passing hiccup slowed (another process's poll, a page fault) does
    not count; a load that stays (a neighbour on a core) slows every block."""
    rng = np.random.default_rng(20261203)
    a = rng.standard_normal((SIZE, SIZE))
    b = rng.standard_normal((SIZE, SIZE))
    a @ b  # the first product pays for BLAS start-up
    flops = 2.0 * SIZE**3 * PRODUCTS
    rates = []
    for _ in range(BLOCKS):
        start = time.perf_counter()
        for _ in range(PRODUCTS):
            a @ b
        rates.append(flops / (time.perf_counter() - start) / 1e9)
    return float(sorted(rates)[-2])
