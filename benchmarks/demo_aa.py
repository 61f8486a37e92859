"""A/B and A/A on the CPU demo (vLLM's CPU build) with one core kept busy.

    .venv/bin/python benchmarks/demo_aa.py --out benchmarks/cpu/demo-aa.json [--runs 5]
        [--workdir DIR] [--no-hog] [--engine transformers]

``--engine transformers`` runs the demo on ``transformers serve`` instead (on the CPU:
float32, the 4k tier); ``--runs 0`` leaves the A/A out (the demo's A/B and its seconds
alone).

1. **A/B**: ``servegate demo --json --keep-running`` — four commits promoted, each gated
   by the bench against the live release measured again before its switch (the fresh
   baseline); the fourth prefills about five times slower and must be rolled back.
2. **A/A**: ``servegate bench aa --runs N`` on the release the demo leaves serving: the
   gate on the live release against itself, with the gate's own plan and design, a
   restart where a promote would switch.

From the start, a second process keeps one of the box's cores busy (a Python busy loop),
as a neighbour's job would (``--no-hog``: a quiet box). Writes one JSON document: the
demo's promotes (verdict, exit code, the bench check's rows and baseline), the A/A
summary and runs, the seconds each part took, and the box (CPUs, load). The service is
stopped at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

SERVEGATE = Path(sys.executable).with_name("servegate")


def hog() -> subprocess.Popen[bytes]:
    """One core kept busy until killed."""
    return subprocess.Popen([sys.executable, "-c", "while True: pass"])


def servegate(*args: str) -> tuple[int, dict[str, Any], float]:
    start = time.monotonic()
    done = subprocess.run([str(SERVEGATE), *args], capture_output=True, text=True, check=False)
    seconds = time.monotonic() - start
    try:
        doc = json.loads(done.stdout)
    except json.JSONDecodeError:
        doc = {"stdout": done.stdout[-4000:], "stderr": done.stderr[-4000:]}
    return done.returncode, doc, seconds


def bench_rows(step: dict[str, Any]) -> dict[str, Any]:
    record = step.get("record") or {}
    checks = (record.get("gate") or {}).get("checks") or []
    for check in checks:
        if check.get("name") == "bench":
            ev = check.get("evidence") or {}
            return {
                "verdict": check.get("verdict"),
                "baseline": ev.get("baseline"),
                "design": (ev.get("design") or {}).get("name"),
                "rows": [
                    {k: r.get(k) for k in ("case", "metric", "verdict", "ratio", "interval")}
                    for r in ev.get("rows") or []
                ],
            }
    return {}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--workdir", type=Path, default=Path("build/demo-aa"))
    parser.add_argument("--no-hog", action="store_true")
    parser.add_argument("--engine", choices=("vllm", "transformers"), default="vllm")
    args = parser.parse_args()
    neighbour = None if args.no_hog else hog()
    report: dict[str, Any] = {
        "command": " ".join(sys.argv),
        "cpus": os.cpu_count(),
        "neighbour": "one core busy (a Python busy loop)" if neighbour else "none",
        "engine": args.engine,
    }
    try:
        code, demo, seconds = servegate(
            "demo", "--workdir", str(args.workdir), "--json", "--keep-running",
            *(["--engine", args.engine] if args.engine != "vllm" else []),
        )  # fmt: skip
        result = demo.get("result") or demo
        steps = result.get("steps") or result.get("promotes") or []
        report["demo"] = {
            "exit_code": code,
            "seconds": round(seconds, 1),
            "promotes": [
                {
                    "step": s.get("step"),
                    "sha": str(s.get("sha", ""))[:12],
                    "expected": s.get("expected"),
                    "verdict": s.get("verdict"),
                    "exit_code": s.get("exit_code"),
                    "seconds": s.get("seconds"),
                    "bench": bench_rows(s),
                }
                for s in steps
            ],
        }
        if not steps:
            report["demo"]["output"] = demo
        if args.runs < 1:
            return 0
        cfg = str(args.workdir / "servegate.toml")
        out = args.out.with_suffix(".runs.json")
        code, aa, seconds = servegate(
            "bench", "aa", "--runs", str(args.runs), "--config", cfg, "--out", str(out), "--json"
        )
        doc = aa.get("result") or aa
        report["aa"] = {
            "exit_code": code,
            "seconds": round(seconds, 1),
            "summary": doc.get("summary"),
            "runs": doc.get("runs"),
        }
        if code:
            report["aa"]["output"] = aa
        report["load_after"] = os.getloadavg()
    finally:
        if neighbour is not None:
            neighbour.kill()
        stop_service(args.workdir)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps({k: report[k] for k in ("demo", "aa") if k in report})[:3000])
    return 0


def stop_service(workdir: Path) -> None:
    """The demo's supervisord (and the service under it) is stopped."""
    found = subprocess.run(
        ["pgrep", "-f", f"supervisord -c {workdir.resolve()}"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    for pid in found.stdout.split():
        os.kill(int(pid), signal.SIGTERM)


if __name__ == "__main__":
    raise SystemExit(main())
