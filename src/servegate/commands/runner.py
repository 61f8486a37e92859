from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from pathlib import Path

from servegate.commands import args as common_args
from servegate.engine.managers.systemd import unit_dir
from servegate.errors import ConfigError, PreflightFailed
from servegate.output import Output
from servegate.pipeline import proc
from servegate.runners import hooks, manager
from servegate.runners.install import RunnerSpec, default_name, install, plan


def run_install(
    out: Output,
    url: str,
    labels: str,
    name: str | None,
    directory: Path,
    token_env: str,
    start: bool,
    dry_run: bool = False,
    release_ref: str = "",
    release_repo: str = "",
) -> int:
    spec = RunnerSpec(
        url,
        name or default_name(),
        tuple(label for label in labels.split(",") if label),
        directory.resolve(),
        check_ref(release_ref),
        release_repository(url, release_ref, release_repo),
    )
    warn_unguarded(spec.labels, spec.release_ref)
    if dry_run:
        steps = plan(spec, os.environ)
        if out.json_mode:
            return out.emit({"dry_run": True, **dataclasses.asdict(steps)})
        out.line("dry run: nothing is registered, written or started")
        out.line(f"would register: {' '.join(steps.register)}")
        for hook in steps.hooks:
            out.line(f"would write hook: {hook}")
        out.line(f"would write unit: {steps.unit}")
        out.line(steps.unit_text)
        if start:
            out.line(f"would start: {' '.join(steps.start)}")
        return 0
    unit = install(spec, os.environ, token_env, start)
    if out.json_mode:
        return out.emit({"unit": str(unit), "name": spec.name, "labels": list(spec.labels)})
    out.line(f"runner {spec.name} registered (ephemeral) with labels {', '.join(spec.labels)}")
    out.line(f"unit: {unit}" + ("" if start else "  (not started: --no-start)"))
    return 0


def check_ref(ref: str) -> str:
    if ref and not ref.startswith("refs/"):
        raise ConfigError(
            f"--release-ref {ref!r} is not a full ref",
            hint=f"e.g. --release-ref refs/heads/{ref}",
        )
    return ref


def warn_unguarded(labels: tuple[str, ...], ref: str) -> None:
    """A runner labelled ``serving`` (what release.yml asks for) that takes any job."""
    if "serving" in labels and not ref:
        print(
            "warning: this runner has the label `serving` but no --release-ref: GitHub "
            "sends it any job that asks for its labels, a pull request's included, and the "
            "job runs as the user that owns the live service (docs/box-setup.md, step 6)",
            file=sys.stderr,
        )


def release_repository(url: str, ref: str, given: str) -> str:
    """The repository a release runner takes jobs of: the one its --url names, or, for an
    organisation's runner (which GitHub sends every repository's jobs), --release-repo."""
    if not ref:
        if given:
            raise ConfigError(
                "--release-repo does nothing without --release-ref",
                hint="e.g. --release-ref refs/heads/main --release-repo " + given,
            )
        return ""
    scope = manager.Scope.from_url(url)
    named = f"{scope.owner}/{scope.repo}" if scope.repo else ""
    if given and named and given.lower() != named.lower():
        raise ConfigError(f"--release-repo {given} is not the repository --url names ({named})")
    if not (given or named):
        raise ConfigError(
            f"--url {url} registers the runner for an organisation: every repository of it "
            "can send it jobs",
            hint="name the repository it releases: --release-repo OWNER/REPO",
        )
    return given or named


def run_hook(event: str) -> int:
    return hooks.job_started(os.environ) if event == "started" else hooks.job_completed(os.environ)


def run_online(out: Output, name: str, force: bool) -> int:
    """``servegate runner online NAME``: take back a runner that took itself offline, once
    its GPUs check healthy again (``--force``: without the check)."""
    from servegate.commands.gpu import failure

    down = hooks.offline(os.environ, name)
    if down is None:
        out.line(f"runner {name} is not offline")
        return 0
    if not force:
        snap = hooks.gpu_check(os.environ)
        if not snap.healthy:
            for finding in snap.findings:
                out.line(f"  {finding.line()}")
            return out.error(failure(snap))
    hooks.offline_path(os.environ, name).unlink(missing_ok=True)
    out.line(f"runner {name} is online again (it was offline since {down.get('at', '?')}: "
             f"{down.get('why', '?')})")  # fmt: skip
    return 0


def run_serve(out: Output, args: argparse.Namespace) -> int:
    """``servegate runner serve``: the just-in-time runner loop, or its unit."""
    spec = manager.ManagerSpec(
        url=args.url,
        name=args.name or default_name(),
        labels=tuple(label for label in args.labels.split(",") if label),
        directory=args.dir.resolve(),
        api_url=args.api_url,
        runner_group_id=args.runner_group,
        release_ref=check_ref(args.release_ref),
        release_repo=release_repository(args.url, args.release_ref, args.release_repo),
    )
    warn_unguarded(spec.labels, spec.release_ref)
    manager.Scope.from_url(spec.url)  # a bad --url is refused before anything else
    credentials = manager.Credentials.from_options(
        os.environ, args.token_env, args.token_file, args.app_id, args.installation_id,
        args.app_key,
    )  # fmt: skip
    if args.write_unit:
        if credentials.token and not args.token_file:
            raise ConfigError(
                f"the unit cannot see {args.token_env} from this shell",
                hint="give the unit a --token-file (mode 0600) or a GitHub App "
                "(--app-id, --installation-id, --app-key)",
            )
        app = (args.app_id, args.installation_id, args.app_key) if args.app_id else None
        unit_argv = manager.unit_argv(spec, args.token_env, args.token_file, app)
        unit = unit_dir(dict(os.environ)) / manager.unit_name(spec)
        unit.parent.mkdir(parents=True, exist_ok=True)
        unit.write_text(manager.render_unit(spec, unit_argv))
        proc.run(["systemctl", "--user", "daemon-reload"], timeout=60)
        proc.run(["systemctl", "--user", "enable", "--now", unit.name], timeout=60)
        if out.json_mode:
            return out.emit({"unit": str(unit)})
        out.line(f"unit {unit} written, enabled and started")
        return 0
    hidden = (*manager.CREDENTIAL_VARIABLES, args.token_env)
    api = manager.Api(spec, credentials)
    try:
        done = manager.serve(spec, api, os.environ, turns=args.turns, hidden=hidden)
    finally:
        api.close()
    # a bounded run in which no runner ever got going failed
    code = PreflightFailed.exit_code if done and all(o.skipped for o in done) else 0
    if out.json_mode:
        return out.emit({"turns": [dataclasses.asdict(o) for o in done]}, code)
    if code:
        out.err.print(
            f"runner serve: none of {len(done)} turn(s) got a runner: {done[-1].skipped}",
            markup=False,
        )
    return code


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="runner_command", required=True, metavar="COMMAND")
    inst = sub.add_parser("install", help="register an ephemeral runner as a systemd user service")
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
    inst.add_argument("--release-ref", default="", help=common_args.RELEASE_REF_HELP)
    inst.add_argument("--release-repo", default="", help=common_args.RELEASE_REPO_HELP)
    inst.add_argument(
        "--dry-run",
        action="store_true",
        help="show what would be registered, written and started; do none of it (no token needed)",
    )
    common_args.output(inst)
    srv = sub.add_parser(
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
    srv.add_argument("--release-ref", default="", help=common_args.RELEASE_REF_HELP)
    srv.add_argument("--release-repo", default="", help=common_args.RELEASE_REPO_HELP)
    srv.add_argument(
        "--write-unit", action="store_true",
        help="write (and enable) the systemd user unit that keeps this manager running",
    )  # fmt: skip
    common_args.output(srv)
    online = sub.add_parser(
        "online", help="take back a runner that took itself offline, once its GPUs are healthy"
    )
    online.add_argument("name", help="the runner's name")
    online.add_argument(
        "--force", action="store_true", help="without checking the GPUs again (not advised)"
    )
    common_args.output(online)
    hook = sub.add_parser("hook", help="a job hook (the runner calls it)")
    hook.add_argument("event", choices=["started", "completed"])
    hook.add_argument("-v", "--verbose", action="store_true", help=argparse.SUPPRESS)


def main(args: argparse.Namespace, out: Output) -> int:
    if args.runner_command == "hook":
        return run_hook(args.event)
    if args.runner_command == "serve":
        return run_serve(out, args)
    if args.runner_command == "online":
        return run_online(out, args.name, args.force)
    return run_install(
        out, args.url, args.labels, args.name, args.dir, args.token_env, not args.no_start,
        args.dry_run, args.release_ref, args.release_repo,
    )  # fmt: skip
