"""Creeping losses: the candidate against the trend of this host's releases.

Every release passes its gate against the live release alone, so five releases that
each lose 2 % pass a 5 % gate one by one and together lose 10 %. The trend check
compares the candidate with the **best** of the last ``window`` released records of this
host measured with the same bench settings (the same fingerprint digest), or with a
pinned ``anchor`` release; change-point detection over the whole history says at which
release a level shifted.

**The comparison** (:func:`judge`) is the gate's: the geometric-mean ratio and Welch on
log rates (:func:`servegate.judging.stats.compare`), with the restart offset. An old
record is always another service start, so its offset never averages away: the caller
passes the box's measured offset per ``case:metric`` (``servegate bench noise``, its
80 % bound), and a row without one takes :data:`PRIOR_OFFSET`, never 0. With
``T = log(1 - tolerance)`` and ``d`` the log ratio against the best (``d < 0``: a loss):

- **FAIL** when the estimate is a cumulative loss beyond the tolerance (``d < T``) and
  the loss is significant: the upper bound of ``d`` at ``alpha / N`` is below 0;
- **INCONCLUSIVE** when the estimate is a loss beyond the tolerance that the history's
  noise cannot confirm (as the gate's ``evidence`` policy, never a pass), or when the box
  changed since the best record (its reference workload moved significantly and beyond ``drift``:
  :func:`servegate.judging.verdict.box_change`);
- **PASS** otherwise. ``excluded`` says whether the samples exclude a cumulative loss of
  the tolerance against *every* record of the window (each lower bound at ``miss`` at or
  above ``T``: an intersection-union test, so no correction is needed) or only show none;
  ``resolves`` which loss they could have resolved;
- **REPORT** (no verdict) with fewer than two comparable records in the window (with an
  anchor: without the anchor's record), for a report-only case, or when the candidate's
  own samples are no measurement (the bench gate decides those rows).

**Why ``alpha / N``.** The best of ``N`` noisy geometric means is biased upward (the
expected maximum of five standard normals is 1.16 of them), so an unchanged release
compared with the best at ``alpha`` fails more often than ``alpha``. Picking the best and
testing against it rejects no more often than testing against each of the ``N`` records
and failing if any rejects; Bonferroni over those ``N`` tests bounds the false alarms of
an unchanged release at ``alpha`` whatever their correlation (they share the candidate's
samples). It is conservative, and costs little: the quantile at ``alpha / 5`` is about
1.3 times the one at ``alpha``, and a creeping loss grows by a step each release. An
anchor is one record chosen in advance: no selection, no split. ``alpha`` is
``false_alarm`` split over the deciding rows, as the gate splits it.

Why "beyond the tolerance *and* significant" and not "significantly beyond the
tolerance" (the upper bound below ``T``): the latter needs the loss to exceed the
tolerance by a whole interval's width; on a box with a 1 % restart offset that is a
cumulative loss of about 10 % at 5 %, twice the budget. The rule here catches 2 % a
release by the third (72 % of simulated histories, CV 2 %, 1 % offset) or the fourth
release (96 %) and FAILs an unchanged release no more often than ``false_alarm`` (0.8 %
there). Like the gate, it reads the tolerance as the smallest loss that must be caught,
not as an allowance: a real 4 % loss FAILs in 30 % of those histories, when the best of
the window happened to be a lucky high (``tests/judging/test_trend.py``).

**Change points**: :func:`shifts` searches each metric's release-by-release geometric
means with :func:`servegate.judging.changes.change_points` (circular binary segmentation;
that module says how, and why not Apache Otava).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from servegate.bench import results
from servegate.bench.results import CaseSamples, Samples
from servegate.judging import stats, verdict
from servegate.judging.changes import change_points

#: the restart offset (log SD) assumed for a row the box's noise measurement does not
#: cover: the 80 % bounds measured on the reference boxes reached 3.5 % (docs/bench.md)
PRIOR_OFFSET = 0.03
#: the newest releases searched for change points (the scan grows with the square of
#: the length, its simulated null with it)
MAX_SERIES = 50
METHOD = (
    "geometric-mean ratio against the best of the window (or the anchor), one-sided Welch "
    "t on log rates with the restart offset, false alarm split over the rows and the "
    "window's records (Bonferroni)"
)


@dataclass(frozen=True)
class Past:
    """One released record's bench samples."""

    sha: str
    at: str
    samples: Samples


class Released(Protocol):
    """What the trend reads of a release record (``servegate.release.record.
    ReleaseRecord``)."""

    @property
    def sha(self) -> str: ...
    @property
    def verdict(self) -> str: ...
    @property
    def host(self) -> str: ...
    @property
    def host_id(self) -> str: ...
    @property
    def at(self) -> str: ...


R = TypeVar("R", bound=Released)


def history_samples(
    records: Iterable[R],
    *,
    digest: str,
    host: str,
    samples_of: Callable[[R], Mapping[str, Any] | None],
) -> tuple[list[Past], list[str]]:
    """The released records of ``host`` with bench samples measured with the fingerprint
    ``digest``, oldest first; and why each other released record was left out.

    ``samples_of`` reads a record's bench samples (the release package's
    ``bench_gate.recorded_samples``). Records of attempts that were rolled back, and
    rollbacks, are no releases of their own and are not listed."""
    kept: list[Past] = []
    skipped: list[str] = []
    for rec in sorted(records, key=lambda r: r.at):
        if rec.verdict != "released":
            continue
        sha = rec.sha
        theirs = rec.host_id or f"hostname:{rec.host}"
        doc = samples_of(rec)
        if theirs != host:
            skipped.append(f"{sha[:12]}: measured on another host ({theirs})")
        elif doc is None:
            skipped.append(f"{sha[:12]}: no recorded bench samples")
        else:
            try:
                samples = results.from_record(doc, sha[:12])
            except (AttributeError, KeyError, TypeError, ValueError) as exc:
                skipped.append(f"{sha[:12]}: its samples are damaged ({type(exc).__name__})")
                continue
            if samples.fingerprint.get("digest") != digest or not digest:
                skipped.append(f"{sha[:12]}: measured with other bench settings")
                continue
            kept.append(Past(sha, rec.at, samples))
    return kept, skipped


def _values(cs: CaseSamples | None, metric: str) -> list[float]:
    """A case's samples of ``metric`` when they are a measurement: a valid case, two or
    more samples, every one a positive finite number; [] otherwise."""
    vals = (cs.metrics.get(metric) or []) if cs is not None and cs.valid else []
    if len(vals) < 2 or not all(math.isfinite(v) and v > 0 for v in vals):
        return []
    return vals


def judge(
    candidate: Samples,
    history: Sequence[Past],
    rules: Sequence[verdict.Rule],
    *,
    window: int,
    anchor: str | None,
    false_alarm: float,
    miss: float,
    offsets: Mapping[str, float] | None = None,
    prior_offset: float = PRIOR_OFFSET,
    drift: float = 0.01,
) -> dict[str, Any]:
    """The candidate's samples against the trend: a table like the gate's.

    ``history``: this host's released records measured like the candidate, oldest first
    (:func:`history_samples`), the candidate's own record not among them. ``window``: how
    many of the newest are searched for the best; ``anchor``: a SHA (or its prefix)
    judged against instead, "" or None for the best of the window. ``false_alarm`` and
    ``miss``: the gate's error rates (``gate.false_alarm``, ``gate.miss``). ``offsets``:
    the box's restart offset (log SD) per ``case:metric``; a row without one takes
    ``prior_offset``. ``drift``: a significant change of the reference workload beyond this fraction
    since the best record is a change of the box (``gate.drift``).

    Returns ``verdict`` (FAIL, INCONCLUSIVE, PASS, or REPORT when no row could be
    judged), ``why``, ``rows`` (per case and metric: ``verdict``, ``why``, ``best`` and
    ``best_at`` (the record judged against), ``ratio``, ``interval``, ``records``,
    ``excluded``, ``resolves``, ``offset``, ``drift``), ``method``, ``against`` and
    ``window_records`` (the SHAs searched)."""
    if anchor:
        pinned = [p for p in history if p.sha.startswith(anchor.lower())]
        pool = pinned[-1:] if len({p.sha for p in pinned}) == 1 else []
        against = f"anchor {anchor[:12]}"
    else:
        pool = list(history)[-max(window, 1) :]
        against = f"the best of the last {len(pool)} released record(s) (window {window})"
    covered = [
        (cid, cs, rule)
        for cid, cs in sorted(candidate.cases.items())
        for rule in rules
        if rule.tolerance < 1 and verdict.covers(rule, cid)
    ]
    deciding = sum(1 for _, cs, _ in covered if cs.required)
    alpha = false_alarm / max(deciding, 1)
    rows = []
    for cid, cs, rule in covered:
        key = f"{cid}:{rule.metric}"
        measured = offsets is not None and key in offsets
        offset = offsets[key] if offsets is not None and measured else prior_offset
        row = _judge_row(cid, cs, rule, pool, bool(anchor), alpha, miss, offset, drift)
        row["offset"] = {"log_sd": round(offset, 5), "source": "measured" if measured else "prior"}
        rows.append(row)
    verdict_, why = _overall(rows)
    return {
        "verdict": verdict_,
        "why": why,
        "rows": rows,
        "method": f"{METHOD}; false alarm {false_alarm:.0%} a check, miss {miss:.0%} a row",
        "against": against,
        "window_records": [p.sha for p in pool],
    }


def _overall(rows: Sequence[Mapping[str, Any]]) -> tuple[str, str]:
    deciding = [r for r in rows if r["required"] and r["verdict"] != verdict.REPORT]
    for outcome in (verdict.FAIL, verdict.INCONCLUSIVE):
        picked = [r for r in deciding if r["verdict"] == outcome]
        if picked:
            return outcome, "; ".join(f"{r['case']} {r['metric']}: {r['why']}" for r in picked)
    if deciding:
        return verdict.PASS, f"{len(deciding)} row(s) show no creeping loss"
    why = "; ".join(sorted({r["why"] for r in rows})) or "no row to judge"
    return verdict.REPORT, why


def _base_row(cid: str, cs: CaseSamples, rule: verdict.Rule) -> dict[str, Any]:
    return {
        "case": cid, "metric": rule.metric, "required": cs.required,
        "verdict": verdict.REPORT, "why": "", "best": None, "best_at": None, "ratio": None,
        "interval": None, "tolerance": rule.tolerance, "records": 0, "excluded": False,
        "resolves": None, "drift": None,
    }  # fmt: skip


def _judge_row(
    cid: str,
    cs: CaseSamples,
    rule: verdict.Rule,
    pool: Sequence[Past],
    anchored: bool,
    alpha: float,
    miss: float,
    offset: float,
    drift: float,
) -> dict[str, Any]:
    row = _base_row(cid, cs, rule)
    cand = _values(cs, rule.metric)
    comparable = [(p, v) for p in pool if (v := _values(p.samples.cases.get(cid), rule.metric))]
    row["records"] = len(comparable)
    if not cand:
        row["why"] = (
            f"the candidate has no {rule.metric} samples"
            if cs.valid and not cs.metrics.get(rule.metric)
            else "the candidate's samples are no measurement (the bench gate judges them)"
        )
        return row
    if anchored and not comparable:
        row["why"] = "the anchor names no single released record with valid samples of this row"
        return row
    if not anchored and len(comparable) < 2:
        row["why"] = f"too little history: {len(comparable)} comparable release(s), 2 needed"
        return row
    lower = rule.direction == "lower"
    best, base = (min if lower else max)(comparable, key=lambda pv: stats.gm(pv[1]))
    bcs = best.samples.cases[cid]
    starts = (bcs.starts, cs.starts)
    c = stats.compare(base, cand, lower, offset, starts)
    assert c is not None  # both sides hold two or more positive samples
    each = [stats.compare(v, cand, lower, offset, (p.samples.cases[cid].starts, cs.starts))
            for p, v in comparable]  # fmt: skip
    levels = stats.Levels(alpha / len(comparable), miss)
    t = math.log(1 - rule.tolerance)
    lo, hi = math.exp(c.lower(levels.beta)), math.exp(c.upper(levels.alpha))
    row.update(
        best=best.sha, best_at=best.at, ratio=round(c.ratio, 4),
        interval=[round(lo, 4), round(hi, 4)],
        excluded=all(e is not None and e.lower(miss) >= t for e in each),
        resolves=round(stats.resolution(c, levels), 4),
        drift=verdict.box_change(cs, bcs, drift),
    )  # fmt: skip
    what = (
        f"the anchor {best.sha[:12]}"
        if anchored
        else (f"the best of {len(comparable)} releases, {best.sha[:12]}")
    )
    row["verdict"], row["why"] = _decide(
        c, rule, levels, row, f"ratio {c.ratio:.3f} against {what}"
    )
    if not cs.required:
        row["verdict"] = verdict.REPORT
    return row


def _decide(
    c: stats.Comparison,
    rule: verdict.Rule,
    levels: stats.Levels,
    row: Mapping[str, Any],
    ratio: str,
) -> tuple[str, str]:
    lo, hi = row["interval"]
    tol = f"{rule.tolerance:.0%}"
    moved = row["drift"]
    if moved.get("moved"):
        way = "slower" if moved["change"] < 0 else "faster"
        return verdict.INCONCLUSIVE, (
            f"{ratio}: the box is {abs(moved['change']):.0%} {way} than then (reference "
            "workload): the trend cannot tell the box from the releases"
        )
    if c.d < math.log(1 - rule.tolerance):
        if c.upper(levels.alpha) < 0:
            return verdict.FAIL, (
                f"{ratio} (upper bound {hi:.3f} < 1): a cumulative loss of "
                f"{1 - c.ratio:.1%}, beyond {tol}"
            )
        return verdict.INCONCLUSIVE, (
            f"{ratio} in [{lo:.3f}, {hi:.3f}]: an estimated cumulative loss of "
            f"{1 - c.ratio:.1%}, beyond {tol}, that the history's noise cannot confirm: "
            "not a pass"
        )
    if row["excluded"]:
        return verdict.PASS, f"{ratio} (lower bound {lo:.3f}): no cumulative loss of {tol}"
    unsure = (
        f"these samples resolve a loss of {row['resolves']:.0%}, not {tol}"
        if row["resolves"] > rule.tolerance
        else f"a loss of {tol} is not excluded against every release of the window"
    )
    return (
        verdict.PASS,
        f"{ratio} in [{lo:.3f}, {hi:.3f}]: no significant cumulative loss; {unsure}",
    )


def levels(history: Sequence[Past], case: str, metric: str) -> list[tuple[Past, float]]:
    """A case's metric release by release: each record's geometric mean, oldest first
    (records whose samples of it are no measurement left out)."""
    out = []
    for past in history:
        vals = _values(past.samples.cases.get(case), metric)
        if vals:
            out.append((past, stats.gm(vals)))
    return out


def shifts(
    history: Sequence[Past], rules: Sequence[verdict.Rule], *, alpha: float = 0.05
) -> dict[str, list[dict[str, Any]]]:
    """Per ``case:metric`` of the newest record's cases and the rules: the change points
    of its release-by-release geometric means (the release where the level moved, the
    levels before and after, the change and its p-value; ``loss``: the change is a loss
    in the rule's direction)."""
    if not history:
        return {}
    out: dict[str, list[dict[str, Any]]] = {}
    for cid in sorted(history[-1].samples.cases):
        for rule in rules:
            key = f"{cid}:{rule.metric}"
            if rule.tolerance >= 1 or key in out or not verdict.covers(rule, cid):
                continue
            series = levels(history, cid, rule.metric)[-MAX_SERIES:]
            found = change_points([v for _, v in series], alpha=alpha)
            out[key] = [
                {"sha": series[s.index][0].sha, "at": series[s.index][0].at,
                 "before": round(s.before, 4), "after": round(s.after, 4),
                 "change": round(s.change, 4), "pvalue": round(s.pvalue, 4),
                 "loss": (s.change > 0) if rule.direction == "lower" else (s.change < 0)}
                for s in found
            ]  # fmt: skip
    return out
