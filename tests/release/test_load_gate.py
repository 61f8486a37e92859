"""The load gate check's judgement: a percentile or goodput at a point, bootstrapped over
the point's requests; report-only unless required. The sweep itself runs against real
vLLM in tests/bench/test_bench_vllm.py."""

from __future__ import annotations

import random
from typing import Any

import pytest

from servegate import config, documents
from servegate.bench import loadspec
from servegate.config import LoadRule
from servegate.errors import ConfigError
from servegate.judging import stats
from servegate.release import load_gate
from tests.conftest import release_record

BASE_TOML = """
[stack]
remote = "x"
[host]
root = "/x"
[service]
port = 1
command = ["x"]
[gate]
checks = ["smoke", "load"]
"""


def cfg_of(load_toml: str) -> config.Config:
    return config.parse(BASE_TOML + load_toml, environ={})


def point(value: float, scale: float = 1.0, n: int = 400, seed: int = 1,
          good_share: float = 1.0, span: float = 100.0, failed: int = 0) -> dict[str, Any]:  # fmt: skip
    """A compact point: lognormal latencies (TTFT around 0.5 s x ``scale``), ``n``
    requests ending evenly inside a ``span``-second window, the first ``failed`` failed."""
    rng = random.Random(seed)
    ok = [i >= failed for i in range(n)]
    done = n - failed
    ttft = [0.5 * scale * rng.lognormvariate(0, 0.25) for _ in range(done)]
    return {
        "value": value, "window_s": span, "requests": n, "failed": failed, "kept": n,
        "saturated": False, "ok": ok,
        "good": [f and rng.random() < good_share for f in ok],
        "ended": [span * (i + 0.5) / n for i in range(n)],
        "ttft_s": ttft, "request_itl_ms": [30.0 * scale] * done,
        "tpot_ms": [31.0 * scale] * done, "e2el_s": [2.0 * scale] * done,
    }  # fmt: skip


LEVELS = stats.Levels.split(0.05, 0.01, 1, 1)


def typed(p: dict[str, Any] | None) -> load_gate.Point | None:
    """A point as the gate reads it back from a record: through the strict reader."""
    return None if p is None else documents.read(load_gate.Point, p, "point")


def sweep(*points: dict[str, Any], clocked: bool = True) -> load_gate.Sweep:
    """``clocked``: the engine's TTFT clock checked the first texts (vLLM)."""
    return load_gate.Sweep("", [documents.read(load_gate.Point, p) for p in points], clocked)


def judge(rule: LoadRule, base: Any, cand: Any, **kw: Any) -> dict[str, Any]:
    return load_gate.judge(rule, typed(base), typed(cand), LEVELS, kw.get("policy", "fail"),
                           kw.get("first", False))  # fmt: skip


def test_the_same_server_passes_a_median_rule_and_a_slower_one_fails() -> None:
    rule = LoadRule("ttft_s.p50", 2.0, tolerance=0.10, required=True)
    same = judge(rule, point(2.0, seed=1), point(2.0, seed=2))
    assert same["verdict"] == "PASS", same
    assert same["interval"][0] <= same["ratio"] <= same["interval"][1]
    slower = judge(rule, point(2.0, seed=1), point(2.0, scale=1.4, seed=2))
    assert slower["verdict"] == "FAIL", slower
    assert slower["ratio"] == pytest.approx(1.4, rel=0.08)  # the figure's own ratio
    assert "slower beyond doubt" in slower["why"]


def test_a_p99_from_few_requests_is_not_a_verdict() -> None:
    rule = LoadRule("ttft_s.p50", 2.0, tolerance=0.05, required=True)
    row = judge(rule, point(2.0, n=20, seed=1), point(2.0, n=20, seed=2))
    assert row["verdict"] == "INCONCLUSIVE", row
    assert "more requests at this point would tell" in row["why"]


def test_a_percentile_from_fewer_requests_than_can_show_its_tail_is_undecided() -> None:
    """A candidate whose 1 % of requests are 10x slower (its true p99 2.8x the baseline's):
    among 50 requests, more often than not none of the slow ones is drawn, and a
    bootstrap of what was drawn cannot see them (it passed 1 in 10). A pXX row decides
    only from as many requests as make missing the whole tail above it as unlikely as
    the miss level (p99: 459 at 1 %); with fewer it is INCONCLUSIVE."""
    assert load_gate.needed("p99", LEVELS) == 459
    assert load_gate.needed("p90", LEVELS) == 44
    assert load_gate.needed("p50", LEVELS) == 7
    rule = LoadRule("ttft_s.p99", 2.0, tolerance=0.10, required=True)
    passed = 0
    for seed in range(20):
        cand = point(2.0, n=50, seed=100 + seed)
        rng = random.Random(seed)
        cand["ttft_s"] = [v * (10 if rng.random() < 0.01 else 1) for v in cand["ttft_s"]]
        row = judge(rule, point(2.0, n=50, seed=seed), cand)
        passed += row["verdict"] == "PASS"
        assert row["verdict"] == "INCONCLUSIVE", row
        assert "a p99 needs 459 requests" in row["why"]
    assert passed == 0
    tail = point(2.0, n=500, seed=2)
    tail["ttft_s"] = [v * (10 if i % 50 == 7 else 1) for i, v in enumerate(tail["ttft_s"])]
    assert judge(rule, point(2.0, n=500, seed=1), tail)["verdict"] == "FAIL"


def test_a_required_percentile_row_the_sweep_cannot_feed_is_refused_at_load() -> None:
    with pytest.raises(ConfigError) as err:
        load_gate.check_config(
            cfg_of(
                "[load]\nrates = [1, 2]\nduration = 60\n[[load.rules]]\n"
                'metric = "ttft_s.p99"\npoint = 2\nrequired = true\n'
            )
        )
    assert "needs 459 requests" in str(err.value)
    assert "gives about 120" in str(err.value)
    assert "[load] duration = 259" in err.value.hint  # 517 expected: under 459 1 time in 100
    # arrivals are Poisson: 50 expected for a p90's 44 is too few too often
    with pytest.raises(ConfigError, match="needs 44 requests"):
        load_gate.check_config(
            cfg_of(
                "[load]\nrates = [5]\nduration = 10\n[[load.rules]]\n"
                'metric = "ttft_s.p90"\npoint = 5\nrequired = true\n'
            )
        )
    # a miss level so small that a p99 needs more requests than a record keeps
    tiny_miss = config.parse(
        BASE_TOML.replace("[gate]\n", "[gate]\nmiss = 1e-10\n")
        + "[load]\nrates = [100]\nduration = 600\n[[load.rules]]\n"
        'metric = "ttft_s.p99"\npoint = 100\nrequired = true\n',
        environ={},
    )
    with pytest.raises(ConfigError, match="a record keeps 2000"):
        load_gate.check_config(tiny_miss)


def test_failed_requests_count_as_the_slowest_not_as_missing() -> None:
    """The baseline lost 3 % of its requests to instant rejections; the candidate is 30 %
    slower and its slowest 3 % time out. Dropping failed requests, its p99 looked 0.38x
    the baseline's and passed; counted as slower than any answer, both p99s fall on
    failures (no verdict), and the p90 shows the loss."""
    base, cand = point(4.0, n=500, seed=1, failed=15), point(4.0, n=500, seed=2, failed=15)
    cand["ttft_s"] = sorted(v * 1.3 for v in cand["ttft_s"])
    p99 = judge(LoadRule("ttft_s.p99", 4.0, tolerance=0.10, required=True), base, cand)
    assert p99["verdict"] == "INCONCLUSIVE", p99
    assert "falls on failed requests on both sides" in p99["why"]
    p90 = judge(LoadRule("ttft_s.p90", 4.0, tolerance=0.10, required=True), base, cand)
    assert p90["verdict"] == "FAIL", p90
    # a candidate whose p99 is a failure, against a baseline whose is not
    # (10 of 500 failed against 4 is not more beyond doubt: the p99 decides)
    row = judge(LoadRule("ttft_s.p99", 4.0, tolerance=0.10, required=True),
                point(4.0, n=500, failed=4), point(4.0, n=500, seed=2, failed=10))  # fmt: skip
    assert row["verdict"] == "FAIL", row
    assert row["ratio"] is row["candidate"] is None  # JSON has no infinity
    assert row["baseline"] > 0
    assert "the candidate's p99 is a failed request: slower beyond doubt" in row["why"]
    # the baseline's p99 fell on its transient failures: a candidate 5x slower on every
    # request has nothing to be compared with, and does not pass
    slower = point(4.0, n=600, scale=5.0, seed=2)
    row = judge(LoadRule("ttft_s.p99", 4.0, tolerance=0.10, required=True),
                point(4.0, n=600, failed=18), slower)  # fmt: skip
    assert row["verdict"] == "INCONCLUSIVE", row
    assert "the baseline's p99 falls on failed requests" in row["why"]


def test_one_transient_error_is_not_a_regression() -> None:
    """One request in fifty answered with an error, on an otherwise identical server:
    the failed share is not higher beyond doubt, and a median is not moved by it."""
    rule = LoadRule("ttft_s.p50", 4.0, tolerance=0.10, required=True)
    fails = sum(
        judge(rule, point(4.0, n=50, seed=s), point(4.0, n=50, seed=s + 50, failed=1))["verdict"]
        == "FAIL"
        for s in range(20)
    )  # fmt: skip
    assert fails <= 2
    base, one, eight = (
        documents.read(load_gate.Point, point(4.0, n=50, failed=k)) for k in (0, 1, 8)
    )
    assert not load_gate.more_failed(base, one, 0.05)
    assert load_gate.more_failed(base, eight, 0.05)


def test_rows_are_reported_only_unless_required() -> None:
    rule = LoadRule("ttft_s.p50", 2.0)
    row = judge(rule, point(2.0, seed=1), point(2.0, scale=3.0, seed=2))
    assert row["verdict"] == "REPORT"
    assert row["ratio"] > 2.5  # the figures are there all the same


def test_a_load_check_that_no_row_decides_is_refused_and_never_passes() -> None:
    """Rows only reported: the check would PASS a candidate five times slower. `config
    check` (and a promote, before anything is deployed) refuses it, saying how to make a
    row decide; a check that reached a verdict anyway FAILs, as the bench check does."""
    from servegate.release.gate import build_checks

    reported = cfg_of(
        '[load]\nrates = [1, 2]\nduration = 30\n[[load.rules]]\nmetric = "ttft_s.p50"\npoint = 2\n'
    )
    for refuse in (load_gate.check_config, build_checks):
        with pytest.raises(ConfigError, match="no required") as err:
            refuse(reported)
        assert "required = true" in err.value.hint
        assert "servegate bench load" in err.value.hint
    with pytest.raises(ConfigError, match="no required"):
        build_checks(cfg_of("[load]\nrates = [1, 2]\nduration = 30\n"))  # no rows at all
    base = sweep(point(1.0), point(2.0))
    slow = load_gate.decide(reported, base, sweep(point(1.0, 5.0), point(2.0, 5.0)))
    assert slow["verdict"] == "FAIL"
    assert slow["why"] == "no required row: nothing decides"
    assert [r["verdict"] for r in slow["rows"]] == ["REPORT"]


def test_goodput_is_judged_on_the_share_of_requests_that_met_the_slos() -> None:
    rule = LoadRule("goodput_rps", 2.0, tolerance=0.10, required=True)
    row = judge(rule, point(2.0, good_share=0.95), point(2.0, good_share=0.60, seed=3))
    assert row["verdict"] == "FAIL", row
    assert row["baseline"] == pytest.approx(4.0 * 0.95, rel=0.1)  # 400 requests in 100 s


def test_missing_points_and_baselines_never_pass_a_required_row() -> None:
    rule = LoadRule("ttft_s.p50", 4.0, required=True)
    saturated_early = judge(rule, point(4.0), None)
    assert saturated_early["verdict"] == "FAIL"
    assert "saturated before 4" in saturated_early["why"]
    assert judge(rule, None, point(4.0))["verdict"] == "FAIL"
    first = judge(rule, None, point(4.0), policy="first-release", first=True)
    assert first["verdict"] == "PASS"
    assert judge(rule, None, None)["verdict"] == "INCONCLUSIVE"


def test_the_check_verdict_is_decided_by_required_rows_only() -> None:
    cfg = cfg_of(
        "[load]\nrates = [1, 2]\nduration = 30\n"
        '[[load.rules]]\nmetric = "ttft_s.p50"\npoint = 2\nrequired = true\ntolerance = 0.1\n'
        '[[load.rules]]\nmetric = "ttft_s.p99"\npoint = 1\n'
    )
    base = sweep(point(1.0), point(2.0))
    same = load_gate.decide(cfg, base, sweep(point(1.0, 5.0, seed=4), point(2.0, seed=5)))
    assert same["verdict"] == "PASS", same  # the reported row's 5x does not decide
    assert [r["verdict"] for r in same["rows"]] == ["PASS", "REPORT"]
    slow = load_gate.decide(cfg, base, sweep(point(1.0), point(2.0, 1.5, seed=5)))
    assert slow["verdict"] == "FAIL"
    assert "ttft_s.p50 at 2" in slow["why"]
    # an engine without a TTFT clock (transformers serve): a first text under load
    # cannot be shown to be the model's, so a TTFT row cannot pass, however fast
    fast = load_gate.decide(cfg, base, sweep(point(1.0), point(2.0, 0.1, seed=5), clocked=False))
    assert fast["verdict"] == "INCONCLUSIVE", fast
    assert "the engine keeps no TTFT clock" in fast["why"]


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        ("[load]\nduration = 30\n", "rates or concurrencies"),
        ("[load]\nrates = [1]\nconcurrencies = [2]\n", "both rates and concurrencies"),
        ('[load]\nrates = [1]\n[[load.rules]]\nmetric = "ttft"\npoint = 1\n', "not a load figure"),
        ('[load]\nrates = [1]\n[[load.rules]]\nmetric = "ttft_s.p99"\npoint = 3\n',
         "not one of the sweep's points"),
        ('[load]\nrates = [1]\n[[load.rules]]\nmetric = "goodput_rps"\npoint = 1\n',
         "sets no SLO"),
        ("[load]\nrates = [2, 1]\n", "must rise"),
        ('[load]\nrates = [1]\n[[load.rules]]\nmetric = "e2el_s.p50"\npoint = 1\ntolerance = 1.5\n',
         "between 0 and 1"),
    ],
)  # fmt: skip
def test_a_load_check_that_cannot_run_is_refused_at_load(toml: str, message: str) -> None:
    cfg = cfg_of(toml)
    with pytest.raises(ConfigError, match=message):
        load_gate.check_config(cfg)
    from servegate.release.gate import build_checks

    with pytest.raises(ConfigError, match=message):
        build_checks(cfg)  # what promote, init and config check call first


def test_a_baseline_from_another_host_or_another_sweep_is_none() -> None:
    cfg = cfg_of("[load]\nrates = [1]\n")
    digest = load_gate.fingerprint(cfg, "bench-digest")
    record = release_record(
        sha="a" * 40, host_id="machine-id:other",
        gate={"checks": [{"name": "load", "verdict": "PASS", "evidence": {
            "sweep": {"fingerprint": digest, "points": [point(1.0, span=30.0)]}}}]})  # fmt: skip
    base, why = load_gate.baseline(cfg, record, digest)
    assert base is None
    assert "another host" in why
    from servegate.release.record import host_id

    record.host_id = host_id(cfg)
    base, why = load_gate.baseline(cfg, record, digest)
    assert base is not None
    other = load_gate.fingerprint(cfg_of("[load]\nrates = [1]\nduration = 60\n"), "bench-digest")
    assert other != digest
    base, why = load_gate.baseline(cfg, record, other)
    assert base is None
    assert "swept differently" in why


def test_identical_rates_fail_no_more_often_than_the_false_alarm_level() -> None:
    """Throughput of the same server twice, open-loop Poisson arrivals of different
    seeds: the count's own spread is the evidence, so an unchanged release FAILs a
    required rate row about as often as gate.false_alarm allows (5 %), not more."""

    rule = LoadRule("request_throughput", 2.0, tolerance=0.10, required=True)
    fails = 0
    for seed in range(200):
        sides = []
        for k in (0, 1):
            n = len(loadspec.arrivals(2.0, 60.0, 1.0, random.Random(seed * 2 + k)))
            sides.append(point(2.0, n=n, span=60.0, seed=seed))
        fails += judge(rule, sides[0], sides[1])["verdict"] == "FAIL"
    assert fails <= 16, fails  # 5 % of 200 is 10; the margin is binomial noise


def test_failed_requests_at_the_point_fail_a_required_row() -> None:
    """A candidate answering a third of the point's requests with errors does not pass on
    the latencies of the two thirds that completed."""
    for metric in ("ttft_s.p50", "e2el_s.p50", "request_itl_ms.p99"):
        rule = LoadRule(metric, 4.0, tolerance=0.10, required=True)
        row = judge(rule, point(4.0), point(4.0, seed=2, failed=130))
        assert row["verdict"] == "FAIL", row
        assert "130 of 400 request(s) failed at 4" in row["why"]


def test_a_damaged_recorded_sweep_is_no_baseline() -> None:
    cfg = cfg_of("[load]\nrates = [1]\n")
    digest = load_gate.fingerprint(cfg, "d")
    from servegate.release.record import host_id

    def record(p: Any) -> Any:
        return release_record(sha="a" * 40, host_id=host_id(cfg),
                              gate={"checks": [{"name": "load", "verdict": "PASS", "evidence": {
                                  "sweep": {"fingerprint": digest, "points": [p]}}}]})  # fmt: skip

    good = point(1.0, n=50, span=30.0, failed=5)  # [load] duration: 30 s
    assert load_gate.baseline(cfg, record(good), digest)[0] is not None
    keep = load_gate.KEEP
    sampled = {**point(1.0, n=keep, span=30.0, failed=250), "requests": keep + 500, "failed": 310}
    assert load_gate.baseline(cfg, record(sampled), digest)[0] is not None  # a random KEEP
    hidden = {**point(1.0, n=keep, span=30.0), "requests": keep + 1000, "failed": 1000}
    assert "not a random sample" in load_gate.baseline(cfg, record(hidden), digest)[1]
    damaged = [
        # counts the kept requests contradict: they would move the failed share
        {**good, "failed": 50},
        {**good, "failed": 0},
        {**good, "requests": 80, "failed": 2},  # 5 of the kept failed
        {**good, "requests": 80, "failed": 79},  # 45 of the kept completed
        {**good, "requests": 80, "failed": 30},  # 50 kept of 80: a point keeps all below KEEP
        {**good, "requests": 600, "failed": 200},  # its failures left out of what it kept
        {**good, "good": [True] * 50},  # the 5 that failed counted good
        {**good, "window_s": 1000.0},  # would shrink the baseline's rates
        {**good, "kept": 4000},  # would shrink the baseline's rate tenfold
        {**good, "ok": "yes"},
        {**good, "requests": "50"},
        {**good, "ttft_s": "0.5"},
        {**good, "ttft_s": [float("nan")]},
        {**good, "window_s": -1},
        {**good, "good": [True]},
        {**good, "burst": [True]},  # not one flag a kept request
        {**good, "burst": [True] * 50},  # the 5 that failed counted as bursts
        {**good, "burst": ["no"] * 50},
        {**good, "short": [True] * 50},  # the 5 that failed counted short
        {**good, "ttft_s": good["ttft_s"] * 3},  # more values than completed requests
        {**good, "value": True},
        {**good, "value": float("inf")},
        {k: v for k, v in good.items() if k != "ended"},
        "a point",
    ]
    for p in damaged:
        base, why = load_gate.baseline(cfg, record(p), digest)
        assert base is None, p
        assert "recorded sweep is damaged" in why
    # two points at one load: which one is the baseline? (a slow copy would shield the
    # candidate) neither
    twice = release_record(sha="a" * 40, host_id=host_id(cfg),
                           gate={"checks": [{"name": "load", "verdict": "PASS", "evidence": {
                               "sweep": {"fingerprint": digest, "points": [good, good]}}}]})  # fmt: skip
    assert "two points at one load" in load_gate.baseline(cfg, twice, digest)[1]


def test_a_sweep_of_many_requests_is_judged_not_crashed() -> None:
    """The failed-share test counts in whole numbers: 600 requests a side (10 a second for
    a minute) overflowed a float in the binomial coefficients, and the check crashed."""
    rule = LoadRule("ttft_s.p50", 4.0, tolerance=0.10, required=True)
    row = judge(rule, point(4.0, n=600), point(4.0, n=600, seed=2, failed=3))
    assert row["verdict"] in ("PASS", "INCONCLUSIVE"), row
    assert judge(rule, point(4.0, n=600), point(4.0, n=600, seed=2, failed=200))["verdict"] == (
        "FAIL"
    )


def test_answers_that_came_in_a_burst_leave_decode_rules_undecided() -> None:
    """An answer held back between the engine and the client and delivered at once has
    no ITL or TPOT of the client's clock (the single-stream bench's rule). A frontend
    that held back its slowest answers would leave a percentile over the others that
    hides them, and a goodput whose SLOs read ITL would count them as missed on one side
    only: such rows are INCONCLUSIVE (a required one rolls back), never PASS. Rows the
    client timed whole (TTFT, E2E) are judged as before."""
    base = point(4.0)
    cand = point(4.0, seed=2)
    cand["burst"] = [i % 50 == 0 for i in range(400)]  # 8 of 400, the slowest hidden
    for metric in ("request_itl_ms.p90", "tpot_ms.p50"):
        row = judge(LoadRule(metric, 4.0, tolerance=0.10, required=True), base, cand)
        assert row["verdict"] == "INCONCLUSIVE", row
        assert "8 of the candidate's 400 request(s) at 4 arrived in a burst" in row["why"]
        reported = judge(LoadRule(metric, 4.0, tolerance=0.10), base, cand)
        assert reported["verdict"] == "REPORT"
        held_base = judge(LoadRule(metric, 4.0, tolerance=0.10, required=True),
                          {**base, "burst": [True] + [False] * 399}, point(4.0, seed=2))  # fmt: skip
        assert held_base["verdict"] == "INCONCLUSIVE", held_base
        assert "of the baseline's" in held_base["why"]
    goodput = LoadRule("goodput_rps", 4.0, tolerance=0.10, required=True)
    reads = load_gate.Reads(slo=loadspec.parse_goodput("ttft:2s,itl:80ms"))
    row = load_gate.judge(goodput, typed(base), typed(cand), LEVELS, "fail", False, reads)
    assert row["verdict"] == "INCONCLUSIVE", row
    reads = load_gate.Reads(slo=loadspec.parse_goodput("ttft:2s,e2el:5s"))
    timed_whole = load_gate.judge(goodput, typed(base), typed(cand), LEVELS, "fail", False, reads)
    assert "burst" not in timed_whole["why"]  # SLOs of TTFT and E2E only: judged on counts
    ttft = judge(LoadRule("ttft_s.p50", 4.0, tolerance=0.10, required=True), base, cand)
    assert ttft["verdict"] == "PASS", ttft


def test_shorter_answers_leave_end_to_end_rows_undecided() -> None:
    """An engine that takes no ``ignore_eos`` lets a frontend answer in fewer tokens
    (finish reason ``stop``): its E2E is over less work. A candidate with more short
    answers than the baseline beyond doubt leaves E2E rows, and goodput whose SLOs read
    E2E, undecided; a stray short answer does not."""
    base = point(4.0)
    cand = point(4.0, scale=1.5, seed=2)
    cand["e2el_s"] = [v / 3 for v in cand["e2el_s"]]  # 2x slower a token, a quarter the tokens
    cand["short"] = [True] * 400
    row = judge(LoadRule("e2el_s.p50", 4.0, tolerance=0.10, required=True), base, cand)
    assert row["verdict"] == "INCONCLUSIVE", row
    assert "400 of the candidate's 400 answers at 4 were shorter than max_tokens" in row["why"]
    reads = load_gate.Reads(slo=loadspec.parse_goodput("e2el:5s"))
    goodput = LoadRule("goodput_rps", 4.0, tolerance=0.10, required=True)
    assert load_gate.judge(goodput, typed(base), typed(cand), LEVELS, "fail", False, reads)[
        "verdict"
    ] == ("INCONCLUSIVE")
    for metric in ("request_throughput", "goodput_rps"):  # shorter answers finish sooner
        row = judge(LoadRule(metric, 4.0, tolerance=0.10, required=True), base, cand)
        assert row["verdict"] == "INCONCLUSIVE", row
        assert "were shorter than max_tokens" in row["why"]
    stray = point(4.0, seed=2)
    stray["short"] = [i == 3 for i in range(400)]
    row = judge(LoadRule("e2el_s.p50", 4.0, tolerance=0.10, required=True), base, stray)
    assert row["verdict"] == "PASS", row


def test_a_first_release_whose_point_failed_its_requests_does_not_pass() -> None:
    """Nothing to compare with is a pass only for a point that served: 10 of 10 failed
    (or a figure that falls on failed requests) FAILs, whatever no_baseline says."""
    rule = LoadRule("ttft_s.p50", 4.0, tolerance=0.10, required=True)
    dead = judge(rule, None, point(4.0, n=10, failed=10), policy="first-release", first=True)
    assert dead["verdict"] == "FAIL", dead
    assert "10 of 10 request(s) failed" in dead["why"]
    served = judge(rule, None, point(4.0, failed=1), policy="first-release", first=True)
    assert served["verdict"] == "PASS", served
