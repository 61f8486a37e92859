"""``servegate bench`` against a real vLLM server (the CPU build, the demo's tiny model)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from servegate.bench import cases, driver, measure, probes, results
from servegate.bench.schema import Trial
from servegate.demo.local_server import Server, vllm_server
from servegate.engine import adapters
from servegate.engine.openai import Endpoint
from servegate.judging import verdict
from tests.conftest import REAL_HOME, release_record

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(
        os.environ.get("SERVEGATE_SKIP_VLLM") == "1" and os.environ.get("CI") != "true",
        reason="SERVEGATE_SKIP_VLLM=1: the real-vLLM tests were left out",
    ),
]

SERVEGATE = str(Path(sys.executable).with_name("servegate"))


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with vllm_server(tmp_path_factory.mktemp("vllm"), home=REAL_HOME) as s:
        yield s


#: the demo model has random weights: its noise can let one token pass the field's 20 %
BENCH_ONLY = "[bench]\nmax_dominant_ratio = 0.35\n"
RULES = measure.Rules(max_dominant_ratio=0.35)
CONTENT = {"dominant_repeated_token", "low_unique_token_ratio", "too_few_text_tokens",
           "highly_compressible_repetition"}  # fmt: skip


def bench(
    *args: str, cwd: Path, sub: str = "", reference: bool = False
) -> tuple[int, dict[str, Any], str]:
    """``servegate bench`` (``sub``: one of its subcommands) with a bench-only config, as
    JSON. The reference workload beside each group only where the test judges it: its
    readings fill both cores for seconds a group."""
    head = [SERVEGATE, "bench", *([sub] if sub else [])]
    config = BENCH_ONLY + ("" if reference else "reference = false\n")
    (cwd / "bench.toml").write_text(config)  # a bench-only config: --url says where
    run = subprocess.run(
        [*head, "--json", "--no-lease", "--config", str(cwd / "bench.toml"), *args],
        capture_output=True, text=True, timeout=1200, cwd=cwd,
        env={**os.environ},
    )  # fmt: skip
    doc = json.loads(run.stdout) if run.stdout.strip() else {}
    return run.returncode, doc, run.stderr


def test_bench_measures_a_real_server_with_valid_trials(server: Server, tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    code, doc, err = bench(
        "--url", server.url, "--profiles", "regular,coding", "--tiers", "2k", "--repetitions", "2",
        "--max-tokens", "512", "--seed", "-1", "--output", str(out), "--server-log", str(server.log),
        cwd=tmp_path, reference=True,
    )  # fmt: skip
    assert code == 0, err[-3000:]
    result = json.loads(out.read_text())
    assert result["status"] == "complete"
    assert result["engine"]["resolved"] == "vllm"
    assert result["engine"]["tokenize"] is True
    assert {k: v["method"] for k, v in result["sizing"].items()} == {
        "regular-2k": "tokenize",
        "coding-2k": "tokenize",
    }
    assert result["warmup"]["ok"]
    assert result["warmup"]["ignore_eos"] is True
    for case in result["cases"]:
        for group in case["groups"]:
            for t in group["trials"]:
                # the measurement is sound; only the random model's text may be rejected
                assert set(t["invalid_reasons"]) <= CONTENT, t["reason_details"]
                assert t["completion_tokens"] == 512
                assert abs(t["prompt_tokens"] - 2048) <= 2048 * 0.02
                assert t["ignore_eos"] is False  # never on a measured request
                if not t["client_timing"]:  # a burst (starved frontend) drops these
                    assert t["prefill_tps"] == pytest.approx(
                        t["prompt_tokens"] / t["ttft_s"], rel=1e-3
                    )
                    assert t["generation_tps"] == pytest.approx(
                        511 / t["decode_window_s"], rel=1e-3
                    )
                assert t["tokens_per_chunk"] >= 1.0
                # the answer counted again by /tokenize backs usage's 512 (within 2 % + 12)
                assert t["recounted_tokens"] * 1.02 + 12 >= 512, t["recounted_tokens"]
                # the engine's own clock for the same request
                assert t["engine_prefill_tps"] > 0
                assert t["engine_generation_tps"] > 0
            # the server saw exactly this request, inside our clock: its TTFT histogram
            # (arrival → first token) lies within the client's (sent → first text)
            sm = group["server_metrics"]
            assert sm["prefix_cache_hits"] == 0
            t = group["trials"][0]
            if t["ttft_s"] is not None:
                assert 0 < sm["ttft_mean_s"] <= t["ttft_s"] + 0.005
                # the client's TTFT is the engine's plus the frontend's share, apart
                assert t["engine_ttft_s"] == pytest.approx(sm["ttft_mean_s"], abs=1e-6)
                assert t["frontend_ttft_s"] == pytest.approx(
                    t["ttft_s"] - t["engine_ttft_s"], abs=2e-6
                )
                assert t["client_wait_s"] is not None
                assert t["client_wait_s"] >= 0
            assert group["reference"]["rate"] > 0  # the box's speed beside the group
    rows = {r["case"]: r for r in result["performance_table"]}
    assert set(rows) == {"regular-2k", "coding-2k"}
    for case in result["cases"]:
        valid = sum(t["performance_valid"] for g in case["groups"] for t in g["trials"])
        assert rows[case["id"]]["valid_trials"] == valid
        assert rows[case["id"]]["performance_valid"] is (valid == 2)
    # sizing is cached per model and tokenizer: the next run does not tokenize again
    code, doc, err = bench("--url", server.url, "--profiles", "regular", "--tiers", "2k",
                           "--repetitions", "1", "--max-tokens", "512", "--seed", "-1",
                           "--no-warmup", "--output", str(tmp_path / "r2.json"), cwd=tmp_path)  # fmt: skip
    assert code == 0, err[-3000:]
    assert doc["result"]["sizing"]["regular-2k"]["method"] == "cache"
    # the baseline gate: the same server against itself passes
    code, doc, err = bench("--url", server.url, "--profiles", "regular", "--tiers", "2k",
                           "--repetitions", "2", "--max-tokens", "512", "--seed", "-1",
                           "--no-warmup", "--baseline", str(out), "--output", str(tmp_path / "r3.json"),
                           cwd=tmp_path)  # fmt: skip
    assert code == 14, "a baseline measured with other cases has another fingerprint"
    assert "fingerprints differ in: cases" in doc["error"]["message"]
    assert not (tmp_path / "r3.json").exists()  # refused before measuring
    # the same settings: judged against it, with the gate table in the result
    code, doc, err = bench("--url", server.url, "--profiles", "regular", "--tiers", "2k",
                           "--repetitions", "2", "--max-tokens", "512", "--seed", "-1",
                           "--no-warmup", "--baseline", str(tmp_path / "r2.json"), cwd=tmp_path)  # fmt: skip
    # one baseline trial: no variance, nothing to compare — never a pass (open: nothing
    # was compared; FAIL where a trial was spoilt by the random model's text)
    assert code == 9, err[-3000:]
    gate = doc["result"]["gate"]
    assert gate["verdict"] in ("FAIL", "INCONCLUSIVE"), gate
    assert {r["metric"] for r in gate["rows"]} == {"prefill_tps", "generation_tps"}
    for r in gate["rows"]:  # a degenerate sample of the random model is a reason, not a pass
        assert r["verdict"] != "PASS", r
        # the one baseline trial was spoilt (random text), dropped its client timings (a
        # burst on a busy box), or is just one: never a comparison, never a pass
        assert any(
            w in r["why"] for w in ("invalid", "fewer than two samples", "has no", "kept no")
        ), r


def test_a_reused_request_tag_is_caught_as_a_cache_hit(server: Server, tmp_path: Path) -> None:
    """vLLM reports no cached tokens in usage: only the /metrics delta betrays the hit."""
    spec = cases.Spec(Endpoint(server.url), "demo", cases.parse_cases(["regular"], ["2k"], [1]),
                       repetitions=1, max_tokens=512, warmup=False,
                       sampling=cases.Sampling(seed=-1), rules=RULES)  # fmt: skip
    first = driver.Bench(spec, tmp_path / "a.json")
    first.prepare()
    doc = first.measure(spec.cases[0], 1)
    assert set(doc["groups"][0]["trials"][0]["invalid_reasons"]) <= CONTENT
    again = driver.Bench(spec, tmp_path / "b.json")
    again.scope = first.scope  # the same tag: the prompt's prefix is in the cache
    again.prepare()
    t = again.measure(spec.cases[0], 1)["groups"][0]["trials"][0]
    assert not t["performance_valid"]
    assert "prompt_cache_hit" in t["invalid_reasons"]
    assert "vllm:prefix_cache_hits" in t["reason_details"]["prompt_cache_hit"]
    assert t["cached_tokens"] == {}  # usage said nothing
    hits = again.result["cases"][0]["groups"][0]["server_metrics"]["prefix_cache_hits"]
    assert hits is not None
    assert t["prompt_tokens"] is not None
    assert hits >= 0.9 * t["prompt_tokens"]  # the whole prompt came from the cache


def test_bad_input_is_a_clear_failure_and_keeps_the_partial_result(
    server: Server, tmp_path: Path
) -> None:
    out = tmp_path / "too-long.json"
    code, doc, _ = bench("--url", server.url, "--tiers", "16k", "--output", str(out), cwd=tmp_path)
    assert code == 13
    assert "max model length is 10240" in doc["error"]["message"]
    assert json.loads(out.read_text())["status"] == "failed"
    down = tmp_path / "down.json"
    code, doc, _ = bench("--url", "http://127.0.0.1:9", "--model", "demo", "--tiers", "2k",
                           "--output", str(down), cwd=tmp_path)  # fmt: skip
    assert code == 13
    assert "does not answer /v1/models" in doc["error"]["message"]
    code, doc, _ = bench("--url", server.url, "--model", "nope", "--tiers", "2k", cwd=tmp_path)
    assert code == 13
    assert "'nope' is not served" in doc["error"]["message"]


def test_prefix_reuse_probe_on_a_real_server(server: Server) -> None:
    r = probes.prefix_reuse(Endpoint(server.url), "demo", "4k", 0.70, 0.5, 300)
    assert r.ok, r
    assert r.evidence["cached_source"] == "/metrics prefix_cache_hits delta"
    assert r.evidence["cached_share"] >= 0.7
    too_long = probes.prefix_reuse(Endpoint(server.url), "demo", "16k", 0.70, 0.5, 300)
    assert not too_long.ok
    assert "does not fit" in too_long.reason


def test_correctness_probe_fails_a_model_that_answers_nonsense(server: Server) -> None:
    """The demo model has random weights: it must fail, with the answer shown."""
    from servegate.config import DEFAULT_CORRECTNESS

    r = probes.correctness(Endpoint(server.url), "demo", DEFAULT_CORRECTNESS[:2], 120)
    assert not r.ok
    assert len(r.evidence["answers"]) == 4  # each prompt asked twice
    assert "Paris" in r.reason


def test_spec_decode_probe_reports_absent_counters(server: Server) -> None:
    """No counters is no evidence: the probe fails, whatever the configured minimum."""
    for minimum in (0.0, 0.5):
        r = probes.spec_decode(Endpoint(server.url), "demo", 120, min_acceptance=minimum)
        assert not r.ok
        assert "exports no speculative-decoding counters" in r.reason
        assert r.evidence["drafted"] in (None, 0)


def test_verdict_on_real_samples_is_pass_against_itself(server: Server, tmp_path: Path) -> None:
    spec = cases.Spec(Endpoint(server.url), "demo", cases.parse_cases(["regular"], ["1k"], [1]),
                       repetitions=3, max_tokens=512, warmup=False,
                       sampling=cases.Sampling(seed=-1), rules=RULES)  # fmt: skip
    a = results.from_result(driver.run(spec, tmp_path / "a.json"))
    b = results.from_result(driver.run(spec, tmp_path / "b.json"))
    assert results.check_comparable(a, b) == []
    # this shared 2-CPU box drifts by up to 40 % within minutes: a wide tolerance here,
    # benchmarks/gate_power.py measures the gate's power
    # decode by the engine's clock: a busy neighbour can hold the stream back between the
    # engine and this client, which drops the client's timings (see test_measure)
    d = verdict.evaluate(a, b, [verdict.Rule("engine_generation_tps", "higher", 0.5)])
    (row,) = d["rows"]
    if not b.cases["regular-1k"].valid:  # the random model's text was rejected: FAIL, never PASS
        assert d["verdict"] == "FAIL"
        assert "case invalid" in row["why"]
        return
    if not a.cases["regular-1k"].valid:  # an invalid baseline passes nothing
        assert d["verdict"] == "FAIL"
        assert "the baseline case is invalid" in row["why"]
        return
    # the same server against itself: never a FAIL, whatever the box did between the runs
    assert d["verdict"] != "FAIL", row
    if d["verdict"] == "INCONCLUSIVE":
        # a neighbour moved the box between the runs, scattered one run's samples, or left
        # samples whose interval still holds a 50 % loss: the gate says so, never a pass
        whys = ("not excluded", "scatter", "far slower", "box is", "measuring again")
        assert any(w in row["why"] for w in whys), row
    else:
        assert d["verdict"] == "PASS", row
        assert "a loss of 50% is excluded" in row["why"], row
    assert row["n_baseline"] == row["n_candidate"] == 3
    assert row["interval"][0] <= row["ratio"] <= row["interval"][1]
    assert row["drift"]["checked"] is True  # both runs measured the reference workload


def test_compare_live_servers_interleaved_and_result_files(server: Server, tmp_path: Path) -> None:
    code, doc, err = bench(
        "--profiles", "regular", "--tiers", "1k", "--max-tokens", "512", "--seed", "-1",
        "--output", str(tmp_path / "ab"),
        "--a-url", server.url, "--b-url", server.url, "--rounds", "2",
        cwd=tmp_path, sub="compare",
    )  # fmt: skip
    assert code == 0, err[-3000:]
    result = doc["result"]
    assert result["order"] == "ABAB"
    rows = {r["metric"]: r for r in result["rows"]}
    gen = rows["generation_tps"]
    a, b = tmp_path / "ab" / "A.json", tmp_path / "ab" / "B.json"
    # two rounds: two trials a side, less those the random model's text made invalid
    for side, path in (("n_a", a), ("n_b", b)):
        trials = [t for c in json.loads(path.read_text())["cases"] for g in c["groups"]
                  for t in g["trials"]]  # fmt: skip
        assert len(trials) == 2
        assert gen[side] == sum(
            t["performance_valid"] and t["generation_tps"] is not None for t in trials
        )
    if gen["n_a"] == gen["n_b"] == 2:
        assert gen["interval_pct"][0] <= gen["delta_pct"] <= gen["interval_pct"][1]
    assert json.loads(a.read_text())["status"] == "complete"
    run = subprocess.run([SERVEGATE, "bench", "compare", str(a), str(b), "--json"],
                         capture_output=True, text=True, cwd=tmp_path)  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["result"]["rows"][0]["case"] == "regular-1k"
    gate = subprocess.run([SERVEGATE, "bench", "gate", str(a), str(b), "--json",
                           "--config", str(tmp_path / "bench.toml")],
                          capture_output=True, text=True, cwd=tmp_path)  # fmt: skip
    judged = json.loads(gate.stdout)["result"]
    decided = judged["verdict"]
    # a file gate is final: PASS, FAIL, or — where the estimate is a loss beyond the
    # tolerance that the few samples could not decide (a busy box) — INCONCLUSIVE, which
    # is never a pass
    assert decided in ("PASS", "FAIL", "INCONCLUSIVE")
    if decided == "INCONCLUSIVE":  # an estimate beyond the tolerance, or too few samples
        assert "not a pass" in judged["why"] or "never a pass" in judged["why"], judged["rows"]
    assert gate.returncode == (0 if decided == "PASS" else 9)
    report = subprocess.run([SERVEGATE, "report", str(a), str(b), "--out", str(tmp_path / "rep"),
                             "--config", str(tmp_path / "bench.toml")],
                            capture_output=True, text=True, cwd=tmp_path)  # fmt: skip
    assert report.returncode == 0, report.stderr
    png = (tmp_path / "rep" / "bench-history.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    page = (tmp_path / "rep" / "bench-history.html").read_text()
    assert "regular-1k" in page
    assert "data:image/png;base64," in page
    # a CPU server: the page says there was no GPU telemetry, and why
    assert "GPU telemetry beside every group" in page
    assert f"{a.stem}: none — " in page


def _percentiles_ordered(p: dict[str, float] | None) -> None:
    assert p is not None
    assert p["p50"] <= p["p90"] <= p["p99"] <= p["max"]


def test_load_sweep_finds_the_knee_of_a_real_server(server: Server, tmp_path: Path) -> None:
    """Open-loop Poisson arrivals at a light rate and at one two CPUs cannot serve (12 a
    second was served on a quiet box; 40 is past any 2-CPU box), 5 s each (200 arrivals
    at 40 a second; 10 s only made the queue longer to drain):
    the light point holds, the heavy one saturates (its queue grows), the knee is the
    light one; every figure comes from the requests, and the file exports."""
    out = tmp_path / "load.json"
    code, doc, err = bench(
        "--url", server.url, "--rates", "1,40", "--duration", "5", "--profiles", "regular",
        "--tiers", "1k,2k", "--max-tokens", "32", "--seed", "-1", "--goodput", "ttft:2s",
        "--output", str(out),
        cwd=tmp_path, sub="load",
    )  # fmt: skip
    assert code == 0, err[-3000:]
    result = json.loads(out.read_text())
    assert result["kind"] == "servegate.load"
    assert result["status"] == "complete"
    assert result["telemetry"]["source"] is None  # a CPU server: said so
    assert "a CPU server" in result["telemetry"]["why"]
    light, heavy = result["points"]
    assert not light["saturated"], light["why"]
    assert light["failed"] == 0
    assert light["completed"] == light["requests"] > 0
    for p in (light, heavy):
        for key in ("ttft_s", "itl_ms", "tpot_ms", "e2el_s"):
            if p[key] is None and key in ("itl_ms", "tpot_ms"):
                # a busy box: the client read every answer of the point at once, so their
                # decode timings were dropped, each request saying why, never made up
                assert all(r["client_timing"] for r in p["requests_detail"] if r["ok"]), p
                continue
            _percentiles_ordered(p[key])
        assert p["prefix_hit_rate"] == 0  # cold: every prompt starts with its own tag
        detail = p["requests_detail"]
        assert {r["prompt"] for r in detail} <= {"regular-1k", "regular-2k"}
        assert all(r["completion_tokens"] == 32 for r in detail if r["ok"])  # ignore_eos
    assert {r["prompt"] for r in heavy["requests_detail"]} == {"regular-1k", "regular-2k"}
    assert heavy["saturated"], heavy
    assert heavy["server_queue"]["waiting_max"] > 0  # vLLM's own queue saw it too
    assert heavy["ttft_s"]["p50"] > light["ttft_s"]["p50"]
    assert result["knee"]["value"] == 1
    assert result["knee"]["saturated_at"] == 40
    # goodput: requests that met TTFT ≤ 2 s, never more than the completed ones
    assert light["goodput_rps"] <= light["request_throughput"]
    assert doc["result"]["knee"]["value"] == 1  # --json: the same, no per-request rows
    assert "requests_detail" not in doc["result"]["points"][0]

    exported = subprocess.run(
        [SERVEGATE, "bench", "export", str(out), "--format", "pytorch"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert exported.returncode == 0, exported.stderr
    records = [json.loads(x) for x in out.with_suffix(".pytorch.jsonl").read_text().splitlines()]
    p99 = [r for r in records if r["metric"]["name"] == "p99_ttft_ms"]
    assert [r["metric"]["benchmark_values"][0] for r in p99] == [
        pytest.approx(light["ttft_s"]["p99"] * 1000),
        pytest.approx(heavy["ttft_s"]["p99"] * 1000),
    ]


def test_shared_prefix_load_reports_the_engines_prefix_hit_rate(
    server: Server, tmp_path: Path
) -> None:
    """Prompts of two profiles and two tiers share one prefix (the head of the longest):
    the engine's hit rate comes near the target, not the share each prompt has with
    others of its own kind."""
    out = tmp_path / "warm.json"
    code, _, err = bench(
        "--url", server.url, "--rates", "1", "--duration", "8", "--profiles", "regular,coding",
        "--tiers", "1k,2k", "--max-tokens", "16", "--seed", "-1", "--workload",
        "shared-prefix", "--prefix-share", "0.8", "--output", str(out),
        cwd=tmp_path, sub="load",
    )  # fmt: skip
    assert code == 0, err[-3000:]
    (point,) = json.loads(out.read_text())["points"]
    assert point["requests"] >= 3
    # the first request fills the cache; the others hit up to 80 % of their prompt:
    # about what a cache that forgot nothing would have served in that order (vLLM caches
    # whole blocks of 16 tokens, and the chat template's head is common too)
    rate, ideal = point["prefix_hit_rate"], point["prefix_hit_ideal"]
    assert 0.3 < ideal < 0.8
    assert ideal - 0.1 < rate < 0.9, (rate, ideal)


def test_load_gate_check_judges_a_real_sweep_against_the_live_releases(
    server: Server, tmp_path: Path
) -> None:
    """The `load` gate check twice on one server: the first release has no baseline (its
    required row passes only by the explicit first-release policy), the second is judged
    against the first's recorded sweep, request by request, and is never a FAIL."""
    from servegate import config, documents
    from servegate.pipeline.stages import QuietReporter
    from servegate.release import load_gate
    from servegate.release.record import host_id

    cfg = config.parse(
        f'[stack]\nremote = "x"\n[host]\nroot = "{tmp_path}"\n[service]\nport = 1\n'
        'command = ["x"]\nmodel = "demo"\n'
        '[gate]\nchecks = ["smoke", "load"]\nno_baseline = "first-release"\n'
        '[bench]\nseed = -1\n'
        '[load]\nrates = [1]\nduration = 15\ntiers = ["1k"]\nmax_tokens = 16\n'
        'goodput = "ttft:5s"\n'
        '[[load.rules]]\nmetric = "ttft_s.p50"\npoint = 1\nrequired = true\ntolerance = 0.5\n'
        '[[load.rules]]\nmetric = "goodput_rps"\npoint = 1\n',
        environ={},
    )  # fmt: skip
    endpoint = Endpoint(server.url)
    first = load_gate.run(cfg, endpoint, "demo", "a" * 40, None, QuietReporter(), os.environ,
                          first_release=True)  # fmt: skip
    assert first["verdict"] == "PASS", first["why"]
    assert first["baseline"] == "no live release recorded"
    assert [r["verdict"] for r in first["rows"]] == ["PASS", "REPORT"]
    assert "first release" in first["rows"][0]["why"]
    (swept,) = first["sweep"]["points"]
    assert swept["kept"] == swept["requests"] >= 5
    assert len(swept["ttft_s"]) == sum(swept["ok"])
    assert Path(first["result_file"]).exists()
    assert json.loads(Path(first["result_file"]).read_text())["run"]["release"] == "a" * 40

    record = release_record(sha="a" * 40, host_id=host_id(cfg),
                            gate={"checks": [{"name": "load", "verdict": "PASS", "evidence": first}]})  # fmt: skip
    second = load_gate.run(cfg, endpoint, "demo", "b" * 40, record, QuietReporter(), os.environ)
    assert second["baseline"] == f"live release {'a' * 12}"
    row, reported = second["rows"]
    kept = documents.read(load_gate.Point, swept)  # as the record keeps it, read back
    assert row["baseline"] == pytest.approx(load_gate.figure(kept, "ttft_s.p50"))
    assert row["interval"][0] <= row["ratio"] <= row["interval"][1]
    # the same server: no evidence of a loss (a busy box may leave it undecided)
    assert second["verdict"] in ("PASS", "INCONCLUSIVE"), second["rows"]
    assert reported["verdict"] == "REPORT"
    assert reported["candidate"] > 0  # every request met TTFT <= 5 s


#: the padding a hostile frontend adds to every chunk of the answer: varied words, so
#: the content rules see ordinary text
PADDING = [f" {w}" for w in ("amber", "basalt", "cobalt", "delta", "ember", "fjord", "garnet",
                             "harbor", "indigo", "juniper", "kelvin", "lumen", "marble")]  # fmt: skip


class Hostile(BaseHTTPRequestHandler):
    """A hostile frontend in front of the real server, as a commit in a vLLM fork could
    make it. ``early``: a space at once, then the model's stream (the first text is what
    TTFT times, so the prefill looks as fast as the proxy's reply). ``truncate``: the
    engine gets half the prompt, usage reports the whole (a prefill that looks twice as
    fast). ``pad``: a word added to every chunk of the answer and counted in usage, so
    the recount of the streamed text agrees with the claim (a decode that looks faster).
    ``hide``: early text, and the engine's TTFT series taken out of ``/metrics``. ``side``:
    early text, and one more short request of its own to the engine for each one it is
    sent, so the TTFT histogram counts twice the group's requests. ``hidecounts``: ``pad``,
    and the engine's generation token counts taken out of ``/metrics``."""

    upstream = ""
    mode = "early"

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        self._forward("GET", b"")

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        if self.path != "/v1/chat/completions":
            self._forward("POST", body)
            return
        request = json.loads(body)
        if self.mode == "side":  # its own request, answered before the client's ends
            aside = {"model": request["model"], "max_tokens": 1,
                     "messages": [{"role": "user", "content": "hi"}]}  # fmt: skip
            httpx.post(self.upstream + self.path, json=aside, timeout=60)
        whole = None
        if self.mode == "truncate":
            ask = {"model": request["model"], "messages": request["messages"]}
            whole = httpx.post(self.upstream + "/tokenize", json=ask, timeout=60).json()["count"]
            last = request["messages"][-1]
            last["content"] = last["content"][: len(last["content"]) // 2]
            body = json.dumps(request).encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        if self.mode in ("early", "hide", "side"):
            self.wfile.write(b'data: {"choices": [{"index": 0, "delta": {"content": " "}}]}\n\n')
            self.wfile.flush()
        text, n = [], 0
        with httpx.stream("POST", self.upstream + self.path, content=body, timeout=600,
                          headers={"Content-Type": "application/json"}) as up:  # fmt: skip
            for line in up.iter_lines():
                if line.startswith("data: {"):
                    event = json.loads(line[6:])
                    for choice in event.get("choices") or ():
                        delta = choice.get("delta") or {}
                        if self.mode in ("pad", "hidecounts") and delta.get("content"):
                            delta["content"] += PADDING[n % len(PADDING)]
                            n += 1
                        text.append(delta.get("content") or "")
                    usage = event.get("usage")
                    if usage and whole is not None:
                        usage["prompt_tokens"] = whole
                    if usage and self.mode in ("pad", "hidecounts"):
                        ask = {"model": request["model"], "prompt": "".join(text),
                               "add_special_tokens": False}  # fmt: skip
                        counted = httpx.post(self.upstream + "/tokenize", json=ask, timeout=60)
                        usage["completion_tokens"] = counted.json()["count"]
                    line = "data: " + json.dumps(event)
                self.wfile.write(line.encode() + b"\n")
                self.wfile.flush()

    def _forward(self, method: str, body: bytes) -> None:
        up = httpx.request(method, self.upstream + self.path, content=body or None, timeout=60,
                           headers={"Content-Type": "application/json"})  # fmt: skip
        content = up.content
        hidden = {"hide": "time_to_first_token", "hidecounts": "request_generation_tokens"}
        if self.mode in hidden and self.path == "/metrics":
            lines = up.text.splitlines(keepends=True)
            content = "".join(x for x in lines if hidden[self.mode] not in x).encode()
        self.send_response(up.status_code)
        self.send_header("Content-Type", up.headers.get("content-type", "text/plain"))
        self.send_header("Content-Length", str(len(content)))
        self.end_headers()
        self.wfile.write(content)


@contextlib.contextmanager
def hostile(server: Server, mode: str) -> Iterator[str]:
    handler = type("H", (Hostile,), {"upstream": server.url, "mode": mode})
    proxy = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{proxy.server_address[1]}"
    finally:
        proxy.shutdown()
        proxy.server_close()


def test_text_sent_ahead_of_the_model_is_caught_by_the_engines_clock(
    server: Server, tmp_path: Path
) -> None:
    """A space before the prefill ends makes the real server's 2k prefill look many
    times faster; vLLM's TTFT histogram (arrival → first token) says the client got
    text before the model had any: no trial of the group is valid, and no request of a
    load point."""
    with hostile(server, "early") as url:
        spec = cases.Spec(Endpoint(url, engine=adapters.VLLM), "demo",
                          cases.parse_cases(["regular"], ["2k"], [1, 2]), repetitions=1,
                          max_tokens=256, warmup=False, sampling=cases.Sampling(seed=-1),
                          rules=RULES)  # fmt: skip
        single = driver.Bench(spec, tmp_path / "r.json")
        single.prepare()
        for case in spec.cases:  # one request, then two at once (the group's mean)
            group = single.measure(case, 1)["groups"][0]
            for t in group["trials"]:
                assert "text_before_first_token" in t["invalid_reasons"], t["reason_details"]
                assert not t["performance_valid"]
                why = t["reason_details"]["text_before_first_token"]
                assert "before the model had any" in why
            sm = group["server_metrics"]
            seen = [t["ttft_s"] for t in group["trials"] if t["ttft_s"] is not None]
            engine = sm["ttft_mean_s"]
            assert engine is not None
            if seen:  # what the lie showed: text long before vLLM's first token
                assert max(seen) < engine
        # under load: the point's requests fail with the reason, so the load gate's failed
        # share judges it and no latency of the point is taken from them
        single.release()
        bench(
            "--url", url, "--rates", "1", "--duration", "5", "--profiles", "regular",
            "--tiers", "1k", "--max-tokens", "32", "--seed", "-1",
            "--output", str(tmp_path / "load.json"), cwd=tmp_path, sub="load",
        )  # fmt: skip
        (point,) = json.loads((tmp_path / "load.json").read_text())["points"]
        assert point["requests"] > 0
        assert point["failed"] == point["requests"], point["errors"]
        assert all(e.startswith("text_before_first_token: ") for e in point["errors"])
        assert point["ttft_s"] is None


def hostile_trial(server: Server, mode: str, tmp_path: Path) -> Trial:
    """One 2k trial through a ``Hostile`` frontend of ``mode``."""
    with hostile(server, mode) as url:
        spec = cases.Spec(Endpoint(url, engine=adapters.VLLM), "demo",
                          cases.parse_cases(["regular"], ["2k"], [1]), repetitions=1,
                          max_tokens=256, warmup=False, sampling=cases.Sampling(seed=-1),
                          rules=RULES)  # fmt: skip
        b = driver.Bench(spec, tmp_path / "r.json")
        b.prepare()
        (t,) = b.measure(spec.cases[0], 1)["groups"][0]["trials"]
        b.release()
    return t


@pytest.mark.parametrize("mode", ["hide", "side", "hidecounts"])
def test_an_engine_clock_hidden_or_blurred_fails_closed(
    server: Server, tmp_path: Path, mode: str
) -> None:
    """Text sent ahead, and the engine's TTFT clock taken out of /metrics or made to
    count other requests; or a padded answer, and the engine's token counts taken out:
    the bench does not fall back to a weaker check the frontend chose, or to none; no
    trial is valid."""
    t = hostile_trial(server, mode, tmp_path)
    reason = "engine_counts_unread" if mode == "hidecounts" else "engine_clock_unread"
    assert reason in t["invalid_reasons"], t["reason_details"]
    assert not t["performance_valid"]
    counted = "counted 2 requests" if mode == "side" else "no count"
    assert counted in t["reason_details"][reason]


@pytest.mark.parametrize("mode", ["truncate", "pad"])
def test_usage_the_engine_did_not_count_is_caught(
    server: Server, tmp_path: Path, mode: str
) -> None:
    """A frontend that prefills half the prompt and reports it whole, or pads the answer
    and counts the padding (so the recount of the streamed text agrees with usage):
    vLLM's own per-request token histograms count less than usage claims, and no trial
    is valid."""
    t = hostile_trial(server, mode, tmp_path)
    assert "usage_exceeds_engine" in t["invalid_reasons"], t["reason_details"]
    assert "usage_exceeds_stream" not in t["invalid_reasons"]  # the recount was fooled
    assert not t["performance_valid"]
    what = "prompt" if mode == "truncate" else "output"
    assert f"{what} tokens" in t["reason_details"]["usage_exceeds_engine"]
