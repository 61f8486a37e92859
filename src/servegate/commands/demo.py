"""``servegate demo``: promote two good commits, then two bad ones, on a local sandbox."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

from servegate import config as config_mod
from servegate.commands import args as common_args
from servegate.demo import sandbox, scenario, vllm_env
from servegate.engine.managers.supervisor import Supervisor
from servegate.errors import ConfigError
from servegate.output import Output
from servegate.pipeline.stages import Reporter
from servegate.release.context import Context
from servegate.release.promote import Outcome, promote

STEPS = (
    ("good #1", scenario.good_first, "released"),
    ("good #2", scenario.good_second, "released"),
    ("bad", scenario.bad_shared_kernels, "rolled_back"),
    ("slow", scenario.slow_prefill, "rolled_back"),
)


def _bench_summary(outcome: Outcome) -> str:
    """The bench gate's verdict and ratios, e.g. "PASS prefill 1.02x decode 0.97x"."""
    checks = (outcome.record or {}).get("gate", {}).get("checks", [])
    for check in checks:
        if check.get("name") != "bench":
            continue
        ratios = [
            f"{'prefill' if 'prefill' in r['metric'] else 'decode'} {r['ratio']:.2f}x"
            for r in check["evidence"].get("rows", [])
            if r["ratio"] is not None
        ]
        return " ".join([check["verdict"], *ratios]) if ratios else f"{check['verdict']} (first)"
    return "-"


def _row(step: str, outcome: Outcome, subject: str) -> list[str]:
    back = outcome.rollback.get("sha") if outcome.rollback else None
    what = outcome.tag if outcome.verdict == "released" else outcome.reason
    if back:
        what += f" → back on {str(back)[:12]}"
    startup = next((s["seconds"] for s in outcome.stages if s["name"] == "healthy"), 0.0)
    return [
        step,
        outcome.sha[:12],
        subject[:40],
        outcome.verdict,
        f"{outcome.seconds:.0f}s",
        f"{startup:.0f}s",
        _bench_summary(outcome),
        what,
    ]


def _serving_python(
    environ: dict[str, str], engine: str, arch: str, python: Path | None, reporter: Reporter
) -> Path:
    """The interpreter that serves: vLLM's demo environment, or for ``transformers serve``
    the one given, this one on a GPU, the demo environment (which carries transformers
    and its serving extras) on a CPU; checked before anything is built."""
    vllm_env.require_compiler(environ, arch)
    if engine == "vllm":
        if not arch.startswith("gfx"):
            raise ConfigError(
                f"the vLLM demo serves on the CPU with gfx kernels, not {arch}",
                hint="on an NVIDIA GPU: servegate demo --engine transformers --arch " + arch,
            )
        return vllm_env.ensure(environ, reporter)
    if python is None and arch.startswith("sm_"):
        python = Path(sys.executable)
    chosen = python or vllm_env.ensure_transformers_serve(environ, reporter)
    vllm_env.require_transformers_serve(chosen)
    return chosen


def run(
    out: Output,
    workdir: Path,
    keep_running: bool,
    stack_only: bool = False,
    *,
    engine: str = "vllm",
    arch: str = "gfx1030",
    python: Path | None = None,
) -> int:
    environ = dict(os.environ)
    reporter = out.reporter()
    if stack_only and engine != "vllm":
        raise ConfigError(
            "--stack-only makes the vLLM demo stack (the walkthrough's launch script)",
            hint="leave out --engine, or leave out --stack-only",
        )
    python = _serving_python(environ, engine, arch, python, reporter)
    if stack_only:
        return _stack_only(out, workdir, python)
    reporter.note(f"building the sandbox in {workdir} (bare origin, host root, tiny model) …")
    sb = sandbox.create(workdir, python, engine=engine, arch=arch)
    cfg = config_mod.load(sb.config, environ)
    rows: list[list[str]] = []
    results: list[dict[str, Any]] = []
    exit_code = 0
    failure = ""
    start = time.monotonic()
    try:
        for step, make_commit, expected in STEPS:
            sha = make_commit(sb)
            reporter.note(f"\n== {step}: release promote {sha}")
            ctx = Context.create(cfg, reporter, environ)
            outcome = promote(ctx, sha)
            rows.append(_row(step, outcome, ctx.deployer.repo.subject(sha)))
            results.append({"step": step, "expected": expected, **outcome.as_dict()})
            if outcome.verdict != expected:
                exit_code = outcome.exit_code or 1
                failure = (
                    f"step {step!r} ({sha[:12]}) ended {outcome.verdict}, "
                    f"expected {expected}: {outcome.reason or _bench_summary(outcome)}"
                )
                break
    finally:
        if not keep_running:
            Supervisor(cfg).shutdown_daemon()
    if out.json_mode:
        document: dict[str, Any] = {
            "sandbox": str(sb.root),
            "config": str(sb.config),
            "steps": results,
        }
        if failure:
            document["reason"] = failure
        return out.emit(document, exit_code)
    out.table(
        f"servegate demo — {time.monotonic() - start:.0f}s",
        ["step", "sha", "commit", "verdict", "total", "start-up", "bench gate", "tag / reason"],
        rows,
    )
    if failure:
        out.line(f"the demo did not go as expected: {failure}")
    out.line(f"sandbox: {sb.root}   config: {sb.config}")
    if keep_running:
        out.line(
            f"the service still runs: try `release status --config {sb.config}` "
            f"and `release verify --config {sb.config}`"
        )
    out.line(f"history: `release history --config {sb.config}`")
    return exit_code


def _stack_only(out: Output, workdir: Path, python: Path) -> int:
    """The demo stack, a model and an origin — no config, nothing promoted: the
    walkthrough in docs/box-setup.md starts here, as a team with its own stack would."""
    sb = sandbox.create(workdir, python, config=False)
    sha = sandbox.stack_only(sb)
    doc = {"stack": str(sb.work), "origin": str(sb.origin), "model": str(sb.model),
           "host_root": str(sb.host_root), "commit": sha}  # fmt: skip
    if out.json_mode:
        return out.emit(doc)
    out.line(f"the demo stack is in {sb.work} (origin {sb.origin}), at {sha[:12]}")
    out.line("it starts with launch.sh and builds with build.sh, as a team's stack would; next:")
    out.line(f"  cd {sb.work}")
    out.line(f'  servegate init --from-command launch.sh --build "bash build.sh" '
             f"--host-root {sb.host_root} --gate smoke")  # fmt: skip
    return 0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--workdir",
        type=Path,
        default=Path("demo-sandbox"),
        help="sandbox directory (default: ./demo-sandbox)",
    )
    p.add_argument(
        "--keep-running", action="store_true", help="leave the demo service running at the end"
    )
    p.add_argument(
        "--stack-only",
        action="store_true",
        help="only make the demo stack (origin, clone with launch.sh and build.sh, model); "
        "promote nothing (the walkthrough in docs/box-setup.md)",
    )
    p.add_argument(
        "--engine",
        choices=("vllm", "transformers"),
        default="vllm",
        help="the server the stack runs: vLLM's CPU build (default) or Hugging Face's "
        "`transformers serve` (on a GPU with --arch sm_90)",
    )
    p.add_argument(
        "--arch",
        default="gfx1030",
        help="the GPU arch the stack's kernels are built for (default gfx1030, hipcc); an "
        "NVIDIA arch such as sm_90 (nvcc) serves on that GPU with --engine transformers",
    )
    p.add_argument(
        "--python",
        type=Path,
        help="--engine transformers: the Python with torch, transformers and its serving "
        "extras (default: this one on a GPU, the demo's vLLM environment on a CPU)",
    )
    common_args.output(p)


def main(args: argparse.Namespace, out: Output) -> int:
    return run(
        out, args.workdir, args.keep_running, args.stack_only,
        engine=args.engine, arch=args.arch, python=args.python,
    )  # fmt: skip
