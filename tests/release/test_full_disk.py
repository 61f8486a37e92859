"""A disk that fills up under servegate: a real tmpfs as the host root, filled to its
last byte before a promote. The promote stops with an error that says so, the live
release keeps serving, state.json is as it was and no lock is left behind; with space
again, the next promote releases."""

from __future__ import annotations

import errno
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from servegate.cli import release_main
from servegate.engine.managers.supervisor import Supervisor
from servegate.release.promote import promote
from tests.conftest import Host, Stack, make_host


def _mount(where: Path) -> str:
    """Mount a 96 MiB tmpfs at ``where`` (mode 0700): "" when done, else why not."""
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=96m,mode=0700", "tmpfs", str(where)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    return "" if done.returncode == 0 else (done.stderr.strip() or f"exit {done.returncode}")


@pytest.fixture
def small_disk_host(tmp_path: Path, stack: Stack) -> Iterator[Host]:
    root = tmp_path / "host-worktree"  # the root make_host gives its config
    root.mkdir(mode=0o700)
    why = _mount(root) if os.geteuid() == 0 else "mounting a tmpfs needs root"
    if why:
        pytest.skip(f"no tmpfs for a small disk here: {why}")
    try:
        host = make_host(tmp_path, stack)
        assert host.cfg.host_root == root
        yield host
        Supervisor(host.cfg).shutdown_daemon()
    finally:
        subprocess.run(["umount", "-l", str(root)], check=False)


def _fill(directory: Path) -> Path:
    """A file that takes every byte left on ``directory``'s filesystem."""
    filler = directory / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    chunk = b"\0" * (1 << 20)
    try:
        while True:
            try:
                os.write(fd, chunk)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                if len(chunk) == 1:
                    break
                chunk = chunk[: len(chunk) // 2]
    finally:
        os.close(fd)
    return filler


def test_a_full_disk_stops_the_promote_before_anything_changes(
    small_disk_host: Host, stack: Stack, capsys: pytest.CaptureFixture[str]
) -> None:
    host = small_disk_host
    good = stack.commit("ok")
    assert promote(host.context(), good).verdict == "released"
    root = host.cfg.host_root
    state = (root / "state.json").read_text()
    filler = _fill(root)
    nxt = stack.commit("ok", "the next release")
    capsys.readouterr()
    code = release_main(["promote", nxt, "--config", str(host.path), "--json"])
    out = capsys.readouterr()
    assert out.out.strip(), (code, out.err[-3000:])
    doc = json.loads(out.out)
    assert code not in (0, 70), doc  # a failure servegate names, not a crash
    said = json.dumps(doc)
    assert "No space left on device" in said, said[-3000:]
    assert host.live_root() == host.release_dir(good)
    assert (root / "state.json").read_text() == state
    assert release_main(["verify", "--config", str(host.path)]) == 0
    filler.unlink()
    assert release_main(["promote", nxt, "--config", str(host.path)]) == 0
    assert host.live_root() == host.release_dir(nxt)


def test_a_disk_that_fills_after_the_switch_still_gets_the_live_release_back(
    small_disk_host: Host, stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The disk fills while the candidate starts (its own logs, a neighbour): the checks
    after the switch fail with ENOSPC, and so would the rollback's own writes — the unit
    it installs, the launch it keeps. The space servegate holds back in the host root
    gives way, the live release is put back and proven, and the attempt is recorded."""
    from servegate.release import bringup

    host = small_disk_host
    good = stack.commit("ok")
    assert promote(host.context(), good).verdict == "released"
    root = host.cfg.host_root
    assert (root / "reserve").stat().st_size == 8 * 1024 * 1024
    healthy = bringup.healthy
    fillers: list[Path] = []

    def fill_then_healthy(*args: object, **kw: object) -> None:
        if not fillers:
            fillers.append(_fill(root))
        healthy(*args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(bringup, "healthy", fill_then_healthy)
    nxt = stack.commit("ok", "the next release")
    outcome = promote(host.context(), nxt)
    monkeypatch.undo()
    assert outcome.verdict == "rolled_back", outcome.reason
    assert "No space left on device" in outcome.reason or "Out of diskspace" in outcome.reason
    assert outcome.rollback["ok"]
    assert outcome.rollback["reserve_used"]
    assert host.live_root() == host.release_dir(good)
    assert release_main(["status", "--config", str(host.path)]) == 0
    fillers[0].unlink()
    assert release_main(["verify", "--config", str(host.path)]) == 0
    assert release_main(["promote", nxt, "--config", str(host.path)]) == 0
    assert (root / "reserve").stat().st_size == 8 * 1024 * 1024  # held back again


def test_a_disk_that_fills_during_the_build_stops_before_the_switch(
    small_disk_host: Host, stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The build (the release's own, in the host root) meets a full disk: the promote
    stops with an error that names it, before the switch, and the live release serves."""
    from servegate.release import promote as promote_mod

    host = small_disk_host
    good = stack.commit("ok")
    assert promote(host.context(), good).verdict == "released"
    root = host.cfg.host_root
    build = getattr(promote_mod, "run_build")  # noqa: B009 (promote's own reference)
    fillers: list[Path] = []

    def fill_then_build(*args: object, **kw: object) -> object:
        fillers.append(_fill(root))
        return build(*args, **kw)

    monkeypatch.setattr(promote_mod, "run_build", fill_then_build)
    nxt = stack.commit("ok", "the next release")
    code = release_main(["promote", nxt, "--config", str(host.path)])
    monkeypatch.undo()
    assert fillers
    assert code not in (0, 70)
    assert host.live_root() == host.release_dir(good)
    fillers[0].unlink()
    assert release_main(["verify", "--config", str(host.path)]) == 0
    assert release_main(["promote", nxt, "--config", str(host.path)]) == 0
