"""How fast the bench's streaming parser is, against the decode rates it measures.

    .venv/bin/python benchmarks/bench_client.py [RESULT.json ...]

Feeds a recorded-shape vLLM stream (one text delta per event, ~1.6 tokens per event as
vLLM flushes) through ``servegate.bench.sse.parse_lines`` on one core and reports
events/s. The fastest decode rate is read from the given result files (every valid
trial's ``generation_tps``); the parser must sustain at least 20 x that rate, counted
conservatively as one event per token.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path

from servegate.bench.sse import Stream, now, parse_lines

EVENTS = 200_000


def stream_lines(n: int) -> list[str]:
    words = ["the", " server", " answered", ",", " and", " then", " it", " kept", " going", "."]
    lines = []
    for i in range(n):
        event = {
            "id": "chatcmpl-0123456789abcdef",
            "object": "chat.completion.chunk",
            "created": 1796215690,
            "model": "demo",
            "choices": [
                {
                    "index": 0,
                    "delta": {"content": words[i % len(words)]},
                    "logprobs": None,
                    "finish_reason": None,
                }
            ],
        }
        lines.append("data: " + json.dumps(event))
        lines.append("")
    usage = {"prompt_tokens": 8192, "completion_tokens": n}
    lines.append("data: " + json.dumps({"choices": [], "usage": usage}))
    lines.append("data: [DONE]")
    return lines


def fastest_decode(paths: list[Path]) -> float:
    rates = []
    for path in paths:
        doc = json.loads(path.read_text())
        for case in doc.get("cases", []):
            for group in case["groups"]:
                rates += [t["generation_tps"] for t in group["trials"] if t["performance_valid"]]
    return max(rates) if rates else 0.0


def main() -> int:
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # one core
    lines = stream_lines(EVENTS)
    runs = []
    for _ in range(5):
        st = Stream(started=now())
        start = time.perf_counter()
        parse_lines(iter(lines), st, now)
        runs.append(EVENTS / (time.perf_counter() - start))
        assert st.text_chunks == EVENTS
        assert st.saw_done
    events_s = statistics.median(runs)
    print(f"parser: {events_s:,.0f} events/s on one core (median of 5 x {EVENTS:,} events)")
    paths = [Path(p) for p in sys.argv[1:]]
    fastest = fastest_decode(paths)
    if fastest:
        ratio = events_s / fastest
        verdict = "OK" if ratio >= 20 else "TOO SLOW"
        print(
            f"fastest decode measured: {fastest:,.1f} tok/s -> headroom {ratio:,.0f} x "
            f"(counting one event per token; target >= 20 x): {verdict}"
        )
        return 0 if ratio >= 20 else 1
    print("no result files given: pass servegate bench results to compare with their decode rates")
    return 0


if __name__ == "__main__":
    sys.exit(main())
