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
    set wait for a CPU, sleeping in the read or not, preempted in it or not."""

    def __init__(self) -> None:
        self.t = 0.0
        self.waited = 0.0
        self.runs = 0  # times put on a CPU
        self.sleeps = 0

    def sample(self) -> tuple[float, int, int]:
        return self.waited, self.runs, self.sleeps

    def read(self, at: float, waited: float, slept: bool, preempted: int = 0) -> None:
        self.t, self.waited = at, self.waited + waited
        self.runs += slept + preempted
        self.sleeps += slept


Script = list[tuple[str, float, float, bool] | tuple[str, float, float, bool, int]]


def lines_read(kernel: Kernel, script: Script) -> Iterator[str]:
    for line, *read in script:
        kernel.read(*read)  # type: ignore[arg-type]
        yield line


def text(piece: str) -> str:
    return "data: " + json.dumps({"choices": [{"index": 0, "delta": {"content": piece}}]})


def test_a_first_text_read_after_a_wait_for_the_cpu_is_stamped_when_it_came() -> None:
    kernel = Kernel()
    script: Script = [
        (text("a"), 1.09, 0.09, True),  # came at 1.00 (woke the thread), read 0.09 s later
        ("", 1.09, 0.0, False),
        (text(" b"), 1.10, 0.01, False),  # buffered behind it: read as it was
        ("", 1.10, 0.0, False),
        (text(" c"), 1.20, 0.0, True),
    ]
    st = parse(lines_read(kernel, script), Stream(started=0.5), lambda: kernel.t, kernel.sample)
    assert st.first_text_at == pytest.approx(1.00)
    assert st.client_wait == pytest.approx(0.09)
    assert st.early == pytest.approx([1.09, 1.10, 1.20])  # the start, as read


def test_a_backlog_at_the_end_keeps_its_read_time() -> None:
    """Chunks read at once after a wait came over the whole wait: pulling them back to
    when the first of them came would shorten the decode window and speed the rate."""
    kernel = Kernel()
    script: Script = [
        (text("a"), 1.0, 0.0, True),
        (text(" b"), 1.01, 0.0, True),
        (text(" c"), 5.0, 3.9, True),  # woke at 1.1, kept off the CPU until 5.0
        (text(" d"), 5.0, 0.0, False),  # came somewhere in between
    ]
    st = parse(lines_read(kernel, script), Stream(started=0.5), lambda: kernel.t, kernel.sample)
    assert (st.first_text_at, st.last_text_at) == (1.0, 5.0)
    assert st.client_wait == 0.0


def test_a_wait_before_the_thread_first_slept_for_bytes_is_not_taken_off() -> None:
    kernel = Kernel()
    # preempted before any read slept: what it read may have come just then
    script: Script = [(text("a"), 2.0, 0.5, False, 1), (text("b"), 2.1, 0.0, False)]
    st = parse(lines_read(kernel, script), Stream(started=0.0), lambda: kernel.t, kernel.sample)
    assert st.first_text_at == 2.0
    assert st.client_wait is None  # it cannot be told


def test_a_read_preempted_on_its_way_to_the_socket_moves_nothing() -> None:
    """Preempted for 26 ms before it slept, woken by the first text 1.27 s before it ran:
    the 1.296 s waited cannot be split, and taking it all off would end the TTFT 26 ms
    before the text was sent (seen beside a busy loop on 2 CPUs)."""
    kernel = Kernel()
    script: Script = [(text("a"), 1.536, 1.296, True, 1), (text("b"), 1.536, 0.0, False)]
    st = parse(lines_read(kernel, script), Stream(started=0.0), lambda: kernel.t, kernel.sample)
    assert st.first_text_at == 1.536
    assert st.client_wait is None


def test_without_the_kernels_counters_nothing_is_moved() -> None:
    t = iter([3.0, 4.0])
    st = parse([text("a"), text("b")], Stream(started=0.0), lambda: next(t), lambda: None)
    assert (st.first_text_at, st.last_text_at) == (3.0, 4.0)
    assert st.client_wait is None


def test_a_trial_says_how_long_its_first_text_waited_for_the_client() -> None:
    st = Stream(started=0.0, first_text_at=0.2, client_wait=0.0853, text_chunks=1)
    st.early, st.last_text_at = [0.2], 0.2
    assert measure.trial(st, measure.Rules())["client_wait_s"] == 0.0853
    st.client_wait = None  # the OS does not say
    assert measure.trial(st, measure.Rules())["client_wait_s"] is None


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
    assert second[1] > first[1]  # put back on a CPU after the sleep
    assert second[2] > first[2]  # and it slept
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
def test_a_reader_kept_off_its_cpu_still_times_the_first_text_when_it_came() -> None:
    """The reading thread shares one CPU with a real-time busy loop that starts before the
    first text leaves the server (0.3 s) and lasts until 0.75 s: the thread reads that
    text about 0.45 s late, and the stream's stamp is still the time it came."""
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
    read_at = st.first_text_at + st.client_wait
    assert read_at - left > 0.2, "the reader was not kept off its CPU: nothing to remove"
    # what is left of the client's lateness is its own running, not the wait: wide margin
    assert -0.01 < st.first_text_at - left < 0.15
    assert st.first_text_at - st.started >= PREFILL
