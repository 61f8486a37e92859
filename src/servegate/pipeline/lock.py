"""One promote or rollback at a time per host root.

The lock is an ``flock`` on a file that also names its holder (pid, command, since).
The kernel drops the flock when the holder dies, so a dead holder never blocks; the
leftover holder record is reported when the lock is taken over.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import stat
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from servegate.errors import LockHeld, PreflightFailed
from servegate.pipeline.proc import pid_alive


@dataclass(frozen=True)
class Holder:
    pid: int
    host: str
    command: str
    since: float

    def describe(self) -> str:
        age = time.time() - self.since
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.since))
        return f"pid {self.pid} on {self.host} ({self.command!r}) since {when}, {age:.0f}s ago"


def read_holder(path: Path) -> Holder | None:
    """The holder the lock file names; None when it names none that could be true (empty,
    not JSON, a field missing or of the wrong type, a pid or a time out of range): the
    caller then speaks of an unknown holder."""
    try:
        data = json.loads(path.read_text(errors="replace") or "null")
    except (OSError, ValueError, RecursionError):
        return None
    if not isinstance(data, dict):
        return None
    pid, host, command, since = (data.get(k) for k in ("pid", "host", "command", "since"))
    if not (isinstance(pid, int) and not isinstance(pid, bool) and 0 < pid < 2**31):
        return None
    if not (isinstance(host, str) and isinstance(command, str)):
        return None
    if not (isinstance(since, int | float) and not isinstance(since, bool)):
        return None
    if not 0 <= since < 2**33:  # a finite time before the year 2242
        return None
    return Holder(pid, host[:200], command[:200], float(since))


WaitCallback = Callable[[Holder | None, float], None]


def _check_directory(directory: Path) -> bool:
    """Where a lock lives no one else may create names: a directory others may write (a
    sticky one too: a neighbour plants ``gpu.lease`` → a file of ours before we first
    run) or another user's (root's aside) is refused. A group may share it (a ``gpu``
    group's lease: the release user and the pull-request runner's user) when it is
    sticky, so that no member can unlink the lock another member holds and take a fresh
    one beside it. True when the group shares it."""
    info = os.stat(directory)
    shared = bool(info.st_mode & 0o020)
    if shared and not info.st_mode & stat.S_ISVTX:
        raise PreflightFailed(
            f"{directory} is writable by its group without the sticky bit (mode "
            f"{oct(stat.S_IMODE(info.st_mode))}): a member could remove the lock another "
            "holds and take a second one",
            hint=f"chmod +t {directory} (a shared lease folder: chmod 3770, group of the "
            "GPU's users)",
        )
    if info.st_mode & 0o002 or info.st_uid not in (0, os.getuid()):
        raise PreflightFailed(
            f"{directory} is writable by every user or belongs to another (owner uid "
            f"{info.st_uid}, mode {oct(stat.S_IMODE(info.st_mode))}): anyone could plant "
            "the lock file there",
            hint=(
                f"chown $(id -u) {directory} && chmod go-w {directory}"
                if info.st_uid not in (0, os.getuid())
                else f"chmod o-w {directory}"
            )
            + "; or use a directory of your own (host.root, host.state_dir for the lease)",
        )
    return shared


def _owner(path: Path) -> str:
    try:
        return f" owned by uid {os.lstat(path).st_uid}"
    except OSError:
        return ""


class HostLock:
    """``with HostLock(path, "release promote abc"):`` — raises LockHeld when taken.

    With ``wait`` > 0 it waits up to that many seconds for the holder, calling
    ``on_wait(holder, waited_seconds)`` about once a second.
    """

    def __init__(
        self,
        path: Path,
        command: str,
        *,
        wait: float = 0.0,
        on_wait: WaitCallback | None = None,
        hint: str = "wait for it to finish; servegate runs one promote or rollback at a time",
    ) -> None:
        self.path = path
        self.command = command
        self.wait = wait
        self.on_wait = on_wait
        self.hint = hint
        self.took_over: Holder | None = None
        self._fd: int | None = None

    def _acquire(self, fd: int) -> None:
        start = last_report = time.monotonic()
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                waited = time.monotonic() - start
                holder = read_holder(self.path)
                if waited >= self.wait:
                    os.close(fd)
                    who = (
                        holder.describe()
                        if holder
                        else "a process that left no readable record in it"
                    )
                    after = f" (waited {waited:.0f}s)" if self.wait else ""
                    raise LockHeld(f"{self.path} is held by {who}{after}", hint=self.hint) from None
                if self.on_wait is not None and time.monotonic() - last_report >= 1.0:
                    last_report = time.monotonic()
                    self.on_wait(holder, waited)
                time.sleep(0.1)

    def __enter__(self) -> HostLock:
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        shared = _check_directory(self.path.parent)
        try:  # never through a planted link: the lock is truncated and rewritten below
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW,
                         0o660 if shared else 0o600)  # fmt: skip
            if shared and os.fstat(fd).st_uid == os.getuid():
                os.fchmod(fd, 0o660)  # the group's other users take it too
        except OSError as exc:
            if exc.errno == errno.ELOOP or os.path.islink(self.path):
                raise LockHeld(
                    f"{self.path} is a symbolic link{_owner(self.path)}: refusing to open it "
                    "as a lock",
                    hint=f"something planted it; inspect it (ls -l {self.path}) and remove it",
                ) from None
            if exc.errno in (errno.EACCES, errno.EPERM):
                raise LockHeld(
                    f"{self.path} cannot be opened ({exc.strerror}): it is{_owner(self.path)} "
                    "in a directory others may write",
                    hint=f"inspect it (ls -l {self.path}); point host.state_dir at a directory "
                    "only the GPU's users share",
                ) from None
            raise
        self._acquire(fd)
        stale = read_holder(self.path)
        if stale is not None and stale.pid != os.getpid() and not pid_alive(stale.pid):
            self.took_over = stale
            print(
                f"servegate: taking over a stale lock left by {stale.describe()} "
                "(that process is gone)",
                file=sys.stderr,
            )
        record = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "command": self.command,
            "since": time.time(),
        }
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps(record).encode(), 0)
        except OSError as exc:  # a full disk (or quota): nothing has been changed yet
            os.close(fd)  # the flock goes with it
            raise PreflightFailed(
                f"cannot write the lock {self.path} ({exc.strerror}): the filesystem of "
                f"{self.path.parent} is full or read-only; nothing was changed and the live "
                "service was not touched",
                hint=f"free space there (df -h {self.path.parent}) and run the command again",
            ) from None
        self._fd = fd
        return self

    @property
    def fd(self) -> int:
        """The locked descriptor: a child given it keeps the lock while it lives."""
        if self._fd is None:
            raise RuntimeError("the lock is not held")
        return self._fd

    def hand_to(self, pid: int, command: str) -> None:
        """Name ``pid`` as the holder: a child that inherited :attr:`fd` holds the flock
        as long as it runs, even if this process dies first."""
        record = {"pid": pid, "host": socket.gethostname(), "command": command,
                  "since": time.time()}  # fmt: skip
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, json.dumps(record).encode(), 0)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._fd is not None:
            os.ftruncate(self._fd, 0)
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
