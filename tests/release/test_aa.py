"""On a real host (supervisord, the tiny stack's server, provenance at every start): the
A/A command runs the gate on the live release against itself and leaves it serving,
and a promote judges its candidate against the live release measured afresh."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from servegate import config as config_mod
from servegate.bench import results
from servegate.bench.cases import spec_from_config
from servegate.bench.document import fingerprint
from servegate.commands import aa
from servegate.engine.openai import Endpoint
from servegate.judging import noise
from servegate.output import Output
from servegate.release import bench_gate
from servegate.release.promote import promote
from tests.conftest import Host, Stack

BENCH = """
[bench]
profiles = ["regular"]
tiers = ["1k"]
repetitions = 3
max_repetitions = 5
max_tokens = 40
min_text_tokens = 20
# the test stack is a Python thread on a box that may be busy: a stall of its first
# tokens is a hiccup here, not text sent ahead of a prefill
max_first_gap_share = 0.9
# each start warmed up, as a real box is: a restarted Python server's first answers
# stall while the box is busy
warmup = true
reference = false
results_dir = "{results}"

[gate]
checks = ["smoke", "bench"]
no_baseline = "first-release"

[[gate.rules]]
metric = "generation_tps"
tolerance = 0.05
"""


def _with_bench(host: Host, tmp_path: Path) -> Host:
    """The host's config with the bench gate (an OpenAI-compatible server: no engine
    metrics to read)."""
    path = host.path.with_name("servegate-bench.toml")
    text = host.path.read_text().replace("[service]\n", '[service]\nengine = "openai"\n', 1)
    path.write_text(text + BENCH.format(results=tmp_path / "bench"))
    return Host(config_mod.load(path, {}), path)


def test_aa_gates_the_live_release_against_itself_and_leaves_it_serving(
    host: Host, stack: Stack, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = stack.commit("ok")
    benched = _with_bench(host, tmp_path)
    assert promote(host.context(), good).verdict == "released"  # the first: no bench
    pid = benched.context().manager.main_pid()
    dest = tmp_path / "aa.json"

    assert aa.run(benched.path, Output(json_mode=True, command="bench aa"), 2, dest) == 0
    printed = json.loads(capsys.readouterr().out)["result"]
    doc = json.loads(dest.read_text())
    assert printed["summary"] == doc["summary"]
    assert doc["sha"] == good
    assert doc["summary"]["runs"] == 2
    assert sum(doc["summary"]["verdicts"].values()) == 2
    low, high = doc["summary"]["interval_95"]
    assert 0 <= low <= doc["summary"]["rolled_back_share"] <= high <= 1
    for run in doc["runs"]:
        assert run["design"] == "fresh"
        assert run["switch"]["provenance"] == "ok"  # the "switch" restarted and proved it
        assert run["switch"]["sha"] == good
        (row,) = run["rows"]
        assert row["metric"] == "generation_tps"
        assert row["ratio"] is not None, row
        for key in ("result_file", "baseline_result_file"):
            assert json.loads(Path(run[key]).read_text())["status"] == "complete"
    # the live release serves again, from its own checkout, in a process started since
    ctx = benched.context()
    assert ctx.state.current is not None
    assert ctx.state.current.sha == good
    assert benched.live_root() == benched.release_dir(good)
    assert ctx.manager.main_pid() not in (None, pid)


def test_a_promote_measures_the_live_release_afresh_and_rolls_a_slower_one_back(
    host: Host, stack: Stack, tmp_path: Path
) -> None:
    good = stack.commit("ok")
    benched = _with_bench(host, tmp_path)
    assert promote(host.context(), good).verdict == "released"  # the first: no bench
    slow = stack.commit("slow-decode")
    outcome = promote(benched.context(), slow)
    assert outcome.verdict == "rolled_back", outcome.reason
    assert outcome.exit_code == 9
    stages = [s["name"] for s in outcome.stages]
    assert stages.index("baseline") < stages.index("switch")
    (check,) = [c for c in outcome.record["gate"]["checks"] if c["name"] == "bench"]
    ev = check["evidence"]
    assert ev["baseline"] == f"fresh: live release {good[:12]} measured during this promote (fresh)"
    (row,) = ev["rows"]
    assert row["ratio"] < 0.85, row  # 6 ms between tokens against 4
    assert check["verdict"] == "FAIL", row
    assert json.loads(Path(ev["design"]["baseline_result_file"]).read_text())["status"] == (
        "complete"
    )
    assert benched.live_root() == benched.release_dir(good)


def test_where_restarts_dominate_the_promote_alternates_live_and_candidate(
    host: Host, stack: Stack, tmp_path: Path
) -> None:
    """ABAB on a real host: the service is switched back to the live release and to the
    candidate again between blocks, and each start is proven as the release it runs."""
    good = stack.commit("ok")
    benched = _with_bench(host, tmp_path)
    assert promote(host.context(), good).verdict == "released"  # the first: no bench
    cfg = benched.cfg
    fp = fingerprint(spec_from_config(cfg.bench, Endpoint(""), "tiny"))
    found = {"regular-1k:generation_tps": noise.Noise(0.003, 0.008, 3, 15)}
    noise.save(cfg.host_root, found, fp, good, "box", [])
    (row,) = bench_gate.plan(cfg, found)
    assert row["starts"] > 1

    again = stack.commit("ok", "the same server, another commit")
    outcome = promote(benched.context(), again)
    (check,) = [c for c in outcome.record["gate"]["checks"] if c["name"] == "bench"]
    ev = check["evidence"]
    assert ev["design"]["name"] == "abab", ev["design"]
    assert ev["design"]["live_starts"] == row["starts"]
    assert [s["sha"] for s in ev["design"]["switches"]] == [good] * (row["starts"] - 1)
    assert [s["sha"] for s in ev["restarts"]] == [again] * (row["starts"] - 1)
    assert all(s["provenance"] == "ok" for s in ev["design"]["switches"] + ev["restarts"])
    base = results.from_record(ev["baseline_samples"], "x").cases["regular-1k"]
    assert base.starts == row["starts"]
    # whatever the verdict on this box, the release serving is the one the outcome names
    serving = again if outcome.verdict == "released" else good
    assert check["verdict"] != "FAIL", ev["rows"]
    assert benched.live_root() == benched.release_dir(serving)


def test_a_build_that_leaves_a_process_behind_has_it_stopped_and_named(
    host: Host, stack: Stack
) -> None:
    daemon = stack.commit("build-daemon")
    outcome = promote(host.context(), daemon)
    assert outcome.verdict == "released", outcome.reason
    built = Path(host.release_dir(daemon)) / "build"
    for name in ("daemon.pid", "grandchild.pid"):  # detached (setsid), and orphaned twice
        pid = int((built / name).read_text())
        assert not Path(f"/proc/{pid}").exists() or _zombie(pid), name
    warned = " ".join(outcome.record["warnings"] or [])
    assert "the build left 2 process(es) running, stopped before anything was measured" in warned
    assert "sleep 1000" in warned


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_a_build_that_slows_the_live_release_gets_no_fair_baseline(
    host: Host, stack: Stack, tmp_path: Path
) -> None:
    """The candidate's build runs beside the live release as the same user: it could
    renice it before the baseline is measured. The gate notices the change and rolls
    the candidate back INCONCLUSIVE, instead of comparing with a slowed live release."""
    good = stack.commit("ok")
    assert promote(host.context(), good).verdict == "released"  # the first: no bench
    benched = _with_bench(host, tmp_path)
    sly = stack.commit("build-renices-live")
    outcome = promote(benched.context(), sly)
    assert outcome.verdict == "rolled_back", outcome.reason
    (check,) = [c for c in outcome.record["gate"]["checks"] if c["name"] == "bench"]
    assert check["verdict"] == "INCONCLUSIVE"
    assert check["reason"].startswith("no fair baseline: the live service's scheduling changed")
    assert re.search(r"nice -?\d+ → -?\d+", check["reason"]), check["reason"]
    assert benched.live_root() == benched.release_dir(good)


def test_bench_noise_measures_the_live_release_over_its_restarts(
    host: Host,
    stack: Stack,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from servegate.cli import main
    from servegate.errors import BenchFailed
    from servegate.judging import noise

    good = stack.commit("ok")
    assert promote(host.context(), good).verdict == "released"
    benched = _with_bench(host, tmp_path)
    # four groups a start: on a busy box a group whose client timings were dropped still
    # leaves the two a start an estimate needs
    argv = ["bench", "noise", "--restarts", "1", "--repetitions", "4", "--config"]
    assert main([*argv, str(benched.path), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)["result"]
    assert Path(doc["file"]).is_file()
    assert "regular-1k:generation_tps" in doc["rows"], doc["unmeasured"]
    assert benched.live_root() == benched.release_dir(good)
    # a run that estimates nothing fails and keeps the record there was
    kept = Path(doc["file"]).read_bytes()
    with monkeypatch.context() as m:
        m.setattr(noise, "measure", lambda starts, metrics: {})
        assert main([*argv, str(benched.path), "--json"]) == BenchFailed.exit_code
    failed = json.loads(capsys.readouterr().out)["error"]
    assert failed["message"].startswith("the noise could not be estimated for any case")
    assert "more --repetitions" in failed["hint"]
    assert Path(doc["file"]).read_bytes() == kept
    assert benched.live_root() == benched.release_dir(good)
