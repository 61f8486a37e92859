"""How an honest stream starts: the time to its first text against the gaps after it,
on the real CPU vLLM with the demo's tiny model, quiet and beside a CPU hog.

    .venv/bin/python benchmarks/first_gap.py [--words 200,1500,3500] [--repeats 8]
        [--max-tokens 128] [--json FILE]

The bench's check for text sent ahead of the prefill on engines without a clock of
their own (``measure.first_text_ahead``) compares the longest wait in a stream's start
with the time to its first text and with the stream's pace. This prints, per prompt
length and with or without a neighbour (a Python loop on one core), every stream's
TTFT, its first gap (first text → second), the median and mean of its later gaps and
its longest later gap: what an honest stream looks like, and how long a neighbour can
stall one anywhere in it.
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
WORDS = "the quick brown fox jumps over the lazy dog while servers stream tokens to clients"


def stream(url: str, n_words: int, max_tokens: int) -> dict[str, float]:
    prompt = " ".join(random.choice(WORDS.split()) for _ in range(n_words))
    body = {"model": "demo", "messages": [{"role": "user", "content": prompt}],
            "max_tokens": max_tokens, "stream": True, "ignore_eos": True}  # fmt: skip
    stamps = []
    t0 = time.perf_counter()
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=300) as r:
        for line in r.iter_lines():
            if not line.startswith("data:") or "[DONE]" in line:
                continue
            for c in json.loads(line[5:]).get("choices") or ():
                if (c.get("delta") or {}).get("content"):
                    stamps.append(time.perf_counter())
    gaps = [b - a for a, b in itertools.pairwise(stamps)]
    rest = gaps[1:]
    return {
        "ttft_s": round(stamps[0] - t0, 4),
        "first_gap_s": round(gaps[0], 4),
        "later_median_s": round(statistics.median(rest), 4),
        "later_mean_s": round(statistics.mean(rest), 4),
        "later_max_s": round(max(rest), 4),
    }


def main() -> int:
    from servegate.demo.local_server import vllm_server
    from tests.conftest import REAL_HOME

    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--words", default="200,1500,3500", help="prompt lengths in words")
    ap.add_argument("--repeats", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--json", type=Path, help="also write the rows here")
    args = ap.parse_args()
    rows = []
    with (
        tempfile.TemporaryDirectory(prefix="sg-first-gap-") as work,
        vllm_server(Path(work), home=REAL_HOME) as server,
    ):
        for hog in (False, True):
            neighbour = (
                subprocess.Popen([sys.executable, "-c", "while True: pass"]) if hog else None
            )
            try:
                for n in (int(w) for w in args.words.split(",")):
                    for _ in range(args.repeats):
                        row = {"words": n, "neighbour": hog,
                               **stream(server.url, n, args.max_tokens)}  # fmt: skip
                        rows.append(row)
                        print(json.dumps(row), flush=True)
            finally:
                if neighbour is not None:
                    neighbour.kill()
                    neighbour.wait()
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
