"""Real SSH hosts for the tests: one network namespace per host (``ip netns add``, a veth
pair, its own address), Debian's sshd listening inside it, host keys and a client key
made for the run. Only these addresses are ever connected to.

Each host shares this machine's filesystem (servegate in .venv, the bare origin) but has
its own network: its service's port, health checks and probes live in its namespace.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

SSHD = "/usr/sbin/sshd"
SERVEGATE = str(Path(sys.executable).parent / "servegate")


def unavailable() -> str:
    """Why the lab cannot run here ("" when it can)."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if not Path(SSHD).exists():
        return f"{SSHD} missing (Debian: apt-get install openssh-server; scripts/bootstrap.sh does)"
    if shutil.which("ip") is None or shutil.which("ssh-keygen") is None:
        return "ip (iproute2) or ssh-keygen missing"
    probe = f"sgprobe{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"cannot create a network namespace: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], check=False)
    return ""


def sh(*argv: str) -> str:
    return subprocess.run(argv, check=True, capture_output=True, text=True).stdout


@dataclass
class LabHost:
    index: int
    ns: str
    address: str  # IPv4
    host_key: Path
    sshd: subprocess.Popen[bytes] | None = None
    root: Path = field(default_factory=Path)
    config: Path = field(default_factory=Path)

    @property
    def ssh(self) -> str:
        return f"root@{self.address}"

    def session_pids(self) -> list[int]:
        """The sshd processes serving connections: every sshd below the listener (the
        privileged monitor and the session process holding the terminal)."""
        if self.sshd is None:
            return []
        children: dict[int, list[int]] = {}
        names: dict[int, str] = {}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            pid = int(entry.name)
            names[pid] = stat[stat.index("(") + 1 : stat.rindex(")")]
            children.setdefault(int(stat.rsplit(")", 1)[1].split()[1]), []).append(pid)
        out: list[int] = []
        todo = list(children.get(self.sshd.pid, []))
        while todo:
            pid = todo.pop()
            if names.get(pid) == "sshd":
                out.append(pid)
                todo += children.get(pid, [])
        return out

    def drop_connections(self) -> int:
        """Cut every SSH connection to this host, as a lost network would: its sshd
        processes die (SIGKILL), the session's terminal hangs up."""
        pids = self.session_pids()
        for pid in pids:
            os.kill(pid, 9)
        return len(pids)


@dataclass
class Lab:
    dir: Path
    client_key: Path
    known_hosts: Path
    hosts: list[LabHost]

    def start(self, host: LabHost) -> None:
        conf = self.dir / f"sshd-{host.index}.conf"
        conf.write_text(
            f"ListenAddress {host.address}\nPort 22\nHostKey {host.host_key}\n"
            f"PidFile {self.dir}/sshd-{host.index}.pid\n"
            f"AuthorizedKeysFile {self.dir}/authorized_keys\n"
            "PermitRootLogin prohibit-password\nPasswordAuthentication no\n"
            "KbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\n"
            "PrintMotd no\nLogLevel ERROR\n"
        )
        Path("/run/sshd").mkdir(exist_ok=True)
        log = self.dir / f"sshd-{host.index}.log"
        with log.open("ab") as err:
            host.sshd = subprocess.Popen(
                ["ip", "netns", "exec", host.ns, SSHD, "-D", "-e", "-f", str(conf)],
                stdout=subprocess.DEVNULL,
                stderr=err,
            )
        # 60 s: on a box whose two cores run vLLM beside this, a start can take seconds.
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and host.sshd.poll() is None:
            try:
                with socket.create_connection((host.address, 22), timeout=0.5):
                    return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError(
            f"sshd in {host.ns} did not listen on {host.address}:22 "
            f"(exit {host.sshd.poll()}): {log.read_text(errors='replace')[-2000:]}"
        )

    def stop(self, host: LabHost) -> None:
        if host.sshd is not None:
            host.drop_connections()
            host.sshd.kill()
            host.sshd.wait()
            host.sshd = None


def _free_subnet() -> int:
    """A second octet no address on this machine uses: a lab's namespace can outlive
    its deletion while a process started in it still runs, and a new lab on the same
    subnet would then route its connections to the old one."""
    used = sh("ip", "-4", "-o", "addr", "show")
    taken: set[int] = {int(p.split(".")[1]) for p in used.split() if p.startswith("10.")}
    names = sh("ip", "netns", "list")
    for subnet in [*range(200 + os.getpid() % 50, 250), *range(100, 250)]:
        if subnet not in taken and f"sg{subnet}" not in names:
            return int(subnet)
    raise RuntimeError("no free 10.x.0.0/16 subnet for the SSH lab")


def _end_namespace(ns: str) -> None:
    """Kill what still runs inside a host's namespace (a service the test left), then
    delete it, so that its addresses go with it."""
    pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True)
    for pid in pids.stdout.split():
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), 9)
    subprocess.run(["ip", "netns", "del", ns], check=False)


@contextmanager
def lab(tmp: Path, count: int) -> Iterator[Lab]:
    """``count`` hosts. Labs of several test processes may stand at once: the subnet is
    chosen and taken under a lock, so two never pick the same one."""
    tmp.mkdir(parents=True, exist_ok=True)
    choosing = open("/run/servegate-sshlab.lock", "a")  # noqa: SIM115 (closed below)
    fcntl.flock(choosing, fcntl.LOCK_EX)
    subnet = _free_subnet()
    tag = f"{subnet}{os.getpid() % 100:02d}"
    key = tmp / "id_ed25519"
    sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "servegate-test", "-f", str(key))
    (tmp / "authorized_keys").write_text(key.with_suffix(".pub").read_text())
    hosts: list[LabHost] = []
    known: list[str] = []
    made: list[LabHost] = []
    try:
        for i in range(1, count + 1):
            ns, address = f"sg{tag}h{i}", f"10.{subnet}.{i}.2"
            hk = tmp / f"host{i}_key"
            sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(hk))
            host = LabHost(i, ns, address, hk)
            sh("ip", "netns", "add", ns)
            made.append(host)
            outer, inner = f"sg{tag}v{i}a", f"sg{tag}v{i}b"
            sh("ip", "link", "add", outer, "type", "veth", "peer", "name", inner)
            sh("ip", "link", "set", inner, "netns", ns)
            sh("ip", "addr", "add", f"10.{subnet}.{i}.1/24", "dev", outer)
            sh("ip", "link", "set", outer, "up")
            sh("ip", "netns", "exec", ns, "ip", "addr", "add", f"{address}/24", "dev", inner)
            sh("ip", "netns", "exec", ns, "ip", "link", "set", inner, "up")
            sh("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
            public = hk.with_suffix(".pub").read_text().split()
            known.append(f"{address} {public[0]} {public[1]}")
            hosts.append(host)
        choosing.close()  # its addresses are there: the next lab sees the subnet taken
        (tmp / "known_hosts").write_text("\n".join(known) + "\n")
        the_lab = Lab(tmp, key, tmp / "known_hosts", hosts)
        for host in hosts:
            the_lab.start(host)
        yield the_lab
    finally:
        choosing.close()
        for host in made:
            if host.sshd is not None:
                host.sshd.kill()
                host.sshd.wait()
            _end_namespace(host.ns)
            subprocess.run(["ip", "link", "del", f"sg{tag}v{host.index}a"], check=False,
                           capture_output=True)  # fmt: skip
