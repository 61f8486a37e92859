"""Which processes listen on a TCP port (read from the kernel, no tools needed).

The listening sockets come from the kernel's socket-diagnostics netlink interface
(``NETLINK_SOCK_DIAG``, what ``ss`` uses), asked for listening TCP sockets only, and from
``/proc/net/tcp{,6}`` where netlink is refused. Reading ``/proc/net/tcp`` walks the whole
connection table: 5-17 ms a read on a 24 GiB box however few sockets it holds, and a
promote asks about its port several times (the test suite's promotes spent 8 % of their
CPU there). The standard library has no such call, and pyroute2 (which has one) is a
large dependency for one query: the request is a few packed structs, written here.
"""

from __future__ import annotations

import os
import socket
import struct
from pathlib import Path

LISTEN = "0A"
#: <linux/sock_diag.h>, <linux/inet_diag.h>, <linux/netlink.h>
_SOCK_DIAG_BY_FAMILY = 20
_NLM_F_REQUEST, _NLM_F_DUMP = 0x1, 0x300
_NLMSG_ERROR, _NLMSG_DONE = 2, 3
_TCP_LISTEN = 10
_NETLINK_SOCK_DIAG = 4
_NLMSG = struct.Struct("=IHHII")  # len, type, flags, seq, pid
# family, protocol, ext, pad, states; sockid: sport, dport (big-endian), src, dst, if, cookie
_REQ = struct.Struct("=BBBBI")
_SOCKID = struct.Struct(">HH16s16s")
_SOCKID_REST = struct.Struct("=I8s")
# family, state, timer, retrans; sockid; expires, rqueue, wqueue, uid, inode
_MSG_HEAD = struct.Struct("=BBBB")
_MSG_TAIL = struct.Struct("=IIIII")


def _netlink_listeners(family: int) -> list[tuple[int, str]] | None:
    """(port, inode) of every listening TCP socket of ``family`` in this network
    namespace; None where the kernel does not answer (netlink refused)."""
    req = (
        _REQ.pack(family, socket.IPPROTO_TCP, 0, 0, 1 << _TCP_LISTEN)
        + _SOCKID.pack(0, 0, b"", b"")
        + _SOCKID_REST.pack(0, b"\xff" * 8)
    )
    msg = _NLMSG.pack(_NLMSG.size + len(req), _SOCK_DIAG_BY_FAMILY,
                      _NLM_F_REQUEST | _NLM_F_DUMP, 1, 0) + req  # fmt: skip
    out: list[tuple[int, str]] = []
    try:
        with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, _NETLINK_SOCK_DIAG) as s:
            s.settimeout(5)
            s.send(msg)
            while True:
                data = s.recv(65536)
                at = 0
                while at + _NLMSG.size <= len(data):
                    length, kind, _, _, _ = _NLMSG.unpack_from(data, at)
                    if length < _NLMSG.size:
                        return None
                    if kind == _NLMSG_DONE:
                        return out
                    if kind == _NLMSG_ERROR:
                        return None
                    body = at + _NLMSG.size
                    _, state, _, _ = _MSG_HEAD.unpack_from(data, body)
                    sport, _, _, _ = _SOCKID.unpack_from(data, body + _MSG_HEAD.size)
                    tail = body + _MSG_HEAD.size + _SOCKID.size + _SOCKID_REST.size
                    inode = _MSG_TAIL.unpack_from(data, tail)[4]
                    if state == _TCP_LISTEN:
                        out.append((sport, str(inode)))
                    at += (length + 3) & ~3
                if not data:
                    return None
    except (OSError, struct.error):
        return None


def _listening_inodes(port: int) -> set[str]:
    found: set[str] = set()
    for family in (socket.AF_INET, socket.AF_INET6):
        listed = _netlink_listeners(family)
        if listed is None:
            return _proc_listening_inodes(port)
        found |= {inode for p, inode in listed if p == port}
    return found


def _proc_listening_inodes(port: int) -> set[str]:
    inodes: set[str] = set()
    # the local address ends ":PORT" in hex: rows without it are not split (a busy box's
    # table holds thousands of connections, a few of them on this port)
    local = f":{port:04X} "
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            if local not in row:
                continue
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
