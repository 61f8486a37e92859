"""The host's GPU lease, contended by real processes."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from servegate.cli import release_main
from servegate.pipeline.proc import pid_alive
from servegate.provenance.liveproc import descendants
from tests.conftest import Host, Stack

LEASE = [sys.executable, "-m", "servegate", "lease"]


def env_for(state: Path) -> dict[str, str]:
    return dict(os.environ, SERVEGATE_STATE_DIR=str(state))


@contextmanager
def holder(state: Path, seconds: float = 60) -> Iterator[subprocess.Popen[str]]:
    """A CI GPU job holding the lease."""
    job = subprocess.Popen(
        [
            *LEASE,
            "--what",
            "gpu job 17",
            "--",
            sys.executable,
            "-c",
            f"import time; print('held', flush=True); time.sleep({seconds})",
        ],
        env=env_for(state),
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert job.stdout is not None
    assert job.stdout.readline().strip() == "held"
    try:
        yield job
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
        job.wait()
        job.stdout.close()


def test_second_holder_times_out_naming_the_first(tmp_path: Path) -> None:
    with holder(tmp_path):
        start = time.monotonic()
        late = subprocess.run(
            [*LEASE, "--timeout", "1.5", "--", "true"],
            env=env_for(tmp_path),
            capture_output=True,
            text=True,
        )
        assert time.monotonic() - start >= 1.5
    assert late.returncode == 4
    assert "gpu job 17" in late.stderr
    waited = re.search(r"\(waited (\d+)s\)", late.stderr)
    assert waited, late.stderr
    assert int(waited[1]) >= 1  # a busy box may start the waiter late: never less


def test_waiter_sees_the_holder_then_runs(tmp_path: Path) -> None:
    with holder(tmp_path) as job:
        waiter = subprocess.Popen(
            [*LEASE, "--timeout", "60", "--", "sh", "-c", "echo ran; exit 3"],
            env=env_for(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert waiter.stderr is not None
        said = waiter.stderr.readline()  # it says whom it waits for, then waits
        os.killpg(job.pid, signal.SIGTERM)  # the holder's job ends: the lease is free
        out, rest = waiter.communicate(timeout=60)
    assert waiter.returncode == 3  # the command's own exit code
    assert "waits for the GPU lease, held by pid" in said, said + rest
    assert "gpu job 17" in said
    assert out.strip() == "ran"


def test_dead_holder_releases_the_lease(tmp_path: Path) -> None:
    with holder(tmp_path) as job:
        os.killpg(job.pid, signal.SIGKILL)
        job.wait()
    after = subprocess.run(
        [*LEASE, "--timeout", "0", "--", "true"],
        env=env_for(tmp_path),
        capture_output=True,
        text=True,
    )
    assert after.returncode == 0
    assert "taking over a stale lock" in after.stderr


def test_killing_the_lease_process_keeps_the_lease_while_its_command_runs(
    tmp_path: Path,
) -> None:
    """``kill -9`` of ``servegate lease`` alone (not its command): the GPU job still runs,
    so the lease must stay held — by the job, which the waiter is told about."""
    with holder(tmp_path) as job:
        (command,) = descendants(job.pid)[1:]
        os.kill(job.pid, signal.SIGKILL)
        job.wait()
        assert pid_alive(command)
        late = subprocess.run(
            [*LEASE, "--timeout", "1", "--", "true"],
            env=env_for(tmp_path),
            capture_output=True,
            text=True,
        )
        assert late.returncode == 4, late.stderr
        assert f"held by pid {command}" in late.stderr
        assert "gpu job 17" in late.stderr
        os.kill(command, signal.SIGKILL)
        while pid_alive(command):
            time.sleep(0.05)
    after = subprocess.run(
        [*LEASE, "--timeout", "0", "--", "true"], env=env_for(tmp_path), capture_output=True,
        text=True,
    )  # fmt: skip
    assert after.returncode == 0, after.stderr


def test_sigterm_to_the_lease_process_reaches_its_command(tmp_path: Path) -> None:
    with holder(tmp_path) as job:
        job.send_signal(signal.SIGTERM)
        assert (
            job.wait(timeout=30) == 128 + signal.SIGTERM
        )  # the command's death, as a shell says it


def test_nested_lease_does_not_deadlock(tmp_path: Path) -> None:
    inner = f"{sys.executable} -m servegate lease --timeout 0 -- true"
    nested = subprocess.run(
        [*LEASE, "--timeout", "0", "--", "sh", "-c", inner],
        env=env_for(tmp_path),
        capture_output=True,
        text=True,
    )
    assert nested.returncode == 0, nested.stderr


def test_no_command_is_a_usage_error(tmp_path: Path) -> None:
    run = subprocess.run([*LEASE], env=env_for(tmp_path), capture_output=True, text=True)
    assert run.returncode == 2
    assert "no command to run" in run.stderr


def test_promote_waits_for_the_lease_and_leaves_the_service_alone(
    host: Host,
    stack: Stack,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    state = tmp_path / "state"
    monkeypatch.setenv("SERVEGATE_STATE_DIR", str(state))
    good = stack.commit()
    assert release_main(["promote", good, "--config", str(host.path)]) == 0
    pid = host.context().manager.main_pid()
    text = host.path.read_text().replace(
        "keep_releases = 3", "keep_releases = 3\nlease_timeout = 1"
    )
    host.path.write_text(text)
    with holder(state):
        assert release_main(["promote", stack.commit(), "--config", str(host.path)]) == 4
    assert "gpu job 17" in capsys.readouterr().err
    assert host.context().manager.main_pid() == pid
    assert host.live_root() == host.release_dir(good)


def test_the_lease_command_takes_the_file_promote_takes(tmp_path: Path) -> None:
    """host.state_dir moves the lease for promote; `servegate lease --config` follows."""
    shared = tmp_path / "shared-state"
    cfg = tmp_path / "servegate.toml"
    cfg.write_text(f'[host]\nroot = "{tmp_path / "root"}"\nstate_dir = "{shared}"\n')
    probe = "import os; print(os.environ['SERVEGATE_GPU_LEASE'])"
    run = subprocess.run(
        [*LEASE, "--config", str(cfg), "--", sys.executable, "-c", probe],
        env=env_for(tmp_path / "default-state"), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip().startswith(str(shared / "gpu.lease"))
    assert not (tmp_path / "default-state" / "gpu.lease").exists()
