"""Service managers behind one Protocol: where the service gets (re)started."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from servegate.config import Config
from servegate.engine.launch import LaunchSpec
from servegate.errors import ConfigError


@dataclass(frozen=True)
class ServiceState:
    """What the manager says about the service right now."""

    #: the manager's own word for it (RUNNING, BACKOFF, active/activating, ...)
    raw: str
    pid: int | None
    #: the process exited (and was not merely stopped by us)
    exited: bool
    exit_status: int | None
    #: restarts the manager made since the last start we asked for
    restarts: int
    #: the manager gave up restarting it
    gave_up: bool


class ServiceManager(Protocol):
    name: str
    #: the file the service's output goes to (None: a journal); the bench scans it
    log_file: Path | None

    def install(self, spec: LaunchSpec) -> Path:
        """Render the unit/program for ``spec``; returns the file written. Refuses
        (ConfigError) a spec :meth:`render_problems` finds anything in: nothing written."""
        ...

    def render_problems(self, spec: LaunchSpec) -> list[str]:
        """What the rendered unit/program would not carry exactly: the rendering parsed
        back by the manager's own rules and compared with ``spec``'s command and
        environment (never quoting a value: it may be a secret)."""
        ...

    def start(self) -> None: ...

    def stop(self) -> None: ...

    def state(self) -> ServiceState: ...

    def main_pid(self) -> int | None: ...

    def last_log_line(self) -> str: ...

    def log_tail(self, lines: int) -> str: ...

    def log_mark(self) -> str:
        """A position in the service's output; :meth:`log_since` reads what follows it."""
        ...

    def log_since(self, mark: str) -> str:
        """The output since ``mark``; OSError when it cannot be read (never "" for that)."""
        ...


def make_manager(cfg: Config) -> ServiceManager:
    if cfg.service.manager == "systemd-user":
        from servegate.engine.managers.systemd import SystemdUser

        return SystemdUser(cfg)
    from servegate.engine.managers.supervisor import Supervisor

    return Supervisor(cfg)


def read_tail(path: Path, lines: int, since: int = 0) -> str:
    """The last ``lines`` lines of a log file after byte offset ``since``, reading only its end."""
    try:
        with path.open("rb") as handle:
            handle.seek(0, 2)
            size = handle.tell()
            handle.seek(max(since if since <= size else 0, size - 64 * 1024))
            data = handle.read().decode(errors="replace")
    except FileNotFoundError:
        return ""
    return "\n".join(data.rstrip("\n").splitlines()[-lines:])


def read_from(path: Path, offset: int, limit: int = 16 * 1024 * 1024, strict: bool = False) -> str:
    """What a log file holds after byte ``offset`` (at most ``limit`` bytes); ``strict``:
    a file that cannot be read raises OSError instead of reading as empty."""
    try:
        with path.open("rb") as handle:
            handle.seek(offset)
            return handle.read(limit).decode(errors="replace")
    except OSError:
        if strict:
            raise
        return ""


def refuse(manager: ServiceManager, spec: LaunchSpec) -> None:
    """ConfigError when ``spec`` cannot be written as ``manager``'s unit exactly (before
    the switch in a promote; before anything is written in ``install``)."""
    problems = manager.render_problems(spec)  # each manager's begins with unsafe()
    if problems:
        raise ConfigError(
            f"the launch of {spec.sha[:12] or 'the release'} cannot be written as a "
            f"{manager.name} unit exactly: " + "; ".join(problems),
            hint="remove the control character where the value is set (a secret with a "
            "trailing newline: strip it where the variable is exported), or fix the name; "
            "nothing was written and the live service was not touched",
        )
