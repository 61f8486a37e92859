"""The reference workload: how fast the box is right now, whatever release it serves.

A bench measures it right before and right after every group, while the server is idle:
fixed float64 matrix products through NumPy's BLAS, one BLAS thread on each core the
bench may use, all cores at once, in short rounds over a window of about a second. Its
rate (GFLOP/s, all cores together) moves when the box moves — a neighbour taking a
core, a throttled CPU, a noisy VM host — and never because of the release. The gate
compares the rates beside the baseline's groups with those beside the candidate's: a
change beyond ``gate.drift`` is a change of the machine, answered INCONCLUSIVE instead
of a verdict on the release (:mod:`servegate.judging.verdict`).

Two things it must not mistake for the box:

- an engine that is still spinning. vLLM's CPU engine keeps its OpenMP threads busy
  for about half a second after the last request ends; a reading taken then is a
  fraction of the box's. The rate is the second-best round of the whole window, so a
  window longer than the spin sees the box after it;
- its own threads' synchronisation. A multi-threaded BLAS product waits for its slowest
  thread: with one core shared, its rate falls off a cliff (a tenth of the idle rate on
  a 2-core box), far beyond the capacity the box lost. One BLAS thread per core, each on
  its own product, loses what the cores lose and no more.

Written here rather than taken from a benchmark suite because it must be small,
deterministic in its work (the same FLOPs every round), take about a second, and run
inside the bench process between two requests; NumPy's matmul and threadpoolctl are the
well-kept pieces it stands on. On a GPU box it sees host contention, not GPU clocks.
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor

SIZE = 320
#: seconds of work in one reading: longer than an engine's spin after a request
WINDOW = 1.2
#: the reading is cut into slices of this many seconds; the second-best slice counts
SLICE = 0.15


def cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def workload() -> str:
    """What :func:`rate` measures, kept beside every reading: readings of different
    workloads are never compared."""
    return f"numpy float64 {SIZE}x{SIZE} matmul, 1 BLAS thread x {cores()} cores"


def rate(window: float = WINDOW) -> float:
    """GFLOP/s the box gives the reference products now, all cores together: the
    products finished in each slice of ``window`` seconds, the second-best slice. A slice
    that a passing load slowed (an engine's spin, another process's poll) does not
    count; a load that stays (a neighbour on a core) slows every slice. Each core's
    thread runs on its own, never waiting for another: a thread that shares its core
    loses its share and no more."""
    # imported here: every command that imports the bench would pay NumPy's import
    import numpy as np
    from threadpoolctl import threadpool_limits

    n = cores()
    rng = np.random.default_rng(20261203)
    mats = [(rng.standard_normal((SIZE, SIZE)), rng.standard_normal((SIZE, SIZE)))
            for _ in range(n)]  # fmt: skip
    slices = max(2, round(window / SLICE))

    def work(i: int, start: float) -> list[float]:
        a, b = mats[i]
        a @ b  # BLAS start-up
        done = []
        end = start + slices * SLICE
        while (t := time.perf_counter()) < end or t < start:
            a @ b
            done.append(time.perf_counter())
        return done

    with threadpool_limits(limits=1, user_api="blas"), ThreadPoolExecutor(n) as pool:
        start = time.perf_counter() + 0.02  # every thread started, BLAS warm
        finished = [t for ts in pool.map(work, range(n), [start] * n) for t in ts]
    counts = [0] * slices
    for t in finished:
        k = int((t - start) / SLICE)
        if 0 <= k < slices:
            counts[k] += 1
    flops = 2.0 * SIZE**3
    return float(sorted(counts)[-2] * flops / SLICE / 1e9)
