"""Sample sets a hostile or broken release can produce, on which the gate must not PASS
a real loss nor roll back an unchanged release far more often than ``false_alarm``."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Literal

import pytest

from servegate.bench import results
from servegate.bench.results import CaseSamples, Samples
from servegate.judging import verdict
from tests.judging.test_stats_verdict import _with_reference, samples

BASE = [63.0, 64.1, 62.7, 63.5, 63.2]
RULES = [verdict.Rule("generation_tps", "higher", 0.05)]


def test_one_infinite_sample_does_not_pass_a_release_at_half_speed() -> None:
    """A release at half the rate with one trial whose rate is +inf (a zero time from a
    broken clock, or an engine histogram with a zero sum): the mean of the logs is inf,
    its variance NaN, every bound NaN, and NaN fails each check of the evidence policy
    (d < T, the F test, resolution > max_resolution), so the row PASSes as "no evidence
    of a loss" with the interval [nan, nan]."""
    cand = samples({"generation_tps": [30.0, 31.0, 29.0, math.inf]})
    d = verdict.evaluate(samples({"generation_tps": BASE}), cand, RULES)
    assert d["verdict"] != "PASS", d["rows"]


@pytest.mark.parametrize("lost", [0.0, -1.0, math.nan])
def test_samples_the_log_cannot_take_are_not_dropped_in_the_candidates_favour(
    lost: float,
) -> None:
    """Three of five trials of the candidate carry a rate of 0 (served nothing), a
    negative or a NaN: stats._logs drops them without a word, the gate compares the two
    good trials with the baseline and PASSes decisively (n 5+2, lower bound 0.975)."""
    cand = samples({"generation_tps": [63.0, 63.5, lost, lost, lost]})
    d = verdict.evaluate(samples({"generation_tps": BASE}), cand, RULES)
    assert d["verdict"] != "PASS", d["rows"]


def test_a_release_that_loads_the_box_is_not_credited_with_its_own_load() -> None:
    """A release that keeps a core busy while idle (a busy-polling engine thread) slows
    the reference workload measured beside its groups by 25 % ("a load that stays slows
    every slice") and itself by 25 %. As measured that is a decisive loss (interval
    [0.739, 0.756]); the drift credit calls the box 25 % slower, credits it, and at the
    cap the evidence policy PASSes the credited ratio 0.999. Users get a 25 % slower
    release: the box cannot tell its own load from a neighbour's, and a decisive measured
    loss that only the credit removes should not be released (the mirror of the case
    _judge_drifted already refuses: a loss only the credit shows)."""
    ref = [30.0, 30.2, 29.9, 30.1, 30.0]
    base = _with_reference(samples({"generation_tps": BASE}), ref)
    slow = [0.75 * v for v in [63.2, 63.9, 62.8, 63.4, 63.0]]
    cand = _with_reference(samples({"generation_tps": slow}), [0.75 * r for r in ref])
    d = verdict.evaluate(base, cand, RULES, QUIET)
    row = d["rows"][0]
    assert row["interval"][1] < 0.8, row  # decisive loss as measured
    assert d["verdict"] != "PASS", row


@pytest.mark.parametrize("bad", [0.0, -30.0, math.nan, math.inf])
def test_reference_readings_that_are_no_rate_are_no_measure_of_the_box(bad: float) -> None:
    """A result file is the user's: a reference reading of 0 (or worse) divided by zero
    in the drift check and crashed the gate. The box's change is then unmeasured, and
    the rows are judged as they are."""
    ref = [30.0, 30.2, 29.9, 30.1, 30.0]
    base = _with_reference(samples({"generation_tps": BASE}), [bad] * 5)
    cand = _with_reference(samples({"generation_tps": [0.75 * v for v in BASE]}), ref)
    d = verdict.evaluate(base, cand, RULES, QUIET)
    assert d["verdict"] == "FAIL", d["rows"]
    assert "not all positive rates" in str(d)


def test_copies_of_a_group_mean_are_not_independent_samples() -> None:
    """At concurrency > 1 every trial of a group carries the group's engine-clock rate
    (runner._engine_clock: "the group's mean above"), so 3 groups at concurrency 4 give
    12 samples that hold 3 values. Welch's t counted 12 + 12 and shrank the interval by
    about 2x: an unchanged release whose 3 groups measured 3 % lower (2 % group noise)
    FAILed at 12 + 12 (interval [0.947, 0.985]) where its 3 + 3 values PASS at the cap.
    Simulated (2 rows, 3 looks, 3 reps up to 5, group CV 2 % / 4 %): an unchanged
    release FAILed 7 % / 30 % of checks at concurrency 4, 2 % at concurrency 1. The
    result file's groups are the repetitions: one sample each."""
    rule = [verdict.Rule("engine_generation_tps", "higher", 0.05)]
    st = verdict.Settings(looks=3, first=3, restart_offset=1e-6)
    base_groups, cand_groups = [20.0, 20.5, 19.6], [19.4, 19.8, 19.0]

    def at(conc: int, groups: list[float]) -> Samples:
        doc = {
            "harness": {"name": "servegate-bench/1"},
            "cases": [{
                "id": "regular-16k",
                "groups": [
                    {"start": 0, "trials": [
                        {"performance_valid": True, "engine_generation_tps": g}
                        for _ in range(conc)
                    ]}
                    for g in groups
                ],
            }],
        }  # fmt: skip
        return results.from_result(doc)

    four_base = at(4, base_groups)
    assert four_base.cases["regular-16k"].metrics["engine_generation_tps"] == pytest.approx(
        base_groups
    )
    one = verdict.evaluate(at(1, base_groups), at(1, cand_groups), rule, st)
    four = verdict.evaluate(four_base, at(4, cand_groups), rule, st)
    assert one["verdict"] != "FAIL", one["rows"]
    assert four["verdict"] == one["verdict"], four["rows"]
    assert four["rows"][0]["interval"] == one["rows"][0]["interval"]
    assert four["rows"][0]["n_candidate"] == 3


#: a box whose restart offset is known to be negligible
QUIET = verdict.Settings(restart_offset=1e-6)


def _result(trials: Sequence[Mapping[str, object]]) -> dict[str, object]:
    """A result document of one case, one trial a group (concurrency 1)."""
    return {
        "harness": {"name": "servegate-bench/1"},
        "cases": [{"id": "regular-16k", "groups": [{"start": 0, "trials": [t]} for t in trials]}],
    }


def test_a_release_that_bursts_its_slow_answers_is_judged_on_all_of_them() -> None:
    """A frontend that holds back the text of its slow answers and sends it at once makes
    those trials bursts: the client's timings of a burst are dropped (not measurements)
    and the trial stays valid, so the client-clock rows were judged on the fast trials
    alone — a selection the release made. Three of six answers at a third of the rate
    PASSed decisively (n 5+3). A row whose candidate lacks its metric on some valid
    trials is no pass."""
    base = results.from_result(_result([
        {"performance_valid": True, "generation_tps": v} for v in BASE
    ]))  # fmt: skip
    fast = [63.2, 63.9, 62.8]
    burst = {"performance_valid": True, "generation_tps": None,
             "client_timing": "burst: held back between engine and client"}  # fmt: skip
    cand = results.from_result(_result(
        [{"performance_valid": True, "generation_tps": v} for v in fast] + [burst] * 3
    ))  # fmt: skip
    assert cand.cases["regular-16k"].missing == {"generation_tps": 3}
    d = verdict.evaluate(base, cand, RULES, QUIET)
    (row,) = d["rows"]
    assert d["verdict"] == "INCONCLUSIVE", row
    assert "3 of 6 valid trials have no generation_tps" in row["why"]
    fail = verdict.evaluate(
        base, cand, RULES, verdict.Settings(inconclusive="fail", restart_offset=1e-6)
    )
    assert fail["verdict"] == "FAIL"
    # a loss the measured trials show is still a FAIL: the selection only hides losses
    slow = results.from_result(_result(
        [{"performance_valid": True, "generation_tps": v / 2} for v in fast] + [burst]
    ))  # fmt: skip
    assert verdict.evaluate(base, slow, RULES)["verdict"] == "FAIL"
    # and the count survives the release record the next gate reads its baseline from
    again = results.from_record(cand.as_dict(), "record")
    assert again.cases["regular-16k"].missing == {"generation_tps": 3}
    # a first release, passed on validity alone, compared nothing a selection could hide:
    # a box so busy that one trial's client timings were dropped does not roll it back
    first = verdict.Settings(no_baseline="first-release", first_release=True)
    one = results.from_result(_result(
        [{"performance_valid": True, "generation_tps": v} for v in fast] + [burst]
    ))  # fmt: skip
    d = verdict.evaluate(None, one, RULES, first)
    assert d["verdict"] == "PASS", d["rows"]
    assert "nothing was compared on them" in d["rows"][0]["why"]
    # with a floor, the trials it was judged on are a selection again
    floored = [verdict.Rule("generation_tps", floor=50.0)]
    assert verdict.evaluate(None, one, floored, first)["verdict"] == "INCONCLUSIVE"


def test_a_burst_of_the_box_is_measured_again_then_set_apart() -> None:
    """One trial at a third of the rate (a neighbour's burst) among the candidate's: the
    gate measures again instead of judging it; once the candidate has enough samples
    that one far-slow sample is no more than the box explains, it is set apart, named and
    kept in the row, and the rest decide."""
    base = samples({"generation_tps": BASE})
    burst = [63.3, 62.9, 21.0, 63.6, 63.1]
    early = verdict.evaluate(base, samples({"generation_tps": burst}), RULES, QUIET, final=False)
    assert early["verdict"] == "INCONCLUSIVE", early["rows"]
    assert "measuring again" in early["rows"][0]["why"]
    again = [*burst, 63.4, 63.0, 62.8]
    final = verdict.evaluate(base, samples({"generation_tps": again}), RULES, QUIET)
    row = final["rows"][0]
    assert final["verdict"] == "PASS", row
    assert row["outliers"]["candidate"] == [21.0]
    assert row["outliers"]["set_apart"] == [0, 1]


def test_two_bursts_in_four_are_measured_again_not_failed_at_once() -> None:
    """Two of the first four trials hit by bursts look like a 40 % loss and scatter far
    beyond the baseline: before the cap that is a reason to measure again, not a FAIL."""
    base = samples({"generation_tps": BASE})
    cand = samples({"generation_tps": [63.3, 21.0, 63.1, 21.2]})
    d = verdict.evaluate(base, cand, RULES, QUIET, final=False)
    assert d["verdict"] == "INCONCLUSIVE", d["rows"]
    # the same scatter at the baseline's sample size (five) is judged: measured again
    tight = samples({"generation_tps": [63.3, 21.0, 63.1, 21.2, 63.0, 62.9, 21.1, 63.4]})
    d = verdict.evaluate(base, tight, RULES, QUIET, final=False)
    assert d["verdict"] != "FAIL", d["rows"]


def test_a_repeating_slow_tail_is_no_pass_and_a_significant_one_fails() -> None:
    """A release that serves a third of its requests at a third of the rate, against a
    baseline measured alike (twelve trials, no burst): its far-slow samples are counted,
    not averaged away, and four of twelve against none keep it from a PASS; half of its
    samples far slow leave no bulk to set them apart from, and the loss FAILs."""
    base = samples({"generation_tps": [*BASE, 63.4, 62.9, 63.1, 63.6, 62.8, 63.3, 63.0]})
    tail = [63.3, 21.0, 63.1, 62.8, 21.2, 63.5, 63.0, 20.9, 63.2, 62.7, 21.1, 63.4]
    d = verdict.evaluate(base, samples({"generation_tps": tail}), RULES, QUIET)
    (row,) = d["rows"]
    assert d["verdict"] == "INCONCLUSIVE", row
    assert "4 of 12 candidate samples are far slower" in row["why"]
    assert row["tail"]
    assert row["outliers"]["set_apart"] == [0, 4]
    half = [63.3, 21.0, 63.1, 21.2, 63.5, 20.9, 63.2, 21.1, 63.4, 21.0, 62.9, 21.3]
    d = verdict.evaluate(base, samples({"generation_tps": half}), RULES, QUIET)
    assert d["verdict"] == "FAIL", d["rows"]
    assert d["rows"][0]["outliers"] is None


def test_bursts_of_the_box_on_both_sides_are_set_apart_and_pass() -> None:
    """A box that bursts one trial in ten hits the baseline and the candidate alike: two
    bursts in twelve on the candidate against one in twelve on its baseline are the box's
    (Fisher p far above any level), set apart on both sides, and the rest PASS."""
    base = samples({"generation_tps": [*BASE, 21.3, 63.4, 62.9, 63.1, 63.6, 62.8, 63.0]})
    cand = [63.3, 63.1, 21.0, 62.8, 63.5, 63.0, 63.2, 62.7, 21.4, 63.4, 63.1, 62.9]
    d = verdict.evaluate(base, samples({"generation_tps": cand}), RULES, QUIET)
    (row,) = d["rows"]
    assert d["verdict"] == "PASS", row
    assert row["outliers"]["set_apart"] == [1, 2]


def test_a_tail_in_every_case_is_counted_over_the_check() -> None:
    """A tail too thin to show in one case shows over all of them: six cases, each with
    two of its twelve candidate trials far slow and none of the baseline's, FAIL as the
    release's tail although no single case's count is significant."""
    clean = [*BASE, 63.4, 62.9, 63.1, 63.6, 62.8, 63.3, 63.0]
    thin = [63.3, 21.0, 63.1, 62.8, 63.5, 63.0, 63.2, 20.9, 62.7, 63.4, 63.1, 62.9]
    ids = tuple(f"{p}-{t}" for p in ("regular", "coding") for t in ("16k", "32k", "64k"))
    base = Samples("b", "servegate-bench/1", {}, {
        c: CaseSamples(c, True, True, len(clean), {"generation_tps": clean}) for c in ids
    })  # fmt: skip
    cand = Samples("c", "servegate-bench/1", {}, {
        c: CaseSamples(c, True, True, len(thin), {"generation_tps": thin}) for c in ids
    })  # fmt: skip
    one = verdict.evaluate(
        Samples("b", "servegate-bench/1", {}, {ids[0]: base.cases[ids[0]]}),
        Samples("c", "servegate-bench/1", {}, {ids[0]: cand.cases[ids[0]]}),
        RULES, QUIET,
    )  # fmt: skip
    assert one["verdict"] != "FAIL", one["rows"]
    d = verdict.evaluate(base, cand, RULES, QUIET)
    assert d["verdict"] == "FAIL", d["rows"]
    assert "over the check's cases 12 of 72 against 0 of 72" in d["rows"][0]["why"]


def test_three_bursts_in_four_are_measured_again_before_a_fail() -> None:
    """Three of the candidate's first four trials hit by bursts make the bursts its bulk
    and its one ordinary trial a far-fast outlier: before the cap the gate measures again
    instead of failing on a third of the rate; at the cap the samples are what they are."""
    base = samples({"generation_tps": [100.0, 102.0, 100.5, 101.0]})
    cand = samples({"generation_tps": [33.1, 102.0, 34.0, 33.4]})
    early = verdict.evaluate(base, cand, RULES, QUIET, final=False)
    assert early["verdict"] == "INCONCLUSIVE", early["rows"]
    assert "far faster than its bulk: measuring again" in early["rows"][0]["why"]
    assert verdict.evaluate(base, cand, RULES, QUIET)["verdict"] == "FAIL"


def test_one_kept_sample_is_no_pass_where_none_kept_is_none() -> None:
    """A box (or a frontend that holds back its slow answers) drops the client timings of
    five of six valid trials: none kept is INCONCLUSIVE (FAIL under ``inconclusive =
    "fail"``), never a PASS; one kept PASSed. A first release PASSed on that one sample
    under every policy, "fail" too, and recorded it as the next gate's baseline, with
    which nothing can be compared; a floor-only row PASSed it under ``"pass"``. Fewer
    than two samples left on a side is nothing to compare: no PASS. A loss the one
    sample shows (below the floor) still FAILs, and a first release measured once with
    nothing dropped (``bench.repetitions = 1``) still passes on validity."""
    gone = {"performance_valid": True, "generation_tps": None,
            "client_timing": "burst: held back between engine and client"}  # fmt: skip
    one = results.from_result(_result([{"performance_valid": True, "generation_tps": 63.2},
                                       *[gone] * 5]))  # fmt: skip
    first = verdict.Settings(no_baseline="first-release", first_release=True, restart_offset=1e-6)
    floor = [verdict.Rule("generation_tps", "higher", 1.0, 50.0)]
    wants: list[tuple[Literal["inconclusive", "fail", "pass"], str]] = [
        ("inconclusive", "INCONCLUSIVE"), ("pass", "INCONCLUSIVE"), ("fail", "FAIL")
    ]  # fmt: skip
    for policy, want in wants:
        st = dataclasses.replace(first, inconclusive=policy)
        for rules in (RULES, floor):
            d = verdict.evaluate(None, one, rules, st)
            (row,) = d["rows"]
            assert (d["verdict"], row["verdict"]) == (want, want), (policy, row)
            assert "never a pass on missing data" in row["why"]
        # before the last look: measured again
        assert verdict.evaluate(None, one, RULES, st, final=False)["verdict"] == "INCONCLUSIVE"
    # the one sample below the floor is a loss it shows: FAIL, as before
    slow = results.from_result(_result([{"performance_valid": True, "generation_tps": 20.0},
                                        *[gone] * 5]))  # fmt: skip
    assert verdict.evaluate(None, slow, floor)["verdict"] == "FAIL"
    # one trial, nothing dropped: a first release passes on validity, as before
    once = results.from_result(_result([{"performance_valid": True, "generation_tps": 63.2}]))
    assert verdict.evaluate(None, once, RULES, first)["verdict"] == "PASS"


def test_a_valid_trial_without_the_metric_among_trials_with_it_is_a_dropped_timing() -> None:
    """A result file (llm-context-bench's, or one written by another tool) whose slow
    valid trials leave the metric out instead of writing null: the trials were counted
    as missing until the gate took an absent key for "not measured here" (an engine
    without a clock), and three of six trials then PASSed as if they were all of them.
    A metric the case's other valid trials measured is missing where a trial lacks it;
    one that no trial names is still not measured."""
    base = results.from_result(_result([
        {"performance_valid": True, "generation_tps": v} for v in BASE
    ]))  # fmt: skip
    fast = [63.2, 63.9, 62.8]
    cand = results.from_result(_result(
        [{"performance_valid": True, "generation_tps": v} for v in fast]
        + [{"performance_valid": True}] * 3
    ))  # fmt: skip
    cs = cand.cases["regular-16k"]
    assert cs.missing == {"generation_tps": 3}
    d = verdict.evaluate(base, cand, RULES, QUIET)
    assert d["verdict"] == "INCONCLUSIVE", d["rows"]
    assert "3 of 6 valid trials have no generation_tps" in d["rows"][0]["why"]
    # a metric no trial names (prefill_tps here) is not measured, not dropped
    assert "prefill_tps" not in cs.missing
