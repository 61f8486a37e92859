"""One promote or rollback at a time per host root.

The lock is an ``flock`` on a file that also names its holder (pid, command, since).
The kernel drops the flock when the holder dies, so a dead holder never blocks; the
leftover holder record is reported when the lock is taken over.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from servegate.errors import LockHeld
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
    try:
        data = json.loads(path.read_text() or "null")
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    return Holder(int(data["pid"]), str(data["host"]), str(data["command"]), float(data["since"]))


class HostLock:
    """``with HostLock(path, "release promote abc"):`` — raises LockHeld when taken."""

    def __init__(self, path: Path, command: str) -> None:
        self.path = path
        self.command = command
        self.took_over: Holder | None = None
        self._fd: int | None = None

    def __enter__(self) -> HostLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            holder = read_holder(self.path)
            who = holder.describe() if holder else "an unknown process"
            raise LockHeld(
                f"{self.path} is held by {who}",
                hint="wait for it to finish; servegate runs one promote or rollback at a time",
            ) from None
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
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(record).encode(), 0)
        self._fd = fd
        return self

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
