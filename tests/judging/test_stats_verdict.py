"""The gate's statistics and decisions on known samples."""

from __future__ import annotations

import dataclasses
import math
import random
import statistics
from typing import Literal

import pytest
from scipy import stats as sps  # type: ignore[import-untyped]

from servegate.bench.results import CaseSamples, Samples
from servegate.judging import stats, verdict


def samples(
    values: dict[str, list[float]],
    valid: bool = True,
    required: bool = True,
    case: str = "regular-16k",
) -> Samples:
    cs = CaseSamples(
        case,
        required,
        valid,
        len(next(iter(values.values()), [])),
        values,
        {} if valid else {"dominant_repeated_token": 1},
    )
    return Samples("test", "servegate-bench/1", {"digest": "x"}, {case: cs})


#: a box whose restart offset is known to be negligible (the rule's own behaviour)
QUIET = verdict.Settings(restart_offset=1e-6)


def test_comparison_is_the_geometric_mean_ratio_with_welch_bounds() -> None:
    c = stats.compare([100, 101, 99], [90, 91, 89])
    assert c is not None
    assert c.ratio == pytest.approx((90 * 91 * 89) ** (1 / 3) / (100 * 101 * 99) ** (1 / 3))
    assert c.lower(0.01) < c.d < c.upper(0.05)
    assert c.upper(0.05) < 0  # a 10 % loss with 1 % noise is plain
    assert stats.compare([100], [90, 91]) is None  # one sample: no variance, no test
    turned = stats.compare([8.5, 8.6, 8.4], [9.9, 10.0, 10.1], lower_is_better=True)
    assert turned is not None
    assert turned.ratio < 1  # a longer TTFT is a loss


def test_ten_percent_slower_decode_fails_and_identical_passes() -> None:
    base = samples({"generation_tps": [63.0, 64.1, 62.7]})
    slow = samples({"generation_tps": [56.9, 57.5, 56.2]})
    same = samples({"generation_tps": [63.4, 62.5, 63.9]})
    rules = [verdict.Rule("generation_tps", "higher", 0.05)]
    d = verdict.evaluate(base, slow, rules, QUIET)
    assert d["verdict"] == "FAIL"
    assert "upper bound" in d["rows"][0]["why"]
    d = verdict.evaluate(base, same, rules, QUIET)
    assert d["verdict"] == "PASS", d["rows"]
    assert "a loss of 5% is excluded" in d["rows"][0]["why"]
    # with nothing measured about the box's restarts the prior offset (2 %) stands in:
    # three trials a side in one start each cannot exclude 5 %, and that is no PASS
    d = verdict.evaluate(base, same, rules)
    assert d["verdict"] == "INCONCLUSIVE", d["rows"]
    assert d["rows"][0]["offset"]["from"].startswith("prior gate.restart_offset")


def test_a_loss_of_exactly_the_tolerance_fails_and_half_of_it_is_not_a_coin_flip() -> None:
    """The tolerance is the smallest loss that must be caught: the old rule (interval
    entirely below 1 - tolerance) caught a loss of exactly 5 % half the time."""
    base = samples({"generation_tps": [100.0, 100.5, 99.5, 100.2, 99.8]})
    lost = samples({"generation_tps": [95.0, 95.4, 94.6, 95.2, 94.8]})
    d = verdict.evaluate(base, lost, [verdict.Rule("generation_tps", "higher", 0.05)], QUIET)
    assert d["verdict"] == "FAIL", d["rows"]
    assert d["rows"][0]["threshold"] == pytest.approx(0.95)  # the loss a PASS must exclude


def test_open_rows_are_inconclusive_until_the_cap_then_policy_decides() -> None:
    base = samples({"generation_tps": [60.0, 66.0, 63.0]})
    cand = samples({"generation_tps": [59.5, 65.5, 62.5]})
    rules = [verdict.Rule("generation_tps", "higher", 0.05)]
    open_ = verdict.evaluate(base, cand, rules, final=False)
    assert open_["verdict"] == "INCONCLUSIVE"
    assert "is not excluded yet" in open_["rows"][0]["why"]
    # no evidence of a loss is not a PASS: at the cap the row stays open (rolled back)
    final = verdict.evaluate(base, cand, rules)
    assert final["verdict"] == "INCONCLUSIVE"
    why = final["rows"][0]["why"]
    assert "at the cap the interval still holds a loss of 5%" in why
    assert "these samples resolve" in why
    fail = verdict.evaluate(base, cand, rules, verdict.Settings(inconclusive="fail"))
    assert fail["verdict"] == "FAIL"
    assert "gate.inconclusive = 'fail' decides" in fail["rows"][0]["why"]
    chosen = verdict.evaluate(base, cand, rules, verdict.Settings(inconclusive="pass"))
    assert chosen["verdict"] == "PASS"
    assert "gate.inconclusive = 'pass' decides" in chosen["rows"][0]["why"]


def test_scattered_samples_of_a_large_loss_are_no_pass_at_the_cap() -> None:
    """A release five times slower whose samples scatter (a starved trial) is not
    significant at 3 + 3 — and "evidence" must not PASS it: the estimate is a loss far
    beyond the tolerance, so the row stays INCONCLUSIVE and the release rolls back."""
    base = samples({"engine_prefill_tps": [9000.0, 8000.0, 8500.0]})
    cand = samples({"engine_prefill_tps": [1500.0, 9000.0, 400.0]})
    rules = [verdict.Rule("engine_prefill_tps", "higher", 0.5)]
    d = verdict.evaluate(base, cand, rules)
    assert d["verdict"] == "INCONCLUSIVE", d["rows"]
    assert d["rows"][0]["ratio"] < 0.5
    assert "not a pass" in d["why"]


def test_lower_is_better_metrics_turn_the_ratio() -> None:
    base = samples({"ttft_s": [8.5, 8.6, 8.4]})
    slower = samples({"ttft_s": [9.9, 10.0, 10.1]})
    rules = [verdict.Rule("ttft_s", "lower", 0.05)]
    assert verdict.evaluate(base, slower, rules, QUIET)["verdict"] == "FAIL"
    assert verdict.evaluate(base, base, rules, QUIET)["verdict"] == "PASS"


def test_an_invalid_required_case_fails_and_a_report_only_case_never_decides() -> None:
    base = samples({"generation_tps": [63.0, 64.0, 62.0]})
    bad = samples({"generation_tps": [63.0]}, valid=False)
    d = verdict.evaluate(base, bad, [verdict.Rule("generation_tps")])
    assert d["verdict"] == "FAIL"
    assert "dominant_repeated_token" in d["rows"][0]["why"]
    report_only = samples({"generation_tps": [63.0]}, valid=False, required=False)
    d = verdict.evaluate(base, report_only, [verdict.Rule("generation_tps")])
    assert d["rows"][0]["verdict"] == "REPORT"
    assert d["verdict"] == "FAIL"  # nothing required: nothing decides, never a pass


def test_a_side_whose_every_timing_the_box_dropped_is_no_loss_and_never_a_pass() -> None:
    """Valid trials that kept no sample (each timing dropped: a client kept off its CPU,
    a burst): no evidence either way. INCONCLUSIVE, never the FAIL that claims a loss the
    release showed, and never a PASS, whatever ``inconclusive`` says."""
    rules = [verdict.Rule("generation_tps", "higher", 0.05)]
    kept = samples({"generation_tps": [63.0, 64.1, 62.7]})
    dropped = samples({"generation_tps": []})
    dropped.cases["regular-16k"].trials = 3
    dropped.cases["regular-16k"].missing = {"generation_tps": 3}
    for base, cand, side in ((kept, dropped, "candidate"), (dropped, kept, "baseline")):
        policies: list[tuple[Literal["inconclusive", "fail", "pass"], str]] = [
            ("inconclusive", "INCONCLUSIVE"), ("pass", "INCONCLUSIVE"), ("fail", "FAIL")
        ]  # fmt: skip
        for policy, want in policies:
            st = dataclasses.replace(QUIET, inconclusive=policy)
            d = verdict.evaluate(base, cand, rules, st)
            (row,) = d["rows"]
            assert (d["verdict"], row["verdict"]) == (want, want), (side, policy, row)
            assert f"the {side}'s 3 valid trial(s) kept no generation_tps sample" in row["why"]
            assert "never a pass on missing data" in row["why"]
        # before the last look it is open: the gate measures again
        d = verdict.evaluate(base, cand, rules, dataclasses.replace(QUIET, inconclusive="fail"),
                             final=False)  # fmt: skip
        assert d["verdict"] == "INCONCLUSIVE"
    # trials that were invalid (the release's text) still FAIL, as before
    invalid = samples({"generation_tps": []}, valid=False)
    assert verdict.evaluate(kept, invalid, rules, QUIET)["verdict"] == "FAIL"


def test_floors_decide_without_a_baseline_but_a_missing_baseline_never_passes() -> None:
    cand = samples({"generation_tps": [25.7, 33.8, 30.0]})
    floors = list(verdict.floors("v620-tp4"))
    d = verdict.evaluate(None, cand, floors)
    assert d["verdict"] == "FAIL"
    assert "below the floor 56.00" in d["why"]
    ok = samples({"generation_tps": [63.0, 69.7, 68.5], "prefill_tps": [1957.8, 1982.8, 1944.0]})
    d = verdict.evaluate(None, ok, floors)
    assert d["verdict"] == "PASS", d
    assert {r["why"] for r in d["rows"] if r["metric"] == "generation_tps"} == {"floor 56.00 met"}
    # a relative rule without a baseline: FAIL by default
    d = verdict.evaluate(None, ok, [verdict.Rule("generation_tps")])
    assert d["verdict"] == "FAIL"
    assert "never a pass on missing data" in d["why"]
    # "first-release" passes only while the host has no released record at all
    first = verdict.Settings(no_baseline="first-release", first_release=True)
    d = verdict.evaluate(None, ok, [verdict.Rule("generation_tps")], first)
    assert d["verdict"] == "PASS"
    assert "first release of the stack on this host" in d["rows"][0]["why"]
    later = verdict.Settings(no_baseline="first-release", first_release=False)
    assert verdict.evaluate(None, ok, [verdict.Rule("generation_tps")], later)["verdict"] == "FAIL"


def test_an_invalid_baseline_never_lets_a_candidate_pass() -> None:
    broken = samples({"generation_tps": [63.0]}, valid=False)
    crawl = samples({"generation_tps": [1.0, 1.1, 0.9]})
    for st in (
        verdict.Settings(no_baseline="first-release", first_release=True),
        verdict.Settings(no_baseline="fail"),
    ):
        d = verdict.evaluate(broken, crawl, [verdict.Rule("generation_tps")], st)
        assert d["verdict"] == "FAIL"
        assert "the baseline case is invalid" in d["why"]


def _with_reference(s: Samples, rates: list[float]) -> Samples:
    for cs in s.cases.values():
        cs.reference = rates
    return s


def test_a_slower_box_is_not_a_verdict_on_the_release() -> None:
    """The reference workload moved significantly: the row is judged as measured and
    credited with the box's change, and only a verdict both agree on stands."""
    rules = [verdict.Rule("prefill_tps", "higher", 0.5)]
    base = _with_reference(samples({"prefill_tps": [6000.0, 6100.0, 5900.0]}), [30.0, 31.0, 29.5])
    # a neighbour halved the box: the same release measures half the rate
    busy = _with_reference(samples({"prefill_tps": [3000.0, 3100.0, 2900.0]}), [15.0, 15.5, 14.8])
    d = verdict.evaluate(base, busy, rules, QUIET, final=False)
    assert d["verdict"] == "INCONCLUSIVE"
    assert "the box is 50% slower than at the baseline" in d["why"]
    assert "cannot be separated from the release's" in d["why"]
    assert d["rows"][0]["drift"]["moved"] is True
    # at the cap: credited, no loss; as measured, one. The box cannot tell a neighbour
    # from a release that loads it: never released, never a FAIL
    final = verdict.evaluate(base, busy, rules, QUIET)
    assert final["verdict"] == "INCONCLUSIVE", final["rows"]
    strict = verdict.evaluate(base, busy, rules, dataclasses.replace(QUIET, inconclusive="fail"))
    assert strict["verdict"] == "FAIL"
    # a slower box that slowed the release less than the tolerance: both views pass
    mild = _with_reference(samples({"prefill_tps": [5400.0, 5500.0, 5300.0]}), [24.0, 24.6, 23.8])
    final = verdict.evaluate(base, mild, rules, QUIET)
    assert final["verdict"] == "PASS", final["rows"]
    assert "credited with that" in final["rows"][0]["why"]
    # five times slower on a half-speed box is a loss both ways
    slow = _with_reference(samples({"prefill_tps": [600.0, 640.0, 580.0]}), [15.0, 15.5, 14.8])
    d = verdict.evaluate(base, slow, rules, QUIET, final=False)
    assert d["verdict"] == "FAIL"
    assert "credited with that" in d["why"]
    # a faster box with an unchanged rate hides a loss: not a PASS
    fast = _with_reference(samples({"prefill_tps": [6000.0, 6050.0, 5950.0]}), [60.0, 61.0, 59.0])
    d = verdict.evaluate(base, fast, rules, QUIET, final=False)
    assert d["verdict"] != "PASS"


def test_a_reference_shift_within_its_own_noise_is_no_change_of_the_box() -> None:
    """Drift is a measurement, not a switch at 10 %: a reference that scatters by 20 %
    and moved 8 % is not significant, and the row is judged as measured."""
    rules = [verdict.Rule("prefill_tps", "higher", 0.5)]
    base = _with_reference(samples({"prefill_tps": [6000.0, 6100.0, 5900.0]}), [30.0, 40.0, 24.0])
    cand = _with_reference(samples({"prefill_tps": [6050.0, 5950.0, 6000.0]}), [27.0, 37.0, 23.0])
    row = verdict.evaluate(base, cand, rules, QUIET)["rows"][0]
    assert row["drift"]["checked"] is True
    assert row["drift"]["moved"] is False
    assert row["verdict"] == "PASS", row
    # a small but steady shift (2 %, the reference's own noise 0.1 %) is measured
    base = _with_reference(samples({"prefill_tps": [6000.0, 6100.0, 5900.0]}), [30.0, 30.03, 29.97])
    cand = _with_reference(samples({"prefill_tps": [6050.0, 5950.0, 6000.0]}), [29.4, 29.43, 29.37])
    row = verdict.evaluate(base, cand, rules, QUIET)["rows"][0]
    assert row["drift"]["moved"] is True
    assert row["verdict"] == "PASS", row  # both views agree


def test_a_loss_only_the_drift_credit_shows_is_neither_a_fail_nor_released() -> None:
    """What a CI run on a shared 2-CPU box saw: during the baseline a bursty neighbour
    slowed the reference workload far more than the server, so beside the candidate the
    box looked 42 % faster, and credited with that an unchanged release (0.91 as
    measured) became a "decisive" 0.64. The box cannot tell that from a real loss hidden
    by a faster box: the row stays open (measured again), and at the cap it is not
    released under any policy."""
    rule = verdict.Rule("engine_generation_tps", "higher", 0.5)
    base = _with_reference(
        samples({"engine_generation_tps": [20.0, 20.4, 19.8, 20.2]}), [10.0, 10.1, 9.9, 10.0]
    )
    cand = _with_reference(
        samples({"engine_generation_tps": [18.2, 18.4, 18.0, 18.3]}), [14.2, 14.3, 14.1, 14.2]
    )
    d = verdict.evaluate(base, cand, [rule], QUIET, final=False)
    row = d["rows"][0]
    assert row["drift"]["change"] > 0.4
    assert d["verdict"] == "INCONCLUSIVE", row
    assert "cannot be separated from the release's" in row["why"]
    for st, expected in ((QUIET, "INCONCLUSIVE"),
                         (dataclasses.replace(QUIET, inconclusive="fail"), "FAIL")):  # fmt: skip
        final = verdict.evaluate(base, cand, [rule], st)
        assert final["verdict"] == expected, (st, final["rows"])
    # against a 5 % rule 0.91 as measured is itself a decisive loss: that FAILs
    strict = verdict.evaluate(
        base, cand, [verdict.Rule("engine_generation_tps", "higher", 0.05)], QUIET
    )
    assert strict["verdict"] == "FAIL", strict["rows"]
    assert "credited with that" in strict["rows"][0]["why"]


@pytest.mark.parametrize(
    "st",
    [verdict.Settings(inconclusive="inconclusive"), verdict.Settings(inconclusive="fail")],
)  # fmt: skip
def test_a_loss_hidden_by_a_faster_box_is_not_released(st: verdict.Settings) -> None:
    """20 % slower on a box 25 % faster: as measured unchanged, for a rate and for a
    latency (whose credit goes the same way: a faster box lowers it)."""
    ref_base, ref_fast = [30.0, 30.03, 29.97, 30.0], [37.5, 37.54, 37.46, 37.5]
    rate = [6000.0, 6006.0, 5994.0, 6003.0]
    base = _with_reference(samples({"prefill_tps": rate}), ref_base)
    hidden = _with_reference(samples({"prefill_tps": rate}), ref_fast)
    d = verdict.evaluate(base, hidden, [verdict.Rule("prefill_tps", "higher", 0.05)], st)
    assert d["verdict"] != "PASS", d["rows"]
    ttft = [1.00, 1.01, 0.99, 1.0]
    base = _with_reference(samples({"ttft_s": ttft}), ref_base)
    hidden = _with_reference(samples({"ttft_s": ttft}), ref_fast)
    d = verdict.evaluate(base, hidden, [verdict.Rule("ttft_s", "lower", 0.05)], st)
    assert d["verdict"] != "PASS", d["rows"]
    assert "credited" in d["rows"][0]["why"]


def test_an_unchanged_latency_on_a_slower_box_is_credited_the_right_way() -> None:
    """A box 20 % slower makes a latency 1.25 times longer: credited, the ratio is about
    1 (and 1.25 times longer is no decisive loss at the rule's 50 % as measured either)."""
    base = _with_reference(samples({"ttft_s": [1.00, 1.01, 0.99]}), [30.0, 31.0, 29.5])
    busy = _with_reference(samples({"ttft_s": [1.25, 1.26, 1.24]}), [24.0, 24.8, 23.6])
    d = verdict.evaluate(base, busy, [verdict.Rule("ttft_s", "lower", 0.5)], QUIET)
    assert d["verdict"] == "PASS", d["rows"]
    assert "credited with that (1.0" in d["rows"][0]["why"]
    # twice as long on a box half as fast: credited 1.0, but a loss as measured
    slow = _with_reference(samples({"ttft_s": [2.00, 2.02, 1.98]}), [15.0, 15.5, 14.75])
    d = verdict.evaluate(base, slow, [verdict.Rule("ttft_s", "lower", 0.5)], QUIET)
    assert d["verdict"] == "INCONCLUSIVE", d["rows"]


def test_without_reference_samples_the_drift_check_says_it_did_not_look() -> None:
    base = samples({"generation_tps": [63.0, 64.1, 62.7]})
    same = samples({"generation_tps": [63.4, 62.5, 63.9]})
    d = verdict.evaluate(base, same, [verdict.Rule("generation_tps")])
    assert d["rows"][0]["drift"] == {
        "checked": False,
        "why": "the baseline has no reference-workload samples",
    }


def test_readings_of_another_reference_workload_are_not_compared() -> None:
    # a baseline recorded with another reference workload (an older servegate, another
    # core count) would credit the candidate with a change of the measuring stick
    base = _with_reference(samples({"prefill_tps": [6000.0, 6100.0, 5900.0]}), [4.1, 4.5, 4.2])
    base.cases["regular-16k"].reference_workload = "numpy float64 320x320 matmul"
    cand = _with_reference(samples({"prefill_tps": [5900.0, 6000.0, 6050.0]}), [95.0, 96.0, 94.0])
    cand.cases[
        "regular-16k"
    ].reference_workload = "numpy float64 320x320 matmul, 1 BLAS thread x 2 cores"
    d = verdict.evaluate(base, cand, [verdict.Rule("prefill_tps", "higher", 0.5)])
    row = d["rows"][0]
    assert row["drift"]["checked"] is False
    assert "the reference workload differs" in row["drift"]["why"]
    assert d["verdict"] == "PASS", row


def test_plan_and_resolution_follow_the_box_noise() -> None:
    def plan(cv: float, offset: float = 0.0, cap: int = 50) -> int | None:
        return stats.plan(cv, offset, 0.05, 0.05, 0.01, rows=2, reps=3, cap=cap)

    quiet, noisy = plan(0.01), plan(0.02)
    assert quiet is not None
    assert noisy is not None
    assert 3 <= quiet <= 6
    assert noisy > 2 * quiet  # the repetitions grow with the square of the noise
    # a restart-to-restart offset no number of trials in one start averages away
    assert plan(0.01, offset=0.02, cap=200) is None
    levels = stats.Levels.split(0.05, 0.01, rows=2, looks=1)
    assert stats.resolvable(0.01, 0.02, levels, 200) > 0.05
    assert stats.resolvable(0.005, 0.0, levels, 5) < 0.05


def test_the_plan_counts_the_rows_that_must_all_pass() -> None:
    """Every deciding row must PASS, so the plan splits the error rates over them: a box
    (CV 2 %, restart offset 1 %) whose four rows resolve 5 % at the default caps cannot
    resolve it for sixteen, and the plan says so before anything is measured (config
    check and the gate name the loss it resolves) instead of rolling back an unchanged
    release one time in seven."""
    caps = (3, 10, 10, 1000)  # repetitions, max_repetitions, max_starts, a known noise
    four = stats.plan_starts(0.02, 0.01, 0.05, 0.05, 0.01, 4, *caps)
    assert four is not None
    assert four[0] <= 10
    assert stats.plan_starts(0.02, 0.01, 0.05, 0.05, 0.01, 16, *caps) is None
    sixteen = stats.Levels.split(0.025, 0.01, 16, 1)
    assert 0.05 < stats.resolvable(0.02, 0.01, sixteen, 10, 10, 1000) < 0.06


def test_unknown_floor_set_is_a_config_error() -> None:
    from servegate.errors import ConfigError

    with pytest.raises(ConfigError, match="not a shipped floor set") as err:
        verdict.floors("v999")
    assert "v620-tp4" in err.value.hint


def test_an_erratic_release_is_no_pass_at_the_cap() -> None:
    """A hostile release that serves every other request 2.5 times slower (and the rest
    2.5 times faster, so the mean of the logs does not move) scatters its samples so wide
    that no loss is significant. "No evidence of a loss" must not PASS it: its samples
    scatter thirty times the baseline's, and that is a change of the release."""
    base = samples({"generation_tps": [63.0, 64.1, 62.7, 63.5]})
    erratic = samples({"generation_tps": [25.2, 157.5, 25.4, 158.0, 25.1, 157.0]})
    rules = [verdict.Rule("generation_tps", "higher", 0.05)]
    d = verdict.evaluate(base, erratic, rules, QUIET)
    row = d["rows"][0]
    assert 0.95 < row["ratio"] < 1.05  # the estimate alone says nothing is lost
    assert d["verdict"] == "INCONCLUSIVE", row
    assert "not a pass" in row["why"]


#: a demo release's prefill and the reference workload beside it, in two runs of one
#: unchanged release on the 2-CPU box (the second run in a minute the box itself
#: scattered: the reference moved from 98 to 73 GFLOP/s between two trials)
DEMO_STEADY = ([12730.0, 12903.0, 13008.0, 12908.0], [80.3, 92.2, 96.7, 91.3])
DEMO_NOISY = ([8029.0, 12063.0, 11833.0, 9997.0], [82.8, 98.3, 73.5, 92.2])


def test_an_unchanged_release_measured_while_the_box_scattered_is_no_erratic_release() -> None:
    """A real box's scatter changes from one run to the next. The candidate's samples
    scattering twenty times a steady baseline's, while the reference workload beside
    them scattered as much, is the box: with a loss of 50 % excluded it passes."""
    base = _with_reference(samples({"prefill_tps": DEMO_STEADY[0]}), DEMO_STEADY[1])
    cand = _with_reference(samples({"prefill_tps": DEMO_NOISY[0]}), DEMO_NOISY[1])
    rules = [verdict.Rule("prefill_tps", "higher", 0.50)]
    d = verdict.evaluate(base, cand, rules, QUIET)
    assert d["verdict"] == "PASS", d["rows"]
    # without the box's readings the same samples read as an erratic release
    bare = verdict.evaluate(samples({"prefill_tps": DEMO_STEADY[0]}),
                            samples({"prefill_tps": DEMO_NOISY[0]}), rules, QUIET)  # fmt: skip
    assert bare["verdict"] == "INCONCLUSIVE", bare["rows"]
    assert "scatter" in bare["rows"][0]["why"]


def test_an_erratic_release_on_a_steady_box_is_still_no_pass() -> None:
    """The box's credit is what the reference workload saw, no more: a release that
    serves every other request 1.6 times slower than the rest while the box
    holds steady (its reference within 2 %) is held back, though its samples exclude a
    loss of 50 %; the reason names the box's scatter too."""
    steady = [96.0, 97.1, 95.8, 96.6, 97.0, 96.2]
    base = _with_reference(samples({"generation_tps": [63.0, 64.1, 62.7, 63.5]}), steady[:4])
    erratic = _with_reference(
        samples({"generation_tps": [50.0, 80.0, 50.5, 79.0, 49.8, 80.5]}), steady
    )
    rules = [verdict.Rule("generation_tps", "higher", 0.50)]
    row = verdict.evaluate(base, erratic, rules, QUIET)["rows"][0]
    assert row["verdict"] == "INCONCLUSIVE", row
    assert "the box's 0.00" in row["why"], row["why"]


def test_the_box_credit_needs_the_baselines_workload() -> None:
    """Readings of another reference workload measure another thing: no credit."""
    base = _with_reference(samples({"prefill_tps": DEMO_STEADY[0]}), DEMO_STEADY[1])
    cand = _with_reference(samples({"prefill_tps": DEMO_NOISY[0]}), DEMO_NOISY[1])
    (cs,) = cand.cases.values()
    cs.reference_workload = "another"
    rules = [verdict.Rule("prefill_tps", "higher", 0.50)]
    assert verdict.evaluate(base, cand, rules, QUIET)["verdict"] == "INCONCLUSIVE"


def test_samples_that_resolve_nothing_are_no_pass_at_the_cap() -> None:
    """Two scattered baseline trials leave an interval of [0.08, 12]: the samples could
    not have seen a loss of 90 %, so "no evidence of a loss" is no evidence at all: the
    row stays INCONCLUSIVE (rolled back) unless the user chose ``pass``."""
    base = samples({"generation_tps": [40.0, 90.0]})
    cand = samples({"generation_tps": [55.0, 70.0, 45.0, 80.0]})
    rules = [verdict.Rule("generation_tps", "higher", 0.05)]
    d = verdict.evaluate(base, cand, rules, QUIET)
    row = d["rows"][0]
    assert row["interval"][0] < 0.6, row
    assert row["interval"][1] > 1.6, row
    assert d["verdict"] == "INCONCLUSIVE", row
    flat = dataclasses.replace(QUIET, inconclusive="pass")
    assert verdict.evaluate(base, cand, rules, flat)["verdict"] == "PASS"


def test_box_noise_on_both_sides_still_passes_when_the_samples_resolve_it() -> None:
    """The scatter check compares the candidate with its own baseline: a box that
    scatters both alike is no reason to roll back an unchanged release once its
    samples exclude the loss."""
    base = samples({"generation_tps": [60.0, 61.2, 60.6, 59.4, 60.3, 61.0, 59.8, 60.1]})
    cand = samples({"generation_tps": [59.9, 61.1, 60.4, 59.5, 61.2, 60.0, 59.6, 60.7]})
    rules = [verdict.Rule("generation_tps", "higher", 0.05)]
    d = verdict.evaluate(base, cand, rules, dataclasses.replace(QUIET, looks=3, first=6))
    assert d["verdict"] == "PASS", d["rows"]
    assert "scatter" not in d["rows"][0]["why"]


def test_a_candidate_spread_over_starts_may_scatter_by_the_restart_offset() -> None:
    """Spread over three service starts, a candidate's samples carry the box's restart
    offset, which a baseline measured in one start does not: that much more scatter is
    the box, not the release."""
    quiet = [100.0, 100.4, 99.7, 100.2, 99.9, 100.3]
    starts = [97.0, 97.3, 103.1, 102.8, 100.0, 99.6]  # three starts, offsets of ~3 %
    plain = stats.compare(quiet, starts)
    assert plain is not None
    assert stats.more_scattered(plain, 0.01) is not None
    spread = stats.compare(quiet, starts, offset=0.03, starts=(1, 3))
    assert spread is not None
    assert stats.more_scattered(spread, 0.01) is None


def test_an_offset_estimated_from_few_starts_widens_the_interval_by_its_freedom() -> None:
    """A measured restart offset is an estimate: from two service starts' worth of
    freedom the t quantile is wide, from two hundred it is nearly the normal one, and an
    estimate of 0 from a few starts is no certainty that restarts cost nothing."""
    base = [100.0, 101.0, 99.0, 100.5, 99.5, 100.2, 99.8, 100.1]
    cand = [99.0, 100.2, 98.8, 99.9, 99.1, 99.6, 99.3, 100.0]
    between = 0.01**2 + 0.01**2 / 4
    given = stats.compare(base, cand, offset=0.01, starts=(2, 2))
    few = stats.compare(base, cand, offset=0.01, starts=(2, 2), offset_evidence=(between, 2))
    many = stats.compare(base, cand, offset=0.01, starts=(2, 2), offset_evidence=(between, 200))
    assert given is not None
    assert few is not None
    assert many is not None
    assert few.se == many.se == given.se  # the same estimate ...
    assert 1 <= few.df < many.df <= given.df  # ... known less well
    assert few.lower(0.01) < many.lower(0.01) <= given.lower(0.01)
    zero_few = stats.compare(base, cand, offset=0.0, starts=(2, 2), offset_evidence=(between, 2))
    zero_given = stats.compare(base, cand, offset=0.0, starts=(2, 2))
    assert zero_few is not None
    assert zero_given is not None
    assert zero_few.lower(0.01) < zero_given.lower(0.01)


def test_one_sample_a_start_is_a_t_test_on_the_starts_means() -> None:
    """Spread one repetition a start (what the plan picks where restarts dominate), a
    side's starts' scatter holds the offset and the within-start noise together: its
    mean's variance is that scatter over the starts (Welch's t test on the log samples),
    neither that scatter undivided nor the offset added on top again."""
    base = [100.0, 98.1, 101.7, 99.2, 102.4, 97.6, 100.9, 99.8]
    cand = [99.1, 101.3, 97.9, 100.4, 98.6, 102.0, 99.5, 100.2]
    blocks = list(range(8))
    c = stats.compare(base, cand, offset=0.02, blocks=(blocks, blocks),
                      offset_evidence=(0.0004, 10))  # fmt: skip
    assert c is not None
    lb, lc = [math.log(x) for x in base], [math.log(x) for x in cand]
    welch = sps.ttest_ind(lc, lb, equal_var=False)
    assert c.se == pytest.approx(
        math.sqrt(statistics.variance(lb) / 8 + statistics.variance(lc) / 8)
    )
    assert c.d / c.se == pytest.approx(float(welch.statistic), rel=1e-9)
    assert c.df == pytest.approx(float(welch.df), rel=1e-9)


def _starts(level: float, offsets: list[float], per: int, cv: float, seed: int) -> list[float]:
    rng = random.Random(seed)
    return [level * math.exp(o + rng.gauss(0, cv)) for o in offsets for _ in range(per)]


def test_a_row_borrows_the_other_rows_restart_evidence_unless_its_starts_differ() -> None:
    """A row's own few starts barely measure the restart offset; the other rows' starts
    (a restart moves the whole server) are pooled with them, so the t test has their
    degrees of freedom too. A row whose starts scatter far beyond what the others allow
    is judged on its own starts alone, and says so."""
    per, starts = 3, 3
    blocks = [s for s in range(starts) for _ in range(per)]
    offsets = [[0.004, -0.003, 0.001], [-0.002, 0.003, -0.001], [0.002, -0.004, 0.002],
               [-0.001, 0.002, -0.003]]  # fmt: skip
    cases = ["regular-16k", "regular-32k", "coding-16k", "coding-32k"]

    def side(seed: int, wild: float = 0.0) -> Samples:
        out = {}
        for i, case in enumerate(cases):
            offs = [o * (wild / 0.004 if wild and i == 0 else 1) for o in offsets[i]]
            values = _starts(100.0, [o * (1 if seed else -1) for o in offs], per, 0.004,
                             seed + i)  # fmt: skip
            out[case] = CaseSamples(case, True, True, len(values), {"prefill_tps": values},
                                    blocks={"prefill_tps": blocks})  # fmt: skip
        return Samples("test", "servegate-bench/1", {"digest": "x"}, out)

    rules = [verdict.Rule("prefill_tps", "higher", 0.05)]
    d = verdict.evaluate(side(0), side(1), rules)
    rows = {r["case"]: r for r in d["rows"]}

    def first(s: Samples) -> Samples:
        return dataclasses.replace(s, cases={"regular-16k": s.cases["regular-16k"]})

    alone = verdict.evaluate(first(side(0)), first(side(1)), rules)["rows"][0]
    pooled = rows["regular-16k"]
    assert "pooled with the other rows'" in pooled["offset"]["from"], pooled["offset"]
    assert pooled["offset"]["df"] > alone["offset"]["df"]
    assert "pooled" not in alone["offset"]["from"]
    # the first row's starts scatter eight times the others': not pooled, and said
    d = verdict.evaluate(side(0, wild=0.032), side(1, wild=0.032), rules)
    wild = {r["case"]: r for r in d["rows"]}["regular-16k"]
    assert "not pooled: its starts scatter beyond the other rows'" in wild["offset"]["from"]
    assert wild["offset"]["df"] <= alone["offset"]["df"]
    assert wild["verdict"] != "PASS" or wild["interval"][0] >= 0.95


def test_one_sample_a_start_without_a_within_variance_is_judged_on_its_scatter() -> None:
    """With nothing measured within a start (no noise record, one sample a start on both
    sides), a stated offset cannot stand in for the samples' own scatter: the sides'
    scatter decides, as a t test on their means."""
    base = [100.0, 96.0, 104.0, 99.0, 101.5, 97.0]
    cand = [98.0, 103.0, 95.5, 101.0, 99.0, 104.5]
    blocks = list(range(6))
    c = stats.compare(base, cand, offset=0.001, blocks=(blocks, blocks))
    assert c is not None
    lb, lc = [math.log(x) for x in base], [math.log(x) for x in cand]
    assert c.se == pytest.approx(
        math.sqrt(statistics.variance(lb) / 6 + statistics.variance(lc) / 6)
    )
