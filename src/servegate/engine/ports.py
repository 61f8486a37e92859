"""Which processes listen on a TCP port (read from /proc, no tools needed)."""

from __future__ import annotations

import os
from pathlib import Path

LISTEN = "0A"


def _listening_inodes(port: int) -> set[str]:
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            cols = row.split()
            if len(cols) > 9 and cols[3] == LISTEN and int(cols[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(cols[9])
    return inodes


def listeners(port: int) -> set[int]:
    """PIDs holding a socket that listens on ``port`` (any address)."""
    inodes = _listening_inodes(port)
    if not inodes:
        return set()
    wanted = {f"socket:[{i}]" for i in inodes}
    pids: set[int] = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fds = os.listdir(f"/proc/{entry}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{entry}/fd/{fd}") in wanted:
                    pids.add(int(entry))
                    break
            except OSError:
                continue
    return pids


def port_in_use(port: int) -> bool:
    return bool(_listening_inodes(port))


def argv(pid: int) -> list[str]:
    """The process's arguments as it was started (``["?"]`` when unreadable)."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return ["?"]
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def cmdline(pid: int) -> str:
    return " ".join(argv(pid))
