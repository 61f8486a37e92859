"""A server that never finishes cannot hold servegate: every request has a whole-request
deadline (not only one per read), so a stream that goes on forever or a body trickled a
byte at a time ends at the request's timeout — and a promote whose candidate does that
is rolled back, its host lock released."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from servegate import config
from servegate.bench import client, probes
from servegate.engine.openai import Endpoint, ResponseTooLarge, WholeRequestTimeout
from servegate.release.promote import promote
from tests.conftest import Host, Stack
from tests.release.test_aa import _with_bench


class Endless(BaseHTTPRequestHandler):
    """Streams an event every 50 ms forever, or trickles a JSON body a byte at a time."""

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:  # a /metrics page of 20 MB
        page = b"# HELP x y\n" + b"x 1\n" * (5 * 1024 * 1024)
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(page)))
        self.end_headers()
        with contextlib.suppress(OSError):
            self.wfile.write(page)

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.send_response(200)
        if body.get("model") == "huge":  # one event of 2 MB
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            event = {"choices": [{"index": 0, "delta": {"content": "x" * (2 << 20)}}]}
            with contextlib.suppress(OSError):
                self.wfile.write(b"data: " + json.dumps(event).encode() + b"\n\n")
            return
        if body.get("stream"):
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            event = {"choices": [{"index": 0, "delta": {"content": "x "}}]}
            try:
                while True:
                    self.wfile.write(b"data: " + json.dumps(event).encode() + b"\n\n")
                    self.wfile.flush()
                    time.sleep(0.05)
            except OSError:  # the client gave up: that is the point
                return
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", "1000000")
        self.end_headers()
        try:
            while True:
                self.wfile.write(b" ")
                self.wfile.flush()
                time.sleep(0.05)
        except OSError:
            return


@pytest.fixture
def endless() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Endless)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_a_stream_that_never_ends_stops_at_the_request_timeout(endless: str) -> None:
    started = time.monotonic()
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
    stream = client.stream_chat(Endpoint(endless), body, 3.0)
    took = time.monotonic() - started
    assert "took longer than 3s in all" in stream.error, stream.error
    assert stream.text_chunks > 5  # it was reading all along: each read came in time
    assert took < 15, took  # 3 s, and a busy box's slack


def test_a_body_trickled_forever_stops_the_smoke_probe_at_its_timeout(endless: str) -> None:
    started = time.monotonic()
    result = probes.smoke(Endpoint(endless), "m", "hi", 8, 3.0)
    assert not result.ok
    assert time.monotonic() - started < 15
    with Endpoint(endless).client(3.0) as http, pytest.raises(WholeRequestTimeout):
        http.post("/v1/chat/completions", json={"model": "m"})
    assert issubclass(WholeRequestTimeout, httpx.TimeoutException)


def test_an_event_or_a_response_too_large_is_refused_not_kept(endless: str) -> None:
    body = {"model": "huge", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
    stream = client.stream_chat(Endpoint(endless), body, 30.0)
    assert "EventTooLarge" in stream.error, stream.error
    assert stream.content == ""  # nothing of it kept
    with Endpoint(endless).client(30.0) as http, pytest.raises(ResponseTooLarge):
        http.get("/metrics").read()


def test_a_candidate_that_streams_forever_is_rolled_back_and_frees_the_host(
    host: Host, stack: Stack, tmp_path: Path
) -> None:
    benched = _with_bench(host, tmp_path)
    # 10 s: the live release's own trials (measured afresh first, while the candidate
    # builds) end well within it on a box busy with two other test processes and a busy
    # core (its warm-up once took more than 5 s there)
    text = benched.path.read_text().replace("[bench]\n", "[bench]\ntimeout = 10\n", 1)
    benched.path.write_text(text)
    benched = Host(config.load(benched.path, {}), benched.path)
    good = stack.commit("ok")
    first = promote(host.context(), good)  # the first release, without the bench
    assert first.verdict == "released", first.reason
    endless_commit = stack.commit("stream-forever")
    started = time.monotonic()
    outcome = promote(benched.context(), endless_commit)
    assert outcome.verdict == "rolled_back", outcome.reason
    assert time.monotonic() - started < 180, outcome.record["stages"]
    (check,) = [c for c in outcome.record["gate"]["checks"] if c["name"] == "bench"]
    assert check["verdict"] == "FAIL", check["reason"]
    # the warm-up's request, or each measured trial, says why it ended
    kept = check["reason"] + Path(check["evidence"]["result_file"]).read_text()
    assert "took longer than 10s in all" in kept, check["reason"]
    assert benched.live_root() == benched.release_dir(good)
    # the host lock was released: the next promote runs
    assert promote(host.context(), good).verdict == "released"
