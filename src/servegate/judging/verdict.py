"""Baseline vs candidate samples → PASS / FAIL / INCONCLUSIVE per case and metric.

For each rule (metric, direction, tolerance, floor) and each case it covers:

- a required case with an invalid trial, or without samples, FAILs (never a pass on
  missing data); a report-only case is shown and never decides;
- a candidate beyond the absolute floor FAILs;
- samples far from their side's bulk (a neighbour's burst, a GC pause) are set apart,
  named in the row and kept in the record (:func:`servegate.judging.stats.outliers`), and
  the rest decide; the far-slow ones are counted instead of averaged: more on the
  candidate than on its baseline are measured again, a significant excess (in the case
  or over the check's cases) is the release's tail and FAILs, and an excess short of
  that keeps the row from a PASS at the cap (:data:`TAIL_OPEN`);
- otherwise the geometric-mean ratio of the rest decides, with a Welch interval on log
  rates (:mod:`servegate.judging.stats`) whose standard error always carries the box's
  restart-to-restart offset: estimated from ``servegate bench noise``'s starts and the
  gate's own pooled, its uncertainty paid in the t test's degrees of freedom
  (Welch-Satterthwaite; an estimate of 0 from a few starts still widens the interval),
  or the stated prior ``restart_offset`` where neither measured it — never assumed
  zero;
- **PASS** only when the interval excludes the loss the rule names (its lower bound is
  at or above ``1 - tolerance``); **FAIL** when it excludes no loss at all; each look
  of a sequential gate is held to a group-sequential boundary
  (:mod:`servegate.judging.sequential`), so clear cases stop early and the error rates
  hold over all looks;
- the reference workload measured beside every group is a measurement of the box: when
  it moved significantly between the two sides (and by more than ``drift``), the row is
  judged both as measured and credited with that change, and only a verdict both agree
  on stands — a loss only the credit shows is never a FAIL, a loss only the credit
  removes is never released;
- a row still open at the cap stays INCONCLUSIVE (rolled back), unless ``inconclusive``
  says ``fail`` or, explicitly, ``pass``;
- without a comparable baseline, ``no_baseline`` decides (see :class:`Settings`).
"""

from __future__ import annotations

import dataclasses
import fnmatch
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from servegate.bench.results import CaseSamples, Samples
from servegate.config import Gate
from servegate.judging import sequential, stats
from servegate.judging.noise import Noise

Direction = Literal["higher", "lower"]
PASS, FAIL, INCONCLUSIVE, REPORT = "PASS", "FAIL", "INCONCLUSIVE", "REPORT"
METHOD = "geometric-mean ratio, one-sided Welch t on log rates"
#: a reference-workload shift this significant (two-sided) is a change of the box
DRIFT_LEVEL = 0.01


@dataclass(frozen=True)
class Rule:
    metric: str
    direction: Direction = "higher"
    #: the smallest loss that must be caught, as a fraction of the baseline (0.05: 5 %)
    tolerance: float = 0.05
    #: absolute bound on the candidate median (minimum for "higher", maximum for "lower");
    #: 0: none
    floor: float = 0.0
    #: case ids (globs) the rule applies to
    cases: tuple[str, ...] = ("*",)


DEFAULT_RULES = (
    Rule("prefill_tps", "higher", 0.05),
    Rule("generation_tps", "higher", 0.05),
)


#: the ``[gate]`` settings as the config declares them: the rule's defaults
_GATE = Gate()


@dataclass(frozen=True)
class Settings:
    """How the rule decides. A field named as one of ``config.Gate``'s is that setting:
    its default is the config's declaration (never a second copy) and :meth:`of` fills it
    from a config's ``[gate]``."""

    #: probability that an unchanged release is rolled back, per check (all deciding rows
    #: together): half for a false FAIL, half for a row the plan leaves open at the cap
    false_alarm: float = _GATE.false_alarm
    #: probability that a loss of the tolerance PASSes, per row
    miss: float = _GATE.miss
    #: the looks a sequential gate plans: the first at ``first`` candidate samples, one
    #: more sample each look after it (``first`` 0: this is the only look)
    looks: int = 1
    first: int = 0
    #: what a row still INCONCLUSIVE at the cap becomes: ``inconclusive`` (rolled back),
    #: ``fail``, or ``pass`` (the user's explicit choice: no evidence is then a pass)
    inconclusive: Literal["inconclusive", "fail", "pass"] = _GATE.inconclusive
    #: rows without a baseline: "first-release" (only when ``first_release`` is true: the
    #: host has no released record; floors and validity decide), or "fail"
    no_baseline: Literal["first-release", "fail"] = _GATE.no_baseline
    first_release: bool = False
    #: a significant change of the reference workload beyond this fraction is a change
    #: of the box (judged both as measured and credited)
    drift: float = _GATE.drift
    #: per "case:metric", the box's noise measured by ``bench noise``: its restart offset
    #: is pooled with the gate's own starts, its within-start variance with both sides'
    noise: Mapping[str, Noise] = field(default_factory=dict)
    #: the restart offset (log SD) assumed where neither ``bench noise`` nor the gate's
    #: own service starts measured it
    restart_offset: float = _GATE.restart_offset
    #: per "case:metric", a restart offset to use as it is (a log SD; overrides the rest)
    offsets: Mapping[str, float] = field(default_factory=dict)

    @classmethod
    def of(cls, gate: Gate, **rest: Any) -> Settings:
        """The settings ``gate`` (a config's ``[gate]``) holds, with ``rest``."""
        shared = {f.name for f in dataclasses.fields(cls)} & {
            f.name for f in dataclasses.fields(Gate)
        }
        return cls(**{name: getattr(gate, name) for name in shared}, **rest)


def covers(rule: Rule, case_id: str) -> bool:
    return any(fnmatch.fnmatchcase(case_id, pat) for pat in rule.cases)


def _row(case: str, metric: str, required: bool, **kw: Any) -> dict[str, Any]:
    base = {
        "case": case,
        "metric": metric,
        "required": required,
        "baseline_median": None,
        "candidate_median": None,
        "ratio": None,
        "interval": None,
        "threshold": None,
        "tolerance": None,
        "floor": None,
        "n_baseline": 0,
        "n_candidate": 0,
        "drift": None,
        "offset": None,
        "outliers": None,
        "tail": None,
        "look": None,
        "verdict": INCONCLUSIVE,
        "why": "",
    }
    base.update(kw)
    return base


def _median(v: Sequence[float]) -> float:
    s = sorted(v)
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def evaluate(
    baseline: Samples | None,
    candidate: Samples,
    rules: Sequence[Rule] = DEFAULT_RULES,
    settings: Settings | None = None,
    final: bool = True,
) -> dict[str, Any]:
    """The decision table; ``final``: the last look (no more repetitions)."""
    st = settings or Settings()
    covered = [
        (cid, cs, rule)
        for cid, cs in sorted(candidate.cases.items())
        for rule in rules
        if covers(rule, cid)
    ]
    deciding_rows = sum(1 for _, cs, r in covered if cs.required and r.tolerance < 1)
    # half the false-alarm budget is the FAIL test's; the other half is the plan's (an
    # unchanged release left open at the cap is rolled back too)
    levels = stats.Levels.split(st.false_alarm / 2, st.miss, deciding_rows, 1)
    pooled = _slow_counts(covered, baseline)
    evidence = _offset_evidence(covered, baseline, st)
    decided = [
        (
            _decide(cid, cs, rule, baseline, st, levels, final, pooled.get(rule.metric),
                    evidence),
            cs,
            rule,
        )
        for cid, cs, rule in covered
    ]  # fmt: skip
    rows = [_selected(row, cs, rule, st, final) for row, cs, rule in decided]
    if not rows:
        rows.append(_row("(none)", "-", True, verdict=FAIL, why="the candidate has no cases"))
    deciding = [r for r in rows if r["required"]]
    verdicts = {r["verdict"] for r in deciding}
    if not deciding:
        verdict, why = FAIL, "no required case: nothing decides"
    elif FAIL in verdicts:
        verdict, why = FAIL, _whys(deciding, FAIL)
    elif INCONCLUSIVE in verdicts:
        verdict, why = INCONCLUSIVE, _whys(deciding, INCONCLUSIVE)
    else:
        verdict, why = PASS, f"{len(deciding)} required row(s) pass"
    return {
        "verdict": verdict,
        "why": why,
        "rows": rows,
        "method": f"{METHOD}; PASS only where the interval excludes the tolerated loss; "
        f"false alarm {st.false_alarm:.0%} a check, miss {st.miss:.0%} a row, over "
        f"{st.looks} look(s) (group-sequential boundaries); restart offset always in the "
        "error; a significant change of the reference workload is judged both ways",
        "baseline": baseline.source if baseline else None,
        "candidate": candidate.source,
    }


def _slow(base: Sequence[float], cand: Sequence[float], lower: bool) -> tuple[list[int], list[int]]:
    """The far-slow samples of each side (:func:`servegate.judging.stats.outliers`)."""
    ob, oc = stats.outliers(base, cand)
    slow_b = [i for i in ob if (base[i] > _median(base)) == lower]
    slow_c = [i for i in oc if (cand[i] > _median(cand)) == lower]
    return slow_b, slow_c


def _slow_counts(
    covered: Sequence[tuple[str, CaseSamples, Rule]], baseline: Samples | None
) -> dict[str, tuple[int, int, int, int]]:
    """Per metric, the far-slow samples of the check's required cases added up:
    (candidate's, its samples, baseline's, its samples). A release's tail hits every case
    it serves; the box's bursts too, at the box's rate: over all cases the count test
    has the samples one case lacks."""
    out: dict[str, tuple[int, int, int, int]] = {}
    for cid, cs, rule in covered:
        bcs = baseline.cases.get(cid) if baseline else None
        if not cs.required or rule.tolerance >= 1 or bcs is None:
            continue
        base, cand = bcs.metrics.get(rule.metric) or [], cs.metrics.get(rule.metric) or []
        if not base or not cand or any(v <= 0 for v in (*base, *cand)):
            continue
        slow_b, slow_c = _slow(base, cand, rule.direction == "lower")
        sc, nc, sb, nb = out.get(rule.metric, (0, 0, 0, 0))
        out[rule.metric] = (sc + len(slow_c), nc + len(cand), sb + len(slow_b), nb + len(base))
    return out


def _whys(rows: Sequence[Mapping[str, Any]], verdict: str) -> str:
    picked = [r for r in rows if r["verdict"] == verdict]
    return "; ".join(f"{r['case']} {r['metric']}: {r['why']}" for r in picked)


def _decide(
    cid: str,
    cs: CaseSamples,
    rule: Rule,
    baseline: Samples | None,
    st: Settings,
    levels: stats.Levels,
    final: bool,
    pooled: tuple[int, int, int, int] | None = None,
    evidence: Mapping[str, _Evidence] | None = None,
) -> dict[str, Any]:
    row = _row(cid, rule.metric, cs.required, floor=rule.floor or None)
    undecided = REPORT if not cs.required else None
    cand = cs.metrics.get(rule.metric) or []
    row["n_candidate"] = len(cand)
    if _all_dropped(cs, rule.metric):
        verdict, why = _dropped(cs, "candidate", rule.metric, st, final)
        row.update(verdict=undecided or verdict, why=why)
        return row
    if not cs.valid or not cand:
        reasons = ", ".join(f"{k}x{v}" for k, v in cs.reasons.items()) or "no valid samples"
        row.update(verdict=undecided or FAIL, why=f"case invalid ({reasons})")
        return row
    if bad := _unloggable(cand, "candidate", "not a measurement"):
        row.update(verdict=undecided or FAIL, why=bad)
        return row
    cmed = _median(cand)
    row["candidate_median"] = round(cmed, 4)
    if rule.floor:
        beyond = cmed < rule.floor if rule.direction == "higher" else cmed > rule.floor
        if beyond:
            word = "below the floor" if rule.direction == "higher" else "above the ceiling"
            row.update(verdict=undecided or FAIL, why=f"{cmed:,.2f} is {word} {rule.floor:,.2f}")
            return row
    if rule.tolerance >= 1:  # a floor-only rule: the floor was met
        row.update(verdict=undecided or PASS, why=f"floor {rule.floor:,.2f} met")
        return row
    bcs = baseline.cases.get(cid) if baseline else None
    if bcs is not None and _all_dropped(bcs, rule.metric):
        verdict, why = _dropped(bcs, "baseline", rule.metric, st, final)
        row.update(verdict=undecided or verdict, why=why)
        return row
    if bcs is None or not bcs.valid or not bcs.metrics.get(rule.metric):
        return _no_baseline(row, bcs, rule, st, undecided)
    base = bcs.metrics[rule.metric]
    row["n_baseline"] = len(base)
    if bad := _unloggable(base, "baseline", "nothing to compare with"):
        row.update(verdict=undecided or FAIL, why=bad)
        return row
    row["baseline_median"] = round(_median(base), 4)
    verdict, why = _measured(row, cid, cs, bcs, rule, st, levels, final, pooled, evidence)
    row.update(verdict=undecided or verdict, why=why)
    return row


def _measured(
    row: dict[str, Any],
    cid: str,
    cs: CaseSamples,
    bcs: CaseSamples,
    rule: Rule,
    st: Settings,
    levels: stats.Levels,
    final: bool,
    pooled: tuple[int, int, int, int] | None = None,
    evidence: Mapping[str, _Evidence] | None = None,
) -> tuple[str, str]:
    """The statistics of one row with samples on both sides (fills ``row``);
    ``evidence``: per "case:metric", the deciding rows' bulk and restart-offset evidence
    (:func:`_offset_evidence`, worked out once for all rows)."""
    base, cand = bcs.metrics[rule.metric], cs.metrics[rule.metric]
    bblocks, cblocks = bcs.blocks_of(rule.metric), cs.blocks_of(rule.metric)
    lower = rule.direction == "lower"
    key = f"{cid}:{rule.metric}"
    mine = (evidence or {}).get(key)
    bulk = mine.bulk if mine else _Bulk.of(base, cand, bblocks, cblocks, lower)
    ob, oc, slow_b, slow_c, fast_c = bulk.ob, bulk.oc, bulk.slow_b, bulk.slow_c, bulk.fast_c
    if ob or oc:
        row["outliers"] = {
            "baseline": [base[i] for i in ob],
            "candidate": [cand[i] for i in oc],
            "slow": [len(slow_b), len(slow_c)],
            "set_apart": [len(base) - len(bulk.base), len(cand) - len(bulk.cand)],
        }
    bulk_b, bulk_c, blocks = bulk.base, bulk.cand, bulk.blocks
    others = [s for k, e in (evidence or {}).items() if k != key for s in e.sources]
    offset, source, known = _offset(key, mine or _Evidence.of(bulk, st, key), st, others)
    row["offset"] = {"log_sd": round(offset, 5), "from": source}
    if known is not None:
        row["offset"]["df"] = round(known[1], 1)
    c = stats.compare(bulk_b, bulk_c, lower, offset, (bcs.starts, cs.starts), blocks,
                      _within(st, f"{cid}:{rule.metric}"), known)  # fmt: skip
    if c is None:
        why = "fewer than two samples on a side: nothing to compare yet"
        if not final:
            return INCONCLUSIVE, why
        # no evidence either way at the cap: open (rolled back), FAIL under "fail", and
        # never the PASS that "pass" gives an estimate, as there is none
        why += "; at the cap nothing was compared (never a pass on missing data)"
        return (FAIL if st.inconclusive == "fail" else INCONCLUSIVE), why
    look = _look(len(cand), st, final)
    bound_a, bound_b = _bounds(c, st, levels, look, offset)
    row["look"] = {"at": look + 1, "of": max(st.looks, 1),
                   "fail_level": round(bound_a, 6), "pass_level": round(bound_b, 6)}  # fmt: skip
    t = math.log(1 - rule.tolerance)
    lo, hi = c.d - _t(bound_b, c.df) * c.se, c.d + _t(bound_a, c.df) * c.se
    row.update(
        ratio=round(c.ratio, 4),
        interval=[round(_exp(lo), 4), round(_exp(hi), 4)],
        threshold=round(math.exp(t), 4),
        tolerance=rule.tolerance,
    )
    drift = box_change(cs, bcs, st.drift)
    row["drift"] = drift
    n = f"n {c.n_base}+{c.n_cand}" + (f", {c.starts[0]}+{c.starts[1]} starts"
                                      if max(c.starts) > 1 else "")  # fmt: skip
    verdict, why = _judge(c, rule, bound_a, bound_b, n)
    if drift.get("moved"):
        verdict, why = _both_ways(c, rule, bound_a, bound_b, drift, n, verdict, why)
    tail = _tail((len(slow_c), len(cand), len(slow_b), len(base)), pooled, levels.alpha)
    if tail and tail[0] == FAIL:
        return tail
    if tail and not final:  # measure again: a burst of the box does not repeat
        return INCONCLUSIVE, (
            f"{tail[1]}; measuring again to tell a burst of the box from the release's tail"
        )
    if tail and tail[0] == "open" and verdict == PASS:
        verdict, why = INCONCLUSIVE, f"{why}; but {tail[1]}"
    if tail:
        row["tail"] = tail[1]
    if verdict == FAIL and not final and fast_c:
        # the release's own far-fast samples were set apart: its bulk may be the box's
        # bursts (three in four) and those the release as it is: measure again first
        return INCONCLUSIVE, (
            f"{why}; but {len(fast_c)} of the release's samples are far faster than its "
            "bulk: measuring again before a verdict"
        )
    if verdict == FAIL and not final and stats.more_scattered(c, levels.alpha) is not None:
        # a few far-slow samples among few (bursts of the box, two in four) look like a
        # large loss and scatter far beyond the baseline: measure again before a FAIL
        return INCONCLUSIVE, (
            f"{why}; but the release's samples scatter far beyond the baseline's (log SD "
            f"{c.sd_cand:.3f} against {c.sd_base:.3f}): measuring again before a verdict"
        )
    # the box's own scatter is credited here only: before a FAIL, scatter measures again
    box = _box_scatter(cs, bcs)
    if verdict == PASS and (scatter := stats.more_scattered(c, levels.alpha, box=box)):
        times = "any" if math.isinf(scatter) else f"{scatter:.1f} times"
        steady = f", the box's {math.sqrt(box):.3f}" if box else ""
        verdict, why = (
            INCONCLUSIVE,
            (
                f"{why}; but the release's samples scatter {times} the baseline's (log SD "
                f"{c.sd_cand:.3f} against {c.sd_base:.3f}{steady}): an erratic release (or "
                "a box that changed during the run) is not a pass"
            ),
        )
    if verdict != INCONCLUSIVE or not final:
        return verdict, why
    res = stats.resolution(c, levels)
    if st.inconclusive == "inconclusive":
        return INCONCLUSIVE, (
            f"{why}: at the cap the interval still holds a loss of {rule.tolerance:.0%} "
            f"(these samples resolve {res:.0%}): not a pass"
        )
    return _flat(st, why)


#: (degrees of freedom, variance of a start's mean, its within-start part): one set of
#: service starts' evidence on the restart offset (:func:`stats.offset_point`)
Source = tuple[int, float, float]
#: a row whose own starts scatter beyond the other rows' offset at this one-sided level
#: is judged on its own starts alone
POOL_LEVEL = 0.01


@dataclass(frozen=True)
class _Bulk:
    """One row's samples with its outliers set apart: what the comparison reads."""

    base: list[float]
    cand: list[float]
    blocks: tuple[list[int] | None, list[int] | None]
    ob: list[int]
    oc: list[int]
    slow_b: list[int]
    slow_c: list[int]
    fast_c: list[int]

    @classmethod
    def of(
        cls,
        base: Sequence[float],
        cand: Sequence[float],
        bblocks: Sequence[int] | None,
        cblocks: Sequence[int] | None,
        lower: bool,
    ) -> _Bulk:
        ob, oc = stats.outliers(base, cand)
        slow_b, slow_c = _slow(base, cand, lower)
        # set apart what cannot favour the candidate: its own far samples (its far-slow
        # ones are judged by the tail test, never averaged away) and the baseline's
        # far-slow ones; the baseline's far-fast ones only as many as the candidate shows
        fast_b = [i for i in ob if i not in slow_b]
        fast_c = [i for i in oc if i not in slow_c]
        out_b = set(slow_b) | set(fast_b[: len(fast_c)])
        keep_b = [i for i in range(len(base)) if i not in out_b]
        keep_c = [i for i in range(len(cand)) if i not in set(oc)]
        blocks = (
            [bblocks[i] for i in keep_b] if bblocks else None,
            [cblocks[i] for i in keep_c] if cblocks else None,
        )
        return cls([base[i] for i in keep_b], [cand[i] for i in keep_c], blocks, ob, oc,
                   slow_b, slow_c, fast_c)  # fmt: skip

    def own_sources(self, prior: tuple[int, float] | None = None) -> list[Source]:
        """The restart-offset evidence of this row's own service starts, a side each;
        ``prior``: the box's within-start variance from ``bench noise`` (df, variance),
        pooled with the sides' own."""
        sides = [
            (stats.SideStats.of([math.log(v) for v in values if v > 0], bl), bl)
            for values, bl in ((self.base, self.blocks[0]), (self.cand, self.blocks[1]))
            if len(values) >= 2
        ]
        df = sum(s.df for s, _ in sides) + (prior[0] if prior else 0)
        ss = math.fsum(s.within * s.df for s, _ in sides) + (prior[0] * prior[1] if prior else 0)
        within = ss / df if df > 0 else None
        found = [s.own_offset(within) for s, bl in sides if bl is not None]
        return [f for f in found if f is not None]


def _usable(values: Sequence[float]) -> bool:
    return len(values) >= 2 and not _unloggable(values, "", "")


@dataclass(frozen=True)
class _Evidence:
    """One row's bulk and its restart-offset evidence: ``bench noise``'s record and the
    gate's own service starts."""

    bulk: _Bulk
    record: Source | None
    starts: list[Source]

    @classmethod
    def of(cls, bulk: _Bulk, st: Settings, key: str) -> _Evidence:
        found = st.noise.get(key)
        return cls(bulk, found.evidence() if found else None, bulk.own_sources(_within(st, key)))

    @property
    def sources(self) -> list[Source]:
        return ([self.record] if self.record else []) + self.starts


def _offset_evidence(
    covered: Sequence[tuple[str, CaseSamples, Rule]], baseline: Samples | None, st: Settings
) -> dict[str, _Evidence]:
    """Per "case:metric", a deciding row's bulk and restart-offset evidence: what the
    other rows pool with theirs."""
    out: dict[str, _Evidence] = {}
    for cid, cs, rule in covered:
        bcs = baseline.cases.get(cid) if baseline else None
        if bcs is None or rule.tolerance >= 1 or f"{cid}:{rule.metric}" in st.offsets:
            continue
        base, cand = bcs.metrics.get(rule.metric) or [], cs.metrics.get(rule.metric) or []
        if not (cs.valid and bcs.valid and _usable(base) and _usable(cand)):
            continue
        bulk = _Bulk.of(base, cand, bcs.blocks_of(rule.metric), cs.blocks_of(rule.metric),
                        rule.direction == "lower")  # fmt: skip
        key = f"{cid}:{rule.metric}"
        out[key] = _Evidence.of(bulk, st, key)
    return out


def _offset(
    key: str, ev: _Evidence, st: Settings, others: Sequence[Source] = ()
) -> tuple[float, str, tuple[float, float] | None]:
    """The restart offset (log SD) this row's error carries, where it came from, and
    (variance of a start's mean, degrees of freedom) where it was estimated:
    ``bench noise``'s record and the gate's own service starts, pooled with the other
    rows' (``others``: a restart moves the whole server, and a row's own few
    starts barely measure a variance) unless this row's starts scatter beyond what
    theirs allow; else the prior. Never zero by default: the two sides always ran in
    different service starts."""
    if key in st.offsets:
        return st.offsets[key], "given", None
    own = ev.sources
    about = ["bench noise"] if ev.record else []
    own_starts = sum(s[0] + 1 for s in ev.starts)
    if own_starts:
        about.append(f"the gate's own {own_starts} starts")
    sources = own
    if others:
        p = stats.offset_differs(own, others)
        if p < POOL_LEVEL:
            about.append(f"not pooled: its starts scatter beyond the other rows' (p {p:.3f})")
        else:
            sources = [*own, *others]
            n_others = sum(s[0] for s in others)
            about.append(f"pooled with the other rows' ({n_others} degrees of freedom)")
    if sum(s[0] for s in sources) >= 1:
        point, between, df = stats.offset_point(sources)
        return point, " + ".join(about), (between, df)
    return (
        st.restart_offset,
        "prior gate.restart_offset (not measured: `servegate bench noise`)",
        None,
    )


def _within(st: Settings, key: str) -> tuple[int, float] | None:
    """The box's within-start log variance from ``bench noise``: (df, variance)."""
    found = st.noise.get(key)
    return None if found is None else (found.samples - found.starts, found.cv**2)


def _look(n_cand: int, st: Settings, final: bool) -> int:
    """Which planned look this is (0-based): the last one when ``final``."""
    looks = max(st.looks, 1)
    if final or not st.first:
        return looks - 1
    return min(max(n_cand - st.first, 0), looks - 1)


def _bounds(
    c: stats.Comparison, st: Settings, levels: stats.Levels, look: int, offset: float
) -> tuple[float, float]:
    """The nominal one-sided levels (FAIL test, PASS test) at this look: the
    group-sequential boundaries over the planned looks' information, where the
    candidate's within-start share of the variance shrinks with its samples."""
    looks = max(st.looks, 1)
    if looks == 1 or not st.first:
        return levels.alpha, levels.beta
    vb, vc = c.var_within
    fixed = vb + offset**2 * (1 / c.starts[0] + 1 / c.starts[1])
    now = st.first + look
    info = [1 / max(fixed + vc * now / (st.first + i), 1e-18) for i in range(looks)]
    fa = sequential.boundaries(info, levels.alpha)[look]
    fb = sequential.boundaries(info, levels.beta)[look]
    return sequential.nominal(fa), sequential.nominal(fb)


def _exp(x: float) -> float:
    """exp that saturates (a bound from a handful of starts may be astronomically wide)."""
    return math.exp(min(max(x, -700.0), 700.0))


def _t(level: float, df: float) -> float:
    return math.inf if level <= 0 else stats.t_quantile(1 - level, df)


def _judge(
    c: stats.Comparison, rule: Rule, level_a: float, level_b: float, n: str
) -> tuple[str, str]:
    m, t = stats.midpoint(rule.tolerance), math.log(1 - rule.tolerance)
    lo, hi = c.d - _t(level_b, c.df) * c.se, c.d + _t(level_a, c.df) * c.se
    tol = f"{rule.tolerance:.0%}"
    if c.d < m and hi < 0:
        return FAIL, f"ratio {c.ratio:.3f} (upper bound {math.exp(hi):.3f} < 1): a loss ({n})"
    if c.d >= m and lo >= t:
        return PASS, (
            f"ratio {c.ratio:.3f} (lower bound {math.exp(lo):.3f} >= {math.exp(t):.3f}): "
            f"a loss of {tol} is excluded ({n})"
        )
    return INCONCLUSIVE, (
        f"ratio {c.ratio:.3f} in [{_exp(lo):.3f}, {_exp(hi):.3f}]: a loss of {tol} "
        f"is not excluded yet ({n})"
    )


def _both_ways(
    c: stats.Comparison,
    rule: Rule,
    level_a: float,
    level_b: float,
    drift: Mapping[str, Any],
    n: str,
    verdict: str,
    why: str,
) -> tuple[str, str]:
    """The box changed between the sides: the row judged as measured (``verdict``) and
    credited with the change; only a verdict both agree on stands.

    The credit assumes the server scales like the reference workload (on a box ``r``
    times faster a rate is ``r`` times higher and a latency ``r`` times lower, so both
    directions' log ratio moves by ``log r``). Neither view alone is safe: a neighbour
    that slows the reference more than the server breaks the credit, and the box cannot
    tell a neighbour from a release that loads it (an engine thread that busy-polls while
    idle slows the reference beside its own groups as much as itself). So a loss only
    the credit shows is never a FAIL, and a loss only the credit removes is never
    released: both stay INCONCLUSIVE, measured again up to the cap."""
    way = "slower" if drift["change"] < 0 else "faster"
    box = f"the box is {abs(drift['change']):.0%} {way} than at the baseline (reference workload)"
    credited = dataclasses.replace(c, d=c.d - drift["log_change"], se=math.hypot(c.se, drift["se"]))
    other, _ = _judge(credited, rule, level_a, level_b, n)
    if other == verdict:
        return verdict, f"{why}; {box}, and credited with that ({credited.ratio:.3f}) the same"
    return INCONCLUSIVE, (
        f"{box}: as measured {verdict} (ratio {c.ratio:.3f}), credited with that change "
        f"{other} ({credited.ratio:.3f}): the box's change cannot be separated from the "
        f"release's, not a verdict ({n})"
    )


#: far-slow samples over the check's cases this much more frequent on the candidate than
#: on its baseline (one-sided Fisher p below it) keep a row from a PASS at the cap: too
#: few to call the release's tail, too many to release on its other samples
#: (``benchmarks/gate_sim.py``: an unchanged release on a box that bursts one trial in
#: ten is rolled back 4.7 %, a release serving 30 % of its trials at a third of the rate
#: is released 50 %; without this, 3.7 % and 61 %)
TAIL_OPEN = 0.1


def _tail(
    own: tuple[int, int, int, int], pooled: tuple[int, int, int, int] | None, alpha: float
) -> tuple[str, str] | None:
    """Far-slow samples that repeat on the candidate: the release's tail, not noise.

    ``own``, ``pooled``: (candidate's far-slow samples, its samples, baseline's far-slow
    samples, its samples) of this row, and of the check's cases added up.

    Outliers of the box (a neighbour's burst, a GC pause) hit both sides alike, at the
    box's rate; a release's tail hits the candidate alone, in every case it serves. Both
    sides' far-slow samples are set apart from the estimate, never averaged into it, and
    their counts compared by Fisher's exact test, in this case and over all the check's
    cases (each at half the row's false-alarm level): a significant excess FAILs — a
    release that serves some requests far slower must not pass on its other requests.
    Returns (FAIL, why); ("open", why) where the excess over the check's cases has
    p < :data:`TAIL_OPEN` (measured again before the cap, no PASS at it); ("again",
    why) where the candidate merely shows a higher far-slow rate than its baseline
    (measured again before the cap: a burst of the box does not repeat, a tail does);
    None otherwise. A tail too rare for these samples to tell from the box's own rate is
    the p99 rules' to judge (``servegate bench load``)."""
    slow_c, n_c, slow_b, n_b = own
    if slow_c == 0:
        return None
    p = stats.tail_p(slow_c, n_c, slow_b, n_b)
    what = (
        f"{slow_c} of {n_c} candidate samples are far slower than its bulk "
        f"(baseline: {slow_b} of {n_b}, Fisher p {p:.2g})"
    )
    if p < alpha / 2:
        return FAIL, f"{what}: the release's tail"
    pp, over = p, ""
    if pooled is not None and pooled[1] > n_c:
        pc, pn, pb, pm = pooled
        pp, over = (
            stats.tail_p(pc, pn, pb, pm),
            (f"; over the check's cases {pc} of {pn} against {pb} of {pm}"),
        )
    if pp < alpha / 2:
        return FAIL, f"{what}{over} (Fisher p {pp:.2g}): the release's tail"
    if pp < TAIL_OPEN:
        return "open", f"{what}{over} (Fisher p {pp:.2g}): too many to pass on the rest"
    if slow_c * n_b > slow_b * n_c:
        return "again", f"{what}: more than the baseline shows"
    return None


def _selected(
    row: dict[str, Any], cs: CaseSamples, rule: Rule, st: Settings, final: bool
) -> dict[str, Any]:
    """A PASS judged on some of the candidate's valid trials is no pass.

    A burst's client timings are dropped (not measurements) and the trial stays valid; a
    group the engine's histograms did not count has no engine-clock rates. Whatever
    made them missing, the samples are then a selection, and a frontend that holds back
    the text of its slow answers chooses it: three of six answers at a third of the
    rate PASSed decisively on the other three. A loss the rest shows still FAILs (the
    selection can only hide one); a PASS becomes INCONCLUSIVE (measured again, rolled
    back at the cap; FAIL under ``inconclusive = "fail"``, PASS under ``"pass"``). With
    fewer than two samples left it is no PASS whatever the policy (:func:`_dropped`)."""
    lost = cs.missing.get(rule.metric, 0)
    if not lost or row["verdict"] != PASS or not cs.required:
        return row
    if row["n_candidate"] < 2:
        # fewer than two left (a first release, a floor): nothing to compare, as with
        # none left, and a first release's one sample is no baseline for the next gate
        verdict, why = _dropped(cs, "candidate", rule.metric, st, final, row["n_candidate"])
        return {**row, "verdict": verdict, "why": f"{row['why']}; but {why}"}
    if not row.get("n_baseline") and row.get("floor") is None:
        # a first release passed on validity alone: nothing was compared, so nothing a
        # selection could hide (its samples, the next release's baseline, are said to be
        # a selection, and a fast-biased baseline only makes the next gate stricter)
        return {**row, "why": f"{row['why']}; {lost} of {cs.trials} valid trials have no "
                f"{rule.metric} (nothing was compared on them)"}  # fmt: skip
    cause = (
        "the engine's histograms did not count their group"
        if rule.metric.startswith("engine_")
        else "a burst's client timings are dropped"
    )
    why = (
        f"{row['why']}; but {lost} of {cs.trials} valid trials have no {rule.metric} "
        f"({cause}): judged on the rest, the samples are a selection, not a pass"
    )
    verdict = INCONCLUSIVE
    if final and st.inconclusive != "inconclusive":
        verdict, why = _flat(st, why)
    return {**row, "verdict": verdict, "why": why}


def _flat(st: Settings, why: str) -> tuple[str, str]:
    """A row still open at the cap: INCONCLUSIVE (rolled back) by default; ``fail``
    FAILs it and ``pass`` PASSes it, saying so."""
    if st.inconclusive == "inconclusive":
        return INCONCLUSIVE, f"{why}; still open at the cap"
    verdict = PASS if st.inconclusive == "pass" else FAIL
    return verdict, f"{why}; at the cap gate.inconclusive = '{st.inconclusive}' decides"


def _unloggable(values: Sequence[float], side: str, meaning: str) -> str:
    """Why a side's values are no measurement, if the log-rate statistics cannot take
    some of them (0, negative, NaN, inf): dropped, they would leave the test only the
    good trials; kept, inf and NaN turn every bound into NaN, which fails every check of
    the evidence policy. "" when all are positive finite numbers."""
    bad = sum(1 for v in values if not (math.isfinite(v) and v > 0))
    if not bad:
        return ""
    return (
        f"{bad} of {len(values)} {side} sample(s) are not a positive finite number: "
        f"{meaning} (never a pass on missing data)"
    )


def _all_dropped(cs: CaseSamples, metric: str) -> bool:
    """Valid trials, none of which kept a sample of ``metric`` (each timing dropped)."""
    return cs.valid and not cs.metrics.get(metric) and bool(cs.missing.get(metric))


def _dropped(
    cs: CaseSamples, side: str, metric: str, st: Settings, final: bool, kept: int = 0
) -> tuple[str, str]:
    """(verdict, why) of a row whose side ran valid trials that kept no sample of the
    metric (``kept``: or fewer than two): each one's timing was dropped (a client kept
    off its CPU, a stream held back in a burst, a group the engine's clock did not
    count). No evidence either way: not a loss the release showed, never a pass.
    INCONCLUSIVE (measured again while the plan allows, rolled back at the cap), FAIL at
    the cap under ``inconclusive = "fail"``; ``"pass"`` does not pass it, as there is
    nothing to pass on."""
    lost = cs.missing[metric]
    what = (
        f"the {side} kept {kept} {metric} sample of {kept + lost} valid trials (the other "
        f"{lost}'s timings dropped"
        if kept
        else f"the {side}'s {lost} valid trial(s) kept no {metric} sample (each timing dropped"
    )
    why = (
        f"{what}: a client kept off its CPU, a stream held back in a burst, or a group the "
        "engine's clock did not count): nothing to compare, never a pass on missing data; "
        "measure again on a quieter box"
    )
    if final and st.inconclusive == "fail":
        return FAIL, f'{why}; FAIL at the cap (inconclusive = "fail")'
    return INCONCLUSIVE, why


def _no_baseline(
    row: dict[str, Any], bcs: CaseSamples | None, rule: Rule, st: Settings, undecided: str | None
) -> dict[str, Any]:
    if bcs is None:
        what = "no comparable baseline"
    elif not bcs.valid:
        what = "the baseline case is invalid"
    else:
        what = f"the baseline has no {rule.metric} samples"
    if st.no_baseline == "first-release" and st.first_release and bcs is None:
        floor = f"floor {rule.floor:,.2f} met" if rule.floor else "no floor set"
        row.update(verdict=undecided or PASS,
                   why=f"first release of the stack on this host ({what}); {floor}")  # fmt: skip
    else:
        why = f"{what}: nothing to compare with (never a pass on missing data)"
        row.update(verdict=undecided or FAIL, why=why)
    return row


def _box_scatter(cs: CaseSamples, bcs: CaseSamples) -> float:
    """The box's own scatter during the candidate's run: the log variance of the
    reference workload beside its groups (0 where it was not measured, or measured by
    another workload than the baseline's)."""
    readings = cs.reference
    if len(readings) < 2 or cs.reference_workload != bcs.reference_workload:
        return 0.0
    if not all(math.isfinite(r) and r > 0 for r in readings):
        return 0.0
    return stats.log_sd(readings) ** 2


def box_change(cs: CaseSamples, bcs: CaseSamples, drift: float) -> dict[str, Any]:
    """The box's change between the two sides, measured by the reference workload beside
    every group: ``moved`` when the shift of its log rate is significant (two-sided,
    :data:`DRIFT_LEVEL`) and beyond ``drift``. A shift within the noise of the
    reference is no change of the box, however large it looks."""
    if not cs.reference or not bcs.reference:
        side = "baseline" if not bcs.reference else "candidate"
        return {"checked": False, "why": f"the {side} has no reference-workload samples"}
    for side, readings in (("baseline", bcs.reference), ("candidate", cs.reference)):
        if not all(math.isfinite(r) and r > 0 for r in readings):
            why = f"the {side}'s reference readings are not all positive rates"
            return {"checked": False, "why": why}
    if cs.reference_workload != bcs.reference_workload:
        return {
            "checked": False,
            "why": f"the reference workload differs (baseline: "
            f"{bcs.reference_workload or 'unnamed'}; candidate: "
            f"{cs.reference_workload or 'unnamed'}): the box's change is not measured",
        }
    change = stats.gm(cs.reference) / stats.gm(bcs.reference) - 1
    var = stats.log_sd(cs.reference) ** 2 / len(cs.reference) + stats.log_sd(
        bcs.reference
    ) ** 2 / len(bcs.reference)
    se = math.sqrt(var)
    z = abs(math.log1p(change)) / se if se > 0 else (math.inf if change else 0.0)
    significant = z > stats.t_quantile(1 - DRIFT_LEVEL / 2, math.inf)
    return {
        "checked": True,
        "change": round(change, 4),
        "z": round(min(z, 1e6), 2),
        "moved": significant and abs(change) > drift,
        "log_change": math.log1p(change),
        "se": se,
    }


def compare_table(
    base: Samples, cand: Samples, metrics: Sequence[str], confidence: float = 0.90
) -> list[dict[str, Any]]:
    """A/B deltas (geometric-mean ratio, Welch t interval on log rates at ``confidence``),
    no verdict: for ``servegate bench compare``. Fewer than two samples a side: no delta."""
    rows = []
    for cid in sorted(set(base.cases) & set(cand.cases)):
        for m in metrics:
            b = base.cases[cid].metrics.get(m) or []
            c = cand.cases[cid].metrics.get(m) or []
            row: dict[str, Any] = dict.fromkeys(
                ("a_median", "b_median", "delta_pct", "interval_pct")
            )
            row.update(case=cid, metric=m, n_a=len(b), n_b=len(c))
            cmp_ = stats.compare(b, c)
            if cmp_ is not None:
                half = stats.t_quantile((1 + confidence) / 2, cmp_.df) * cmp_.se
                row.update(
                    a_median=round(_median(b), 4),
                    b_median=round(_median(c), 4),
                    delta_pct=round((cmp_.ratio - 1) * 100, 2),
                    interval_pct=[round((math.exp(cmp_.d - half) - 1) * 100, 2),
                                  round((math.exp(cmp_.d + half) - 1) * 100, 2)],
                )  # fmt: skip
            rows.append(row)
    return rows


def floor_profiles() -> list[str]:
    from importlib import resources

    root = resources.files("servegate.bench").joinpath("floors")
    return sorted(p.name.removesuffix(".toml") for p in root.iterdir() if p.name.endswith(".toml"))


def floors(name: str) -> tuple[Rule, ...]:
    """A shipped floor set: floor-only rules (the relative check is left to the others)."""
    import tomllib
    from importlib import resources

    from servegate.errors import ConfigError

    if name not in floor_profiles():
        raise ConfigError(
            f"gate.floors = {name!r} is not a shipped floor set",
            hint=f"shipped: {', '.join(floor_profiles())}",
        )
    text = resources.files("servegate.bench").joinpath(f"floors/{name}.toml").read_text()
    return tuple(
        Rule(r["metric"], r.get("direction", "higher"), 1.0, float(r["floor"]), tuple(r["cases"]))
        for r in tomllib.loads(text)["rules"]
    )
