from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from servegate.errors import LockHeld, PreflightFailed
from servegate.pipeline.lock import HostLock, read_holder
from tests.conftest import hold_lock


def test_second_holder_fails_at_once_naming_the_first(tmp_path: Path) -> None:
    path = tmp_path / "servegate.lock"
    with hold_lock(path) as holder:
        with pytest.raises(LockHeld) as err:
            HostLock(path, "release promote b").__enter__()
        assert f"pid {holder.pid}" in str(err.value)
        assert "release promote other" in str(err.value)


def test_lock_is_released_on_exit(tmp_path: Path) -> None:
    path = tmp_path / "servegate.lock"
    with HostLock(path, "one"):
        holder = read_holder(path)
        assert holder is not None
        assert holder.pid == os.getpid()
    assert read_holder(path) is None
    with HostLock(path, "two"):
        pass


def test_stale_lock_of_a_dead_process_is_taken_over(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "servegate.lock"
    with hold_lock(path) as holder:
        dead_pid = holder.pid
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    # the kernel dropped the flock, the record of the dead holder is still there
    assert json.loads(path.read_text())["pid"] == dead_pid
    with HostLock(path, "release promote new") as lock:
        assert lock.took_over is not None
        assert lock.took_over.pid == dead_pid
    assert f"stale lock left by pid {dead_pid}" in capsys.readouterr().err


def test_lock_excludes_across_processes(tmp_path: Path) -> None:
    path = tmp_path / "servegate.lock"
    with HostLock(path, "release rollback"):
        probe = subprocess.run(
            [
                sys.executable,
                "-c",
                "import sys; from pathlib import Path; from servegate.pipeline.lock import HostLock\n"
                "try:\n    HostLock(Path(sys.argv[1]), 'x').__enter__()\n"
                "except Exception as e:\n    print(type(e).__name__, e)",
                str(path),
            ],
            capture_output=True,
            text=True,
            check=True,
        )
    assert probe.stdout.startswith("LockHeld")
    assert "release rollback" in probe.stdout


def _as_user(uid: int, gid: int, work: Callable[[], str]) -> str:
    """``work()`` in a forked child running as ``uid``/``gid``: what it returned, or
    the name of what it raised."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.close(read)
        try:
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)
            answer = work()
        except BaseException as exc:  # reported to the parent
            answer = f"{type(exc).__name__}: {exc}"
        os.write(write, answer.encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as f:
        answer = f.read()
    os.waitpid(pid, 0)
    return answer


@pytest.mark.skipif(os.geteuid() != 0, reason="acting as two other users needs root")
def test_a_lease_folder_two_users_share_gives_one_lease_between_them() -> None:
    """The release user and the pull-request runner's user share the GPU lease in a
    group folder: each can take it, neither while the other holds it, and neither can
    remove the other's lock to take a second one beside it."""
    group = 65534
    folder = Path(tempfile.mkdtemp(prefix="servegate-shared-lease-"))
    try:
        folder.chmod(0o770)  # group-writable, not sticky: refused
        os.chown(folder, 0, group)
        lease = folder / "gpu.lease"
        with pytest.raises(PreflightFailed, match="without the sticky bit") as err:
            HostLock(lease, "x").__enter__()
        assert "chmod +t" in err.value.hint
        folder.chmod(0o3770)
        first, second = 65534, 65533
        held = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the first user holds the lease
            os.setgroups([])
            os.setgid(group)
            os.setuid(first)
            with HostLock(lease, "pull request #7"):
                os.write(held[1], b"1")
                time.sleep(30)
            os._exit(0)
        assert os.read(held[0], 1) == b"1"
        try:
            assert stat.S_IMODE(lease.stat().st_mode) == 0o660

            def take() -> str:
                with HostLock(lease, "release promote"):
                    return "took it"

            assert "is held by" in _as_user(second, group, take)

            def remove() -> str:
                lease.unlink()
                return "removed"

            assert "PermissionError" in _as_user(second, group, remove)
            assert lease.exists()
        finally:
            os.kill(pid, signal.SIGTERM)
            os.waitpid(pid, 0)
        assert _as_user(second, group, take) == "took it"
    finally:
        shutil.rmtree(folder)
