"""The box's own noise: within-run CV and the restart-to-restart offset of a release.

``servegate bench noise`` measures the live release in several service starts (the same
cases, the same repetitions each) and estimates, per case and metric, on log rates:

- ``cv``: the pooled within-start standard deviation (what more trials average away);
- ``offset``: the standard deviation of a start's mean beyond what ``cv`` explains
  (what no number of trials inside one start averages away: the baseline and the
  candidate always run in different starts), as an upper confidence bound
  (:data:`CONFIDENCE`, 80 %) from the starts measured; ``offset_estimate`` is the point
  estimate beside it.

Why a bound: a handful of starts barely measures a variance between them (three starts
give two degrees of freedom), and the method-of-moments estimate is often exactly 0
when the starts' means happen to agree. A gate that takes that 0 at its word narrows its
interval below what the box can hold: on one H200 a prefill offset estimated at 0.0 % from
three starts let an identical release FAIL once in ten gates, and with a 2 % offset a
release 5 % slower PASSes more often than ``gate.miss`` allows (``tests/bench/
test_noise_plan.py`` replays both). The bound shrinks toward the estimate as starts are
added (``bench noise --restarts``), so a box measured more is planned more tightly.

The estimate lives with the host's records (``<host.root>/noise.json``) and is tied to
the bench fingerprint it was measured with; the gate reads the bound to plan its
repetitions and starts and to say before measuring which loss the box can resolve.
To judge, it pools the record's starts with its own (:meth:`Noise.evidence`) into a
point estimate of the offset and pays for how few starts that is in the t test's
degrees of freedom: an interval as wide as the evidence, neither the bound's
(which, inside a 99 % interval, rolled back an unchanged release a quarter of the time
at a 2 % CV and a 1 % offset in ``benchmarks/gate_sim.py``) nor a bare 0.
"""

from __future__ import annotations

import datetime as dt
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from servegate import documents
from servegate.bench.results import Samples
from servegate.judging import stats
from servegate.pipeline import atomic

#: 2: ``offset`` is an upper confidence bound (1 held the point estimate)
SCHEMA = 2
FILE = "noise.json"
#: the one-sided confidence of the restart offset the gate uses
CONFIDENCE = 0.80
#: the largest CV or offset (log SD) a record may hold: 5 is a factor of about 150
MAX_LOG_SD = 5.0


@dataclass(frozen=True)
class Noise:
    cv: float
    #: what the gate uses: the offset's upper confidence bound
    offset: float
    starts: int
    samples: int
    #: the point estimate (method of moments; None: not known, e.g. set by hand)
    offset_estimate: float | None = None
    #: the one-sided confidence of ``offset`` (:data:`CONFIDENCE`; written beside the
    #: estimate, so a reader knows what the bound is)
    offset_confidence: float | None = None

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "cv": round(self.cv, 5),
            "offset": round(self.offset, 5),
            "starts": self.starts,
            "samples": self.samples,
        }
        if self.offset_estimate is not None:
            out["offset_estimate"] = round(self.offset_estimate, 5)
            out["offset_confidence"] = CONFIDENCE
        return out

    def evidence(self) -> tuple[int, float, float]:
        """What the gate pools with its own service starts: (degrees of freedom, the
        variance of a start's mean, its within-start part), recovered from the record
        (from the point estimate where it is above 0, else from the bound)."""
        df = self.starts - 1
        within = self.cv**2 / (self.samples / self.starts)
        if self.offset_estimate:
            return df, self.offset_estimate**2 + within, within
        return df, (self.offset**2 + within) * stats.chdtri(df, CONFIDENCE) / df, within

    def problem(self) -> str:
        """Why the gate may not use this row ("" when it may): out of range, a bound
        below its own estimate, or from one start."""
        for name in ("cv", "offset", "offset_estimate"):
            value = getattr(self, name)
            if value is not None and not (0 <= value <= MAX_LOG_SD):  # NaN fails too
                return f"{name} {value} outside 0..{MAX_LOG_SD}"
        if self.offset_estimate is not None and self.offset < self.offset_estimate:
            return "an upper bound below its own estimate"
        if self.starts < 2:
            return "one start bounds no offset between starts"
        if self.samples < self.starts:
            return "fewer samples than starts"
        return ""


@dataclass(frozen=True)
class NoiseRecord:
    """``noise.json`` as written (schema :data:`SCHEMA`)."""

    schema: int
    kind: Literal["servegate.noise"]
    measured_at: str
    host: str
    sha: str
    fingerprint: dict[str, Any]
    rows: dict[str, Noise]
    result_files: list[str] = field(default_factory=list)


def estimate(groups: Sequence[Sequence[float]]) -> Noise | None:
    """One-way random effects on log values: ``groups`` are the samples of each start.

    The between-start variance of a start's mean, ``s_b²`` on ``k - 1`` degrees of
    freedom, estimates ``offset² + cv² / n``; its upper bound at :data:`CONFIDENCE` is
    ``(k - 1) s_b² / χ²(k - 1)`` at the lower ``1 - CONFIDENCE`` quantile (the textbook
    interval for a variance), less ``cv² / n``."""
    logs = [[math.log(v) for v in g if v > 0] for g in groups]
    logs = [g for g in logs if len(g) >= 2]
    if len(logs) < 2:  # one start bounds nothing between starts: no estimate, not a 0
        return None
    within_ss = sum(math.fsum((x - math.fsum(g) / len(g)) ** 2 for x in g) for g in logs)
    within_df = sum(len(g) - 1 for g in logs)
    cv = math.sqrt(within_ss / within_df) if within_df else 0.0
    means = [math.fsum(g) / len(g) for g in logs]
    n_bar = sum(len(g) for g in logs) / len(logs)
    between = stats.log_sd([math.exp(m) for m in means]) ** 2
    point = math.sqrt(max(0.0, between - cv**2 / n_bar))
    df = len(logs) - 1
    upper = df * between / stats.chdtri(df, CONFIDENCE)  # >= between: the quantile < df
    offset = math.sqrt(max(0.0, upper - cv**2 / n_bar))
    return Noise(cv, offset, len(logs), sum(len(g) for g in logs), point)


def measure(starts: Sequence[Samples], metrics: Sequence[str]) -> dict[str, Noise]:
    """Per ``case:metric``: the noise over the service starts' samples."""
    out: dict[str, Noise] = {}
    cases = sorted({cid for s in starts for cid in s.cases})
    for cid in cases:
        for m in metrics:
            groups = [s.cases[cid].metrics.get(m, []) for s in starts if cid in s.cases]
            found = estimate(groups)
            if found is not None:
                out[f"{cid}:{m}"] = found
    return out


def save(
    root: Path,
    found: Mapping[str, Noise],
    fingerprint: Mapping[str, Any],
    sha: str,
    host: str,
    result_files: Sequence[str],
) -> Path:
    path = root / FILE
    atomic.write_json(
        path,
        {
            "schema": SCHEMA,
            "kind": "servegate.noise",
            "measured_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "host": host,
            "sha": sha,
            "fingerprint": dict(fingerprint),
            "rows": {k: v.as_dict() for k, v in found.items()},
            "result_files": list(result_files),
        },
    )
    return path


def load(root: Path, digest: str) -> tuple[dict[str, Noise], str]:
    """(noise per case:metric, what it is). Empty with the reason when there is none or
    it was measured with another bench fingerprint."""
    path = root / FILE
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        return {}, "no noise measurement on this host (`servegate bench noise`)"
    except (OSError, ValueError, RecursionError) as exc:
        return {}, f"{path} is unreadable ({str(exc)[:200]}): re-run `servegate bench noise`"
    if isinstance(doc, dict) and doc.get("schema") == 1:
        return {}, (
            f"{path} was measured by an earlier servegate, whose restart offset was a point "
            "estimate (three starts often put it at 0, too narrow for the gate): re-run "
            "`servegate bench noise`"
        )
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        return {}, f"{path} is not a noise record of schema {SCHEMA}"
    fingerprint = doc.get("fingerprint")
    if not isinstance(fingerprint, dict) or fingerprint.get("digest") != digest:
        return {}, f"{path} was measured with other bench settings: re-run `servegate bench noise`"
    try:
        record = documents.read(NoiseRecord, doc)
    except documents.DocumentError as exc:
        return (
            {},
            f"{path} is not a noise record ({str(exc)[:200]}): re-run `servegate bench noise`",
        )
    bad = {k: why for k, row in record.rows.items() if (why := row.problem())}
    if bad:
        key, why = next(iter(bad.items()))
        return {}, (
            f"{path} holds a row that is not a noise estimate ({key}: {why}; an offset "
            "bound not below its estimate, two starts or more): it is ignored; re-run "
            "`servegate bench noise`"
        )
    rows = dict(record.rows)
    return rows, f"noise measured {record.measured_at[:40]} on {record.sha[:12] or '?'}"
