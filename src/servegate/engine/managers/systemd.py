"""A systemd user unit: rendered from the launch spec, driven with ``systemctl --user``."""

from __future__ import annotations

import os
from pathlib import Path

from servegate.config import Config
from servegate.engine.launch import LaunchSpec, unsafe
from servegate.engine.managers import ServiceState, refuse
from servegate.errors import CommandFailed, PreflightFailed
from servegate.pipeline import atomic, proc


def quote_arg(value: str, dollar: bool = True) -> str:
    """One ExecStart or Environment word: C-style double quotes, ``%`` doubled (a
    specifier in both). ``$`` is doubled only in ExecStart, which expands ``$VAR``;
    in Environment= it has no special meaning (systemd.exec(5)) and stays one ``$``."""
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%")
    if dollar:
        escaped = escaped.replace("$", "$$")
    return f'"{escaped}"'


def render_unit(spec: LaunchSpec) -> str:
    lim = spec.limits
    what = f"profile {spec.profile}" if spec.profile else "service.command"
    lines = [
        "[Unit]",
        f"Description=servegate: {spec.unit} at {spec.sha or '(no release yet)'} ({what})",
        f"StartLimitIntervalSec={lim.start_limit_interval}",
        f"StartLimitBurst={lim.start_limit_burst}",
        "",
        "[Service]",
        "Type=simple",
        f"WorkingDirectory={spec.cwd}",
    ]
    lines += [f"Environment={quote_arg(f'{k}={v}', dollar=False)}" for k, v in spec.env.items()]
    lines += [
        "ExecStart=" + " ".join(quote_arg(a) for a in spec.argv),
        f"Restart={lim.restart}",
        f"RestartSec={lim.restart_sec}",
        f"TimeoutStopSec={lim.timeout_stop}",
        f"KillMode={lim.kill_mode}",
    ]
    if lim.memory_max:
        lines.append(f"MemoryMax={lim.memory_max}")
    if lim.memory_swap_max:
        lines.append(f"MemorySwapMax={lim.memory_swap_max}")
    lines += ["", "[Install]", "WantedBy=default.target", ""]
    return "\n".join(lines)


def render_problems(spec: LaunchSpec, text: str) -> list[str]:
    """``text`` (a unit) read back line by line: one directive a line, the keys servegate
    writes and no other, one ``Environment=`` per variable and one ``ExecStart=``. With
    control characters refused (:func:`servegate.engine.launch.unsafe`) no value can
    start a directive of its own; this says so of the rendering itself."""
    known = {"Description", "StartLimitIntervalSec", "StartLimitBurst", "Type",
             "WorkingDirectory", "Environment", "ExecStart", "Restart", "RestartSec",
             "TimeoutStopSec", "KillMode", "MemoryMax", "MemorySwapMax", "WantedBy"}  # fmt: skip
    keys = [
        line.split("=", 1)[0] for line in text.splitlines() if line and not line.startswith("[")
    ]
    problems = [f"the unit would hold a directive {k!r} servegate does not write"
                for k in keys if k not in known]  # fmt: skip
    if keys.count("Environment") != len(spec.env) or keys.count("ExecStart") != 1:
        problems.append("the unit's Environment=/ExecStart= lines are not the launch's")
    return problems


def unit_dir(environ: dict[str, str] | None = None) -> Path:
    env = environ if environ is not None else dict(os.environ)
    base = env.get("XDG_CONFIG_HOME") or str(Path(env.get("HOME", str(Path.home()))) / ".config")
    return Path(base) / "systemd" / "user"


class SystemdUser:
    name = "systemd-user"

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.unit = f"{cfg.service.unit}.service"
        self.path = unit_dir() / self.unit
        self._restarts_at_start = 0
        self.log_file: Path | None = None  # journald

    def _ctl(self, *args: str) -> proc.Result:
        done = proc.run(["systemctl", "--user", *args], check=False,
                        timeout=self.cfg.service.stop_timeout + 30)  # fmt: skip
        if not done.ok and "Failed to connect to bus" in done.output:
            raise PreflightFailed(
                "systemctl --user cannot reach this user's systemd (no user bus: "
                f'{proc.tail(done.output, 1)}); service.manager = "systemd-user" needs it',
                hint="enable the user's own systemd for this user (sudo loginctl enable-linger "
                "$USER) and run servegate in a session that has it (XDG_RUNTIME_DIR="
                '/run/user/$(id -u)); or set service.manager = "supervisor"',
            )
        if not done.ok:
            raise CommandFailed(
                f"systemctl --user {' '.join(args)} failed (exit {done.returncode}): "
                f"{proc.tail(done.output, 5)}"
            )
        return done

    def render_problems(self, spec: LaunchSpec) -> list[str]:
        return unsafe(spec) or render_problems(spec, render_unit(spec))

    def install(self, spec: LaunchSpec) -> Path:
        refuse(self, spec)
        # the environment may hold secrets: only the owner reads the unit (mkstemp: 0600)
        atomic.write_text(self.path, render_unit(spec))
        self._ctl("daemon-reload")
        return self.path

    def _show(self) -> dict[str, str]:
        out = self._ctl(
            "show",
            self.unit,
            "-p",
            "MainPID",
            "-p",
            "NRestarts",
            "-p",
            "ActiveState",
            "-p",
            "SubState",
            "-p",
            "ExecMainStatus",
            "-p",
            "Result",
        ).output
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)

    def start(self) -> None:
        self._ctl("reset-failed", self.unit)
        self._restarts_at_start = int(self._show().get("NRestarts", "0") or 0)
        self._ctl("start", "--no-block", self.unit)

    def stop(self) -> None:
        self._ctl("stop", self.unit)

    def state(self) -> ServiceState:
        props = self._show()
        active, sub = props.get("ActiveState", ""), props.get("SubState", "")
        pid = int(props.get("MainPID", "0") or 0) or None
        restarts = int(props.get("NRestarts", "0") or 0) - self._restarts_at_start
        exited = active == "failed" or (sub in ("auto-restart", "dead", "exited") and pid is None)
        status = int(props.get("ExecMainStatus", "0") or 0) if exited else None
        return ServiceState(f"{active}/{sub}", pid, exited, status, restarts, active == "failed")

    def main_pid(self) -> int | None:
        return self.state().pid

    def last_log_line(self) -> str:
        return self.log_tail(1)

    def log_tail(self, lines: int) -> str:
        out = proc.run(
            ["journalctl", "--user", "-u", self.unit, "-n", str(lines), "-o", "cat", "--no-pager"],
            check=False,
            timeout=30,
        )
        return out.output.strip() if out.ok else ""

    def log_mark(self) -> str:
        out = proc.run(
            ["journalctl", "--user", "-u", self.unit, "-n", "0", "--show-cursor", "--no-pager"],
            check=False,
            timeout=30,
        )
        cursor = [ln for ln in out.output.splitlines() if ln.startswith("-- cursor: ")]
        return cursor[-1].removeprefix("-- cursor: ").strip() if cursor else ""

    def log_since(self, mark: str) -> str:
        where = ["--after-cursor", mark] if mark else ["-b"]
        out = proc.run(
            ["journalctl", "--user", "-u", self.unit, *where, "-o", "cat", "--no-pager"],
            check=False,
            timeout=60,
        )
        if not out.ok:
            raise OSError(f"journalctl --user -u {self.unit} failed: {out.output.strip()[:300]}")
        return out.output
