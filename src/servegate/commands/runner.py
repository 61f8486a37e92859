from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from pathlib import Path

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
