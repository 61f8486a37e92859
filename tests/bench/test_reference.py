"""The reference workload sees a load that stays, and not an engine's passing spin."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from servegate.bench import document, reference, results

SPIN = """
import sys, time
end = time.monotonic() + float(sys.argv[1])
print("spinning", flush=True)
while time.monotonic() < end:
    pass
"""


@contextmanager
def spinners(seconds: float) -> Iterator[None]:
    """One busy process on every core the bench may use, for ``seconds``."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", SPIN, str(seconds)], stdout=subprocess.PIPE, text=True
        )
        for _ in range(reference.cores())
    ]
    try:
        for p in procs:
            assert p.stdout is not None
            assert p.stdout.readline().strip() == "spinning"
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait()
            if p.stdout is not None:
                p.stdout.close()


def test_an_engine_spinning_after_its_last_request_is_not_a_slower_box() -> None:
    # vLLM's CPU engine keeps its OpenMP threads busy for about half a second after a
    # request; the bench reads the box right then
    idle = reference.rate()
    with spinners(0.4):
        after_spin = reference.rate()
    assert after_spin > 0.75 * idle, (idle, after_spin)


def test_a_neighbour_that_stays_slows_the_reading() -> None:
    idle = reference.rate()
    with spinners(reference.WINDOW + 1.5):
        busy = reference.rate()
    assert busy < 0.8 * idle, (idle, busy)


def test_the_reading_names_its_workload_and_the_samples_keep_it() -> None:
    ref = document.group_reference(40.0, 90.0)
    assert ref is not None
    assert ref["rate"] == 60.0
    assert ref["workload"] == reference.workload()
    assert f"x {reference.cores()} cores" in ref["workload"]
    doc = {"cases": [{"id": "regular-2k", "groups": [{"reference": ref, "trials": []}]}]}
    cs = results.from_result(doc).cases["regular-2k"]
    assert cs.reference == [60.0]
    assert cs.reference_workload == reference.workload()
    kept = results.from_record(results.Samples("r", "h", {}, {"regular-2k": cs}).as_dict(), "r")
    assert kept.cases["regular-2k"].reference_workload == reference.workload()
