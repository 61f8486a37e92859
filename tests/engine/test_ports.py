"""Who listens on a port: the kernel's socket diagnostics, and /proc where they are refused."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator

import pytest

from servegate.engine import ports


@pytest.fixture
def listening() -> Iterator[tuple[int, int]]:
    """A listener on 127.0.0.1 and one on ::1 (where IPv6 is up), and a connection to
    the first: (IPv4 port, IPv6 port or 0)."""
    v4 = socket.socket()
    v4.bind(("127.0.0.1", 0))
    v4.listen()
    port = v4.getsockname()[1]
    conn = socket.create_connection(("127.0.0.1", port))
    v6 = socket.socket(socket.AF_INET6)
    try:
        v6.bind(("::1", 0))
        v6.listen()
        port6 = v6.getsockname()[1]
    except OSError:
        port6 = 0
    try:
        yield port, port6
    finally:
        for s in (conn, v4, v6):
            s.close()


def test_the_kernels_listeners_are_the_ones_proc_lists(listening: tuple[int, int]) -> None:
    port, port6 = listening
    for p in (port, port6) if port6 else (port,):
        found = ports._listening_inodes(p)
        assert found, p
        assert found == ports._proc_listening_inodes(p)
    assert ports.owners(port) == ({os.getpid()}, 0)


def test_a_connection_on_the_port_is_no_listener(listening: tuple[int, int]) -> None:
    """The connected socket and its accepted end hold the port too, but do not listen."""
    port, _ = listening
    listed = ports._netlink_listeners(socket.AF_INET)
    assert listed is not None
    on_port = [inode for p, inode in listed if p == port]
    assert len(on_port) == 1  # the listener; not the established socket on its port
    assert set(on_port) == ports._listening_inodes(port)


def test_where_netlink_is_refused_proc_answers(
    listening: tuple[int, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    port, _ = listening
    want = ports._listening_inodes(port)
    real = socket.socket

    def refuse(family: int = -1, *args: object, **kwargs: object) -> socket.socket:
        if family == socket.AF_NETLINK:
            raise PermissionError(1, "Operation not permitted")
        return real(family, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(socket, "socket", refuse)
    assert ports._netlink_listeners(socket.AF_INET) is None
    assert ports._listening_inodes(port) == want
    assert not ports.port_in_use(1)
