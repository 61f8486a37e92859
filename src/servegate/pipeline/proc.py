"""The one way servegate runs a process.

Every child goes through :func:`run`: the quoted command is logged, a timeout is
enforced by escalating SIGTERM to SIGKILL on the child's whole process group, and a
failure raises :class:`~servegate.errors.CommandFailed` whose text shows the command,
its exit code and its indented output.
"""

from __future__ import annotations

import logging
import os
import shlex
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from servegate.errors import CommandFailed
from servegate.pipeline import atomic

log = logging.getLogger("servegate.proc")

TAIL_LINES = 40


@dataclass(frozen=True)
class Result:
    argv: tuple[str, ...]
    returncode: int
    output: str
    seconds: float

    @property
    def ok(self) -> bool:
        return self.returncode == 0


def quote(argv: Sequence[str]) -> str:
    return shlex.join(argv)


def tail(text: str, lines: int = TAIL_LINES) -> str:
    return "\n".join(text.rstrip("\n").splitlines()[-lines:])


def failure_text(argv: Sequence[str], returncode: int | None, output: str) -> str:
    status = "timed out" if returncode is None else f"exited with {returncode}"
    body = "\n".join(f"    {line}" for line in tail(output).splitlines()) or "    (no output)"
    return f"command {status}: {quote(argv)}\n  output (last lines):\n{body}"


def _stop_group(popen: subprocess.Popen[bytes], grace: float) -> None:
    """Terminate the child's process group, then kill it if it is still there."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(popen.pid, sig)
        except ProcessLookupError:
            return
        try:
            popen.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def run(
    argv: Sequence[str],
    *,
    cwd: str | Path | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float | None = None,
    check: bool = True,
    log_path: Path | None = None,
    stdin_text: str | None = None,
    capture: bool = True,
    redact: Sequence[str] = (),
) -> Result:
    """Run ``argv`` to completion and return its combined stdout/stderr.

    ``env`` replaces the environment when given. ``capture=False`` lets the output
    through to the terminal (for test runs people watch) and returns none of it.
    ``log_path`` also receives the full output (the error message shows only its tail).
    On timeout the process group gets SIGTERM, then SIGKILL, and CommandFailed is raised
    whatever ``check`` says.
    """
    argv = tuple(str(a) for a in argv)
    shown = tuple(_hide(a, redact) for a in argv)  # secrets never reach a log or an error
    log.debug("$ %s%s", quote(shown), f"  (in {cwd})" if cwd else "")
    start = time.monotonic()
    try:
        popen = subprocess.Popen(
            argv,
            cwd=cwd,
            env=dict(env) if env is not None else None,
            stdin=subprocess.PIPE if stdin_text is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE if capture else None,
            stderr=subprocess.STDOUT if capture else None,
            start_new_session=True,
        )
    except FileNotFoundError as exc:
        raise CommandFailed(
            f"cannot run {quote(shown)}: {exc.strerror}: {exc.filename}",
            hint=f"install {argv[0]!r} or fix the configured command",
        ) from exc
    try:
        raw, _ = popen.communicate(
            stdin_text.encode() if stdin_text is not None else None, timeout=timeout
        )
        returncode: int | None = popen.returncode
    except subprocess.TimeoutExpired:
        _stop_group(popen, grace=5.0)
        raw, _ = popen.communicate()
        returncode = None
    finally:
        if popen.poll() is None:
            _stop_group(popen, grace=1.0)
    output = _hide(raw.decode(errors="replace"), redact) if raw is not None else ""
    seconds = time.monotonic() - start
    if log_path is not None:
        atomic.write_text(log_path, f"$ {quote(shown)}\n{output}")  # 0600: it may hold secrets
    if returncode is None:
        raise CommandFailed(
            failure_text(shown, None, output) + f"\n  (limit: {timeout:.0f}s)",
            hint="raise the timeout in the config or find out why the command hangs",
        )
    if check and returncode != 0:
        raise CommandFailed(failure_text(shown, returncode, output))
    return Result(shown, returncode, output, seconds)


def _hide(text: str, secrets: Sequence[str]) -> str:
    for secret in secrets:
        if secret:
            text = text.replace(secret, "<redacted>")
    return text


def pid_alive(pid: int) -> bool:
    """True when a process with ``pid`` exists and is not a zombie."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def parent_of(pid: int) -> int | None:
    """The parent PID from /proc/PID/stat (the field after the closing parenthesis of the
    command name, which may itself hold spaces and parentheses), or None if it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[1])


def lineage(pid: int) -> set[int]:
    """``pid`` and all its ancestors (PID 1 excluded)."""
    chain: set[int] = set()
    current: int | None = pid
    while current is not None and current > 1:
        chain.add(current)
        current = parent_of(current)
    return chain
