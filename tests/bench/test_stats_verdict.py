"""The gate's statistics and decisions on known samples."""

from __future__ import annotations

import pytest

from servegate.bench import stats, verdict
from servegate.bench.results import CaseSamples, Samples


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


def test_interval_is_seeded_and_brackets_the_point() -> None:
    a = stats.median_ratio_interval([100, 101, 99], [90, 91, 89])
    assert a == stats.median_ratio_interval([100, 101, 99], [90, 91, 89])
    point, lo, hi = a
    assert lo <= point <= hi
    assert point == pytest.approx(0.9)


def test_ten_percent_slower_decode_fails_and_identical_passes() -> None:
    base = samples({"generation_tps": [63.0, 64.1, 62.7]})
    slow = samples({"generation_tps": [56.9, 57.5, 56.2]})
    same = samples({"generation_tps": [63.4, 62.5, 63.9]})
    rules = [verdict.Rule("generation_tps", "higher", 0.05)]
    assert verdict.evaluate(base, slow, rules)["verdict"] == "FAIL"
    assert verdict.evaluate(base, same, rules)["verdict"] == "PASS"


def test_straddling_interval_is_inconclusive_until_the_cap_then_policy_decides() -> None:
    base = samples({"generation_tps": [60.0, 66.0, 63.0]})
    cand = samples({"generation_tps": [58.0, 64.0, 61.5]})
    rules = [verdict.Rule("generation_tps", "higher", 0.05)]
    open_ = verdict.evaluate(base, cand, rules, final=False)
    assert open_["verdict"] == "INCONCLUSIVE"
    assert "straddles" in open_["rows"][0]["why"]
    assert (
        verdict.evaluate(base, cand, rules, verdict.Settings(inconclusive="median"))["verdict"]
        == "PASS"
    )
    assert (
        verdict.evaluate(base, cand, rules, verdict.Settings(inconclusive="fail"))["verdict"]
        == "FAIL"
    )


def test_lower_is_better_metrics_turn_the_ratio() -> None:
    base = samples({"ttft_s": [8.5, 8.6, 8.4]})
    slower = samples({"ttft_s": [9.9, 10.0, 10.1]})
    rules = [verdict.Rule("ttft_s", "lower", 0.05)]
    assert verdict.evaluate(base, slower, rules)["verdict"] == "FAIL"
    assert verdict.evaluate(base, base, rules)["verdict"] == "PASS"


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


def test_floors_and_missing_baselines() -> None:
    cand = samples({"generation_tps": [25.7, 33.8, 30.0]})
    floors = list(verdict.floors("v620-tp4"))
    d = verdict.evaluate(None, cand, floors)
    assert d["verdict"] == "FAIL"
    assert "below the floor 56.00" in d["why"]
    ok = samples({"generation_tps": [63.0, 69.7, 68.5], "prefill_tps": [1957.8, 1982.8, 1944.0]})
    d = verdict.evaluate(None, ok, floors)
    assert d["verdict"] == "PASS", d
    assert "no comparable baseline" in d["rows"][0]["why"]
    strict = verdict.evaluate(
        None, ok, [verdict.Rule("generation_tps")], verdict.Settings(no_baseline="fail")
    )
    assert strict["verdict"] == "FAIL"


def test_unknown_floor_set_is_a_config_error() -> None:
    from servegate.errors import ConfigError

    with pytest.raises(ConfigError, match="not a shipped floor set") as err:
        verdict.floors("v999")
    assert "v620-tp4" in err.value.hint
