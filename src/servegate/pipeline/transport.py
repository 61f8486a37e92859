"""How a host elsewhere is reached: SSH through Fabric.

A transport runs one argv and returns its exit code and output; everything servegate
does on a host is a servegate command run there, so the behaviour and the records are the
same code as on this machine. Over SSH:

* host keys are checked against ``known_hosts`` — an unknown or changed key refuses the
  connection (Fabric's own default would accept any key);
* keys come from the user's SSH setup (agent, ``~/.ssh``, or ``identity``); no password
  is ever asked for or stored;
* the command runs on a pseudo-terminal, so a dropped connection ends it (SIGHUP) rather
  than leaving it to run unobserved; the host's state file tells the next run what it
  left behind.
"""

from __future__ import annotations

import contextlib
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import paramiko

from servegate.errors import ConfigError, HostKeyRejected, HostUnreachable


@dataclass(frozen=True)
class Output:
    exit_code: int
    text: str


class Transport(Protocol):
    #: "local" or the SSH address
    name: str

    def run(
        self, argv: Sequence[str], *, timeout: float, env: Mapping[str, str] | None = None
    ) -> Output: ...

    def connect(self) -> None:
        """Open the connection now: an unreachable host or a rejected key says so here,
        before any command is sent."""
        ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class Address:
    user: str
    host: str
    port: int

    @classmethod
    def parse(cls, text: str, default_user: str = "") -> Address:
        user, _, rest = text.rpartition("@")
        host, _, port = rest.partition(":")
        if not host:
            raise ConfigError(f"SSH address {text!r} has no host", hint="write user@host[:port]")
        return cls(user or default_user, host, int(port) if port else 22)

    def __str__(self) -> str:
        port = f":{self.port}" if self.port != 22 else ""
        return f"{self.user}@{self.host}{port}" if self.user else f"{self.host}{port}"


class Ssh:
    """One SSH connection (opened on first use) to ``address``."""

    def __init__(
        self,
        address: str,
        known_hosts: Path,
        identity: str = "",
        connect_timeout: float = 10.0,
    ) -> None:
        import getpass

        self.address = Address.parse(address, getpass.getuser())
        self.name = str(self.address)
        self.known_hosts = known_hosts
        self.identity = identity
        self.connect_timeout = connect_timeout
        self._conn: object | None = None

    def connect(self) -> None:
        self._connection()

    def _connection(self) -> object:
        if self._conn is not None:
            return self._conn
        from fabric import Connection

        kwargs: dict[str, object] = {
            "banner_timeout": self.connect_timeout,
            "auth_timeout": self.connect_timeout,
            "allow_agent": True,
            "look_for_keys": not self.identity,
        }
        if self.identity:
            kwargs["key_filename"] = str(Path(self.identity).expanduser())
        conn = Connection(
            self.address.host,
            user=self.address.user,
            port=self.address.port,
            connect_kwargs=kwargs,
            connect_timeout=self.connect_timeout,
        )
        client: paramiko.SSHClient = conn.client
        client.set_missing_host_key_policy(paramiko.RejectPolicy())
        if self.known_hosts.is_file():
            client.load_host_keys(str(self.known_hosts))
        self._open(conn)
        self._conn = conn
        return conn

    def _open(self, conn: object) -> None:
        where = f"{self.name}"
        try:
            conn.open()  # type: ignore[attr-defined]
        except paramiko.BadHostKeyException as exc:
            raise HostKeyRejected(
                f"the host key of {where} does not match {self.known_hosts}: the server "
                f"offered {exc.key.get_name()} {exc.key.get_fingerprint().hex()}",
                hint="if the box was reinstalled, verify its new key out of band and replace "
                f"its line in {self.known_hosts} (ssh-keygen -R {self.address.host}); "
                "nothing was changed on the host",
            ) from None
        except paramiko.SSHException as exc:
            if "not found in known_hosts" in str(exc):
                raise HostKeyRejected(
                    f"{where} is not in {self.known_hosts}: servegate does not accept unknown "
                    "host keys",
                    hint=f"verify the key and add it (ssh-keyscan {self.address.host} >> "
                    f"{self.known_hosts}), or set host.known_hosts",
                ) from None
            raise HostUnreachable(
                f"cannot open an SSH session to {where}: {exc}",
                hint="check the address, the user's key (agent or host.identity) and sshd",
            ) from None
        except (TimeoutError, OSError, EOFError) as exc:
            raise HostUnreachable(
                f"cannot reach {where}: {type(exc).__name__}: {exc}",
                hint="check that the host is up and its sshd listens; nothing was changed",
            ) from None

    def run(
        self, argv: Sequence[str], *, timeout: float, env: Mapping[str, str] | None = None
    ) -> Output:
        conn = self._connection()
        prefix = ["env", *(f"{k}={v}" for k, v in (env or {}).items())] if env else []
        command = shlex.join([*prefix, *argv])
        try:
            result = conn.run(  # type: ignore[attr-defined]
                command, hide=True, warn=True, pty=True, timeout=timeout, in_stream=False
            )
        except Exception as exc:  # invoke/paramiko raise several kinds for a lost link
            self.close()
            if type(exc).__name__ == "CommandTimedOut":
                raise HostUnreachable(
                    f"{self.name}: `{shlex.join(argv)[:120]}` did not finish within {timeout:.0f}s",
                    hint="the host's state file says where it stopped; run the command again",
                ) from None
            raise HostUnreachable(
                f"the connection to {self.name} was lost while running "
                f"`{shlex.join(argv)[:120]}`: {type(exc).__name__}: {exc}",
                hint="the next run on that host finds what was left half done in its state "
                "file and finishes the rollback",
            ) from None
        return Output(int(result.exited), str(result.stdout).replace("\r\n", "\n"))

    def close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):  # closing a dead connection: nothing to do
                self._conn.close()  # type: ignore[attr-defined]
            self._conn = None
