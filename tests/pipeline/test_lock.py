from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from servegate.errors import LockHeld
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
