"""The load gate check's judgement: a percentile or goodput at a point, bootstrapped over
the point's requests; report-only unless required. The sweep itself runs against real
vLLM in tests/bench/test_bench_vllm.py."""

from __future__ import annotations

import random
from typing import Any

import pytest

from servegate import config
from servegate.bench import stats
from servegate.config import LoadRule
from servegate.errors import ConfigError
from servegate.release import load_gate

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
          good_share: float = 1.0, span: float = 100.0) -> dict[str, Any]:  # fmt: skip
    """A compact point: lognormal latencies (TTFT around 0.5 s x ``scale``)."""
    rng = random.Random(seed)
    ttft = [0.5 * scale * rng.lognormvariate(0, 0.25) for _ in range(n)]
    return {
        "value": value, "span_s": span, "requests": n, "kept": n, "saturated": False,
        "ok": [True] * n, "good": [rng.random() < good_share for _ in range(n)],
        "ttft_s": ttft, "itl_ms": [30.0 * scale] * n,
        "tpot_ms": [31.0 * scale] * n, "e2el_s": [2.0 * scale] * n,
    }  # fmt: skip


LEVELS = stats.Levels.split(0.05, 0.01, 1, 1)


def judge(rule: LoadRule, base: Any, cand: Any, **kw: Any) -> dict[str, Any]:
    return load_gate.judge(rule, base, cand, LEVELS, kw.get("policy", "fail"),
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
    rule = LoadRule("ttft_s.p99", 2.0, tolerance=0.05, required=True)
    row = judge(rule, point(2.0, n=20, seed=1), point(2.0, n=20, seed=2))
    assert row["verdict"] == "INCONCLUSIVE", row
    assert "more requests at this point would tell" in row["why"]


def test_rows_are_reported_only_unless_required() -> None:
    rule = LoadRule("ttft_s.p50", 2.0)
    row = judge(rule, point(2.0, seed=1), point(2.0, scale=3.0, seed=2))
    assert row["verdict"] == "REPORT"
    assert row["ratio"] > 2.5  # the figures are there all the same


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
    base = {"points": [point(1.0), point(2.0)]}
    same = load_gate.decide(cfg, base, {"points": [point(1.0, 5.0, seed=4),
                                                   point(2.0, seed=5)]})  # fmt: skip
    assert same["verdict"] == "PASS", same  # the reported row's 5x does not decide
    assert [r["verdict"] for r in same["rows"]] == ["PASS", "REPORT"]
    slow = load_gate.decide(cfg, base, {"points": [point(1.0), point(2.0, 1.5, seed=5)]})
    assert slow["verdict"] == "FAIL"
    assert "ttft_s.p50 at 2" in slow["why"]


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        ("[load]\nduration = 30\n", "rates or concurrencies"),
        ("[load]\nrates = [1]\nconcurrencies = [2]\n", "rates or concurrencies"),
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
    record = {"sha": "a" * 40, "host_id": "machine-id:other",
              "gate": {"checks": [{"name": "load", "evidence": {
                  "sweep": {"fingerprint": digest, "points": [point(1.0)]}}}]}}  # fmt: skip
    base, why = load_gate.baseline(cfg, record, digest)
    assert base is None
    assert "another host" in why
    from servegate.release.record import host_id

    record["host_id"] = host_id(cfg)
    base, why = load_gate.baseline(cfg, record, digest)
    assert base is not None
    other = load_gate.fingerprint(cfg_of("[load]\nrates = [1]\nduration = 60\n"), "bench-digest")
    assert other != digest
    base, why = load_gate.baseline(cfg, record, other)
    assert base is None
    assert "swept differently" in why
