"""The trend of a host's releases from real release notes: `release history` and
`servegate report` show the newest release against the best of the window and the
change points, from records written to git notes in a tmp repository."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from servegate import hostpaths
from servegate.bench.results import CaseSamples, Samples
from servegate.cli import main, release_main
from servegate.judging import noise
from servegate.release import record
from servegate.release.deploy import make_deployer
from servegate.release.state import Entry, HostState
from tests.conftest import Host, Stack, make_host

PATTERN = (0.98, 1.0, 1.02, 0.99, 1.01)
#: releases 0-3 at one level, 4-7 about 8 % lower: a change point at release 4, and the
#: newest 8 % below the best of its window (release 3)
LEVELS = (100, 101, 99, 100.5, 92, 93, 91.5, 92.5)


def bench_samples(level: float, digest: str = "abc") -> dict[str, object]:
    case = CaseSamples("regular-16k", True, True, 5, {
        "generation_tps": [level * p for p in PATTERN],
        "prefill_tps": [40 * level * p for p in PATTERN],
    })  # fmt: skip
    return Samples("x", "servegate-bench/1", {"digest": digest}, {"regular-16k": case}).as_dict()


def release(host: Host, sha: str, day: int, level: float, verdict: str = "released") -> Entry:
    """One promote's record, in the release note of ``sha`` (and the host's own copy)."""
    rec = record.ReleaseRecord.new(host.cfg, sha, None, verdict)
    rec.at = f"2026-01-{day:02d}T00:00:00.000+00:00"
    rec.gate = record.GateRecord(
        "PASS", [record.CheckRecord("bench", "PASS", evidence={"samples": bench_samples(level)})]
    )
    record.publish(host.cfg, make_deployer(host.cfg).repo, rec, None)
    return Entry(sha=sha, release_dir="", verdict=verdict, at=rec.at)


@pytest.fixture
def released(tmp_path: Path, stack: Stack) -> tuple[Host, list[str]]:
    """Eight releases and one rolled-back attempt (a 30 % loss that never served)."""
    host = make_host(tmp_path, stack)
    shas = [stack.commit(message=f"release {i}") for i in range(len(LEVELS))]
    bad = stack.commit("bad", "rolled back")
    make_deployer(host.cfg).repo.fetch()
    entries = [
        release(host, sha, i + 1, lvl)
        for i, (sha, lvl) in enumerate(zip(shas, LEVELS, strict=True))
    ]
    entries.insert(6, release(host, bad, 7, 70, "rolled_back"))
    state = HostState(hostpaths.of(host.cfg).state, current=entries[-1], history=entries)
    state.save()
    return host, shas


def history_json(host: Host, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    assert release_main(["history", "--config", str(host.path), "--json"]) == 0
    return dict(json.loads(capsys.readouterr().out)["result"])


def test_release_history_shows_the_trend_and_the_change_point(
    released: tuple[Host, list[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    host, shas = released
    result = history_json(host, capsys)
    assert [r["verdict"] for r in result["releases"]].count("rolled_back") == 1
    found = result["trend"]
    assert found["latest"] == shas[-1]
    assert found["records"] == len(LEVELS)  # the rolled-back attempt is no release
    judged = found["judged"]
    assert judged["window_records"] == shas[2:7]  # the five releases before the newest
    rows = {r["metric"]: r for r in judged["rows"]}
    assert rows["generation_tps"]["best"] == shas[3]  # 100.5: the best of the window
    assert rows["generation_tps"]["ratio"] == pytest.approx(92.5 / 100.5, abs=1e-3)
    # without the box's noise measured, the prior restart offset (3 %) leaves the 8 %
    # loss unconfirmed: not a pass, not a FAIL either
    assert rows["generation_tps"]["offset"] == {"log_sd": 0.03, "source": "prior"}
    assert judged["verdict"] == "INCONCLUSIVE"
    (shift,) = found["change_points"]["regular-16k:generation_tps"]
    assert shift["sha"] == shas[4]
    assert shift["change"] == pytest.approx(-0.08, abs=0.005)
    assert shift["loss"] is True

    # the box's measured offset (0.5 %) makes the loss decisive
    measured = {f"regular-16k:{m}": noise.Noise(0.015, 0.005, 3, 15, 0.002)
                for m in ("generation_tps", "prefill_tps")}  # fmt: skip
    noise.save(host.cfg.host_root, measured, {"digest": "abc"}, shas[-1], "box", [])
    judged = history_json(host, capsys)["trend"]["judged"]
    assert judged["verdict"] == "FAIL"
    assert {r["offset"]["source"] for r in judged["rows"]} == {"measured"}

    assert release_main(["history", "--config", str(host.path)]) == 0
    text = capsys.readouterr().out
    assert f"trend: {shas[-1][:12]} against the best of the last 5" in text
    assert f"{shas[4][:12]} -7.9% (p < 0.001)" in text
    assert "trend FAIL: regular-16k prefill_tps: ratio 0.920 against the best of 5" in text


def test_an_anchor_from_the_config_is_judged_against(
    released: tuple[Host, list[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    host, shas = released
    host.path.write_text(host.path.read_text() + f'\n[trend]\nanchor = "{shas[5][:12]}"\n')
    judged = history_json(host, capsys)["trend"]["judged"]
    assert judged["against"] == f"anchor {shas[5][:12]}"
    assert judged["verdict"] == "PASS"  # 92.5 against the anchor's 93
    assert {r["best"] for r in judged["rows"]} == {shas[5]}


def test_servegate_report_marks_the_change_point(
    released: tuple[Host, list[str]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    host, shas = released
    out = tmp_path / "rep"
    assert main(["report", "--config", str(host.path), "--out", str(out), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)["result"]
    marked = {(c["metric"], c["release"]) for c in result["change_points"]}
    assert marked == {("generation_tps", shas[4][:12]), ("prefill_tps", shas[4][:12])}
    page = (out / "bench-history.html").read_text()
    assert "<h2>Change points</h2>" in page
    assert f"<td>{shas[4][:12]}</td>" in page
    assert "-7.9%" in page
