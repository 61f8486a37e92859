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
    return owners(port)[0]


def owners(port: int) -> tuple[set[int], int]:
    """(PIDs holding a socket that listens on ``port``, how many such sockets no process
    this user can read holds): another user's process, or one of ours that made itself
    non-dumpable, hides its ``/proc/PID/fd`` — a listener all the same."""
    inodes = _listening_inodes(port)
    if not inodes:
        return set(), 0
    wanted = {f"socket:[{i}]": i for i in inodes}
    pids: set[int] = set()
    held: set[str] = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fds = os.listdir(f"/proc/{entry}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                inode = wanted.get(os.readlink(f"/proc/{entry}/fd/{fd}"))
            except OSError:
                continue
            if inode is not None:
                pids.add(int(entry))
                held.add(inode)
    # a socket closed while we looked is no stranger: only those still listening count
    return pids, len((inodes - held) & _listening_inodes(port))


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
