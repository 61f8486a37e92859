"""Streams that break: a cut-off stream, an error mid-stream, a 5xx — against a small
real HTTP server standing in for a misbehaving engine (the edge of the client)."""

from __future__ import annotations

import json
import threading
import time
import types
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from servegate.bench import cases, client, runner
from servegate.bench.sse import Stream, now
from servegate.engine import adapters
from servegate.engine.openai import Endpoint

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

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        if self.path == "/v1/models":
            self._json(200, {"data": [{"id": "m", "owned_by": "someone", "max_model_len": 4096}]})
        else:
            self._json(404, {"error": "not found"})

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        if self.path != "/v1/chat/completions":
            self._json(404, {"error": "not found"})
            return
        if self.mode == "503":
            self._json(503, {"error": {"message": "overloaded"}})
            return
        if self.mode == "slow":  # a long prefill, then a slow decode
            time.sleep(0.8)
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for i in range(40):
            event = {"choices": [{"delta": {"content": WORDS[i % len(WORDS)] + " "}}]}
            self.wfile.write(b"data: " + json.dumps(event).encode() + b"\n\n")
            if self.mode == "slow":
                self.wfile.flush()
                time.sleep(0.03)
            if self.mode == "error" and i == 10:
                self.wfile.write(b'data: {"error": {"message": "EngineCore died"}}\n\n')
                return
            if self.mode == "cut" and i == 10:
                return  # connection closes: no usage, no [DONE]
        last = {"choices": [{"delta": {}, "finish_reason": "length"}]}
        self.wfile.write(b"data: " + json.dumps(last).encode() + b"\n\n")
        usage = {"prompt_tokens": 1024, "completion_tokens": 40}
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
                       repetitions=2, max_tokens=40, warmup=False)  # fmt: skip
    out = tmp_path / "r.json"
    bench = runner.Bench(spec, out)
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


def test_a_vllm_server_whose_metrics_cannot_be_read_gives_no_valid_trial(
    engine: tuple[str, type[Engine]], tmp_path: Path
) -> None:
    """On vLLM only the /metrics delta betrays a prompt-cache hit: a scrape that fails
    (here: /metrics answers 404) leaves the trial unproven, never clean."""
    from servegate.engine.adapters import VLLM

    url, _ = engine
    spec = cases.Spec(Endpoint(url, engine=VLLM), "m", cases.parse_cases(["regular"], ["1k"], [1]),
                      repetitions=1, max_tokens=40, warmup=False)  # fmt: skip
    bench = runner.Bench(spec, tmp_path / "r.json")
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
    monkeypatch.setattr(runner, "TICK_SECONDS", 0.25)
    live: list[Stream] = []
    ep = Endpoint(url, "", adapters.VLLM)
    started = now()
    with runner.Bench._ticker(owner, "regular-128k #1", live, started):  # type: ignore[arg-type]
        stream = client.stream_chat(ep, BODY, 30.0, None, live)
    assert not stream.error
    assert any(line.startswith("regular-128k #1: prefill ") and "(no token yet)" in line
               for line in lines), lines  # fmt: skip
    assert any("decode" in line and "chunk(s) received" in line for line in lines), lines
