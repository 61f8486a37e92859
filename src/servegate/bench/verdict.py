"""Baseline vs candidate samples → PASS / FAIL / INCONCLUSIVE per case and metric.

For each rule (metric, direction, tolerance, floor) and each case it covers:

- a required case with an invalid trial, or without samples, FAILs (never a pass on
  missing data); a report-only case is shown and never decides;
- a candidate beyond the absolute floor FAILs;
- otherwise the geometric-mean ratio and a one-sided Welch t on log rates decide
  (:mod:`servegate.bench.stats`): ``tolerance`` is the smallest loss that must be caught;
- when the box itself changed between the baseline and the candidate (the
  release-independent reference workload measured beside every group moved by more than
  ``drift``), the row is INCONCLUSIVE with that reason; a loss decisive both as measured
  and after crediting the box's change FAILs, and one only the credit shows is never
  released;
- without a comparable baseline, ``no_baseline`` decides (see :class:`Settings`).
"""

from __future__ import annotations

import dataclasses
import fnmatch
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from servegate.bench import stats
from servegate.bench.results import CaseSamples, Samples

Direction = Literal["higher", "lower"]
PASS, FAIL, INCONCLUSIVE, REPORT = "PASS", "FAIL", "INCONCLUSIVE", "REPORT"
METHOD = "geometric-mean ratio, one-sided Welch t on log rates"


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


@dataclass(frozen=True)
class Settings:
    #: probability that an unchanged release FAILs, per check (all deciding rows together)
    false_alarm: float = 0.05
    #: probability that a loss of the tolerance PASSes, per row
    miss: float = 0.01
    #: how many times the gate looks at the samples (repetitions .. max_repetitions)
    looks: int = 1
    #: what decides a row still INCONCLUSIVE at the cap: evidence (no evidence of a loss:
    #: PASS, with the loss the samples could resolve; an estimate beyond the tolerance
    #: stays INCONCLUSIVE), fail or pass
    inconclusive: Literal["evidence", "fail", "pass"] = "evidence"
    #: ``evidence`` PASSes an open row only if its samples resolve a loss of at most this
    #: (1 - the interval's width on the loss side); wider, they are no evidence either way
    max_resolution: float = 0.75
    #: rows without a baseline: "first-release" (only when ``first_release`` is true: the
    #: host has no released record; floors and validity decide), or "fail"
    no_baseline: Literal["first-release", "fail"] = "first-release"
    first_release: bool = False
    #: a change of the reference workload beyond this fraction is a change of the box
    drift: float = 0.10
    #: the box's restart-to-restart offset (log SD) per "case:metric" (``bench noise``)
    offsets: Mapping[str, float] = field(default_factory=dict)


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
    """The decision table; ``final``: apply the INCONCLUSIVE policy (no more repetitions)."""
    st = settings or Settings()
    covered = [
        (cid, cs, rule)
        for cid, cs in sorted(candidate.cases.items())
        for rule in rules
        if covers(rule, cid)
    ]
    deciding_rows = sum(1 for _, cs, r in covered if cs.required and r.tolerance < 1)
    levels = stats.Levels.split(st.false_alarm, st.miss, deciding_rows, st.looks)
    rows = [
        _selected(_decide(cid, cs, rule, baseline, st, levels, final), cs, rule, st, final)
        for cid, cs, rule in covered
    ]
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
        "method": f"{METHOD}; false alarm {st.false_alarm:.0%} a check, miss {st.miss:.0%} "
        f"a row, {st.looks} look(s); drift beyond {st.drift:.0%} of the reference workload "
        "is not a verdict",
        "baseline": baseline.source if baseline else None,
        "candidate": candidate.source,
    }


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
) -> dict[str, Any]:
    row = _row(cid, rule.metric, cs.required, floor=rule.floor or None)
    undecided = REPORT if not cs.required else None
    cand = cs.metrics.get(rule.metric) or []
    row["n_candidate"] = len(cand)
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
    if bcs is None or not bcs.valid or not bcs.metrics.get(rule.metric):
        return _no_baseline(row, bcs, rule, st, undecided)
    base = bcs.metrics[rule.metric]
    row["n_baseline"] = len(base)
    if bad := _unloggable(base, "baseline", "nothing to compare with"):
        row.update(verdict=undecided or FAIL, why=bad)
        return row
    row["baseline_median"] = round(_median(base), 4)
    offset = st.offsets.get(f"{cid}:{rule.metric}", 0.0)
    c = stats.compare(base, cand, rule.direction == "lower", offset, (bcs.starts, cs.starts))
    if c is None:
        row.update(verdict=undecided or INCONCLUSIVE,
                   why="fewer than two samples on a side: nothing to compare yet")  # fmt: skip
        if final and not undecided:
            row["verdict"], row["why"] = _flat(st, row["why"])
        return row
    row.update(
        ratio=round(c.ratio, 4),
        interval=[round(math.exp(c.lower(levels.beta)), 4),
                  round(math.exp(c.upper(levels.alpha)), 4)],
        threshold=round(math.exp(stats.midpoint(rule.tolerance)), 4),
        tolerance=rule.tolerance,
    )  # fmt: skip
    drift = _drift(cs, bcs, st)
    row["drift"] = drift
    verdict, why = _judge(c, rule, levels, drift, st, final)
    row.update(verdict=undecided or verdict, why=why)
    return row


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
    back at the cap; FAIL under ``inconclusive = "fail"``, PASS under ``"pass"``)."""
    lost = cs.missing.get(rule.metric, 0)
    if not lost or row["verdict"] != PASS or not cs.required:
        return row
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
    if final and st.inconclusive != "evidence":
        verdict, why = _flat(st, why)
    return {**row, "verdict": verdict, "why": why}


def _flat(st: Settings, why: str) -> tuple[str, str]:
    """The flat policies at the cap: ``pass`` PASSes, ``fail`` (and ``evidence`` where it
    has nothing to weigh) FAILs, saying so."""
    verdict = PASS if st.inconclusive == "pass" else FAIL
    return verdict, f"{why}; at the cap policy '{st.inconclusive}' decides"


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


def _drift(cs: CaseSamples, bcs: CaseSamples, st: Settings) -> dict[str, Any]:
    """The box's change between the two runs, from the reference workload."""
    if not cs.reference or not bcs.reference:
        side = "baseline" if not bcs.reference else "candidate"
        return {"checked": False, "why": f"the {side} has no reference-workload samples"}
    if cs.reference_workload != bcs.reference_workload:
        return {
            "checked": False,
            "why": f"the reference workload differs (baseline: "
            f"{bcs.reference_workload or 'unnamed'}; candidate: "
            f"{cs.reference_workload or 'unnamed'}): the box's change is not measured",
        }
    change = stats.gm(cs.reference) / stats.gm(bcs.reference) - 1
    moved = abs(change) > st.drift
    return {
        "checked": True,
        "change": round(change, 4),
        "moved": moved,
        "log_change": math.log1p(change),
        "se": math.sqrt(
            stats.log_sd(cs.reference) ** 2 / len(cs.reference)
            + stats.log_sd(bcs.reference) ** 2 / len(bcs.reference)
        ),
    }


def _judge(
    c: stats.Comparison,
    rule: Rule,
    levels: stats.Levels,
    drift: Mapping[str, Any],
    st: Settings,
    final: bool,
) -> tuple[str, str]:
    n = f"n {c.n_base}+{c.n_cand}"
    tol = f"{rule.tolerance:.0%}"
    if drift.get("moved"):
        return _judge_drifted(c, rule, levels, drift, st, final)
    decided = stats.decide(c, rule.tolerance, levels)
    lo, hi = math.exp(c.lower(levels.beta)), math.exp(c.upper(levels.alpha))
    if decided == FAIL:
        return FAIL, f"ratio {c.ratio:.3f} (upper bound {hi:.3f} < 1): a loss ({n})"
    if decided == PASS:
        return PASS, f"ratio {c.ratio:.3f} (lower bound {lo:.3f}): no loss of {tol} ({n})"
    why = f"ratio {c.ratio:.3f} in [{lo:.3f}, {hi:.3f}]: not yet decisive at {tol} ({n})"
    if not final:
        return INCONCLUSIVE, why
    return _policy(c, rule, levels, st, why)


def _judge_drifted(
    c: stats.Comparison,
    rule: Rule,
    levels: stats.Levels,
    drift: Mapping[str, Any],
    st: Settings,
    final: bool,
) -> tuple[str, str]:
    """The box changed: a loss decisive both as measured and after crediting that change
    FAILs; a loss only the credit shows is never released, and never called a FAIL.

    The credit assumes the server scales like the reference workload (a rate: on a box
    ``r`` times faster a rate is ``r`` times higher and a latency ``r`` times lower, so
    both directions' log ratio moves by ``log r``). A neighbour that slows the reference
    more than the server (during the baseline only, say) breaks that, and crediting a
    "faster" box then turns an unchanged release into a "decisive" loss. When the
    measured rates show no decisive loss and the credited ones do, the box cannot tell:
    the row stays INCONCLUSIVE (measured again up to the cap, then rolled back; FAIL
    under ``inconclusive = "fail"``) whatever the policy, since a real loss hidden by a
    faster box looks exactly the same.

    The mirror case is never released either: a loss as measured (an estimate beyond the
    tolerance, or a decisive one) that only the credit for a *slower* box removes. The box
    cannot tell a neighbour from the release itself loading it: a release whose engine
    thread busy-polls while idle slows the reference workload beside its own groups as
    much as itself, and crediting that would release a 25 % slower server. Such a row
    stays INCONCLUSIVE at the cap (FAIL under ``fail``): measure again when the box is
    quiet."""
    n = f"n {c.n_base}+{c.n_cand}"
    way = "slower" if drift["change"] < 0 else "faster"
    box = f"the box is {abs(drift['change']):.0%} {way} than at the baseline"
    credited = dataclasses.replace(c, d=c.d - drift["log_change"], se=math.hypot(c.se, drift["se"]))
    if stats.decide(credited, rule.tolerance, levels) == FAIL:
        if stats.decide(c, rule.tolerance, levels) == FAIL:
            return FAIL, (
                f"ratio {c.ratio:.3f}; {box}, and even credited with that the ratio "
                f"{credited.ratio:.3f} is a decisive loss ({n})"
            )
        why = (
            f"{box} (reference workload): as measured the ratio {c.ratio:.3f} is no "
            f"decisive loss, credited with that change {credited.ratio:.3f} is one: the box "
            f"cannot tell a neighbour from a loss, not a pass ({n})"
        )
        if final and st.inconclusive == "fail":
            return FAIL, f"{why}; at the cap policy 'fail' decides"
        return INCONCLUSIVE, why
    why = f"{box} (reference workload): ratio {c.ratio:.3f} is not a verdict on the release ({n})"
    if not final:
        return INCONCLUSIVE, why
    measured_loss = c.d < math.log(1 - rule.tolerance) or (
        stats.decide(c, rule.tolerance, levels) == FAIL
    )
    if measured_loss:
        why = (
            f"{why}: as measured a loss of {1 - c.ratio:.0%}, which only crediting the box's "
            f"change ({credited.ratio:.3f}) removes; the box cannot tell a neighbour from a "
            f"release that loads it, not a pass"
        )
        if st.inconclusive == "fail":
            return FAIL, f"{why}; at the cap policy 'fail' decides"
        return INCONCLUSIVE, why
    return _policy(credited, rule, levels, st, f"{why}; credited ratio {credited.ratio:.3f}")


def _policy(
    c: stats.Comparison, rule: Rule, levels: stats.Levels, st: Settings, why: str
) -> tuple[str, str]:
    """The ``inconclusive`` policy on a row still open at the cap (no decisive loss).

    ``evidence`` PASSes a row when no significant loss was found and the samples could
    have found one. It stays INCONCLUSIVE, which rolls the release back (fail closed):

    - when the estimate is itself a loss beyond the tolerance: samples too scattered to
      prove a loss of 80 % are no evidence that there is none;
    - when the samples resolve no loss within ``max_resolution`` (two baseline trials
      can leave an interval of [0.0001, 2829]: "no evidence" of anything);
    - when the candidate scatters significantly more than its baseline (an F test at
      the row's false-alarm level, at least twice the log SD): a release that serves
      some requests far slower and others faster keeps its mean and widens the
      interval until nothing is significant; that is a change of the release, not an
      absence of one."""
    res = stats.resolution(c, levels)
    resolves = (
        f"; these samples resolve a loss of {res:.0%}, not {rule.tolerance:.0%}"
        if res > rule.tolerance
        else ""
    )
    if st.inconclusive != "evidence":
        return _flat(st, why)
    if c.d < math.log(1 - rule.tolerance):
        return INCONCLUSIVE, (
            f"{why}: at the cap the estimate is a loss of {1 - c.ratio:.0%}, beyond the "
            f"tolerance, and the box could not decide it{resolves}: not a pass"
        )
    scatter = stats.more_scattered(c, levels.alpha)
    if scatter is not None:
        times = "any" if math.isinf(scatter) else f"{scatter:.1f} times"
        return INCONCLUSIVE, (
            f"{why}: the release's samples scatter {times} the baseline's (log SD "
            f"{c.sd_cand:.3f} against {c.sd_base:.3f}), so no mean can be trusted: an "
            f"erratic release (or a box that changed during the run) is not a pass"
        )
    if res > st.max_resolution:
        return INCONCLUSIVE, (
            f"{why}: at the cap these samples resolve only a loss of {res:.0%}, beyond "
            f"gate.max_resolution {st.max_resolution:.0%}: no evidence either way, not a pass"
        )
    return PASS, f"{why}: no evidence of a loss at the cap{resolves}"


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
