"""The one way servegate runs a process.

Every child goes through :func:`run`: the quoted command is logged, a timeout is
enforced by escalating SIGTERM to SIGKILL on the child's whole process group, and a
failure raises :class:`~servegate.errors.CommandFailed` whose text shows the command,
its exit code and its indented output.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import shlex
import signal
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
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


#: prctl(2): orphans among this process's descendants become its children, not init's
PR_SET_CHILD_SUBREAPER = 36


def _ppids() -> dict[int, int]:
    """pid → parent pid of every process visible in /proc."""
    found: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
            found[int(entry)] = int(fields[1])
        except (OSError, IndexError, ValueError):
            continue
    return found


def _subreaper(on: bool) -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0) == 0)
    except (OSError, AttributeError):  # not Linux's libc: no subreaper, nothing found
        return False


def _exited(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] in (b"Z", b"X")
    except (OSError, IndexError):
        return True


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()[:120]
    except OSError:
        return "?"


@contextlib.contextmanager
def stopping_leftovers() -> Iterator[list[str]]:
    """Processes the block's commands leave running are stopped when it ends, and named.

    A build that starts a daemon (a compiler server, or a hostile ``setsid burner &``)
    returns while that process keeps running: beside the live release it would slow the
    very measurement the candidate is compared with. This process is made the
    *subreaper* of its descendants for the block (``prctl(PR_SET_CHILD_SUBREAPER)``), so an
    orphan, detached or not, becomes its child instead of init's; every child that was
    not there before the block is killed with its descendants (SIGKILL) and reaped, and
    the list says which (pid and command line). Written here because no library in the
    field does this (psutil does not set a subreaper); Linux only, nothing found
    elsewhere."""
    me = os.getpid()
    before = {pid for pid, parent in _ppids().items() if parent == me}
    was_on = _subreaper(True)
    found: list[str] = []
    try:
        yield found
    finally:
        parents = _ppids()
        left = sorted(pid for pid, parent in parents.items() if parent == me and pid not in before)
        tree = set(left)
        grew = True
        while grew:
            more = {pid for pid, parent in parents.items() if parent in tree} - tree
            tree |= more
            grew = bool(more)
        for pid in left:
            if not _exited(pid):  # an orphan that already ended is reaped, not reported
                found.append(f"pid {pid}: {_cmdline(pid)}")
        for pid in sorted(tree):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        for pid in left:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
        if was_on:
            _subreaper(False)


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
