"""Time the provenance stage on the live vLLM demo (target: under 2 s for the whole tree).

    .venv/bin/python benchmarks/provenance_time.py [--rounds 10] [--under-load] [--out FILE]

Promotes the demo's first release (real vLLM CPU server under supervisord; the gate
reduced to the smoke probe, which does not change what provenance reads), then runs
the stage `release promote` runs — every process of the tree read from /proc, py-spy
on each Python process, every mapped file classified, the extension hashed by its
mapped inode, the module inference and the start-up hooks — ``--rounds`` times on the
live tree, and `py-spy dump` alone per process. Prints and writes seconds per round.
``--under-load``: the rounds run while a client keeps the server generating (on a small
box this saturates every core: what `release verify` costs on a busy production box).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from servegate import config as config_mod
from servegate.demo import sandbox, scenario, vllm_env
from servegate.engine.managers.supervisor import Supervisor
from servegate.pipeline import atomic
from servegate.pipeline.stages import QuietReporter
from servegate.provenance import check as provenance
from servegate.provenance import frames
from servegate.release import bringup
from servegate.release.context import Context
from servegate.release.promote import promote


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument(
        "--workdir", type=Path, default=Path(tempfile.gettempdir()) / "servegate-prov-sandbox"
    )
    parser.add_argument("--under-load", action="store_true")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    name = "provenance-under-load.json" if args.under_load else "provenance.json"
    args.out = args.out or Path("benchmarks/results") / name
    environ = dict(os.environ)
    reporter = QuietReporter()
    python = vllm_env.ensure(environ, reporter)
    sb = sandbox.create(args.workdir, python)
    cfg = config_mod.load(sb.config, environ)
    cfg = dataclasses.replace(cfg, gate=dataclasses.replace(cfg.gate, checks=("smoke",)))
    try:
        ctx = Context.create(cfg, reporter, environ)
        outcome = promote(ctx, scenario.good_first(sb))
        if outcome.verdict != "released":
            raise SystemExit(
                f"the demo release was not released: {outcome.verdict} ({outcome.reason})"
            )
        current = ctx.state.current
        assert current is not None
        rounds: list[float] = []
        report: provenance.Report | None = None
        stop = threading.Event()
        if args.under_load:
            url = f"http://127.0.0.1:{cfg.service.port}/v1/completions"

            def generate() -> None:
                while not stop.is_set():
                    httpx.post(url, json={"model": "demo", "prompt": "hello world " * 800,
                                          "max_tokens": 1000}, timeout=600)  # fmt: skip

            threading.Thread(target=generate, daemon=True).start()
            time.sleep(3)
        for _ in range(args.rounds):
            evidence = bringup.Evidence()
            start = time.perf_counter()
            report = bringup.prove(
                ctx, current.sha, Path(current.release_dir), current.artifacts, evidence
            )
            rounds.append(time.perf_counter() - start)
        stop.set()
        assert report is not None
        py_spy = frames.find_py_spy(cfg.provenance.py_spy)
        per_process: list[dict[str, Any]] = []
        for p in report.processes:
            start = time.perf_counter()
            seen = frames.observe(p["pid"], py_spy)
            per_process.append(
                {
                    "pid": p["pid"],
                    "title": p["cmdline"][:60],
                    "status": seen.status,
                    "py_spy_s": round(time.perf_counter() - start, 4),
                }
            )
    finally:
        Supervisor(cfg).shutdown_daemon()
    summary = {
        "processes": len(report.processes),
        "evidence": report.evidence,
        "mapped": report.mapped_summary,
        "median_s": round(statistics.median(rounds), 3),
        "max_s": round(max(rounds), 3),
        "min_s": round(min(rounds), 3),
        "target_s": 2.0,
        "under_load": args.under_load,
    }
    atomic.write_json(
        args.out,
        {"schema": 1, "rounds_s": [round(r, 4) for r in rounds], "py_spy": per_process,
         "summary": summary},
    )  # fmt: skip
    for p in per_process:
        print(f"  pid {p['pid']:<8} {p['status']:<10} py-spy {p['py_spy_s']:.3f}s  {p['title']}")
    print(json.dumps(summary))
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
