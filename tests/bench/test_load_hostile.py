"""A hostile or broken server against the real load path (``Load.point`` over HTTP):
answers cut short, token counts that lie, malformed chunks. None of them may count as
a served request, meet an SLO, or make a throughput; and a queue that grows on the
sweep's lightest point is seen."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from servegate.bench import cases, fixtures, load, loadreport, loadspec, sizing
from servegate.bench.driver import Bench
from servegate.engine import adapters
from servegate.engine.openai import Endpoint
from servegate.errors import BenchFailed

MAX_TOKENS = 8
Script = Callable[[BaseHTTPRequestHandler, dict[str, Any]], None]


def _event(obj: Any) -> bytes:
    data = obj if isinstance(obj, bytes) else json.dumps(obj).encode()
    return b"data: " + data + b"\n\n"


def answer(
    n: int = MAX_TOKENS,
    finish: Any = "length",
    usage: Any = "honest",
    gap: float = 0.0,
    at_once: bool = False,
) -> Script:
    """A streamed answer of ``n`` text chunks, its finish reason and its usage; with
    ``at_once``, every chunk in one write (held back and sent together), so that a busy
    box cannot spread them over several reads."""

    def script(h: BaseHTTPRequestHandler, body: dict[str, Any]) -> None:
        held: list[bytes] = []
        for i in range(n):
            time.sleep(gap)
            chunk = _event({"choices": [{"index": 0, "delta": {"content": f" w{i}"}}]})
            if at_once:
                held.append(chunk)
                continue
            h.wfile.write(chunk)
            h.wfile.flush()
        held.append(_event({"choices": [{"index": 0, "delta": {}, "finish_reason": finish}]}))
        if usage is not None:
            counts = {"prompt_tokens": 1000, "completion_tokens": n} if usage == "honest" else usage
            held.append(_event({"choices": [], "usage": counts}))
        held.append(_event(b"[DONE]"))
        h.wfile.write(b"".join(held))

    return script


def raw(*events: Any) -> Script:
    def script(h: BaseHTTPRequestHandler, body: dict[str, Any]) -> None:
        for e in events:
            h.wfile.write(_event(e))
        h.wfile.write(_event(b"[DONE]"))

    return script


class _Server(ThreadingHTTPServer):
    #: a backlog for a point's arrivals: the default 5 drops a burst's connections, which
    #: then wait a second for their SYN to be sent again
    request_queue_size = 64
    daemon_threads = True


@pytest.fixture
def server() -> Iterator[Callable[..., str]]:
    """``start(script)`` → the URL of a server that answers every chat request with it.
    Its ``/metrics`` has vLLM's TTFT clock, counting the chat requests it was sent
    (and ``extra`` requests of its own for each) at ``ttft`` seconds each (0: the check that a
    client's first text did not come before the model's holds), or none with
    ``clock=False``; and vLLM's per-request token counts, ``counts`` (prompt, output)
    for each chat request (None: none); ``buckets``: the TTFT histogram's bounds;
    ``health``: the status its /health and /v1/models answer."""
    running: list[ThreadingHTTPServer] = []

    def start(
        script: Script,
        clock: bool = True,
        ttft: float = 0.0,
        extra: int = 0,
        counts: tuple[int, int] | None = (1000, MAX_TOKENS),
        health: Callable[[], int] = lambda: 200,
        buckets: tuple[float, ...] = (),
    ) -> str:
        asked = [0]

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"

            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                if self.path in ("/health", "/v1/models"):
                    code = health()
                    data = b'{"data": [{"id": "m"}]}' if code == 200 else b""
                    self.send_response(code)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                    return
                if self.path != "/metrics" or not clock:
                    self.send_response(404)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                text = (
                    f"vllm:time_to_first_token_seconds_sum {asked[0] * ttft}\n"
                    f"vllm:time_to_first_token_seconds_count {asked[0] * (1 + extra)}\n"
                )
                for bound in (*buckets, float("inf")) if buckets else ():
                    le = "+Inf" if bound == float("inf") else f"{bound}"
                    under = asked[0] * (1 + extra) if ttft <= bound else 0
                    text += f'vllm:time_to_first_token_seconds_bucket{{le="{le}"}} {under}\n'
                for name, tokens in zip(("prompt", "generation"), counts or (), strict=False):
                    text += (
                        f"vllm:request_{name}_tokens_sum {asked[0] * tokens}\n"
                        f"vllm:request_{name}_tokens_count {asked[0]}\n"
                    )
                self.send_response(200)
                self.send_header("Content-Length", str(len(text)))
                self.end_headers()
                self.wfile.write(text.encode())

            def do_POST(self) -> None:
                asked[0] += 1
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                script(self, body)
                self.wfile.flush()

        srv = _Server(("127.0.0.1", 0), Handler)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        running.append(srv)
        return f"http://127.0.0.1:{srv.server_address[1]}"

    yield start
    for srv in running:
        srv.shutdown()
        srv.server_close()


def bench_at(url: str, timeout: float = 30.0, max_tokens: int = MAX_TOKENS) -> Bench:
    bench_spec = cases.Spec(
        Endpoint(url, "", adapters.VLLM), "m", cases.parse_cases(["regular"], ["1k"], [1]),
        max_tokens=max_tokens, warmup=False, timeout=timeout,
    )  # fmt: skip
    bench = Bench(bench_spec, None)
    bench.prompts = {"regular-1k": fixtures.load("regular").head(2000)}
    return bench


def point(url: str, spec: loadspec.LoadSpec, value: float) -> dict[str, Any]:
    return load.Load(bench_at(url), spec, None).point(value)


SLO = loadspec.parse_goodput("ttft:2s,itl:80ms,tpot:80ms,e2el:5s")


#: the control's SLO: met by an honest server on a box busy with two other test processes
#: and a busy core (the strict one above was missed there by 6 of 9 requests: their
#: threads waited for a CPU, which is the box, not a dishonest answer)
ROOMY = loadspec.parse_goodput("ttft:10s,itl:500ms,tpot:500ms,e2el:20s")


def test_an_honest_server_is_served_in_full(server: Callable[..., str]) -> None:
    """The control: every request whole, counted, good."""
    p = point(server(answer(gap=0.002)), loadspec.LoadSpec("rate", (8.0,), duration_s=1.0,
                                                           slo=ROOMY), 8.0)  # fmt: skip
    assert p["requests"] > 0
    assert p["completed"] == p["requests"] == p["good_requests"], p
    assert p["failed"] == p["short"] == p["bursts"] == 0, p
    assert p["tpot_ms"]["p50"] >= 2.0


@pytest.mark.parametrize("start", [False, True, "one-chunk"],
                         ids=["whole", "after-first-text", "one-chunk"])  # fmt: skip
def test_an_answer_delivered_at_once_has_no_decode_timing(
    server: Callable[..., str], start: bool | str
) -> None:
    """Text held back between the engine and the client and sent at once (a buffering
    frontend, or a starved API process): the client's gaps are the hold's, not the
    decode's. As in the single-stream bench, such an answer keeps its TTFT and E2E (what
    the client felt) but has no ITL or TPOT, so an ITL or TPOT SLO is not met, and the
    point counts it (``bursts``)."""

    def held(h: BaseHTTPRequestHandler, body: dict[str, Any]) -> None:
        if start == "one-chunk":  # every token in one chunk: no gap to time at all
            words = "".join(f" w{i}" for i in range(MAX_TOKENS))
            raw({"choices": [{"index": 0, "delta": {"content": words}}]},
                {"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]},
                {"choices": [], "usage": {"prompt_tokens": 1000,
                                          "completion_tokens": MAX_TOKENS}})(h, body)  # fmt: skip
            return
        if start:  # the first text, a wait, then the rest at once
            h.wfile.write(_event({"choices": [{"index": 0, "delta": {"content": " w"}}]}))
            h.wfile.flush()
            time.sleep(0.05)
        rest = MAX_TOKENS - 1 if start else MAX_TOKENS
        usage = {"prompt_tokens": 1000, "completion_tokens": MAX_TOKENS}
        answer(n=rest, usage=usage, at_once=True)(h, body)

    ttft_only = loadspec.parse_goodput("ttft:2s,e2el:5s")
    for slo, good in ((SLO, 0), (ttft_only, None)):
        spec = loadspec.LoadSpec("rate", (8.0,), duration_s=1.0, slo=slo)
        p = point(server(held), spec, 8.0)
        assert p["requests"] > 0
        assert p["completed"] == p["bursts"] == p["requests"], p["errors"]
        assert p["request_itl_ms"] is p["tpot_ms"] is p["itl_ms"] is None
        assert p["ttft_s"] is not None
        assert p["e2el_s"] is not None
        assert p["good_requests"] == (p["requests"] if good is None else good)
        assert all(r["client_timing"].startswith("burst: ") for r in p["requests_detail"])


@pytest.mark.parametrize(
    ("clock", "reason"),
    [
        ({"ttft": 1.0}, "text_before_first_token: "),  # text at once, first tokens at 1 s
        ({"extra": 1}, "engine_clock_unread: "),  # the clock blurred by made-up requests
    ],
)
def test_a_point_whose_first_texts_the_engine_clock_disowns_serves_no_request(
    server: Callable[..., str], clock: dict[str, Any], reason: str
) -> None:
    p = point(server(answer(), **clock), loadspec.LoadSpec("rate", (8.0,), duration_s=1.0), 8.0)
    assert p["requests"] > 0
    assert p["failed"] == p["requests"]
    assert p["errors"][0].startswith(reason), p["errors"]
    assert p["ttft_s"] is None


def test_a_vllm_server_without_its_ttft_clock_serves_no_request(
    server: Callable[..., str],
) -> None:
    """vLLM's TTFT histogram is what shows a point's first texts were the model's: a
    server whose /metrics lacks it (a frontend that hides it) fails every request."""
    p = point(server(answer(), clock=False), loadspec.LoadSpec("rate", (8.0,), duration_s=1.0), 8.0)
    assert p["requests"] > 0
    assert p["failed"] == p["requests"]
    assert p["errors"][0].startswith("engine_clock_unread: ")
    assert p["ttft_s"] is None
    assert all(r["completion_tokens"] == MAX_TOKENS for r in p["requests_detail"])


@pytest.mark.parametrize(
    ("script", "error"),
    [
        # ignore_eos was sent: an answer shorter than max_tokens was cut short
        (answer(n=1, finish="abort"), "finish_reason 'abort'"),
        (answer(n=2, finish="stop"), "cut short: 2 of 8 tokens"),
        # counts that would shrink ITL/TPOT or make throughput negative
        (answer(usage={"prompt_tokens": 1000, "completion_tokens": 100000}), "100000 completion"),
        (answer(usage={"prompt_tokens": 1000, "completion_tokens": -50000}), "-50000 completion"),
        (answer(usage={"prompt_tokens": 1000, "completion_tokens": True}), "True completion"),
        (answer(usage={"prompt_tokens": -7, "completion_tokens": 8}), "-7 prompt tokens"),
        (answer(usage=None), "carried no usage"),
        # chunks that are not what the API says
        (raw({"choices": [{"delta": {"content": "w"}}]}, {"choices": [{"delta": "oops"}]}),
         "delta is not an object"),
        (raw({"choices": "oops"}), "choices is not a list"),
        (raw({"choices": [{"delta": {"content": 5}}]}), "content is not text"),
        (raw([1, 2]), "not an object"),
    ],
    ids=["abort", "stop-early", "usage-huge", "usage-negative", "usage-bool",
         "prompt-negative", "no-usage", "delta-str", "choices-str", "content-int", "event-list"],
)  # fmt: skip
def test_a_lying_or_broken_answer_is_a_failed_request(
    server: Callable[..., str], script: Script, error: str
) -> None:
    spec = loadspec.LoadSpec("rate", (8.0,), duration_s=1.0, slo=SLO)
    p = point(server(script), spec, 8.0)
    assert p["requests"] > 0
    assert p["completed"] == 0
    assert p["failed"] == p["requests"]
    assert p["good_requests"] == 0
    assert p["request_throughput"] == p["output_throughput"] == 0
    assert all(error in r["error"] and not r["ok"] for r in p["requests_detail"]), p["errors"]
    assert "request(s) failed" in loadreport.saturation(p, None, None, spec)
    # the closed loop too: the point runs (no exception) and counts them as failed
    closed = point(server(script), loadspec.LoadSpec("concurrency", (1,), duration_s=0.3), 1)
    assert closed["requests"] > 0
    assert closed["completed"] == 0


def test_a_queue_that_grows_on_the_lightest_point_is_seen(
    server: Callable[..., str],
) -> None:
    """A server that answers one request at a time (0.25 s each, 4 a second), offered 14
    a second on the sweep's first point: the requests in flight grow through it. (At
    3.5 times what it serves: a client slowed by a busy core, offering 9 a second,
    still overloads it twice over.) The point's own median E2E spans most of it; the ramp ends by its first
    arrivals' E2E, so the growth is seen and the knee says the sweep began past it."""
    lock = threading.Lock()
    one_at_a_time = answer(gap=0.25 / MAX_TOKENS)

    def serial(h: BaseHTTPRequestHandler, body: dict[str, Any]) -> None:
        with lock:
            one_at_a_time(h, body)

    url = server(serial)
    spec = loadspec.LoadSpec("rate", (14.0, 28.0), duration_s=3.0, seed=3)
    sweep = load.Load(bench_at(url, timeout=60.0), spec, None)
    result = sweep.sweep()
    first = result["points"][0]
    assert first["completed"] == first["requests"] > 20
    assert first["saturated"], first["in_flight"]
    assert "the queue grew" in first["why"]
    assert result["knee"]["what"] == "the lightest point already saturated the server"


def counted(script: Script) -> Script:
    """``script``'s server with a /tokenize that counts whitespace-separated words (the
    tokenizer that sized the prompts, counting every answer again after the point)."""

    def both(h: BaseHTTPRequestHandler, body: dict[str, Any]) -> None:
        if h.path == "/tokenize":
            h.wfile.write(json.dumps({"count": len(body["prompt"].split())}).encode())
            return
        script(h, body)

    return both


def burst() -> Script:
    """Seven tokens paced, then an eighth chunk of 300 characters: text that arrived at
    once (usage honest about the eight chunks)."""

    def script(h: BaseHTTPRequestHandler, body: dict[str, Any]) -> None:
        for i in range(MAX_TOKENS):
            piece = f" w{i}" if i < MAX_TOKENS - 1 else " " + "y" * 300
            h.wfile.write(_event({"choices": [{"index": 0, "delta": {"content": piece}}]}))
        h.wfile.write(_event({"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]}))
        h.wfile.write(_event({"choices": [], "usage": {"prompt_tokens": 1000,
                                                       "completion_tokens": MAX_TOKENS}}))  # fmt: skip
        h.wfile.write(_event(b"[DONE]"))

    return script


@pytest.mark.parametrize(
    ("script", "max_tokens", "error"),
    [
        (answer(n=40, gap=0.001), 40, ""),  # the control: 40 words streamed, 40 claimed
        # 20 words streamed, 40 claimed: TPOT and ITL half what they were, throughput 2x
        (answer(n=20, usage={"prompt_tokens": 1000, "completion_tokens": 40}), 40,
         "usage_exceeds_stream: usage claims 40 output tokens; the streamed text is 20"),
        (burst(), MAX_TOKENS, "one chunk carried 301"),
    ],
    ids=["honest", "usage-lies", "burst"],
)  # fmt: skip
def test_a_load_answer_whose_text_does_not_back_its_usage_fails(
    server: Callable[..., str], script: Script, max_tokens: int, error: str
) -> None:
    """The load sweep counts every answer again after its point, as the single-stream
    bench does after each group: usage that claims tokens the text does not hold, or a
    chunk of text never decoded in the window, is a failed request, never a good one."""
    # the engine's counts agree with usage (a frontend that rewrites them too): the
    # recount of the streamed text is what catches the lie
    url = server(counted(script), counts=(1000, max_tokens))
    bench = bench_at(url, max_tokens=max_tokens)
    bench._tokenizer = sizing.Tokenizer("words", None)  # what prepare() found: /tokenize
    p = load.Load(bench, loadspec.LoadSpec("rate", (8.0,), duration_s=1.0, slo=SLO), None).point(
        8.0
    )
    bench.release()
    assert p["requests"] > 0
    if not error:
        assert p["completed"] == p["good_requests"] == p["requests"]
        return
    assert p["completed"] == p["good_requests"] == 0
    assert all(error in r["error"] for r in p["requests_detail"]), p["errors"]


def test_a_server_that_goes_away_mid_sweep_fails_the_sweep(
    server: Callable[..., str], tmp_path: Path
) -> None:
    """A server that closes its port during the second point (it died, or was
    restarted) refuses the point's requests: that is a broken server, not a saturated
    one. The sweep fails (exit 13) and its file says so, with the points that finished;
    it reports no knee."""

    def dies(h: BaseHTTPRequestHandler, body: dict[str, Any]) -> None:
        if "-load-r16-" in json.dumps(body):
            srv = h.server

            def close() -> None:
                srv.shutdown()
                srv.server_close()

            threading.Thread(target=close).start()
            return
        answer(gap=0.002)(h, body)

    out = tmp_path / "load.json"
    sweep = load.Load(bench_at(server(dies)), loadspec.LoadSpec("rate", (8.0, 16.0), duration_s=1.0),
                      out)  # fmt: skip
    with pytest.raises(BenchFailed) as err:
        sweep.sweep()
    assert "the server went away during the 16 req/s point" in str(err.value)
    assert "could not connect" in str(err.value)
    assert "not saturated" in (err.value.hint or "")
    saved = json.loads(out.read_text())
    assert saved["status"] == "failed"
    assert saved["error"] == str(err.value)
    assert saved["knee"] is None
    assert saved["run"]["ignore_eos"] is True  # what every load request asked vLLM for
    assert [p["value"] for p in saved["points"]] == [8.0, 16.0]
    assert saved["points"][0]["completed"] == saved["points"][0]["requests"] > 0


def test_a_lightest_point_that_served_nothing_fails_the_sweep(
    server: Callable[..., str], tmp_path: Path
) -> None:
    """Every request of the first point failed: the sweep fails and its file says so
    (status and error agree with the exit code), not "complete"."""
    out = tmp_path / "load.json"
    sweep = load.Load(bench_at(server(raw([1, 2]))),
                      loadspec.LoadSpec("rate", (8.0, 16.0), duration_s=1.0), out)  # fmt: skip
    with pytest.raises(BenchFailed) as err:
        sweep.sweep()
    assert str(err.value).startswith("every request of the lightest point (8 req/s) failed")
    saved = json.loads(out.read_text())
    assert (saved["status"], saved["error"]) == ("failed", str(err.value))
    assert len(saved["points"]) == 1


@pytest.mark.parametrize(
    ("counts", "reason"),
    [
        ((1000, 20), "usage_exceeds_engine: usage claims "),  # answers padded to twice
        ((400, 40), "usage_exceeds_engine: usage claims "),  # prompts cut short
        (None, "engine_counts_unread: "),  # the counts hidden from /metrics
    ],
    ids=["padded", "prompt-cut", "hidden"],
)
def test_a_point_whose_usage_the_engine_did_not_count_serves_no_request(
    server: Callable[..., str], counts: tuple[int, int] | None, reason: str
) -> None:
    """On vLLM the point's usage is checked against the engine's own per-request token
    counts, as a single-stream group's is: a frontend that pads each answer with text it
    counts as tokens (a decode twice as fast: the recount of the text agrees, the text is
    there) or prefills part of the prompt and reports it whole fails every request of
    the point; counts gone from /metrics prove nothing and fail them too."""
    spec = loadspec.LoadSpec("rate", (8.0,), duration_s=1.0, slo=SLO)
    url = server(answer(n=40, gap=0.002), counts=counts)
    p = load.Load(bench_at(url, max_tokens=40), spec, None).point(8.0)
    assert p["requests"] > 0
    assert p["failed"] == p["requests"], p["errors"]
    assert p["errors"][0].startswith(reason), p["errors"]
    assert p["tpot_ms"] is None
    assert p["good_requests"] == 0


def test_an_engine_dead_behind_its_proxy_fails_the_sweep(
    server: Callable[..., str], tmp_path: Path
) -> None:
    """From the second point on, a proxy answers 502 to every request and to the health
    check (its engine died): the server went away, it did not saturate. The sweep fails
    and reads no knee."""
    dead = threading.Event()

    def proxy(h: BaseHTTPRequestHandler, body: dict[str, Any]) -> None:
        if "-load-r16-" in json.dumps(body):
            dead.set()
        if dead.is_set():
            h.wfile.write(_event({"error": {"message": "502 Bad Gateway", "code": 502}}))
            return
        answer(gap=0.002)(h, body)

    url = server(proxy, health=lambda: 502 if dead.is_set() else 200)
    sweep = load.Load(bench_at(url), loadspec.LoadSpec("rate", (8.0, 16.0), duration_s=1.0),
                      tmp_path / "load.json")  # fmt: skip
    with pytest.raises(BenchFailed, match="the server went away during the 16 req/s point"):
        sweep.sweep()
    saved = json.loads((tmp_path / "load.json").read_text())
    assert saved["status"] == "failed"
    assert "it does not answer now (/health answered 502)" in saved["error"]
    assert saved["knee"] is None


def test_one_hung_request_does_not_pay_for_the_early_text_of_the_others(
    server: Callable[..., str],
) -> None:
    """A frontend sends a space at once on every request (its prefill takes 0.3 s by the
    engine's clock) and holds one request without text until the client gives up: the
    hung request's lifetime would cover the others' early texts in the sum, but not in
    the buckets, where its first token only adds to the engine's side."""
    hung = threading.Event()

    def early(h: BaseHTTPRequestHandler, body: dict[str, Any]) -> None:
        if not hung.is_set():
            hung.set()
            time.sleep(4.0)  # the client's timeout: cut off before any text
            return
        answer(gap=0.002)(h, body)

    url = server(early, ttft=0.3, buckets=(0.1, 0.5, 1.0))
    spec = loadspec.LoadSpec("rate", (8.0,), duration_s=1.5)
    p = load.Load(bench_at(url, timeout=3.0), spec, None).point(8.0)
    assert p["requests"] > 3
    assert p["failed"] == p["requests"], p["errors"]
    assert any(e.startswith("text_before_first_token: ") for e in p["errors"]), p["errors"]


def test_a_client_out_of_open_files_is_its_own_limit_not_a_dead_server(tmp_path: Path) -> None:
    """The client's open-file limit reached mid-point makes its sockets fail to open
    (EMFILE), which aiohttp reports as a connection error: that is the client's limit,
    said so, with what to do; not a server that went away."""
    import subprocess
    import sys

    script = (
        "import resource, json, sys\n"
        "from tests.bench.test_load_hostile import bench_at\n"
        "from servegate.bench import load, loadspec\n"
        "from servegate.errors import BenchFailed\n"
        "import os\n"
        "fds = len(os.listdir('/proc/self/fd'))\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (fds + 12, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))\n"
        "sweep = load.Load(bench_at(sys.argv[1], timeout=5.0), loadspec.LoadSpec('rate', (60.0,), duration_s=1.0), None)\n"
        "try:\n"
        "    sweep.sweep()\n"
        "except BenchFailed as exc:\n"
        "    print(json.dumps([str(exc), exc.hint]))\n"
    )  # fmt: skip
    slow = subprocess.Popen([sys.executable, "-c", SLOW_SERVER], stdout=subprocess.PIPE, text=True)
    try:
        assert slow.stdout is not None
        port = slow.stdout.readline().strip()
        run = subprocess.run([sys.executable, "-c", script, f"http://127.0.0.1:{port}"],
                             capture_output=True, text=True, timeout=120, check=False,
                             cwd=Path(__file__).parents[2])  # fmt: skip
    finally:
        slow.kill()
        slow.wait()
        if slow.stdout is not None:
            slow.stdout.close()
    said, hint = json.loads(run.stdout.strip().splitlines()[-1])
    assert said.startswith("the client ran out of open files at the 60 req/s point"), said
    assert "ulimit -n" in hint


#: a server in its own process that holds every chat request 3 s (so the client keeps a
#: socket open for each) and prints its port
SLOW_SERVER = r"""
import asyncio, socket

async def handle(reader, writer):
    try:
        await reader.readuntil(b"\r\n\r\n")
        await asyncio.sleep(3)
    except Exception:
        pass
    writer.close()

async def main():
    server = await asyncio.start_server(handle, "127.0.0.1", 0, backlog=4096)
    print(server.sockets[0].getsockname()[1], flush=True)
    async with server:
        await server.serve_forever()

asyncio.run(main())
"""
