"""Streams that break: a cut-off stream, an error mid-stream, a 5xx — against a small
real HTTP server standing in for a misbehaving engine (the edge of the client)."""

from __future__ import annotations

import json
import threading
import time
import types
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from servegate.bench import cases, client, driver, loadspec, measure
from servegate.bench.schema import Trial
from servegate.bench.sse import Stream, now
from servegate.engine import adapters
from servegate.engine.openai import Endpoint
from servegate.errors import BenchFailed

WORDS = [
    "the",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "the",
    "lazy",
    "dog",
    "while",
    "servers",
    "stream",
    "tokens",
]


class Engine(BaseHTTPRequestHandler):
    mode = "ok"
    #: usage's completion_tokens (None: the 40 chunks streamed, the truth)
    claim: int | None = None
    #: "words": /tokenize counts whitespace-separated words; "broken": it answers 500;
    #: "": there is none (404)
    tokenize = ""

    #: "shared": the one engine every request's prefill and tokens take turns on
    engine_lock = threading.Lock()
    #: "slow": the prefill's seconds and the seconds between tokens
    prefill_s = 0.8
    token_gap_s = 0.03

    def log_message(self, *args: object) -> None:
        pass

    def _event(self, text: str) -> None:
        event = {"choices": [{"index": 0, "delta": {"content": text}}]}
        self.wfile.write(b"data: " + json.dumps(event).encode() + b"\n\n")
        self.wfile.flush()

    def do_GET(self) -> None:
        if self.path == "/health" and self.mode in ("dead", "503"):  # vLLM's health path:
            # "dead": the engine died with the request it was sent; "503": overloaded, alive
            self._json(503 if self.mode == "dead" else 200, {})
        elif self.path == "/v1/models":
            self._json(200, {"data": [{"id": "m", "owned_by": "someone", "max_model_len": 4096}]})
        else:
            self._json(404, {"error": "not found"})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path == "/tokenize" and self.tokenize:
            if self.tokenize == "broken":
                self._json(500, {"error": "tokenizer crashed"})
                return
            texts = (
                [body["prompt"]] if "prompt" in body else [m["content"] for m in body["messages"]]
            )
            if self.tokenize == "list" and "prompt" in body:
                self._json(200, [len(texts[0].split())])  # a count, but not the API's shape
                return
            self._json(200, {"count": sum(len(t.split()) for t in texts), "tokens": [],
                             "max_model_len": 4096})  # fmt: skip
            return
        if self.path != "/v1/chat/completions":
            self._json(404, {"error": "not found"})
            return
        if self.mode == "503":
            self._json(503, {"error": {"message": "overloaded"}})
            return
        if self.mode == "dead":
            self._json(500, {"error": {"message": "EngineCore encountered an issue"}})
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        if self.mode == "early-late":  # 0.6 s of the 0.8 s prefill before the space
            time.sleep(0.6)
        if self.mode in ("early", "early-late", "early2", "early-short"):  # text ahead
            for _ in range(2 if self.mode == "early2" else 1):  # "early2": two spaces
                self._event(" ")
                time.sleep(0.001)
            time.sleep(0.2 if self.mode == "early-late" else 0.8)
        if self.mode == "drip":  # a space every 20 ms through the 0.8 s prefill
            for _ in range(40):
                self._event(" ")
                time.sleep(0.02)
        if self.mode == "zero-width":  # 16 zero-width spaces at once (not str.isspace())
            for _ in range(16):
                self._event("\u200b")
            time.sleep(0.8)
        if self.mode == "hold":  # a space, the prefill, then the answer held back at once
            self._event(" ")
            time.sleep(0.8)
        if self.mode in ("slow", "stall", "lead"):  # a long prefill, then a slow decode
            time.sleep(self.prefill_s if self.mode == "slow" else 0.8)
        if self.mode == "lead":  # honest: the model's first two tokens are newlines
            for _ in range(2):
                self._event("\n")
                time.sleep(0.03)
        if self.mode == "shared-early":  # the shared engine, a space ahead of each prefill
            self._event(" ")
        if self.mode in ("shared", "shared-early"):  # one engine: a prefill holds it 0.4 s
            with self.engine_lock:
                time.sleep(0.4)
        for i in range(10 if self.mode == "early-short" else 40):
            word = WORDS[i % len(WORDS)] + " "
            # "reasoning": the first half as newer vLLM streams a reasoning model's thought
            key = "reasoning" if self.mode == "reasoning" and i < 20 else "content"
            choices: list[dict[str, object]] = [{"index": 0, "delta": {key: word}}]
            if self.mode == "second-choice":  # n=1 was asked: a second choice doubles the text
                choices.append({"index": 1, "delta": {"content": word}})
            event = {"choices": choices}
            if self.mode in ("shared", "shared-early") and i:  # a token waits for the engine
                with self.engine_lock:
                    time.sleep(0.005)
            self.wfile.write(b"data: " + json.dumps(event).encode() + b"\n\n")
            if self.mode in ("slow", "stall", "early", "early-late", "early2", "drip", "lead",
                             "shared", "zero-width", "early-short", "shared-early"):  # fmt: skip
                self.wfile.flush()
                # "stall": a neighbour holds the honest stream 0.25 s after its first token
                gap = self.token_gap_s if self.mode == "slow" else 0.03
                time.sleep(0.25 if self.mode == "stall" and i == 0 else gap)
            if self.mode == "error" and i == 10:
                self.wfile.write(b'data: {"error": {"message": "EngineCore died"}}\n\n')
                return
            if self.mode == "cut" and i == 10:
                return  # connection closes: no usage, no [DONE]
        if self.mode == "burst":  # 60 more words at once, never decoded in the window
            event = {"choices": [{"delta": {"content": "".join(WORDS[i % 13] + " "
                                                               for i in range(60))}}]}  # fmt: skip
            self.wfile.write(b"data: " + json.dumps(event).encode() + b"\n\n")
        last = {"choices": [{"delta": {}, "finish_reason": "length"}]}
        self.wfile.write(b"data: " + json.dumps(last).encode() + b"\n\n")
        usage = {
            "prompt_tokens": 1024,
            "completion_tokens": 40 if self.claim is None else self.claim,
        }
        self.wfile.write(b"data: " + json.dumps({"choices": [], "usage": usage}).encode() + b"\n\n")
        if self.mode != "no-done":  # transformers serve ends a stream without [DONE]
            self.wfile.write(b"data: [DONE]\n\n")

    def _json(self, code: int, body: object) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture
def engine() -> Iterator[tuple[str, type[Engine]]]:
    handler = type("E", (Engine,), {"mode": "ok"})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", handler
    server.shutdown()
    server.server_close()


BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 40}


def test_a_stream_without_done_is_whole_only_where_the_engine_never_sends_it(
    engine: tuple[str, type[Engine]],
) -> None:
    url, handler = engine
    handler.mode = "no-done"
    st = client.stream_chat(Endpoint(url, engine=adapters.TRANSFORMERS), BODY, 10)
    assert st.error == ""
    assert st.usage["completion_tokens"] == 40
    assert client.stream_chat(Endpoint(url, engine=adapters.VLLM), BODY, 10).error == (
        "the stream was cut off before [DONE]"
    )
    handler.mode = "cut"  # no finish reason, no usage: cut off, whatever the engine
    st = client.stream_chat(Endpoint(url, engine=adapters.TRANSFORMERS), BODY, 10)
    assert st.error == "the stream was cut off before its finish reason and usage"


def test_a_whole_stream_is_measured(engine: tuple[str, type[Engine]]) -> None:
    url, _ = engine
    st = client.stream_chat(Endpoint(url), BODY, 10)
    assert st.error == ""
    assert st.text_chunks == 40
    assert st.usage["completion_tokens"] == 40


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("cut", "cut off before [DONE]"),
        ("error", "EngineCore died"),
        ("503", "HTTP 503"),
    ],
)
def test_a_broken_stream_is_a_failed_trial_and_the_result_is_kept(
    engine: tuple[str, type[Engine]], tmp_path: Path, mode: str, expected: str
) -> None:
    url, handler = engine
    spec = cases.Spec(Endpoint(url), "m", cases.parse_cases(["regular"], ["1k"], [1]),
                       repetitions=2, max_tokens=40, warmup=False, reference=False)  # fmt: skip
    out = tmp_path / "r.json"
    bench = driver.Bench(spec, out)
    bench.prepare()
    assert bench.result["sizing"]["regular-1k"]["method"] == "estimate"  # no /tokenize here
    bench.measure(spec.cases[0], 1)
    handler.mode = mode
    bench.measure(spec.cases[0], 1)
    saved = json.loads(out.read_text())  # written after every group
    first, second = (g["trials"][0] for g in saved["cases"][0]["groups"])
    assert first["ok"]
    assert not second["ok"]
    assert second["invalid_reasons"] == ["request_failed"]
    assert expected in second["error"]
    assert saved["cases"][0]["summary"]["performance_valid"] is False
    assert saved["status"] == "running"  # what an interrupted run leaves: status says so


@pytest.mark.parametrize(
    ("claim", "reasons"),
    [
        (None, set()),  # the 40 words streamed: the truth
        (52, set()),  # 40 words + 2 % + 12: special tokens the text does not show
        (53, {"usage_exceeds_stream"}),  # 1.325x: a decode rate 32 % too fast
        (64, {"usage_exceeds_stream"}),  # 1.6x
    ],
)
def test_usage_that_claims_more_tokens_than_were_streamed_is_invalid(
    engine: tuple[str, type[Engine]], tmp_path: Path, claim: int | None, reasons: set[str]
) -> None:
    """A server (a release's code) that reports more output tokens than it streamed
    would make its decode rate look faster: the text is counted again by the tokenizer
    that sized the prompts (here the server's /tokenize counting words) and the claim
    must agree within ``max_usage_excess`` (2 %) + 12."""
    from servegate.engine.adapters import VLLM

    url, handler = engine
    handler.tokenize, handler.claim = "words", claim
    spec = cases.Spec(Endpoint(url, engine=VLLM), "m", cases.parse_cases(["regular"], ["1k"], [1]),
                      repetitions=1, max_tokens=claim or 40, warmup=False, reference=False)  # fmt: skip
    bench = driver.Bench(spec, tmp_path / "r.json")
    bench.prepare()
    assert bench.result["engine"]["tokenizer_source"] == "server /tokenize"
    (trial,) = bench.measure(spec.cases[0], 1)["groups"][0]["trials"]
    bench.finish()
    assert trial["recounted_tokens"] == 40
    usage_reasons = {r for r in trial["invalid_reasons"] if r.startswith("usage")}
    assert usage_reasons == reasons
    if reasons:
        assert (
            f"usage claims {claim} output tokens; the streamed text is 40"
            in (trial["reason_details"]["usage_exceeds_stream"])
        )
        assert not trial["performance_valid"]


@pytest.mark.parametrize(("broken", "said"), [("broken", "500"), ("list", "not a token count")])
def test_a_recount_that_fails_leaves_no_valid_trial(
    engine: tuple[str, type[Engine]], tmp_path: Path, broken: str, said: str
) -> None:
    """The tokenizer sized the prompts, then cannot count the answer (the server's
    /tokenize broke, or answers what is no count): the claim is unproven, the trial
    invalid, never clean, and the run goes on."""
    from servegate.engine.adapters import VLLM

    url, handler = engine
    handler.tokenize = "words"
    spec = cases.Spec(Endpoint(url, engine=VLLM), "m", cases.parse_cases(["regular"], ["1k"], [1]),
                      repetitions=1, max_tokens=40, warmup=False, reference=False)  # fmt: skip
    bench = driver.Bench(spec, tmp_path / "r.json")
    bench.prepare()
    handler.tokenize = broken
    (trial,) = bench.measure(spec.cases[0], 1)["groups"][0]["trials"]
    bench.finish()
    assert trial["recounted_tokens"] is None
    assert "usage_not_recounted" in trial["invalid_reasons"]
    assert said in trial["reason_details"]["usage_not_recounted"]


@pytest.mark.parametrize(
    ("mode", "claim", "reason"),
    [
        # the recount backs the claim (100 words streamed), but 60 of them came in one
        # chunk after the window: a decode rate 2.5x too fast
        ("burst", 100, "oversized_chunk"),
        # a second choice (n=1 was asked) doubles the text the recount sees
        ("second-choice", 80, "request_failed"),
    ],
)
def test_text_the_window_never_decoded_is_no_valid_trial(
    engine: tuple[str, type[Engine]], tmp_path: Path, mode: str, claim: int, reason: str
) -> None:
    from servegate.engine.adapters import VLLM

    url, handler = engine
    handler.tokenize, handler.mode, handler.claim = "words", mode, claim
    spec = cases.Spec(Endpoint(url, engine=VLLM), "m", cases.parse_cases(["regular"], ["1k"], [1]),
                      repetitions=1, max_tokens=claim, warmup=False, reference=False)  # fmt: skip
    bench = driver.Bench(spec, tmp_path / "r.json")
    bench.prepare()
    (trial,) = bench.measure(spec.cases[0], 1)["groups"][0]["trials"]
    bench.finish()
    assert reason in trial["invalid_reasons"], trial["reason_details"]
    assert not trial["performance_valid"]
    if mode == "burst":
        assert trial["recounted_tokens"] == claim  # the recount alone would have passed it
        assert "one chunk carried" in trial["reason_details"]["oversized_chunk"]
    else:
        assert "2 choices: one was asked for" in trial["error"]


def test_a_reasoning_models_thought_is_part_of_the_answer(
    engine: tuple[str, type[Engine]], tmp_path: Path
) -> None:
    """Newer vLLM streams a reasoning model's thought as ``delta.reasoning``: it is text
    the usage counts, so it is text the recount counts (not a usage that lies)."""
    from servegate.engine.adapters import VLLM

    url, handler = engine
    handler.tokenize, handler.mode = "words", "reasoning"
    spec = cases.Spec(Endpoint(url, engine=VLLM), "m", cases.parse_cases(["regular"], ["1k"], [1]),
                      repetitions=1, max_tokens=40, warmup=False, reference=False)  # fmt: skip
    bench = driver.Bench(spec, tmp_path / "r.json")
    bench.prepare()
    (trial,) = bench.measure(spec.cases[0], 1)["groups"][0]["trials"]
    bench.finish()
    assert trial["recounted_tokens"] == 40
    assert trial["text_chunks"] == 40
    assert not {r for r in trial["invalid_reasons"] if r.startswith("usage")}


def test_a_vllm_server_whose_metrics_cannot_be_read_gives_no_valid_trial(
    engine: tuple[str, type[Engine]], tmp_path: Path
) -> None:
    """On vLLM only the /metrics delta betrays a prompt-cache hit: a scrape that fails
    (here: /metrics answers 404) leaves the trial unproven, never clean."""
    from servegate.engine.adapters import VLLM

    url, _ = engine
    spec = cases.Spec(Endpoint(url, engine=VLLM), "m", cases.parse_cases(["regular"], ["1k"], [1]),
                      repetitions=1, max_tokens=40, warmup=False, reference=False)  # fmt: skip
    bench = driver.Bench(spec, tmp_path / "r.json")
    bench.prepare()
    (trial,) = bench.measure(spec.cases[0], 1)["groups"][0]["trials"]
    assert trial["ok"]
    assert "metrics_unread" in trial["invalid_reasons"]
    assert "a prompt-cache hit could not be ruled out" in trial["reason_details"]["metrics_unread"]


def test_a_running_group_says_its_phase_time_and_chunks(
    engine: tuple[str, type[Engine]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """At 128k a trial runs for minutes: the progress line shows prefill (no token yet),
    then decode with the chunks received, while it runs."""
    url, handler = engine
    handler.mode = "slow"
    lines: list[str] = []
    owner = types.SimpleNamespace(reporter=types.SimpleNamespace(progress=lines.append))
    monkeypatch.setattr(driver, "TICK_SECONDS", 0.25)
    live: list[Stream] = []
    ep = Endpoint(url, "", adapters.VLLM)
    started = now()
    with driver.Bench._ticker(owner, "regular-128k #1", live, started):  # type: ignore[arg-type]
        stream = client.stream_chat(ep, BODY, 30.0, None, live)
    assert not stream.error
    assert any(line.startswith("regular-128k #1: prefill ") and "(no token yet)" in line
               for line in lines), lines  # fmt: skip
    assert any("decode" in line and "chunk(s) received" in line for line in lines), lines


GATE_CONFIG = """
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
repetitions = 1
max_repetitions = 1
max_starts = 1
max_tokens = 40
warmup = false
reference = false
[gate]
checks = ["bench"]
no_baseline = "first-release"
"""


@pytest.mark.parametrize("tokenize", ["", "words"])
def test_the_gate_says_what_checked_the_candidates_token_counts(
    engine: tuple[str, type[Engine]], tmp_path: Path, tokenize: str
) -> None:
    """A vLLM candidate whose /tokenize is gone (vLLM always serves it) could hide a usage
    that lies: its gate FAILs. Counted by its own /tokenize, the gate says that the
    evidence is weaker and what makes it stronger."""
    from servegate import config
    from servegate.engine.adapters import VLLM
    from servegate.pipeline.stages import QuietReporter
    from servegate.release import bench_gate

    url, handler = engine
    handler.tokenize = tokenize
    cfg = config.parse(GATE_CONFIG.format(root=tmp_path), environ={})
    ev = bench_gate.run(cfg, Endpoint(url, engine=VLLM), "m", "b" * 40, None, None,
                        QuietReporter(), {}, first_release=True)  # fmt: skip
    assert ev["verdict"] == "FAIL"  # (here also: its /metrics cannot be read)
    weaker = [w for w in ev["weaker_evidence"] if "/tokenize" in w]
    if not tokenize:
        assert "the candidate's /tokenize does not answer" in ev["why"]
        assert "token counts checked" in ev["why"]
        assert ev["rows"] == []  # nothing was measured on its word
    else:
        assert weaker == [
            "the answers' token counts were checked by the candidate's own /tokenize: "
            "bench.tokenizer (the model directory) counts with files the release does not serve"
        ]


def once(url: str, tmp_path: Path, concurrency: int = 1) -> list[Trial]:
    """The trials of one group of the 1k case at ``concurrency``, 40 tokens out, the
    content rules off (the engine's words repeat). No reference workload beside the group
    (the gate's drift check, not judged here): its threads would fill both cores right
    before the stream whose timing these tests judge. So throughout this module."""
    spec = cases.Spec(Endpoint(url), "m", cases.parse_cases(["regular"], ["1k"], [concurrency]),
                      repetitions=1, max_tokens=40, warmup=False, reference=False,
                      rules=measure.Rules(min_text_tokens=1, max_dominant_ratio=1))  # fmt: skip
    bench = driver.Bench(spec, tmp_path / "r.json")
    bench.prepare()
    return bench.measure(spec.cases[0], 1)["groups"][0]["trials"]


def _starved(t: Trial) -> bool:
    """The client could not time this trial: its thread waited for a CPU, or its start
    came in a burst (a busy box reads chunks late and bunched)."""
    return bool(t["client_timing"]) or (t["client_wait_s"] or 0.0) > measure.CLIENT_WAIT_FLOOR


#: the longest pause any mode of the test engine scripts (its 0.8 s prefill), with a
#: little room; a longer one is the engine's thread kept off a CPU (only ever a reason to
#: measure again, never to pass a run)
SCRIPTED_PAUSE_S = 0.9


def _overran(t: Trial) -> bool:
    """The engine itself was starved: a pause longer than any it scripts."""
    return (t["first_gap_s"] or 0.0) > SCRIPTED_PAUSE_S


def judged(
    url: str, tmp_path: Path, concurrency: int, expected: Callable[[list[Trial]], bool]
) -> list[Trial]:
    """:func:`once`, measured again (up to five times) only while a run misses what is
    expected *and* the client was starved in it, or the engine was (it paused longer
    than any of its modes scripts): on a busy box the check's input, not the check, is
    what went wrong. A run both timed as scripted is judged as it came."""
    trials: list[Trial] = []
    for attempt in range(5):  # a core kept busy starves the engine's thread run after run
        (where := tmp_path / f"run{attempt}").mkdir()
        trials = once(url, where, concurrency)
        if expected(trials) or not any(_starved(t) or _overran(t) for t in trials):
            break
    return trials


@pytest.mark.parametrize(
    ("mode", "ahead"),
    [
        ("slow", False),  # 0.8 s of prefill, then 30 ms a token: honest
        ("stall", False),  # honest, held 0.25 s after its first token: under half the TTFT
        ("lead", False),  # honest: two newlines, then words
        ("early", True),  # a space at once, the 0.8 s of prefill after it
        ("early2", True),  # two spaces at once: the wait is after the second
        ("drip", True),  # a space every 20 ms through the prefill: a lead of whitespace
        ("zero-width", True),  # 16 zero-width spaces at once: a lead with no word in it
        ("early-short", True),  # a space, the prefill, 10 words: a short stream's pace
        # a space at 0.6 s of 0.8 (a prefill 25 % faster than it was): within the check's
        # limit, which docs/bench.md states; vLLM's own clock catches this one
        ("early-late", False),
    ],
)
def test_a_first_chunk_sent_ahead_of_the_prefill_is_no_ttft(
    engine: tuple[str, type[Engine]], tmp_path: Path, mode: str, ahead: bool
) -> None:
    """A frontend that sends text (a space, a few, a drip) as soon as a request arrives
    would pass a slow prefill as a fast one: the first text is what TTFT times. This
    engine has no TTFT clock of its own, so the stream's pace judges: the prefill it
    hid is spent in the stream's start, in one long wait or a lead without a word."""
    url, handler = engine
    handler.mode = mode
    # a run must time the stream (a starved client drops its timings) and judge it as
    # expected; one that does neither while the box kept the client or engine waiting
    # is measured again
    (t,) = judged(url, tmp_path, 1,
                  lambda ts: ts[0]["ttft_s"] is not None
                  and ("first_text_ahead" in ts[0]["invalid_reasons"]) == ahead)  # fmt: skip
    ttft = t["ttft_s"]
    assert ttft is not None
    assert t["first_gap_s"] is not None
    if ahead:
        assert ttft < 0.1
        assert "first_text_ahead" in t["invalid_reasons"], t["reason_details"]
        assert "sent ahead of the prefill" in t["reason_details"]["first_text_ahead"]
        assert not t["performance_valid"]
        if mode != "early-short":  # (10 tokens of 40 is invalid for that too)
            assert t["invalid_reasons"] == ["first_text_ahead"]
    else:
        assert "first_text_ahead" not in t["invalid_reasons"], t["reason_details"]


def test_a_start_held_back_behind_a_space_drops_the_clients_timings(
    engine: tuple[str, type[Engine]], tmp_path: Path
) -> None:
    """A space at once, the prefill, then the whole answer at once: its mean inter-token
    latency is not a burst's (the wait is in the window), but its start is; the client's
    timings measure what held it back, not the model, and are dropped."""
    url, handler = engine
    handler.mode = "hold"
    start = "burst: the stream's start came at"
    # a run whose client waited for a CPU drops its timings for that reason first (seen
    # once beside a busy core): measured again, as the module's other starved runs
    (t,) = judged(url, tmp_path, 1, lambda ts: ts[0]["client_timing"].startswith(start))
    assert t["client_timing"].startswith(start), t
    assert t["ttft_s"] is None
    assert t["prefill_tps"] is None
    assert t["generation_tps"] is None


@pytest.mark.parametrize("mode", ["early", "lead-shared"])
def test_streams_that_vouch_for_each_other_are_no_alibi(
    engine: tuple[str, type[Engine]], tmp_path: Path, mode: str
) -> None:
    """Two requests at once, each sent a space ahead of its prefill: each one's wait
    ends as the other's text comes, but neither stream passes on its own, so neither
    explains the other's wait."""
    url, handler = engine
    handler.mode = mode if mode == "early" else "shared-early"
    trials = judged(url, tmp_path, 2,
                    lambda ts: all("first_text_ahead" in t["invalid_reasons"] for t in ts))  # fmt: skip
    for t in trials:
        assert "first_text_ahead" in t["invalid_reasons"], t["reason_details"]


def test_a_wait_for_another_requests_prefill_is_not_text_sent_ahead(
    engine: tuple[str, type[Engine]], tmp_path: Path
) -> None:
    """Two requests at once on one engine: the first one's second token waits while the
    other's prefill holds the engine, as long as its own prefill took. That wait ends
    with the other's first text, so it is not a prefill the first one hid."""
    url, handler = engine
    handler.mode = "shared"

    def explained(ts: list[Trial]) -> bool:
        first = min(ts, key=lambda t: t["ttft_s"] or 0)
        waited = (first["first_gap_s"] or 0) > 0.5 * (first["ttft_s"] or 0)
        return waited and not any("first_text_ahead" in t["invalid_reasons"] for t in ts)

    trials = judged(url, tmp_path, 2, explained)
    first = min(trials, key=lambda t: t["ttft_s"] or 0)
    assert first["first_gap_s"] is not None
    assert first["ttft_s"] is not None
    assert first["first_gap_s"] > 0.5 * first["ttft_s"]  # the wait the check must explain
    for t in trials:
        assert "first_text_ahead" not in t["invalid_reasons"], t["reason_details"]


def test_a_crash_inside_the_first_group_keeps_its_own_error(
    engine: tuple[str, type[Engine]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bug inside the first group (here: making a trial raises) fails the run with that
    error, in the exception and in the result file; the file's table, which that case
    has no summary for yet, does not replace it with its own."""
    url, _ = engine

    def broken(stream: Stream, rules: measure.Rules) -> None:
        raise RuntimeError("the trial could not be made")

    monkeypatch.setattr(measure, "trial", broken)
    spec = cases.Spec(Endpoint(url), "m", cases.parse_cases(["regular"], ["1k"], [1]),
                      repetitions=1, max_tokens=40, warmup=False, reference=False)  # fmt: skip
    out = tmp_path / "r.json"
    with pytest.raises(RuntimeError, match="the trial could not be made"):
        driver.run(spec, out)
    saved = json.loads(out.read_text())
    assert saved["status"] == "failed"
    assert "the trial could not be made" in saved["error"]
    (row,) = saved["performance_table"]
    assert (row["trials"], row["valid_trials"], row["performance_valid"]) == (0, 0, False)


@pytest.mark.parametrize("mode", ["503", "dead"])
def test_a_warm_up_that_took_the_server_down_says_so_and_names_the_seed(
    engine: tuple[str, type[Engine]], tmp_path: Path, mode: str
) -> None:
    """vLLM's CPU build crashes on a per-request seed once a prompt is prefilled in
    chunks, and the error a client sees says only that the engine had an issue: a
    warm-up request that failed and left the server down says so, and names the seed
    and how to send none; one that failed on a server still up points at the length."""
    url, handler = engine
    handler.mode = mode
    spec = cases.Spec(Endpoint(url, "", adapters.VLLM), "m",
                      cases.parse_cases(["regular"], ["1k"], [1]),
                      repetitions=1, max_tokens=40, reference=False)  # fmt: skip
    with pytest.raises(BenchFailed) as err:
        driver.run(spec, tmp_path / "r.json")
    hint = err.value.hint
    assert "check that the server answers a small chat completion" in hint
    if mode == "dead":
        assert "the server no longer answers (/health answered 503)" in hint
        assert "a per-request seed (3407) crashes vLLM's CPU build" in hint
        assert "--seed -1" in hint
    else:
        assert "no longer answers" not in hint
        assert "seed" not in hint


def test_a_load_sweep_that_fails_before_its_first_point_leaves_a_failed_file(
    engine: tuple[str, type[Engine]], tmp_path: Path
) -> None:
    """The warm-up fails (the engine died): an earlier run's file at the same path must
    not stand for this run; it says failed, and why."""
    from servegate.bench import load

    url, handler = engine
    handler.mode = "dead"
    out = tmp_path / "load.json"
    out.write_text(json.dumps({"kind": "servegate.load", "status": "complete", "points": []}))
    spec = cases.Spec(Endpoint(url, "", adapters.VLLM), "m",
                      cases.parse_cases(["regular"], ["1k"], [1]), max_tokens=40, reference=False)  # fmt: skip
    with pytest.raises(BenchFailed, match="the warm-up request failed"):
        load.run(driver.Bench(spec, None), loadspec.LoadSpec("rate", (1.0,), duration_s=10), out)
    saved = json.loads(out.read_text())
    assert saved["status"] == "failed"
    assert saved["error"].startswith("the warm-up request failed")
    assert saved["points"] == []
    assert saved["knee"] is None
