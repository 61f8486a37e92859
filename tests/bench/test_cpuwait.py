"""The client's own wait for a CPU, left out of its stamps: the clock on scripted kernel
counters, then a real stream read by a thread kept off its CPU."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest

from servegate.bench import client, measure
from servegate.bench.cpuwait import ThreadWaits, parse
from servegate.bench.sse import Stream, now
from servegate.engine import adapters
from servegate.engine.openai import Endpoint

linux_only = pytest.mark.skipif(
    not os.path.exists("/proc/thread-self/schedstat"), reason="needs Linux's per-thread schedstat"
)


class Kernel:
    """Scripted counters: each read of the lines below happens at a set time, after a
    set wait for a CPU, sleeping in the read or not."""

    def __init__(self) -> None:
        self.t = 0.0
        self.waited = 0.0
        self.sleeps = 0

    def sample(self) -> tuple[float, int]:
        return self.waited, self.sleeps

    def read(self, at: float, waited: float, slept: bool) -> None:
        self.t, self.waited = at, self.waited + waited
        self.sleeps += slept


def read(script: list[tuple[str, float, float, bool]]) -> Stream:
    kernel = Kernel()

    def lines() -> Iterator[str]:
        for line, *how in script:
            kernel.read(*how)  # type: ignore[arg-type]
            yield line

    return parse(lines(), Stream(started=0.0), lambda: kernel.t, kernel.sample)


def text(piece: str) -> str:
    return "data: " + json.dumps({"choices": [{"index": 0, "delta": {"content": piece}}]})


ROLE = "data: " + json.dumps({"choices": [{"index": 0, "delta": {"role": "assistant"}}]})


def test_a_first_text_read_after_a_wait_for_the_cpu_says_how_long_it_waited() -> None:
    st = read([
        (ROLE, 1.09, 0.09, True),  # both came at 1.00 and woke the thread: read 0.09 s later
        ("", 1.09, 0.0, False),
        (text("a"), 1.09, 0.0, False),
        (text(" b"), 1.30, 0.02, True),  # later waits are not the first text's
    ])  # fmt: skip
    assert st.client_wait == pytest.approx(0.09)
    assert (st.first_text_at, st.early) == (1.09, [1.09, 1.30])  # the stamps stay as read


def test_a_wait_after_an_earlier_event_woke_the_thread_counts_whole() -> None:
    """An upper bound: the role-only event woke the thread as the prefill began (as
    ``transformers serve`` sends it); the first text came some time in the 2 s wait."""
    st = read([(ROLE, 2.1, 2.0, True), (text("a"), 2.1, 0.0, False)])
    assert st.client_wait == pytest.approx(2.0)


def test_a_sleep_between_the_role_event_and_the_first_text_starts_the_count_again() -> None:
    st = read([(ROLE, 0.2, 0.15, True), (text("a"), 1.0, 0.001, True)])
    assert st.client_wait == pytest.approx(0.001)


def test_a_wait_before_the_thread_first_slept_counts_too() -> None:
    st = read([(text("a"), 2.0, 0.5, False)])  # preempted, the bytes already there
    assert st.client_wait == pytest.approx(0.5)


def test_without_the_kernels_counters_the_wait_is_unknown() -> None:
    t = iter([3.0, 4.0])
    st = parse([text("a"), text("b")], Stream(started=0.0), lambda: next(t), lambda: None)
    assert (st.first_text_at, st.last_text_at, st.client_wait) == (3.0, 4.0, None)


def stream(ttft: float, wait: float | None) -> Stream:
    st = Stream(started=0.0, first_text_at=ttft, client_wait=wait, text_chunks=3)
    st.early, st.last_text_at, st.text = [ttft, ttft + 0.01, ttft + 0.02], ttft + 0.02, ["a"] * 3
    return st


def test_a_first_text_that_waited_for_the_client_drops_the_clients_timings() -> None:
    t = measure.trial(stream(0.2, 0.0853), measure.Rules())
    assert t["client_wait_s"] == 0.0853
    assert t["client_timing"].startswith("client wait: its first text waited 0.085 s")
    assert (t["ttft_s"], t["prefill_tps"], t["decode_window_s"]) == (None, None, None)


def test_a_wait_within_the_share_or_the_floor_or_unknown_keeps_them() -> None:
    for ttft, wait in ((2.0, 0.019), (0.05, 0.0009), (0.2, None)):  # 1 % of 2 s; < 1 ms
        t = measure.trial(stream(ttft, wait), measure.Rules())
        assert (t["client_timing"], t["ttft_s"], t["client_wait_s"]) == ("", ttft, wait)


@linux_only
def test_the_threads_counters_are_its_own_and_count_a_sleep() -> None:
    waits = ThreadWaits()
    try:
        first = waits()
        time.sleep(0.01)
        second = waits()
    finally:
        waits.close()
    assert first is not None
    assert second is not None
    assert second[0] >= first[0]  # the time waited for a CPU only grows
    assert second[1] > first[1]  # it slept
    assert waits() is None  # closed


PREFILL = 0.3
SERVER = r"""
import json, sys, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

class H(BaseHTTPRequestHandler):
    def log_message(self, *a): pass
    def event(self, delta):
        data = b"data: " + json.dumps({"choices": [{"index": 0, "delta": delta}]}).encode()
        self.wfile.write(data + b"\n\n"); self.wfile.flush()
    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200); self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        self.event({"role": "assistant", "content": ""})
        time.sleep(PREFILL)
        self.event({"content": "%.6f" % time.time()})  # the first text says when it left
        for i in range(20):
            time.sleep(0.01); self.event({"content": " w%d" % i})
        self.wfile.write(b'data: {"choices": [], "usage": {"prompt_tokens": 8, '
                         b'"completion_tokens": 21}}\n\ndata: [DONE]\n\n')

server = ThreadingHTTPServer(("127.0.0.1", 0), H)
print(server.server_address[1], flush=True)
server.serve_forever()
""".replace("PREFILL", repr(PREFILL))
#: a real-time busy loop on the reader's CPU, from 0.15 s after it starts for 0.6 s
HOG = (
    "import os, sys, time\n"
    "os.sched_setaffinity(0, {int(sys.argv[1])})\n"
    "os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))\n"
    "print('ready', flush=True)\n"
    "time.sleep(0.15)\n"
    "end = time.monotonic() + 0.6\n"
    "while time.monotonic() < end: pass\n"
)


@contextlib.contextmanager
def child(code: str, *args: str) -> Iterator[subprocess.Popen[str]]:
    with subprocess.Popen([sys.executable, "-c", code, *args], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True) as proc:  # fmt: skip
        try:
            yield proc
        finally:
            proc.kill()


@linux_only
def test_a_reader_kept_off_its_cpu_says_its_first_text_waited_for_it() -> None:
    """The reading thread shares one CPU with a real-time busy loop that starts before the
    first text leaves the server (0.3 s) and lasts until 0.75 s: the thread reads that
    text about 0.45 s late, and says that this was its own wait for a CPU."""
    cpu = min(os.sched_getaffinity(0))
    got: dict[str, object] = {}

    def read(url: str) -> None:
        os.sched_setaffinity(0, {cpu})
        endpoint = Endpoint(url, engine=adapters.VLLM)
        body = {"model": "m", "messages": [], "max_tokens": 21}
        with client.pool(endpoint, 30) as http:
            got["offset"] = time.time() - now()  # the two clocks, read together
            got["stream"] = client.stream_chat(endpoint, body, 30, http)

    with child(SERVER) as server:
        assert server.stdout is not None
        port = int(server.stdout.readline())
        with child(HOG, str(cpu)) as hog:
            assert hog.stdout is not None
            assert hog.stderr is not None
            if hog.stdout.readline().strip() != "ready":  # no CAP_SYS_NICE: no real-time hog
                pytest.skip(f"cannot run a real-time busy loop here: {hog.stderr.read()[-200:]}")
            thread = threading.Thread(target=read, args=(f"http://127.0.0.1:{port}",))
            thread.start()
            thread.join(60)
    st = got["stream"]
    assert isinstance(st, Stream)
    assert not st.error, got
    assert st.first_text_at is not None
    assert st.client_wait is not None
    offset = got["offset"]
    assert isinstance(offset, float)
    left = float(st.text[0]) - offset  # when the server sent it, on the stream's clock
    late = st.first_text_at - left
    assert late > 0.2, "the reader was not kept off its CPU: nothing to tell"
    # the wait is the lateness, but for the reader's own running: a wide margin
    assert late - 0.15 < st.client_wait <= late + 0.01
    assert "client wait" in measure.trial(st, measure.Rules())["client_timing"]
