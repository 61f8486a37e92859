"""Command line: ``servegate …`` and its shorthand ``release …``.

One top-level handler turns every ServegateError into its message and exit code,
Ctrl-C into 130, and anything unexpected into 70 with a traceback file to attach to a
bug report.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import logging
import os
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from servegate import config as config_mod
from servegate.about import version_line
from servegate.errors import INTERNAL_ERROR, INTERRUPTED, ConfigError, ServegateError
from servegate.output import Output
from servegate.pipeline import interrupts
from servegate.pipeline.gitenv import scrub_git_env

if TYPE_CHECKING:
    from servegate.bench.loadspec import LoadSpec


class _Version(argparse.Action):
    """``--version``: the version and the commit servegate was installed from
    (:mod:`servegate.about`), worked out only when asked."""

    def __call__(self, parser: argparse.ArgumentParser, *_: object) -> None:
        from servegate.about import version_line

        print(version_line())
        parser.exit()


#: the release commands that switch the live service: SIGTERM and SIGHUP stop them as
#: Ctrl-C does (after the switch, the previous release is put back), whatever SIGINT
#: they inherited
SWITCHING = ("promote", "rollback", "recover")

RELEASE_REF_HELP = (
    "a runner that releases: take only jobs of this ref whose workflow file comes from it "
    "(e.g. refs/heads/main); pull requests' jobs are refused"
)
RELEASE_REPO_HELP = (
    "with --release-ref on an organisation's runner: the repository (OWNER/REPO) whose "
    "jobs it takes (default: the one --url names)"
)


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config",
        type=Path,
        default=Path("servegate.toml"),
        metavar="PATH",
        help="config file (default: ./servegate.toml)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON document on stdout")
    parser.add_argument("-v", "--verbose", action="store_true", help="echo every command run")


def _release_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("promote", help="deploy, verify and mark a SHA; roll back on failure")
    p.add_argument("sha", help="the commit to release (on the configured branch)")
    p.add_argument(
        "--allow-non-ff",
        action="store_true",
        help="allow a SHA that is not a descendant of the live release",
    )
    _common(p)
    p = sub.add_parser("rollback", help="make the previous (or a given) release live again")
    p.add_argument("--to", metavar="SHA", help="an earlier release of this host")
    _common(p)
    p = sub.add_parser("status", help="the live and previous release and the service's state")
    _common(p)
    p = sub.add_parser("history", help="every promote and rollback on this host")
    p.add_argument("-n", type=int, default=20, help="show the last N (0: all)")
    _common(p)
    p = sub.add_parser("verify", help="prove the live service runs the live release's checkout")
    _common(p)
    p = sub.add_parser(
        "recover", help="undo a promote or rollback that was interrupted after its switch"
    )
    p.add_argument(
        "--rebuild-state",
        action="store_true",
        help="make the host state again from this host's release notes and release "
        "directories (the damaged file is kept aside)",
    )
    p.add_argument(
        "--wait",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="wait up to this long for a promote or rollback still running on this host to "
        "end, then recover what it left (default: fail at once, exit 4)",
    )
    _common(p)


def _bench_run_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", help="server base URL (default: from the config's [service])")
    p.add_argument("--model", help="served model name (default: service.model or the first)")
    p.add_argument("--api-key-env", metavar="NAME", help="environment variable with the API key")
    p.add_argument("--profiles", metavar="LIST", help="regular,coding (default: bench.profiles)")
    p.add_argument("--tiers", metavar="LIST",
                   help="of 8k,16k,32k,64k,128k, or 1k,2k,4k for smoke-sized runs "
                   "(default: bench.tiers)")  # fmt: skip
    p.add_argument("--repetitions", type=int, metavar="N", help="groups per case")
    p.add_argument("--concurrency", metavar="LIST", help="streams started together, e.g. 1,4")
    p.add_argument("--max-tokens", type=int, metavar="N", help="exact output tokens (1024)")
    p.add_argument("--tolerance", type=float, metavar="PCT", help="prompt size tolerance in %%")
    p.add_argument("--seed", type=int, help="per-request seed (3407; -1: none sent)")
    p.add_argument("--no-warmup", action="store_true", help="skip the warm-up request")
    p.add_argument("--ignore-eos", action="store_true", help="force the output length (recorded)")
    p.add_argument("--output", type=Path, metavar="FILE", help="result file (JSON)")
    p.add_argument("--no-lease", action="store_true", help="do not take the host's GPU lease")
    p.add_argument(
        "--engine",
        choices=("vllm", "transformers", "openai"),
        help="the server's engine (default: the config's; with --url: from /v1/models)",
    )
    p.add_argument(
        "--tokenizer",
        metavar="DIR",
        help="the model's tokenizer files, to size prompts for a server without /tokenize",
    )
    p.add_argument(
        "--tokenizer-python",
        metavar="PATH",
        help="a Python with transformers that reads --tokenizer (default: this one)",
    )


def _load_command(bsub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    lo = bsub.add_parser(
        "load", help="a load sweep: open-loop rates or closed-loop concurrencies, to the knee"
    )
    how = lo.add_mutually_exclusive_group(required=True)
    how.add_argument("--rates", metavar="LIST", help="requests a second, e.g. 0.5,1,2,4")
    how.add_argument("--concurrencies", metavar="LIST", help="clients, e.g. 1,2,4,8")
    lo.add_argument("--duration", type=float, default=30.0, help="seconds a point (30)")
    lo.add_argument(
        "--burstiness", type=float, default=1.0,
        help="gamma shape of the arrival gaps: 1 Poisson, <1 burstier (1)",
    )  # fmt: skip
    lo.add_argument("--load-seed", type=int, default=0, help="arrivals and prompt draws (0)")
    lo.add_argument("--goodput", default="", metavar="SLOS", help="e.g. ttft:2s,itl:80ms")
    lo.add_argument("--workload", choices=("cold", "shared-prefix"), default="cold")
    lo.add_argument(
        "--prefix-share", type=float, default=0.0,
        help="shared-prefix: the share of every prompt that is common (e.g. 0.8)",
    )  # fmt: skip
    lo.add_argument(
        "--no-stop", action="store_true", help="run every point, past the first saturated one"
    )
    _bench_run_options(lo)
    _common(lo)


def _bench_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    b = sub.add_parser(
        "bench",
        help="long-context bench of an OpenAI-compatible server (or: bench compare / bench gate)",
    )
    _bench_run_options(b)
    b.add_argument("--server-command", default="", help="the server's launch command (recorded)")
    b.add_argument("--system", default="", help="cards, OS, driver, engine version (recorded)")
    b.add_argument("--server-log", type=Path, help="the server's log file (scanned for JIT)")
    b.add_argument(
        "--probes", default="", help="also run: correctness,prefix_reuse,vision,spec_decode"
    )
    b.add_argument("--baseline", type=Path, help="judge this run against a result file")
    b.add_argument("--lenient", action="store_true", help="allow another harness's baseline")
    _common(b)
    bsub = b.add_subparsers(
        dest="bench_command", required=False, metavar="[compare|gate|noise|aa|load|export]"
    )
    cmp_ = bsub.add_parser("compare", help="A/B: two result files, or two live servers (ABAB…)")
    cmp_.add_argument("files", nargs="*", type=Path, metavar="FILE", help="A.json B.json")
    cmp_.add_argument("--a-url", help="live server A")
    cmp_.add_argument("--b-url", help="live server B")
    cmp_.add_argument("--rounds", type=int, default=3, help="ABAB rounds per case (default 3)")
    cmp_.add_argument("--confidence", type=float, default=0.90, help="interval level (0.90)")
    cmp_.add_argument("--lenient", action="store_true", help="allow another harness's file")
    _bench_run_options(cmp_)
    _common(cmp_)
    gat = bsub.add_parser("gate", help="judge a candidate result file against a baseline file")
    gat.add_argument("baseline", type=Path)
    gat.add_argument("candidate", type=Path)
    gat.add_argument("--lenient", action="store_true", help="allow another harness's file")
    _common(gat)
    noi = bsub.add_parser(
        "noise", help="measure the box's noise on the live release (restarts it) and plan the gate"
    )
    noi.add_argument("--restarts", type=int, default=2, help="service restarts (default 2)")
    noi.add_argument("--repetitions", type=int, default=5, help="groups a start (default 5)")
    _common(noi)
    aa = bsub.add_parser(
        "aa",
        help="the live release against itself N times with the gate's own rule and design "
        "(restarts it): how often this box rolls back an unchanged release",
    )
    aa.add_argument("--runs", type=int, default=10, help="gates to run (default 10)")
    aa.add_argument("--out", type=Path, help="the result file (default: bench results dir)")
    _common(aa)
    _load_command(bsub)
    exp = bsub.add_parser(
        "export", help="a result file (bench or load) as PyTorch benchmark JSON lines or CSV"
    )
    exp.add_argument("file", type=Path, metavar="FILE", help="a servegate result file")
    exp.add_argument("--format", choices=("pytorch", "csv"), default="pytorch")
    exp.add_argument(
        "--out",
        help="where to write: a file, or a folder (an existing one, or "
        "one given with a trailing /) to write FILE's name in (default: beside FILE)",
    )
    _common(exp)
    rep = sub.add_parser("report", help="bench history of the stack as a PNG and an HTML page")
    rep.add_argument("--out", type=Path, default=Path("servegate-report"), help="output directory")
    rep.add_argument("files", nargs="*", type=Path, metavar="FILE", help="extra result files")
    _common(rep)


def _launch_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--profile", help="a shipped profile name or a profile file (default: the config's)"
    )
    p.add_argument(
        "--param",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a profile parameter (repeatable)",
    )
    p.add_argument("--release", metavar="DIR", help="the release directory ({release})")
    p.add_argument("--sha", help="the release's commit (keys the compile caches)")
    p.add_argument("--port", type=int, help="the service port ({port})")
    _common(p)


def _init_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    ini = sub.add_parser(
        "init", help="write servegate.toml (and a launch profile) for this stack checkout"
    )
    ini.add_argument("--dir", type=Path, default=Path("."), help="the stack checkout (default: .)")
    ini.add_argument(
        "--from-command",
        type=Path,
        metavar="SCRIPT",
        help="your shell launch script: its exports and arguments become launch.toml",
    )
    ini.add_argument("--model", default="", help="without a script: the model vLLM serves")
    ini.add_argument(
        "--python", default="python3", help="without a script: the Python that has vLLM"
    )
    ini.add_argument("--port", type=int, help="the service port (default: the script's, or 8000)")
    ini.add_argument(
        "--host-root",
        type=Path,
        help="where releases and records live (default: ~/.local/share/servegate/NAME)",
    )
    ini.add_argument("--unit", default="", help="the service's name (default: the checkout's)")
    ini.add_argument("--build", default="", help='the build command, e.g. "bash build.sh"')
    ini.add_argument(
        "--artifacts",
        action="append",
        default=[],
        metavar="GLOB",
        help="what the build makes (repeatable; default with --build: build/*.so)",
    )
    ini.add_argument(
        "--gate", default="smoke,bench", help="gate checks, comma-separated (default smoke,bench)"
    )
    ini.add_argument("--tiers", default="16k", help="bench tiers, comma-separated (default 16k)")
    ini.add_argument("--force", action="store_true", help="replace files init would write")
    ini.add_argument("--json", action="store_true", help="print one JSON document on stdout")
    ini.add_argument("-v", "--verbose", action="store_true", help="echo every command run")


def _profile_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    ren = sub.add_parser("render", help="the exact command, environment and unit of a launch")
    ren.add_argument("--format", choices=("all", "shell", "env", "unit", "json"), default="all")
    _launch_options(ren)
    lnt = sub.add_parser("lint", help="check a launch against the lint rules (exit 15 on fail)")
    lnt.add_argument("--rules", action="store_true", help="list the rules instead")
    _launch_options(lnt)


def release_parser(prog: str = "release") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description="servegate releases")
    sub = parser.add_subparsers(dest="release_command", required=True, metavar="COMMAND")
    _release_commands(sub)
    return parser


def servegate_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="servegate", description="Git-centric release pipeline for LLM serving stacks"
    )
    parser.add_argument("--version", "-V", action=_Version, nargs=0, help="version and commit")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    rel = sub.add_parser("release", help="promote, rollback, status, history, verify, recover")
    rsub = rel.add_subparsers(dest="release_command", required=True, metavar="COMMAND")
    _release_commands(rsub)
    cfg = sub.add_parser("config", help="config file tools")
    csub = cfg.add_subparsers(dest="config_command", required=True, metavar="COMMAND")
    chk = csub.add_parser("check", help="validate a config file, and what this box shows")
    _common(chk)
    chk.add_argument(
        "--offline", action="store_true", help="skip what needs the network (the remote)"
    )
    bld = sub.add_parser("build", help="build the stack's GPU extensions for build.archs (cached)")
    bld.add_argument("--dir", type=Path, default=Path("."), help="the stack checkout (default: .)")
    bld.add_argument(
        "--cache-dir", type=Path, help="build cache (default: ~/.cache/servegate/build-cache)"
    )
    bld.add_argument("--no-cache", action="store_true", help="always compile")
    bld.add_argument(
        "--arch",
        action="append",
        default=[],
        metavar="ARCH",
        help="build for ARCH instead of build.archs (repeatable), e.g. sm_90",
    )
    _common(bld)
    foc = sub.add_parser("focus", help="select (and run) the GPU tests a change touches")
    foc.add_argument("--dir", type=Path, default=Path("."), help="the stack checkout (default: .)")
    foc.add_argument("--base", help="diff base (default: focus.base from the config)")
    foc.add_argument(
        "--label", action="append", default=[], help="a pull-request label (repeatable)"
    )
    foc.add_argument("--run", action="store_true", help="run the selected tests with pytest")
    foc.add_argument(
        "--require-gpu",
        action="store_true",
        help="with --run: fail (exit 21) when no GPU is visible instead of skipping (a GPU CI job)",
    )
    foc.add_argument("pytest_args", nargs="*", help="after --: extra pytest arguments")
    _common(foc)
    lease = sub.add_parser("lease", help="run a command holding the host's GPU lease")
    lease.add_argument(
        "--timeout", type=float, default=3600.0, help="seconds to wait for the lease (default 3600)"
    )
    lease.add_argument("--what", help="how the holder is named to those who wait")
    lease.add_argument(
        "--config",
        type=Path,
        default=None,
        help="the config whose host.state_dir holds the lease (default: ./servegate.toml "
        "where it exists; a --config that does not exist is an error)",
    )
    lease.add_argument("argv", nargs=argparse.REMAINDER, metavar="-- COMMAND ...")
    lease.add_argument("-v", "--verbose", action="store_true", help=argparse.SUPPRESS)
    run = sub.add_parser("runner", help="the self-hosted GitHub Actions runner on this box")
    rsub2 = run.add_subparsers(dest="runner_command", required=True, metavar="COMMAND")
    inst = rsub2.add_parser(
        "install", help="register an ephemeral runner as a systemd user service"
    )
    inst.add_argument("--url", required=True, help="https://github.com/OWNER/REPO")
    inst.add_argument("--labels", default="self-hosted,linux,gfx1030", help="comma-separated")
    inst.add_argument("--name", help="runner name (default: the host name)")
    inst.add_argument(
        "--dir",
        type=Path,
        default=Path.home() / "actions-runner",
        help="where the Actions runner is unpacked (default: ~/actions-runner)",
    )
    inst.add_argument(
        "--token-env",
        default="RUNNER_TOKEN",
        help="environment variable holding the registration token",
    )
    inst.add_argument(
        "--no-start", action="store_true", help="register and write the unit, do not start it"
    )
    inst.add_argument("--release-ref", default="", help=RELEASE_REF_HELP)
    inst.add_argument("--release-repo", default="", help=RELEASE_REPO_HELP)
    inst.add_argument(
        "--dry-run",
        action="store_true",
        help="show what would be registered, written and started; do none of it (no token needed)",
    )
    inst.add_argument("--json", action="store_true", help="print one JSON document on stdout")
    inst.add_argument("-v", "--verbose", action="store_true", help="echo every command run")
    srv = rsub2.add_parser(
        "serve", help="keep one fresh just-in-time runner ready (one runner a job, forever)"
    )
    srv.add_argument("--url", required=True, help="https://github.com/OWNER/REPO (or /ORG)")
    srv.add_argument("--labels", default="self-hosted,linux,gfx1030", help="comma-separated")
    srv.add_argument("--name", help="runner name prefix (default: the host name)")
    srv.add_argument(
        "--dir", type=Path, default=Path.home() / "actions-runner",
        help="where the Actions runner is unpacked (default: ~/actions-runner)",
    )  # fmt: skip
    srv.add_argument("--api-url", default="https://api.github.com", help="the REST API's URL")
    srv.add_argument("--runner-group", type=int, default=1, help="runner group id (1: Default)")
    srv.add_argument("--token-env", default="GITHUB_TOKEN", help="variable holding a token")
    srv.add_argument("--token-file", default="", help="a file (mode 0600) holding a token")
    srv.add_argument("--app-id", default="", help="a GitHub App's id (with the two below)")
    srv.add_argument("--installation-id", default="", help="the App's installation id")
    srv.add_argument("--app-key", default="", help="the App's private key file (PEM, 0600)")
    srv.add_argument("--turns", type=int, default=0, help="stop after N jobs (0: never)")
    srv.add_argument("--release-ref", default="", help=RELEASE_REF_HELP)
    srv.add_argument("--release-repo", default="", help=RELEASE_REPO_HELP)
    srv.add_argument(
        "--write-unit", action="store_true",
        help="write (and enable) the systemd user unit that keeps this manager running",
    )  # fmt: skip
    srv.add_argument("--json", action="store_true", help="print one JSON document on stdout")
    srv.add_argument("-v", "--verbose", action="store_true", help="echo every command run")
    hook = rsub2.add_parser("hook", help="a job hook (the runner calls it)")
    hook.add_argument("event", choices=["started", "completed"])
    hook.add_argument("-v", "--verbose", action="store_true", help=argparse.SUPPRESS)
    summ = sub.add_parser("summary", help="a promote's --json output as Markdown (CI job summary)")
    summ.add_argument("file", type=Path, help="output of `release promote --json`")
    summ.add_argument("-v", "--verbose", action="store_true", help=argparse.SUPPRESS)
    ins = sub.add_parser("inspect", help="list the GPU code objects inside built libraries")
    ins.add_argument("files", nargs="+", type=Path, metavar="FILE", help="built *.so files")
    ins.add_argument(
        "--arch",
        action="append",
        default=[],
        metavar="ARCH",
        help="fail (exit 5) unless every file holds code for ARCH (repeatable)",
    )
    ins.add_argument("--json", action="store_true", help="print one JSON document on stdout")
    ins.add_argument("-v", "--verbose", action="store_true", help="echo every command run")
    _init_command(sub)
    _bench_commands(sub)
    _profile_commands(sub)
    demo = sub.add_parser("demo", help="promote, promote, fail and roll back on a local sandbox")
    demo.add_argument(
        "--workdir",
        type=Path,
        default=Path("demo-sandbox"),
        help="sandbox directory (default: ./demo-sandbox)",
    )
    demo.add_argument(
        "--keep-running", action="store_true", help="leave the demo service running at the end"
    )
    demo.add_argument(
        "--stack-only",
        action="store_true",
        help="only make the demo stack (origin, clone with launch.sh and build.sh, model); "
        "promote nothing (the walkthrough in docs/box-setup.md)",
    )
    demo.add_argument(
        "--engine",
        choices=("vllm", "transformers"),
        default="vllm",
        help="the server the stack runs: vLLM's CPU build (default) or Hugging Face's "
        "`transformers serve` (on a GPU with --arch sm_90)",
    )
    demo.add_argument(
        "--arch",
        default="gfx1030",
        help="the GPU arch the stack's kernels are built for (default gfx1030, hipcc); an "
        "NVIDIA arch such as sm_90 (nvcc) serves on that GPU with --engine transformers",
    )
    demo.add_argument(
        "--python",
        type=Path,
        help="--engine transformers: the Python with torch, transformers and its serving "
        "extras (default: this one on a GPU, the demo's vLLM environment on a CPU)",
    )
    demo.add_argument("--json", action="store_true", help="print one JSON document on stdout")
    demo.add_argument("-v", "--verbose", action="store_true", help="echo every command run")
    return parser


def _dispatch(args: argparse.Namespace, out: Output) -> int:
    if args.command == "init":
        from servegate.commands import init

        return init.run(
            out, args.dir, args.from_command, args.model, args.python, args.port,
            args.host_root, args.unit, args.build, args.artifacts,
            [c for c in args.gate.split(",") if c], [t for t in args.tiers.split(",") if t],
            args.force,
        )  # fmt: skip
    if args.command == "demo":
        from servegate.commands import demo

        return demo.run(
            out, args.workdir, args.keep_running, args.stack_only,
            engine=args.engine, arch=args.arch, python=args.python,
        )  # fmt: skip
    if args.command == "lease":
        from servegate.commands import lease

        return lease.run(out, args.argv, args.timeout, args.what, args.config)
    if args.command == "runner":
        from servegate.commands import runner

        if args.runner_command == "hook":
            return runner.run_hook(args.event)
        if args.runner_command == "serve":
            return runner.run_serve(out, args)
        return runner.run_install(
            out,
            args.url,
            args.labels,
            args.name,
            args.dir,
            args.token_env,
            not args.no_start,
            args.dry_run,
            args.release_ref,
            args.release_repo,
        )
    if args.command == "summary":
        from servegate.commands import summary

        return summary.run(out, args.file)
    if args.command == "inspect":
        from servegate.commands import inspect

        return inspect.run(out, args.files, tuple(args.arch))
    if args.command == "bench":
        remote = _remote_bench(args.argv_seen, out)
        return remote if remote is not None else _bench(args, out)
    if args.command in ("render", "lint"):
        return _launch_command(args, out)
    if args.command == "report":
        from servegate.commands import report

        return report.run(args.config, out, args.out, args.files)
    build_only = args.command in ("build", "focus")
    cfg = config_mod.load(args.config, os.environ, build_only=build_only)
    if args.command == "build":
        from servegate.commands import build

        return build.run(cfg, out, args.dir, args.cache_dir, not args.no_cache, tuple(args.arch))
    if args.command == "focus":
        from servegate.commands import focus

        return focus.run(
            cfg, out, args.dir, args.base, args.label, args.run, args.pytest_args, args.require_gpu
        )
    if args.command == "config":
        from servegate.commands import config_check

        return config_check.run(cfg, out, args.offline)
    if cfg.remote_hosts:
        return _remote(cfg, args, out)
    # each command's module alone: `release status` does not load what a promote needs
    command = importlib.import_module(f"servegate.commands.{args.release_command}")
    handlers: dict[str, Callable[[], int]] = {
        "recover": lambda: command.run(cfg, out, args.rebuild_state, args.wait),
        "promote": lambda: command.run(cfg, out, args.sha, args.allow_non_ff),
        "rollback": lambda: command.run(cfg, out, args.to),
        "status": lambda: command.run(cfg, out),
        "history": lambda: command.run(cfg, out, args.n),
        "verify": lambda: command.run(cfg, out),
    }
    if args.release_command in SWITCHING:
        with interrupts.handled(f"release {args.release_command}"):
            return handlers[args.release_command]()
    return handlers[args.release_command]()


def _remote(cfg: config_mod.Config, args: argparse.Namespace, out: Output) -> int:
    """`release …` on hosts over SSH (host.ssh or [[fleet.hosts]])."""
    from servegate.commands import fleet

    sub = args.release_command
    if sub == "promote":
        return fleet.promote(cfg, out, args.sha, args.allow_non_ff)
    if sub == "status":
        return fleet.status(cfg, out)
    extra = {
        "rollback": ["--to", args.to] if getattr(args, "to", None) else [],
        "history": ["-n", str(getattr(args, "n", 20))],
        "verify": [],
        "recover": (["--rebuild-state"] if getattr(args, "rebuild_state", False) else [])
        + (["--wait", str(args.wait)] if getattr(args, "wait", 0) else []),
    }[sub]
    return fleet.each_command(cfg, out, [sub, *extra])


def _remote_bench(argv: Sequence[str], out: Output) -> int | None:
    """`servegate bench …` with a config of remote hosts: run there, as typed here."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--config", type=Path, default=Path("servegate.toml"))
    known, rest = parser.parse_known_args(list(argv))
    if not known.config.exists():
        return None
    cfg = config_mod.load(known.config, os.environ, build_only=True)
    if not cfg.remote_hosts:
        return None
    from servegate.commands import fleet

    after = rest[rest.index("bench") + 1 :] if "bench" in rest else rest
    return fleet.bench(cfg, out, [a for a in after if a != "--json"])


def _launch_command(args: argparse.Namespace, out: Output) -> int:
    from servegate.commands import lint, render
    from servegate.engine.lint import ruleset

    if args.command == "lint" and args.rules:
        # the shipped rules need no config or profile; a config's [lint] files add to them
        base = config_mod.load(args.config, os.environ) if args.config.exists() else None
        return lint.list_rules(out, ruleset(base or config_mod.bare()))
    t = render.target(args.config, args.profile, args.param, args.release, args.sha, args.port)
    if args.command == "render":
        return render.run(out, t, args.format)
    rules = ruleset(t.cfg)
    return lint.list_rules(out, rules) if args.rules else lint.run(out, t, rules)


def _bench(args: argparse.Namespace, out: Output) -> int:
    from servegate.commands import bench

    sub = getattr(args, "bench_command", None)
    if sub == "noise":
        from servegate.commands import noise

        return noise.run(args.config, out, args.restarts, args.repetitions)
    if sub == "aa":
        from servegate.commands import aa

        return aa.run(args.config, out, args.runs, args.out)
    if sub == "gate":
        return bench.gate_files(args.config, out, args.baseline, args.candidate, args.lenient)
    if sub == "export":
        return bench.export(out, args.file, args.format, args.out or None)
    opts = bench.Options(
        url=args.url,
        model=args.model,
        api_key_env=args.api_key_env,
        profiles=args.profiles,
        tiers=args.tiers,
        repetitions=args.repetitions,
        concurrency=args.concurrency,
        max_tokens=args.max_tokens,
        tolerance=args.tolerance,
        no_warmup=args.no_warmup,
        ignore_eos=args.ignore_eos,
        output=args.output,
        server_command=getattr(args, "server_command", ""),
        system=getattr(args, "system", ""),
        server_log=getattr(args, "server_log", None),
        probes=getattr(args, "probes", ""),
        baseline=getattr(args, "baseline", None),
        lenient=args.lenient,
        lease=not args.no_lease,
        seed=args.seed,
        engine=args.engine,
        tokenizer=args.tokenizer or "",
        tokenizer_python=args.tokenizer_python or "",
    )
    if sub == "load":
        given = [f for f, v in (("--repetitions", args.repetitions),
                                ("--concurrency", args.concurrency)) if v is not None]  # fmt: skip
        if given:
            raise ConfigError(
                f"bench load takes no {' or '.join(given)}: those shape the single-stream "
                "bench's groups; a load sweep sends its own load",
                hint="--concurrencies 1,2,4 for closed-loop clients, --rates for arrivals, "
                "--duration for how long a point runs",
            )
        return bench.load_sweep(args.config, out, opts, _load_spec(args))
    if sub == "compare":
        if args.a_url and args.b_url:
            return bench.compare_live(
                args.config, out, opts, args.a_url, args.b_url, args.rounds, args.confidence
            )
        if len(args.files) != 2:
            raise ConfigError(
                "bench compare needs two result files, or --a-url and --b-url",
                hint="servegate bench compare A.json B.json",
            )
        return bench.compare_files(out, args.files[0], args.files[1], args.lenient, args.confidence)
    return bench.run(args.config, out, opts)


def _load_spec(args: argparse.Namespace) -> LoadSpec:
    from servegate.bench import loadspec

    rates = args.rates is not None
    text = args.rates if rates else args.concurrencies
    try:
        points = tuple(float(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise ConfigError(
            f"{'--rates' if rates else '--concurrencies'} {text!r}: give numbers",
            hint="e.g. --rates 0.5,1,2,4",
        ) from None
    settings = config_mod.Load(
        rates=points if rates else (),
        # whole numbers or not, LoadSpec.check says so below with the option's name
        concurrencies=() if rates else points,  # type: ignore[arg-type]
        duration=args.duration,
        burstiness=args.burstiness,
        seed=args.load_seed,
        goodput=args.goodput,
        workload=args.workload,
        prefix_share=args.prefix_share,
    )
    spec = loadspec.spec_from(settings, stop_at_saturation=not args.no_stop)
    spec.check()
    return spec


def _crash_log(command: str) -> Path:
    fd, name = tempfile.mkstemp(
        prefix=f"servegate-crash-{time.strftime('%Y%m%d-%H%M%S')}-", suffix=".log"
    )
    with os.fdopen(fd, "w") as handle:
        handle.write(f"{version_line()}\ncommand: {command}\npython: {sys.version}\n\n")
        handle.write(traceback.format_exc())
    return Path(name)


def run(
    parser: argparse.ArgumentParser, argv: Sequence[str] | None, default_command: str = ""
) -> int:
    seen = list(sys.argv[1:] if argv is None else argv)
    said = io.StringIO()
    try:
        with contextlib.redirect_stderr(said):
            args = parser.parse_args(argv)
    except SystemExit as exc:
        sys.stderr.write(said.getvalue())
        if "--json" in seen and exc.code not in (0, None):  # one JSON document, always
            words = [w for w in seen if not w.startswith("-")][:3]
            lines = said.getvalue().strip().splitlines()
            Output(json_mode=True, command=" ".join(words)).emit(
                None, 2, ConfigError(lines[-1] if lines else "the command line was not "
                                     "understood", hint=f"{parser.prog} --help")
            )  # fmt: skip
        raise
    sys.stderr.write(said.getvalue())
    args.argv_seen = seen
    if default_command:
        args.command = default_command
    scrub_git_env(os.environ)
    logging.basicConfig(
        level=logging.DEBUG if getattr(args, "verbose", False) else logging.WARNING,
        format="%(message)s",
        stream=sys.stderr,
    )
    # Paramiko logs every failed handshake with a traceback; servegate says it once, plainly
    logging.getLogger("paramiko").setLevel(
        logging.DEBUG if getattr(args, "verbose", False) else logging.CRITICAL
    )
    name = " ".join(
        filter(
            None,
            [
                args.command,
                getattr(args, "release_command", None),
                getattr(args, "config_command", None),
                getattr(args, "runner_command", None),
                getattr(args, "bench_command", None),
            ],
        )
    )
    out = Output(json_mode=getattr(args, "json", False), command=name)
    try:
        return _dispatch(args, out)
    except ServegateError as err:
        return out.error(err)
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return INTERRUPTED
    except Exception as exc:
        log = _crash_log(name)
        print(
            # the type only: an exception's text may quote what it was handling (a
            # request's headers, an API key); the full traceback is in the 0600 log
            f"servegate hit an unexpected error: {type(exc).__name__}\n"
            f"  the traceback is in {log} — please attach it to a bug report",
            file=sys.stderr,
        )
        return INTERNAL_ERROR


def main(argv: Sequence[str] | None = None) -> int:
    return run(servegate_parser(), argv)


def release_main(argv: Sequence[str] | None = None) -> int:
    return run(release_parser(), argv, default_command="release")
