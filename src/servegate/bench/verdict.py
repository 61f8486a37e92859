"""Baseline vs candidate samples → PASS / FAIL / INCONCLUSIVE per case and metric.

For each rule (metric, direction, tolerance, floor) and each case it covers:

- a required case with an invalid trial, or without samples, FAILs (never a pass on
  missing data); a report-only case is shown and never decides;
- a candidate median beyond the absolute floor FAILs;
- otherwise the bootstrap interval of the median ratio, turned so that > 1 is better,
  is set against ``1 - tolerance``: entirely below → FAIL, entirely at or above →
  PASS, straddling → INCONCLUSIVE (the gate then measures more, up to a cap, and the
  configured policy decides what is still INCONCLUSIVE);
- without a comparable baseline, the floors and validity decide and the row says so
  (policy ``no_baseline``).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from servegate.bench import stats
from servegate.bench.results import Samples

Direction = Literal["higher", "lower"]
PASS, FAIL, INCONCLUSIVE, REPORT = "PASS", "FAIL", "INCONCLUSIVE", "REPORT"


@dataclass(frozen=True)
class Rule:
    metric: str
    direction: Direction = "higher"
    #: allowed loss, as a fraction of the baseline median (0.05: 5 %)
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
    confidence: float = 0.90
    resamples: int = 4000
    #: what decides a row still INCONCLUSIVE at the repetition cap
    inconclusive: Literal["median", "fail", "pass"] = "median"
    #: rows without a comparable baseline: "pass" (floors and validity decide) or "fail"
    no_baseline: Literal["pass", "fail"] = "pass"


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
        "floor": None,
        "n_baseline": 0,
        "n_candidate": 0,
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
    rows: list[dict[str, Any]] = []
    for cid, cs in sorted(candidate.cases.items()):
        for rule in rules:
            if not any(fnmatch.fnmatchcase(cid, pat) for pat in rule.cases):
                continue
            rows.append(_decide(cid, cs, rule, baseline, st, final))
    if not rows:
        rows.append(_row("(none)", "-", True, verdict=FAIL, why="the candidate has no cases"))
    deciding = [r for r in rows if r["required"]]
    verdicts = {r["verdict"] for r in deciding}
    if not deciding:
        verdict = FAIL
        why = "no required case: nothing decides"
    elif FAIL in verdicts:
        verdict, why = (
            FAIL,
            "; ".join(
                f"{r['case']} {r['metric']}: {r['why']}" for r in deciding if r["verdict"] == FAIL
            ),
        )
    elif INCONCLUSIVE in verdicts:
        verdict, why = (
            INCONCLUSIVE,
            "; ".join(
                f"{r['case']} {r['metric']}: {r['why']}"
                for r in deciding
                if r["verdict"] == INCONCLUSIVE
            ),
        )
    else:
        verdict, why = PASS, f"{len(deciding)} required row(s) pass"
    return {
        "verdict": verdict,
        "why": why,
        "rows": rows,
        "method": f"bootstrap {st.confidence:.0%} interval of the median ratio, "
        f"{st.resamples} resamples",
        "baseline": baseline.source if baseline else None,
        "candidate": candidate.source,
    }


def _decide(
    cid: str, cs: Any, rule: Rule, baseline: Samples | None, st: Settings, final: bool
) -> dict[str, Any]:
    required = cs.required
    row = _row(cid, rule.metric, required, floor=rule.floor or None)
    undecided = REPORT if not required else None
    cand = cs.metrics.get(rule.metric) or []
    row["n_candidate"] = len(cand)
    if not cs.valid or not cand:
        reasons = ", ".join(f"{k}x{v}" for k, v in cs.reasons.items()) or "no valid samples"
        row.update(verdict=undecided or FAIL, why=f"case invalid ({reasons})")
        return row
    cmed = _median(cand)
    row["candidate_median"] = round(cmed, 4)
    if rule.floor:
        beyond = cmed < rule.floor if rule.direction == "higher" else cmed > rule.floor
        if beyond:
            word = "below the floor" if rule.direction == "higher" else "above the ceiling"
            row.update(verdict=undecided or FAIL, why=f"{cmed:,.2f} is {word} {rule.floor:,.2f}")
            return row
    bcs = baseline.cases.get(cid) if baseline else None
    base = (bcs.metrics.get(rule.metric) or []) if bcs and bcs.valid else []
    row["n_baseline"] = len(base)
    if not base:
        what = (
            "no comparable baseline" if bcs is None or bcs.valid else "the baseline case is invalid"
        )
        ok = st.no_baseline == "pass"
        floor = f"floor {rule.floor:,.2f} met" if rule.floor else "no floor set"
        row.update(
            verdict=undecided or (PASS if ok else FAIL),
            why=f"{what}; {floor}" + ("" if ok else " (policy no_baseline = fail)"),
        )
        return row
    bmed = _median(base)
    point, lo, hi = stats.median_ratio_interval(base, cand, st.confidence, st.resamples)
    if rule.direction == "lower":  # turn so that > 1 is better
        point, lo, hi = 1 / point, 1 / hi, 1 / lo
    threshold = 1 - rule.tolerance
    row.update(
        baseline_median=round(bmed, 4),
        ratio=round(cmed / bmed, 4),
        interval=[round(lo, 4), round(hi, 4)],
        threshold=round(threshold, 4),
    )
    better = "ratio" if rule.direction == "higher" else "baseline/candidate"
    if hi < threshold:
        verdict, why = FAIL, f"{better} interval [{lo:.3f}, {hi:.3f}] is below {threshold:.3f}"
    elif lo >= threshold:
        verdict, why = (
            PASS,
            f"{better} interval [{lo:.3f}, {hi:.3f}] is at or above {threshold:.3f}",
        )
    else:
        verdict = INCONCLUSIVE
        why = f"{better} interval [{lo:.3f}, {hi:.3f}] straddles {threshold:.3f}"
        if final:
            if st.inconclusive == "median":
                verdict = PASS if point >= threshold else FAIL
                why += f"; at the cap the median {better} {point:.3f} decides"
            else:
                verdict = PASS if st.inconclusive == "pass" else FAIL
                why += f"; at the cap policy '{st.inconclusive}' decides"
    row.update(verdict=undecided or verdict, why=why)
    return row


def compare_table(
    base: Samples, cand: Samples, metrics: Sequence[str], confidence: float = 0.90
) -> list[dict[str, Any]]:
    """A/B deltas with intervals, no verdict: for ``servegate bench compare``."""
    rows = []
    for cid in sorted(set(base.cases) & set(cand.cases)):
        for m in metrics:
            b = base.cases[cid].metrics.get(m) or []
            c = cand.cases[cid].metrics.get(m) or []
            row: dict[str, Any] = dict.fromkeys(
                ("a_median", "b_median", "delta_pct", "interval_pct")
            )
            row.update(case=cid, metric=m, n_a=len(b), n_b=len(c))
            if b and c:
                point, lo, hi = stats.median_ratio_interval(b, c, confidence)
                row.update(
                    a_median=round(_median(b), 4),
                    b_median=round(_median(c), 4),
                    delta_pct=round((point - 1) * 100, 2),
                    interval_pct=[round((lo - 1) * 100, 2), round((hi - 1) * 100, 2)],
                )
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
