"""Does the load client keep up? Its scheduling lag (sent - due) at open-loop rates.

``servegate bench load`` records, for every request, how late it left against its
Poisson arrival time. A load figure is only the server's if that lag is small. This
benchmark drives the real load sweep (``servegate.bench.load``) against a server that
costs almost nothing: a separate process answering OpenAI-style streaming chat
completions (a fixed number of chunks at a fixed pace, the usage, ``[DONE]``), so the
client's own limits are what is measured. It prints, per rate, the requests, the p50 /
p99 / max lag, and the client process's CPU time. By default the server runs on the
last core and the client on the others (as a bench client and an engine's API process
sit on a serving host); ``--shared-cores`` lets them share every core.

    python benchmarks/load_client_lag.py [--rates 10,50,100,200] [--duration 10]
        [--shared-cores] [--no-telemetry] [--waits 0.25,1,2,4]

First it times the wait before an arrival alone (``--waits``, seconds, three times
each): how late one ``asyncio.sleep`` of that length ends, and how late the sweep's own
wait (``load._until``) hands over. At low rates the gaps between arrivals are seconds,
and a selector sleep of ``t`` ends up to ``t / 1000`` late (Linux's timer slack), so the
lag at 0.5 req/s is the wait's, not the load's.

On a GPU host the bench samples the vendor's tool (``nvidia-smi``) in a thread beside the
event loop while a point runs, as ``servegate bench load`` does; ``--no-telemetry``
leaves it out, so the two runs show what that thread costs the client's lag.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import subprocess
import sys
import time
from pathlib import Path

SERVER = r"""
import asyncio, json, sys

CHUNKS, PACE = int(sys.argv[2]), float(sys.argv[3])


def event(obj):
    data = f"data: {json.dumps(obj)}\n\n".encode()
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


async def handle(reader, writer):
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode().split("\r\n")
            method, path = lines[0].split()[:2]
            sizes = [x for x in lines if x.lower().startswith("content-length")]
            length = int(sizes[0].split(":")[1]) if sizes else 0
            if length:
                await reader.readexactly(length)
            if path.endswith("/models"):
                body = json.dumps({"data": [{"id": "lag", "owned_by": "bench"}]}).encode()
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                             + f"content-length: {len(body)}\r\n\r\n".encode() + body)
                await writer.drain()
                continue
            if not path.endswith("/chat/completions"):
                writer.write(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n")
                await writer.drain()
                continue
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                         b"transfer-encoding: chunked\r\n\r\n")
            for i in range(CHUNKS):
                await asyncio.sleep(PACE)
                writer.write(event({"choices": [{"index": 0, "delta": {"content": f" w{i}"}}]}))
                await writer.drain()
            writer.write(event({"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]}))
            writer.write(event({"choices": [], "usage": {"prompt_tokens": 1000,
                                "completion_tokens": CHUNKS, "total_tokens": 1000 + CHUNKS}}))
            data = b"data: [DONE]\n\n"
            writer.write(f"{len(data):x}\r\n".encode() + data + b"\r\n0\r\n\r\n")
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


async def main():
    server = await asyncio.start_server(handle, "127.0.0.1", int(sys.argv[1]), backlog=4096)
    async with server:
        await server.serve_forever()

asyncio.run(main())
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def time_waits(waits: list[float], repeats: int = 3) -> list[dict[str, object]]:
    """How late one selector sleep, and the sweep's own wait, end after ``wait`` seconds."""
    import asyncio

    from servegate.bench import load, sse

    async def late(wait: float, own: bool) -> float:
        due = sse.now() + wait
        if own:
            await load._until(due)
        else:
            await asyncio.sleep(wait)
        return (sse.now() - due) * 1000

    rows = []
    print(f"{'wait s':>7} {'one sleep: late ms (max)':>25} {'sweep wait: late ms (max)':>26}")
    for wait in waits:
        plain = [asyncio.run(late(wait, False)) for _ in range(repeats)]
        own = [asyncio.run(late(wait, True)) for _ in range(repeats)]
        rows.append({"wait_s": wait, "sleep_late_ms": [round(x, 3) for x in plain],
                     "until_late_ms": [round(x, 3) for x in own]})  # fmt: skip
        print(f"{wait:>7g} {max(plain):>25.3f} {max(own):>26.3f}")
    return rows


def main() -> int:
    from servegate.bench import cases, fixtures, load, loadspec
    from servegate.bench.driver import Bench
    from servegate.engine import adapters
    from servegate.engine.openai import Endpoint

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rates", default="10,50,100,200")
    ap.add_argument("--duration", type=float, default=10.0)
    ap.add_argument("--chunks", type=int, default=32, help="chunks a response")
    ap.add_argument("--pace", type=float, default=0.01, help="seconds between chunks")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    ap.add_argument("--waits", default="0.25,1,2,4",
                    help="time the wait before an arrival alone first, for these "
                    "lengths in seconds ('' to skip)")  # fmt: skip
    ap.add_argument("--shared-cores", action="store_true",
                    help="let the server and the client share every core (default: the "
                    "server on the last core, the client on the others, as a bench "
                    "client and an engine's API process are on a serving host)")  # fmt: skip
    ap.add_argument("--no-telemetry", action="store_true",
                    help="do not sample the GPU tool during the points")  # fmt: skip
    args = ap.parse_args()
    cores = sorted(os.sched_getaffinity(0))
    pin = not args.shared_cores and len(cores) > 1

    waits = time_waits([float(w) for w in args.waits.split(",") if w.strip()])
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-c", SERVER, str(port), str(args.chunks), str(args.pace)],
        preexec_fn=(lambda: os.sched_setaffinity(0, cores[-1:])) if pin else None,
    )
    if pin:
        os.sched_setaffinity(0, cores[:-1])
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port), 0.2).close()
                break
            except OSError:
                time.sleep(0.05)
        endpoint = Endpoint(url, "", adapters.by_name("openai"))
        spec = cases.Spec(endpoint, "lag", cases.parse_cases(["regular"], ["1k"], [1]),
                          max_tokens=args.chunks, warmup=False)  # fmt: skip
        bench = Bench(spec, None)
        if args.no_telemetry:
            bench.telemetry = None
        bench.prompts = {"regular-1k": fixtures.load("regular").head(4000)}
        rates = tuple(float(r) for r in args.rates.split(","))
        plan = loadspec.LoadSpec("rate", rates, duration_s=args.duration, seed=1)
        sweep = load.Load(bench, plan, None)
        rows = []
        print(f"{'rate/s':>7} {'requests':>8} {'failed':>6} {'lag p50 ms':>10} "
              f"{'lag p99 ms':>10} {'lag max ms':>10} {'client CPU s':>12}")  # fmt: skip
        for rate in rates:
            cpu0 = resource.getrusage(resource.RUSAGE_SELF)
            p = sweep.point(rate)
            cpu1 = resource.getrusage(resource.RUSAGE_SELF)
            cpu = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)
            lag = p["lag_ms"] or {}
            rows.append({"rate": rate, "requests": p["requests"], "failed": p["failed"],
                         "lag_ms": lag, "client_cpu_s": round(cpu, 2)})  # fmt: skip
            p50, p99, top = (lag.get(k, 0.0) for k in ("p50", "p99", "max"))
            print(f"{rate:>7g} {p['requests']:>8} {p['failed']:>6} {p50:>10.3f} "
                  f"{p99:>10.3f} {top:>10.3f} {cpu:>12.2f}")  # fmt: skip
        if args.json:
            figures = {"cpus": os.cpu_count(), "pinned": pin, "rows": rows, "waits": waits,
                       "telemetry": bench.telemetry.tool if bench.telemetry else None}  # fmt: skip
            args.json.write_text(json.dumps(figures, indent=1))
    finally:
        server.terminate()
        server.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
