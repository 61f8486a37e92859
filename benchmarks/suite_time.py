"""How long CI's test command takes: a fresh clone of a commit, ``.ci/run`` in it (the
README's test command: bootstrap, pre-commit, pytest), with the suite in one test
process or spread over several.

    .venv/bin/python benchmarks/suite_time.py --out FILE [--processes 2] [--rev HEAD]
        [--busy]
    .venv/bin/python benchmarks/suite_time.py --out FILE --log CI.LOG --processes N
        --rev SHA --seconds S   (a run already made: its log read, its wall time given)

``--busy`` keeps one core busy the whole time (a shared CI box's neighbour). Writes one
JSON file: the commit, the processes, the wall seconds of the whole run, the CPU seconds
the box spent in it (``/proc/stat``) and those of the busy loop, each pytest phase's
summary line and seconds, and the slowest tests pytest listed. The box's CPU seconds less
the busy loop's are the suite's (and anything else the box ran meanwhile): near the wall
seconds times the free cores, the suite is bound by CPU, and more test processes cannot
make it faster. The vLLM CPU
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


def box_cpu_seconds() -> float:
    """CPU seconds the box has spent since boot, all cores (``/proc/stat``'s cpu line
    less idle and iowait)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def process_cpu_seconds(pid: int) -> float:
    stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(stat[11]) + int(stat[12])) / os.sysconf("SC_CLK_TCK")


def run(rev: str, processes: int, busy: bool) -> tuple[str, float, dict[str, float]]:
    """The run's output, its wall seconds and the CPU seconds the box and the busy loop
    spent in it."""
    with tempfile.TemporaryDirectory(prefix="suite-time-") as tmp:
        clone = Path(tmp) / "clone"
        subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True)
        subprocess.run(["git", "-C", str(clone), "checkout", "-q", rev], check=True)
        env = {**os.environ, "CI": "true", "SERVEGATE_TEST_PROCESSES": str(processes)}
        hog = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if busy else None
        spent: dict[str, float] = {}
        started, cpu = time.monotonic(), box_cpu_seconds()
        try:
            done = subprocess.run(
                ["bash", ".ci/run"], cwd=clone, env=env, capture_output=True, text=True
            )
        finally:
            spent["box_cpu_seconds"] = round(box_cpu_seconds() - cpu, 1)
            if hog:
                spent["busy_loop_cpu_seconds"] = round(process_cpu_seconds(hog.pid), 1)
                hog.kill()
        return done.stdout + done.stderr, time.monotonic() - started, spent


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--processes", type=int, default=2)
    p.add_argument("--rev", default="HEAD")
    p.add_argument("--busy", action="store_true", help="keep one core busy throughout")
    p.add_argument("--log", type=Path, help="read this CI log instead of running")
    p.add_argument("--seconds", type=float, help="with --log: the run's wall seconds")
    p.add_argument("--save-log", type=Path, help="also write the run's whole output here")
    args = p.parse_args()
    sha = subprocess.run(["git", "-C", str(REPO), "rev-parse", args.rev], check=True,
                         capture_output=True, text=True).stdout.strip()  # fmt: skip
    if args.log:
        spent: dict[str, float] = {}
        text, seconds = args.log.read_text(errors="replace"), args.seconds
    else:
        text, seconds, spent = run(sha, args.processes, args.busy)
        if args.save_log:
            args.save_log.write_text(text)
    doc = {
        "command": " ".join(["benchmarks/suite_time.py", *sys.argv[1:]]),
        "commit": sha,
        "processes": args.processes,
        "busy": args.busy,
        "cpus": os.cpu_count(),
        "wall_seconds": round(seconds, 1) if seconds is not None else None,
        **spent,
        **read_log(text),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps({k: doc[k] for k in ("commit", "processes", "wall_seconds", "phases")}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
