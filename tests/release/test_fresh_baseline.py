"""The fresh, paired baseline (``gate.baseline = "fresh"``): the live release measured
again during the promote, live and candidate alternating (ABAB) where the plan spreads
the repetitions over service starts, and the trend check deciding beside it.

Two OpenAI-compatible servers stand for the live release and the candidate: each side's
samples must come from its own server, and the verdict from those samples — never from
a record of the live release measured on another day."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from servegate import config
from servegate.bench import results
from servegate.bench.cases import spec_from_config
from servegate.bench.document import fingerprint
from servegate.bench.driver import Bench
from servegate.engine.openai import Endpoint
from servegate.errors import ConfigError
from servegate.judging import noise, verdict
from servegate.pipeline.stages import QuietReporter
from servegate.release import bench_gate

REPO = Path(__file__).resolve().parents[2]

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
max_repetitions = 6
max_starts = {max_starts}
max_tokens = 40
min_text_tokens = 20
warmup = false
reference = false
[gate]
checks = ["smoke", "bench"]
[[gate.rules]]
metric = "generation_tps"
tolerance = 0.05
"""


def _server(token_gap_s: float) -> Iterator[str]:
    """A test engine in a process of its own (its token gaps are not the client's GIL's),
    with a prefill of 0.25 s: a first text read a few ms late by a client kept off its
    CPU on a busy box stays under the 1 % of the TTFT that drops a trial's timing."""
    code = (
        "import sys\n"
        "from http.server import ThreadingHTTPServer\n"
        "from tests.bench.test_stream_faults import Engine\n"
        "handler = type('E', (Engine,), {'mode': 'slow', 'prefill_s': 0.25, "
        f"'tokenize': 'words', 'token_gap_s': {token_gap_s!r}}})\n"
        "server = ThreadingHTTPServer(('127.0.0.1', 0), handler)\n"
        "print(server.server_address[1], flush=True)\n"
        "server.serve_forever()\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, stdout=subprocess.PIPE,
                            text=True)  # fmt: skip
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.kill()
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


@pytest.fixture
def live_url() -> Iterator[str]:
    yield from _server(0.005)


@pytest.fixture
def slower_url() -> Iterator[str]:
    yield from _server(0.015)  # three times the gap between tokens: generation_tps ~0.33x


def _cfg(tmp_path: Path, max_starts: int, offset: float = 0.0) -> config.Config:
    cfg = config.parse(CFG.format(root=tmp_path, max_starts=max_starts), environ={})
    if offset:  # a box whose restarts differ: the plan spreads the repetitions
        fp = fingerprint(spec_from_config(cfg.bench, Endpoint(""), "m"))
        found = {"regular-1k:generation_tps": noise.Noise(0.003, offset, 3, 15)}
        noise.save(tmp_path, found, fp, "a" * 40, "box", [])
    return cfg


def _live(cfg: config.Config, url: str, to_live: Any = None) -> bench_gate.LiveBench:
    return bench_gate.LiveBench(cfg, Endpoint(url), "m", "a" * 40, QuietReporter(), {},
                                to_live=to_live)  # fmt: skip


def test_the_candidate_is_judged_against_the_live_release_measured_now(
    tmp_path: Path, live_url: str, slower_url: str
) -> None:
    cfg = _cfg(tmp_path, max_starts=1)
    live = _live(cfg, live_url)
    live.begin()
    assert not live.failed
    assert live.design == "fresh"
    evidence = bench_gate.run(
        cfg, Endpoint(slower_url), "m", "b" * 40, None, None, QuietReporter(), {}, live=live
    )
    # no record of the live release exists: the baseline can only be the fresh one
    assert evidence["baseline"] == (
        f"fresh: live release {'a' * 12} measured during this promote (fresh)"
    )
    assert evidence["design"]["name"] == "fresh"
    assert evidence["design"]["switches"] == []
    (row,) = evidence["rows"]
    assert row["ratio"] is not None, row
    assert row["ratio"] < 0.6, row
    assert evidence["verdict"] == verdict.FAIL, row
    # both sides are kept: the baseline's samples in the evidence and in its own file
    kept = results.from_record(evidence["baseline_samples"], "x").cases["regular-1k"]
    # every group kept: a value, or (on a busy box) a decode whose timings were dropped
    got = len(kept.metrics["generation_tps"]) + kept.missing.get("generation_tps", 0)
    assert got == cfg.bench.repetitions, kept
    doc = json.loads(Path(evidence["design"]["baseline_result_file"]).read_text())
    assert doc["status"] == "complete"
    assert all(g["start"] == 0 for g in doc["cases"][0]["groups"])


def test_where_restarts_dominate_live_and_candidate_alternate(
    tmp_path: Path, live_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = _cfg(tmp_path, max_starts=3, offset=0.008)
    (row,) = bench_gate.plan(cfg, noise.load(tmp_path, _digest(cfg))[0])
    assert row["starts"] > 1
    order: list[str] = []
    measure = Bench.measure

    def tagged(self: Bench, case: Any, n: int) -> Any:
        side = "A" if self.output is not None and "-baseline" in self.output.name else "B"
        order.extend(side * n)
        return measure(self, case, n)

    monkeypatch.setattr(Bench, "measure", tagged)

    def to_live() -> dict[str, Any]:
        order.append("switch to A")
        return {"sha": "a" * 40, "provenance": "ok"}

    def to_candidate() -> dict[str, Any]:
        order.append("switch to B")
        return {"sha": "b" * 40, "provenance": "ok"}

    live = _live(cfg, live_url, to_live)
    assert live.design == "abab"
    live.begin()
    order.append("switch to B")  # the promote's switch
    evidence = bench_gate.run(
        cfg, Endpoint(live_url), "m", "b" * 40, None, None, QuietReporter(), {},
        restart=to_candidate, live=live,
    )  # fmt: skip
    blocks = bench_gate.spread(row["repetitions"], row["starts"])
    expected: list[str] = []
    for i, n in enumerate(blocks):
        expected += (["switch to A"] if i else []) + ["A"] * n + ["switch to B"] + ["B"] * n
    assert order[: len(expected)] == expected
    assert set(order[len(expected) :]) <= {"B"}  # later looks measure the candidate only
    design = evidence["design"]
    assert design["name"] == "abab"
    assert design["live_starts"] == row["starts"] == evidence["starts"]
    assert len(design["switches"]) == row["starts"] - 1
    assert len(evidence["restarts"]) == row["starts"] - 1
    base = results.from_record(evidence["baseline_samples"], "x").cases["regular-1k"]
    cand = results.from_record(evidence["samples"], "x").cases["regular-1k"]
    assert base.starts == cand.starts == row["starts"]
    # the same server on both sides: whatever the box did, no loss is claimed
    assert evidence["verdict"] != verdict.FAIL, json.dumps(evidence["rows"])


def test_without_a_way_back_to_the_live_release_it_is_measured_in_its_running_start(
    tmp_path: Path, live_url: str
) -> None:
    cfg = _cfg(tmp_path, max_starts=3, offset=0.008)
    live = bench_gate.LiveBench(cfg, Endpoint(live_url), "m", "a" * 40, QuietReporter(), {},
                                cannot_alternate="an in-place deploy rebuilds")  # fmt: skip
    assert live.design == "fresh"
    assert live.blocks == [live.layout.first]
    assert "an in-place deploy rebuilds" in live.why


def test_a_live_release_that_cannot_be_measured_falls_back_and_says_so(
    tmp_path: Path, live_url: str
) -> None:
    cfg = _cfg(tmp_path, max_starts=1)
    live = _live(cfg, "http://127.0.0.1:9")  # nothing answers
    live.begin()
    assert live.failed.startswith("the live release's bench failed")
    evidence = bench_gate.run(
        cfg, Endpoint(live_url), "m", "b" * 40, None, None, QuietReporter(), {}, live=live
    )
    assert evidence["baseline"] == "no live release recorded"
    assert any("no fresh baseline" in w for w in evidence["weaker_evidence"])
    assert "design" not in evidence
    assert evidence["verdict"] == verdict.FAIL  # no baseline, gate.no_baseline = "fail"


def test_a_trend_fail_fails_the_check_and_an_open_trend_is_reported(
    tmp_path: Path, live_url: str
) -> None:
    cfg = _cfg(tmp_path, max_starts=1)
    seen: list[results.Samples] = []

    def creeping(samples: results.Samples) -> dict[str, Any]:
        seen.append(samples)
        return {"verdict": verdict.FAIL, "why": "regular-1k generation_tps: 0.91x",
                "against": "the best of the last 5 released record(s)"}  # fmt: skip

    live = _live(cfg, live_url)
    live.begin()
    evidence = bench_gate.run(
        cfg, Endpoint(live_url), "m", "b" * 40, None, None, QuietReporter(), {},
        live=live, trend=creeping,
    )  # fmt: skip
    (candidate,) = seen
    assert candidate.cases["regular-1k"].trials
    assert evidence["verdict"] == verdict.FAIL
    assert "creeping loss against the best of the last 5" in evidence["why"]
    assert evidence["trend"]["verdict"] == verdict.FAIL


def test_the_old_baseline_value_is_refused_with_what_to_write(tmp_path: Path) -> None:
    text = CFG.format(root=tmp_path, max_starts=1)
    with pytest.raises(ConfigError, match="'live' is gone") as refused:
        config.parse(text.replace("[gate]\n", '[gate]\nbaseline = "live"\n'), environ={})
    assert "'recorded'" in refused.value.hint
    cfg = config.parse(CFG.format(root=tmp_path, max_starts=1), environ={})
    assert cfg.gate.baseline == "fresh"


def _digest(cfg: config.Config) -> str:
    return str(fingerprint(spec_from_config(cfg.bench, Endpoint(""), "m"))["digest"])


def test_a_baseline_the_candidate_could_have_spoiled_is_no_fallback(
    tmp_path: Path, live_url: str
) -> None:
    """A live release that served when the promote began and cannot be measured after
    the candidate's build: the recorded samples (which a build running as the same user
    could have touched) are not used; the check is INCONCLUSIVE and says what to do."""
    cfg = _cfg(tmp_path, max_starts=1)
    live = _live(cfg, "http://127.0.0.1:9")
    live.begin()
    live.forced = True  # what measure_live sets when the live release served before
    evidence = bench_gate.run(
        cfg, Endpoint(live_url), "m", "b" * 40, None, None, QuietReporter(), {}, live=live
    )
    assert evidence["verdict"] == verdict.INCONCLUSIVE
    assert evidence["why"].startswith("no fair baseline: the live release's bench failed")
    assert "gate.baseline = 'recorded'" in evidence["why"]
    assert "baseline" not in evidence  # nothing was compared
