"""supervisord, run by servegate under the host root, driven through its XML-RPC socket."""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import os
import re
import socket
import stat
import sys
import tempfile
import time
import xmlrpc.client
from pathlib import Path
from typing import Any, cast

from servegate import hostpaths
from servegate.config import Config
from servegate.engine.launch import LaunchSpec, unsafe
from servegate.engine.managers import ServiceState, read_from, read_tail, refuse
from servegate.errors import PreflightFailed, ServiceFailed
from servegate.pipeline import atomic, proc

#: supervisord's process states that mean "the process ended by itself"
EXITED_STATES = {"EXITED", "BACKOFF", "FATAL", "UNKNOWN"}


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str) -> None:
        super().__init__("localhost")
        self.path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(30)
        try:
            sock.connect(self.path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


class _UnixTransport(xmlrpc.client.Transport):
    def __init__(self, path: str) -> None:
        super().__init__()
        self.path = path

    def make_connection(self, host: Any) -> http.client.HTTPConnection:
        conn = _UnixConnection(self.path)
        self._connection = (host, conn)  # so that close() closes it
        return conn


def _escape(value: str) -> str:
    """supervisord expands %(name)s in its config: a literal % is written %%."""
    return value.replace("%", "%%")


def _env_line(env: dict[str, str]) -> str:
    """``environment=``'s value. supervisord splits it with :mod:`shlex` in non-POSIX
    mode and strips quote characters from both ends of each value: there are no escapes,
    so a value is quoted with the quote it does not hold (one that holds both, or starts
    or ends with a quote, cannot be written: :func:`render_problems` says so)."""
    items = []
    for key, value in env.items():
        quote = "'" if '"' in value else '"'
        items.append(f"{key}={quote}{_escape(value)}{quote}")
    return ",".join(items)


def render_problems(spec: LaunchSpec, text: str) -> list[str]:
    """``text`` (a program file) parsed back by supervisor's own config parser and
    compared with ``spec``'s command, environment and directory. Values are not quoted
    (they may be secrets): the message names the key."""
    import shlex

    from supervisor.options import ServerOptions, UnhosedConfigParser

    problems = [
        f"the value of {k} holds both quote characters or starts or ends with one, which "
        "supervisord's environment= cannot carry (it has no escapes)"
        for k, v in spec.env.items()
        if ('"' in v and "'" in v) or v[:1] in "'\"" or v[-1:] in "'\""
    ]
    if problems:
        return problems
    parser = UnhosedConfigParser()
    # the log file's directory may not exist yet (a first promote, `config check`), and
    # supervisor's parser requires it: the log line is not what is compared here
    text = re.sub(r"(?m)^stdout_logfile=.*$", "stdout_logfile=NONE", text)
    try:
        parser.read_string(text)
        options = ServerOptions()
        options.here = str(spec.cwd)
        groups = options.process_groups_from_parser(parser)
    except Exception as exc:  # supervisor's own parser said no: that is the finding
        return [f"supervisord's parser refuses the program file ({type(exc).__name__})"]
    programs = [c for g in groups for c in g.process_configs]
    if len(groups) != 1 or len(programs) != 1:
        return [f"the program file parses as {len(programs)} program(s), not one"]
    (got,) = programs
    if shlex.split(got.command) != list(spec.argv):
        problems.append("the command supervisord would run is not the launch's argv")
    if dict(got.environment or {}) != dict(spec.env):
        wrong = sorted(k for k in set(spec.env) | set(got.environment or {})
                       if (got.environment or {}).get(k) != spec.env.get(k))  # fmt: skip
        problems.append(f"supervisord would read other values for {', '.join(wrong)}")
    if got.directory != str(spec.cwd):
        problems.append("supervisord would start the service in another directory")
    return problems


def socket_path(directory: Path) -> Path:
    """``<dir>/supervisor.sock``, or — when that is longer than a unix socket path may be
    (108 bytes) — a short path in a directory only this user can enter (never a guessable
    name in a shared temp dir another user could listen on first)."""
    natural = directory / "supervisor.sock"
    if len(str(natural)) < 100:
        return natural
    digest = hashlib.sha256(str(directory.resolve()).encode()).hexdigest()[:16]
    return private_dir() / f"{digest}.sock"


def private_dir() -> Path:
    """``$XDG_RUNTIME_DIR/servegate`` or ``<tmp>/servegate-<uid>``: made 0700, and refused
    unless it is a real directory owned by this user that nobody else can enter."""
    base = os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir()
    path = Path(base) / (
        "servegate" if os.environ.get("XDG_RUNTIME_DIR") else f"servegate-{os.getuid()}"
    )
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=0o700)
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise PreflightFailed(
            f"{path} is not a private directory of this user (owner uid {info.st_uid}, mode "
            f"{oct(stat.S_IMODE(info.st_mode))}): servegate will not put its socket there",
            hint=f"remove {path}, or use a shorter host.root so the socket lives inside it",
        )
    return path


class Supervisor:
    name = "supervisor"

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.unit = cfg.service.unit
        self.dir = hostpaths.of(cfg).supervisor
        self.conf = self.dir / "supervisord.conf"
        self.socket = socket_path(self.dir)
        self.program_conf = self.dir / "programs" / f"{self.unit}.conf"
        self.log = hostpaths.of(cfg).service_log(self.unit)
        self.log_file: Path | None = self.log
        self._first_pid: int | None = None
        self._restarts = 0
        self._log_offset = 0

    # -- supervisord itself -------------------------------------------------
    def _call(self, method: str, *args: Any) -> Any:
        """One XML-RPC call on supervisord's unix socket (``supervisor.<method>``)."""
        transport = _UnixTransport(str(self.socket))
        with xmlrpc.client.ServerProxy("http://localhost", transport=transport) as rpc:
            return getattr(rpc.supervisor, method)(*args)

    def _running(self) -> bool:
        try:
            return bool(self._call("getState")["statename"] == "RUNNING")
        except (OSError, xmlrpc.client.Error):
            return False

    def _write_daemon_conf(self) -> None:
        # the service's output may quote its secrets: logs only for the owner
        (self.dir / "programs").mkdir(parents=True, exist_ok=True, mode=0o700)
        self.log.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.log.parent.chmod(0o700)
        self.conf.write_text(
            "[unix_http_server]\n"
            f"file={self.socket}\nchmod=0700\n\n"
            "[supervisord]\n"
            "umask=077\n"
            f"pidfile={self.dir / 'supervisord.pid'}\n"
            f"logfile={self.dir / 'supervisord.log'}\n"
            f"childlogdir={self.log.parent}\n"
            f"directory={self.cfg.host_root}\n\n"
            "[rpcinterface:supervisor]\n"
            "supervisor.rpcinterface_factory = supervisor.rpcinterface:make_main_rpcinterface\n\n"
            "[supervisorctl]\n"
            f"serverurl=unix://{self.socket}\n\n"
            "[include]\n"
            f"files = {self.dir / 'programs'}/*.conf\n"
        )

    def ensure_daemon(self) -> None:
        """Start supervisord under the host root unless it already runs there."""
        if self._running():
            return
        self._write_daemon_conf()
        # a clean environment: the service must get its variables from the config only
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": str(Path.home())}
        proc.run(
            [sys.executable, "-m", "supervisor.supervisord", "-c", str(self.conf)],
            env=env,
            timeout=30,
        )
        deadline = time.monotonic() + 15
        while not self._running():
            if time.monotonic() > deadline:
                raise ServiceFailed(
                    f"supervisord did not come up on {self.socket}",
                    hint=f"read {self.dir / 'supervisord.log'}",
                )
            time.sleep(0.1)

    def shutdown_daemon(self) -> None:
        if self._running():
            self._call("shutdown")
            deadline = time.monotonic() + 30
            while self.socket.exists() and time.monotonic() < deadline:
                time.sleep(0.1)

    # -- the program ----------------------------------------------------------
    def render(self, spec: LaunchSpec) -> str:
        svc = self.cfg.service
        lines = [
            f"[program:{self.unit}]",
            f"command={_escape(proc.quote(spec.argv))}",
            f"directory={_escape(str(spec.cwd))}",
            "autostart=false",
            "autorestart=unexpected",
            "exitcodes=0",
            "startsecs=1",
            f"startretries={svc.start_limit_burst}",
            "stopsignal=TERM",
            f"stopwaitsecs={int(svc.stop_timeout)}",
            "stopasgroup=true",
            "killasgroup=true",
            "redirect_stderr=true",
            f"stdout_logfile={self.log}",
            "stdout_logfile_maxbytes=50MB",
            "stdout_logfile_backups=3",
        ]
        if spec.env:
            lines.append(f"environment={_env_line(dict(spec.env))}")
        return "\n".join(lines) + "\n"

    def render_problems(self, spec: LaunchSpec) -> list[str]:
        return unsafe(spec) or render_problems(spec, self.render(spec))

    def install(self, spec: LaunchSpec) -> Path:
        refuse(self, spec)
        self.ensure_daemon()
        text = self.render(spec)
        self.program_conf.parent.mkdir(parents=True, exist_ok=True)
        # the environment may hold secrets: only the owner reads the program file
        atomic.write_text(self.program_conf, text)  # mkstemp: 0600
        self._reload()
        return self.program_conf

    def _reload(self) -> None:
        added, changed, removed = self._call("reloadConfig")[0]
        for group in changed + removed:
            self._stop_quietly(group)
            self._call("removeProcessGroup", group)
        for group in added + changed:
            self._call("addProcessGroup", group)

    def _stop_quietly(self, name: str) -> None:
        try:
            self._call("stopProcess", name, True)
        except xmlrpc.client.Fault as fault:
            if "NOT_RUNNING" not in fault.faultString and "BAD_NAME" not in fault.faultString:
                raise

    def _info(self) -> dict[str, Any] | None:
        try:
            return cast(dict[str, Any], self._call("getProcessInfo", self.unit))
        except xmlrpc.client.Fault:
            return None
        except OSError:
            return None

    def start(self) -> None:
        self._first_pid = None
        self._restarts = 0
        self._log_offset = self.log.stat().st_size if self.log.exists() else 0
        try:
            self._call("startProcess", self.unit, False)
        except xmlrpc.client.Fault as fault:
            if "ALREADY_STARTED" not in fault.faultString:
                raise ServiceFailed(
                    f"supervisord refused to start {self.unit}: {fault.faultString}"
                ) from None

    def stop(self) -> None:
        if self._running() and self._info() is not None:
            self._stop_quietly(self.unit)

    def state(self) -> ServiceState:
        info = self._info()
        if info is None:
            raw = "not installed" if self._running() else "supervisord not running"
            return ServiceState(raw, None, False, None, 0, False)
        name = str(info["statename"])
        pid = int(info["pid"]) or None
        if pid is not None:
            if self._first_pid is None:
                self._first_pid = pid
            elif pid != self._first_pid:
                self._restarts += 1
                self._first_pid = pid
        exited = name in EXITED_STATES
        # supervisord keeps no exit status for a start that ended too quickly (BACKOFF)
        status = int(info["exitstatus"]) if name == "EXITED" else None
        raw = f"{name}: {info['spawnerr']}" if info.get("spawnerr") else name
        return ServiceState(raw, pid, exited, status, self._restarts, name == "FATAL")

    def main_pid(self) -> int | None:
        info = self._info()
        if info is None or info["statename"] not in ("RUNNING", "STARTING"):
            return None
        return int(info["pid"]) or None

    def last_log_line(self) -> str:
        return read_tail(self.log, 1, self._log_offset)

    def log_tail(self, lines: int) -> str:
        return read_tail(self.log, lines, self._log_offset)

    def log_mark(self) -> str:
        return str(self.log.stat().st_size if self.log.exists() else 0)

    def log_since(self, mark: str) -> str:
        return read_from(self.log, int(mark or 0), strict=True)
