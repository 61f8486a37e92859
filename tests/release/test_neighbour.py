"""A second local user on the serving box — a real one, made with useradd — tries to
read the service's secrets, to own the host root, and to plant a link for the lease."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from servegate import config as config_mod
from servegate.cli import release_main
from servegate.engine.managers.supervisor import Supervisor
from tests.conftest import Stack
from tests.release.test_secrets import hostile_config, leaks

NAME = "sg-neighbour"


@pytest.fixture(scope="module")
def neighbour() -> Iterator[pwd.struct_passwd]:
    if os.geteuid() != 0:
        pytest.skip("a second local user is made with useradd, which needs root")
    if not (shutil.which("useradd") and shutil.which("setpriv")):
        pytest.skip("useradd and setpriv (util-linux) are needed to act as a second user")
    made = False
    try:
        pwd.getpwnam(NAME)
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin",
                        NAME], check=True)  # fmt: skip
        made = True
    yield pwd.getpwnam(NAME)
    if made:
        subprocess.run(["userdel", NAME], check=False)


def as_user(user: pwd.struct_passwd, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--clear-groups",
         *argv],
        capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin"},
    )  # fmt: skip


@pytest.fixture
def shared_base() -> Iterator[Path]:
    """A directory every user may enter (as /srv is), where the host root is made."""
    base = Path("/tmp") / f"sg-box-{uuid.uuid4().hex[:8]}"
    base.mkdir(mode=0o755)
    base.chmod(0o755)
    yield base
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def box_config(
    tmp_path: Path, stack: Stack, shared_base: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Path]:
    monkeypatch.setenv("HF_TOKEN", "hf_abcdefSECRET")
    path = hostile_config(tmp_path, stack)
    path.write_text(path.read_text().replace(str(tmp_path / "host"), str(shared_base / "host")))
    yield path
    Supervisor(config_mod.load(path, {})).shutdown_daemon()


def test_the_neighbour_reads_no_secret_even_where_the_operator_opened_the_host_root(
    neighbour: pwd.struct_passwd, box_config: Path, stack: Stack
) -> None:
    cfg = config_mod.load(box_config, {})
    assert release_main(["promote", stack.commit(), "--config", str(box_config)]) == 0
    root = cfg.host_root
    denied = as_user(neighbour, "ls", str(root))
    assert denied.returncode != 0  # servegate made it 0700
    assert "Permission denied" in denied.stderr
    root.chmod(0o755)  # an operator opens it for a dashboard: secrets must still hold
    holding = []
    for f in root.rglob("*"):
        if f.is_file() and not f.is_symlink() and "releases" not in f.parts:
            found = leaks(f.read_text(errors="replace"))
            if found:
                holding.append(f)
                read = as_user(neighbour, "cat", str(f))
                assert read.returncode != 0, f"the neighbour read {found} in {f}"
                assert leaks(read.stdout) == []
    assert holding  # the supervisor program file holds the launch's environment
    names = {f.name for f in holding}
    assert f"{cfg.service.unit}.conf" in names
    log = as_user(neighbour, "cat", str(root / "logs" / f"{cfg.service.unit}.log"))
    assert log.returncode != 0  # the service's output (it may print its arguments)


def test_a_host_root_the_neighbour_owns_is_refused(
    neighbour: pwd.struct_passwd,
    box_config: Path,
    stack: Stack,
    capsys: pytest.CaptureFixture[str],
) -> None:
    cfg = config_mod.load(box_config, {})
    cfg.host_root.mkdir(mode=0o700)
    os.chown(cfg.host_root, neighbour.pw_uid, neighbour.pw_gid)
    code = release_main(["promote", stack.commit(), "--config", str(box_config), "--json"])
    assert code == 6
    error = json.loads(capsys.readouterr().out)["error"]
    assert f"owner uid {neighbour.pw_uid}" in error["message"]
    assert "chown" in error["hint"]
    assert not (cfg.host_root / "state.json").exists()


def test_a_lease_link_the_neighbour_planted_is_refused_and_its_target_untouched(
    neighbour: pwd.struct_passwd, shared_base: Path
) -> None:
    """A state directory everyone may write (sticky, as /tmp): the neighbour plants
    gpu.lease → a file of root's before servegate first runs. servegate refuses the
    directory itself; in a directory only its users share, a link planted by one of them
    is refused by name."""
    state = shared_base / "state"
    state.mkdir()
    state.chmod(0o1777)
    victim = shared_base / "victim.conf"
    victim.write_text("root's own file\n")
    planted = as_user(neighbour, "ln", "-s", str(victim), str(state / "gpu.lease"))
    assert planted.returncode == 0, planted.stderr

    def lease() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "servegate", "lease", "--timeout", "0", "--", "true"],
            env=dict(os.environ, SERVEGATE_STATE_DIR=str(state)), capture_output=True,
            text=True,
        )  # fmt: skip

    run = lease()
    assert run.returncode == 6, run.stderr
    assert "writable by every user" in run.stderr
    assert "chmod o-w" in run.stderr
    state.chmod(0o770)  # shared with a group, not sticky: a member could remove a lease
    run = lease()
    assert run.returncode == 6, run.stderr
    assert "without the sticky bit" in run.stderr
    state.chmod(0o3770)  # a group's sticky folder: the link the neighbour left is named
    run = lease()
    assert run.returncode == 4, run.stderr
    assert f"symbolic link owned by uid {neighbour.pw_uid}" in run.stderr
    assert victim.read_text() == "root's own file\n"
