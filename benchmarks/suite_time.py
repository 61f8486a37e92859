"""How long CI's test command takes: a fresh clone of a commit, ``.ci/run`` in it (the
README's test command: bootstrap, pre-commit, pytest), with the suite in one test
process or spread over several.

    .venv/bin/python benchmarks/suite_time.py --out FILE [--processes 2] [--rev HEAD]
        [--busy]
    .venv/bin/python benchmarks/suite_time.py --out FILE --log CI.LOG --processes N
        --rev SHA --seconds S   (a run already made: its log read, its wall time given)

``--busy`` keeps one core busy the whole time (a shared CI box's neighbour). Writes one
JSON file: the commit, the processes, the wall seconds of the whole run, each pytest
phase's summary line and seconds, and the slowest tests pytest listed. The vLLM CPU
environment in ``~/.cache/servegate`` is built on first use and kept: a first run on a
new machine includes those two minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SUMMARY = re.compile(r"^=+ (.*\d+ passed.*) in ([\d.]+)s", re.M)
SLOW = re.compile(r"^([\d.]+)s (call|setup|teardown)\s+(\S+)$", re.M)


def read_log(text: str) -> dict[str, Any]:
    """The pytest phases (summary line, seconds) and the slowest tests of a CI log."""
    phases = [{"summary": m.group(1), "seconds": float(m.group(2))} for m in SUMMARY.finditer(text)]
    slowest = [
        {"seconds": float(m.group(1)), "when": m.group(2), "test": m.group(3)}
        for m in SLOW.finditer(text)
    ]
    failed = re.findall(r"^FAILED (\S+)", text, re.M)
    return {"phases": phases, "slowest": slowest, "failed": failed}


def run(rev: str, processes: int, busy: bool) -> tuple[str, float]:
    with tempfile.TemporaryDirectory(prefix="suite-time-") as tmp:
        clone = Path(tmp) / "clone"
        subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True)
        subprocess.run(["git", "-C", str(clone), "checkout", "-q", rev], check=True)
        env = {**os.environ, "CI": "true", "SERVEGATE_TEST_PROCESSES": str(processes)}
        hog = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if busy else None
        started = time.monotonic()
        try:
            done = subprocess.run(
                ["bash", ".ci/run"], cwd=clone, env=env, capture_output=True, text=True
            )
        finally:
            if hog:
                hog.kill()
        return done.stdout + done.stderr, time.monotonic() - started


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--processes", type=int, default=2)
    p.add_argument("--rev", default="HEAD")
    p.add_argument("--busy", action="store_true", help="keep one core busy throughout")
    p.add_argument("--log", type=Path, help="read this CI log instead of running")
    p.add_argument("--seconds", type=float, help="with --log: the run's wall seconds")
    args = p.parse_args()
    sha = subprocess.run(["git", "-C", str(REPO), "rev-parse", args.rev], check=True,
                         capture_output=True, text=True).stdout.strip()  # fmt: skip
    if args.log:
        text, seconds = args.log.read_text(errors="replace"), args.seconds
    else:
        text, seconds = run(sha, args.processes, args.busy)
    doc = {
        "command": " ".join(["benchmarks/suite_time.py", *sys.argv[1:]]),
        "commit": sha,
        "processes": args.processes,
        "busy": args.busy,
        "cpus": os.cpu_count(),
        "wall_seconds": round(seconds, 1) if seconds is not None else None,
        **read_log(text),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps({k: doc[k] for k in ("commit", "processes", "wall_seconds", "phases")}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
