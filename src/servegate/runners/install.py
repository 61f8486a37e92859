"""A GitHub Actions runner on the serving box: registered ephemeral, run as a systemd
user service, with servegate's job hooks. The registration token is read from the
environment, passed to the runner's own ``config.sh`` in its environment (never on a
command line another user could read) and never written anywhere."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from servegate.engine.managers.systemd import quote_arg, unit_dir
from servegate.errors import CommandFailed, ConfigError, PreflightFailed
from servegate.pipeline import proc
from servegate.runners import hooks

EXPIRED = re.compile(r"(401|403|404|Not ?Found|Unauthorized|expired|invalid token)", re.I)


@dataclass(frozen=True)
class RunnerSpec:
    url: str
    name: str
    labels: tuple[str, ...]
    directory: Path
    #: a release runner's ref (``refs/heads/main``): its jobs must be of that ref
    release_ref: str = ""
    #: and its repository (``owner/repo``)
    release_repo: str = ""

    @property
    def unit(self) -> str:
        return f"servegate-runner-{self.name}.service"


def hook_path(spec: RunnerSpec, event: str) -> Path:
    return hooks.script_path(spec.directory, event)


def render_unit(spec: RunnerSpec) -> str:
    env = {
        "SERVEGATE_RUNNER": spec.name,
        "ACTIONS_RUNNER_HOOK_JOB_STARTED": str(hook_path(spec, "started")),
        "ACTIONS_RUNNER_HOOK_JOB_COMPLETED": str(hook_path(spec, "completed")),
    }
    if spec.release_ref:
        env[hooks.RELEASE_REF] = spec.release_ref
        env[hooks.RELEASE_REPO] = spec.release_repo
    lines = [
        "[Unit]",
        f"Description=GitHub Actions runner {spec.name} (ephemeral, servegate hooks)",
        "StartLimitIntervalSec=600",
        "StartLimitBurst=3",
        "",
        "[Service]",
        "Type=simple",
        f"WorkingDirectory={spec.directory}",
        *(f"Environment={quote_arg(f'{k}={v}')}" for k, v in env.items()),
        f"ExecStart={quote_arg(str(spec.directory / 'run.sh'))}",
        # ephemeral: the runner takes one job, deregisters and exits
        "Restart=no",
        "KillMode=control-group",
        "TimeoutStopSec=120",
        "",
        "[Install]",
        "WantedBy=default.target",
        "",
    ]
    return "\n".join(lines)


def token_from(environ: Mapping[str, str], name: str) -> str:
    token = environ.get(name, "").strip()
    if not token:
        raise ConfigError(
            f"{name} is not set: the runner needs a registration token",
            hint="create one (repository Settings → Actions → Runners → New self-hosted "
            "runner, or `gh api -X POST repos/OWNER/REPO/actions/runners/registration-token`), "
            f"export {name}=… and run again; it expires after an hour and servegate "
            "never writes it down",
        )
    return token


#: how ``config.sh`` takes an argument from its environment (the runner reads
#: ``ACTIONS_RUNNER_INPUT_<NAME>`` for ``--<name>``): the token stays off the command
#: line, which every user of the box can read in /proc/PID/cmdline
TOKEN_VARIABLE = "ACTIONS_RUNNER_INPUT_TOKEN"


def config_argv(spec: RunnerSpec) -> list[str]:
    """``config.sh``'s arguments; the token goes in :data:`TOKEN_VARIABLE`."""
    return [
        str(spec.directory / "config.sh"),
        "--unattended",
        "--ephemeral",
        "--replace",
        "--url",
        spec.url,
        "--name",
        spec.name,
        "--labels",
        ",".join(spec.labels),
        "--work",
        "_work",
    ]


@dataclass(frozen=True)
class Plan:
    """What ``install`` would do (``runner install --dry-run``)."""

    register: list[str]
    hooks: list[str]
    unit: str
    unit_text: str
    start: list[str]


def plan(spec: RunnerSpec, environ: Mapping[str, str]) -> Plan:
    """What ``install`` would do, done nowhere: no token is needed and nothing is
    registered, written or started."""
    return Plan(
        register=[f"{TOKEN_VARIABLE}=<token from the environment>", *config_argv(spec)],
        hooks=[str(hook_path(spec, e)) for e in ("started", "completed")],
        unit=str(unit_dir(dict(environ)) / spec.unit),
        unit_text=render_unit(spec),
        start=["systemctl", "--user", "enable", "--now", spec.unit],
    )


def register(spec: RunnerSpec, token: str) -> None:
    config_sh = spec.directory / "config.sh"
    if not config_sh.exists():
        raise PreflightFailed(
            f"{config_sh} not found: the Actions runner is not unpacked in {spec.directory}",
            hint="download and unpack the runner there as GitHub's 'New self-hosted runner' "
            "page shows (tar xzf actions-runner-linux-x64-*.tar.gz), then run again",
        )
    argv = config_argv(spec)
    env = {**os.environ, TOKEN_VARIABLE: token}
    try:
        proc.run(argv, cwd=spec.directory, env=env, timeout=300, redact=(token,))
    except CommandFailed as exc:
        text = str(exc)
        hint = (
            "the registration token is wrong or expired (they last an hour): create a "
            "new one and run again"
            if EXPIRED.search(text)
            else "read the runner's output above"
        )
        raise PreflightFailed(f"registering the runner failed: {text}", hint=hint) from None


def write_hooks(spec: RunnerSpec) -> list[Path]:
    return [hooks.write_script(spec.directory, event) for event in ("started", "completed")]


def install(spec: RunnerSpec, environ: Mapping[str, str], token_env: str, start: bool) -> Path:
    """Register (ephemeral), write the hooks and the unit; start it unless told not to."""
    token = token_from(environ, token_env)
    register(spec, token)
    write_hooks(spec)
    unit = unit_dir(dict(environ)) / spec.unit
    unit.parent.mkdir(parents=True, exist_ok=True)
    unit.write_text(render_unit(spec))
    if start:
        proc.run(["systemctl", "--user", "daemon-reload"], timeout=60)
        proc.run(["systemctl", "--user", "enable", "--now", spec.unit], timeout=60)
    return unit


def default_name() -> str:
    return os.uname().nodename.split(".")[0]
