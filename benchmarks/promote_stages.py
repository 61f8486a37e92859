"""Time every stage of a promote and of a rollback on the demo (real vLLM).

    .venv/bin/python benchmarks/promote_stages.py [--workdir DIR] [--out FILE]

Runs the demo's three promotes (good, good, bad → automatic rollback) and then an
on-demand `release rollback`, and reports per-stage seconds, the tool's own overhead
(total minus build, service stop/start-up and probe time) and the rollback time against
the start-up time of the release it returns to.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from servegate import config as config_mod
from servegate.demo import sandbox, scenario, vllm_env
from servegate.engine.managers.supervisor import Supervisor
from servegate.pipeline import atomic
from servegate.pipeline.stages import ConsoleReporter
from servegate.release.context import Context
from servegate.release.promote import promote
from servegate.release.rollback import rollback

SERVICE = {"switch", "healthy", "rb switch", "rb healthy"}
PROBE = {"gate", "rb smoke"}


def overhead(stages: list[dict[str, Any]], total: float) -> dict[str, float]:
    def sum_of(names: set[str]) -> float:
        return float(sum(s["seconds"] for s in stages if s["name"] in names))

    build = sum_of({"build"})
    service = sum_of(SERVICE)
    probe = sum_of(PROBE)
    tool = total - build - service - probe
    return {
        "total_s": round(total, 3),
        "build_s": round(build, 3),
        "service_stop_start_s": round(service, 3),
        "probe_s": round(probe, 3),
        "tool_overhead_s": round(tool, 3),
        "tool_overhead_pct": round(100 * tool / total, 2) if total else 0.0,
    }


class Quiet(ConsoleReporter):
    def progress(self, text: str) -> None:
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--workdir", type=Path, default=Path(tempfile.gettempdir()) / "servegate-bench-sandbox"
    )
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/promote-stages.json"))
    args = parser.parse_args()
    environ = dict(os.environ)
    reporter = Quiet()
    python = vllm_env.ensure(environ, reporter)
    sb = sandbox.create(args.workdir, python)
    cfg = config_mod.load(sb.config, environ)
    runs: list[dict[str, Any]] = []
    try:
        for make in (scenario.good_first, scenario.good_second, scenario.bad_shared_kernels):
            ctx = Context.create(cfg, reporter, environ)
            outcome = promote(ctx, make(sb))
            runs.append(
                {
                    "what": f"promote ({outcome.verdict})",
                    "sha": outcome.sha,
                    "stages": outcome.stages,
                    **overhead(outcome.stages, outcome.seconds),
                    "rollback_s": outcome.rollback.get("seconds"),
                }
            )
        ctx = Context.create(cfg, reporter, environ)
        start = time.monotonic()
        result = rollback(ctx, None)
        total = time.monotonic() - start
        runs.append(
            {
                "what": "release rollback",
                "sha": result["sha"],
                "stages": result["stages"],
                **overhead(result["stages"], total),
            }
        )
    finally:
        Supervisor(cfg).shutdown_daemon()
    startup_second = next(s["seconds"] for s in runs[1]["stages"] if s["name"] == "healthy")
    startup_first = next(s["seconds"] for s in runs[0]["stages"] if s["name"] == "healthy")
    rb_startup = next(s["seconds"] for s in runs[2]["stages"] if s["name"] == "rb healthy")
    summary = {
        "auto_rollback_s": runs[2]["rollback_s"],
        # the same release's start-up measured inside the rollback: what is not start-up
        "auto_rollback_vs_its_own_startup": round(runs[2]["rollback_s"] / rb_startup, 3),
        "auto_rollback_vs_startup": round(runs[2]["rollback_s"] / startup_second, 3),
        "requested_rollback_s": runs[3]["total_s"],
        "requested_rollback_vs_startup": round(runs[3]["total_s"] / startup_first, 3),
    }
    atomic.write_json(args.out, {"schema": 1, "runs": runs, "summary": summary})
    print(f"\n{'run':<28}{'total':>8}{'build':>8}{'svc':>8}{'probe':>8}{'tool':>8}{'tool%':>7}")
    for r in runs:
        print(
            f"{r['what']:<28}{r['total_s']:8.2f}{r['build_s']:8.2f}{r['service_stop_start_s']:8.2f}"
            f"{r['probe_s']:8.2f}{r['tool_overhead_s']:8.2f}{r['tool_overhead_pct']:7.2f}"
        )
    print("\nper stage (s):")
    for r in runs:
        print(
            f"  {r['what']}: " + ", ".join(f"{s['name']} {s['seconds']:.2f}" for s in r["stages"])
        )
    print(f"\n{json.dumps(summary)}\nwritten to {args.out}")


if __name__ == "__main__":
    main()
