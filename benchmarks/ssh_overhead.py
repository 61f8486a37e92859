"""What promoting over SSH costs compared with the same promote run locally.

    sudo .venv/bin/python benchmarks/ssh_overhead.py [--pairs N]

The stack is the test suite's small real server (tests/stack: a C library built by the
release, a Python HTTP server mapping it). Two hosts with the same config: one on this
machine, one behind a real sshd in its own network namespace (tests/sshlab.py; needs root
and openssh-server). For each of N new commits, `release promote` runs locally and then
over SSH (alternating, so drift hits both), each timed as the whole command. The
transport's overhead is the difference of the medians, and its share of the SSH promote.
"""

from __future__ import annotations

import argparse
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=8)
    args = parser.parse_args()
    why = sshlab.unavailable()
    if why:
        raise SystemExit(f"cannot run: {why}")
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
    lm, rm = statistics.median(local), statistics.median(remote)
    print(f"\npromote median: local {lm:.2f}s, over SSH {rm:.2f}s (n={len(local)})")
    print(f"transport overhead: {rm - lm:+.2f}s = {(rm - lm) / rm:.1%} of the SSH promote")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
