"""Repetitions spread over service starts when the box's restart offset needs it: the
gate restarts the candidate, proves it again, and the statistics count the starts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from servegate import config
from servegate.bench import results
from servegate.bench.cases import spec_from_config
from servegate.bench.document import fingerprint
from servegate.engine.openai import Endpoint
from servegate.errors import ProvenanceMismatch
from servegate.judging import noise, stats
from servegate.pipeline.stages import QuietReporter
from servegate.release import bench_gate, bringup
from servegate.release.promote import promote
from tests.bench.test_stream_faults import Engine, engine  # noqa: F401  (the fixture)
from tests.conftest import Host, Stack

CFG = """
[stack]
remote = "x"
[host]
root = "{root}"
[service]
command = ["x"]
port = 5
model = "m"
[bench]
profiles = ["regular"]
tiers = ["1k"]
repetitions = 3
max_repetitions = 8
max_starts = {max_starts}
max_tokens = 40
warmup = false
reference = false
[gate]
checks = ["smoke", "bench"]
no_baseline = "first-release"
[[gate.rules]]
metric = "generation_tps"
tolerance = 0.05
"""

CV, OFFSET = 0.003, 0.008  # a quiet box whose service starts differ by ~1 %


def _setup(tmp_path: Path, max_starts: int) -> config.Config:
    cfg = config.parse(CFG.format(root=tmp_path, max_starts=max_starts), environ={})
    fp = fingerprint(spec_from_config(cfg.bench, Endpoint(""), "m"))
    found = {"regular-1k:generation_tps": noise.Noise(CV, OFFSET, 3, 15)}
    noise.save(tmp_path, found, fp, "a" * 40, "box", [])
    return cfg


def test_the_plan_spreads_only_what_more_repetitions_cannot_average_away() -> None:
    assert stats.plan_starts(0.01, 0.0, 0.05, 0.05, 0.01, 1, 3, 8, 3) == (
        stats.plan(0.01, 0.0, 0.05, 0.05, 0.01, 1, 3, 8),
        1,
    )
    # a restart offset one start cannot resolve: more starts can
    assert stats.plan(CV, OFFSET, 0.05, 0.05, 0.01, 1, 3, 8) is None
    n, k = stats.plan_starts(CV, OFFSET, 0.05, 0.05, 0.01, 1, 3, 8, 3) or (0, 0)
    assert k > 1
    assert k <= n <= 8
    assert stats.plan_starts(CV, 0.05, 0.05, 0.05, 0.01, 1, 3, 8, 3) is None  # too much
    assert bench_gate.spread(5, 2) == [3, 2]
    assert bench_gate.spread(2, 3) == [1, 1]


def test_the_starts_widen_the_error_only_by_their_share() -> None:
    base, cand = [100.0, 101.0, 99.0], [100.5, 99.5, 100.0]
    one = stats.compare(base, cand, offset=0.02)
    spread_ = stats.compare(base, cand, offset=0.02, starts=(3, 3))
    assert one is not None
    assert spread_ is not None
    assert spread_.se < one.se
    within = stats.compare(base, cand)
    assert within is not None
    assert spread_.se**2 == pytest.approx(within.se**2 + 0.02**2 * (2 / 3))


def _run(cfg: config.Config, url: str, restart: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    evidence = bench_gate.run(
        cfg, Endpoint(url), "m", "b" * 40, None, None, QuietReporter(), {},
        first_release=True, restart=restart,
    )  # fmt: skip
    return evidence, json.loads(Path(evidence["result_file"]).read_text())


def test_the_gate_restarts_between_starts_and_records_them(
    engine: tuple[str, type[Engine]],  # noqa: F811
    tmp_path: Path,
) -> None:
    url, _ = engine
    cfg = _setup(tmp_path, max_starts=3)
    (row,) = bench_gate.plan(cfg, noise.load(tmp_path, _digest(cfg))[0])
    assert row["starts"] > 1
    calls: list[int] = []

    def restart() -> dict[str, Any]:
        calls.append(len(calls) + 1)
        return {"service_pid": 1000 + len(calls), "provenance": "ok"}

    evidence, doc = _run(cfg, url, restart)
    assert evidence["starts"] == row["starts"]
    assert len(calls) == row["starts"] - 1
    assert [r["service_pid"] for r in evidence["restarts"]] == [1001 + i for i in range(len(calls))]
    groups = doc["cases"][0]["groups"]
    first = [g["start"] for g in groups][: row["repetitions"]]
    expected = [i for i, n in enumerate(bench_gate.spread(row["repetitions"], row["starts"]))
                for _ in range(n)]  # fmt: skip
    assert first == expected
    assert [s["start"] for s in doc["starts"]] == list(range(1, row["starts"]))
    # the samples say how many starts they came from: the next gate compares with that
    assert results.from_result(doc).cases["regular-1k"].starts == row["starts"]
    kept = results.from_record(evidence["samples"], "x").cases["regular-1k"]
    assert kept.starts == row["starts"]


def test_without_a_way_to_restart_one_start_is_measured_and_said(
    engine: tuple[str, type[Engine]],  # noqa: F811
    tmp_path: Path,
) -> None:
    url, _ = engine
    evidence, doc = _run(_setup(tmp_path, max_starts=3), url, None)
    assert evidence["starts"] == 1
    assert {g["start"] for g in doc["cases"][0]["groups"]} == {0}
    assert any("cannot restart the service" in w for w in evidence["weaker_evidence"])


def test_max_starts_1_never_restarts(
    engine: tuple[str, type[Engine]],  # noqa: F811
    tmp_path: Path,
) -> None:
    url, _ = engine

    def restart() -> dict[str, Any]:
        raise AssertionError("max_starts = 1 must never restart")

    evidence, _ = _run(_setup(tmp_path, max_starts=1), url, restart)
    assert evidence["starts"] == 1
    assert evidence["noise"]["plan"][0]["starts"] is None  # not resolvable in one start


def test_a_restart_that_fails_its_proof_stops_the_gate_and_keeps_the_result(
    engine: tuple[str, type[Engine]],  # noqa: F811
    tmp_path: Path,
) -> None:
    url, _ = engine

    def restart() -> dict[str, Any]:
        raise ProvenanceMismatch("extension libtiny.so mapped from outside the release")

    with pytest.raises(ProvenanceMismatch):
        _run(_setup(tmp_path, max_starts=3), url, restart)
    (kept,) = (tmp_path / "bench").glob("*.json")
    doc = json.loads(kept.read_text())
    assert doc["status"] == "failed"
    assert "the restart between service starts failed" in doc["error"]


def _digest(cfg: config.Config) -> str:
    return str(fingerprint(spec_from_config(cfg.bench, Endpoint(""), "m"))["digest"])


def test_a_release_clean_only_at_its_first_start_is_caught_on_the_restart(
    host: Host, stack: Stack
) -> None:
    """The gate's restart is proven like the first start: a release that maps code from
    outside itself only when started again cannot ride through on its first proof."""
    good = stack.commit("ok")
    assert promote(host.context(), good).verdict == "released"
    ctx = host.context()
    current = ctx.state.current
    assert current is not None
    release_dir = Path(current.release_dir)
    pid = ctx.manager.main_pid()
    seen = bringup.restarter(ctx, good, release_dir, current.artifacts)()
    assert seen["provenance"] == "ok"
    assert seen["service_pid"] not in (None, pid)

    sly = stack.commit("foreign-on-restart")
    outcome = promote(host.context(), sly)
    assert outcome.verdict == "released", outcome.reason  # clean at its first start
    ctx = host.context()
    current = ctx.state.current
    assert current is not None
    assert current.sha == sly
    with pytest.raises(ProvenanceMismatch, match="mapped from outside the release"):
        bringup.restarter(ctx, sly, Path(current.release_dir), current.artifacts)()
