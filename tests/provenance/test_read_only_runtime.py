"""``provenance.read_only_runtime``: the release's build and server run as the service's
user, and may write whatever that user may: a venv of its own lets a release plant a
library or module there before the service starts, where provenance takes it for the
interpreter's own code. With the option on, a default runtime root that user may write
is a finding; a venv that belongs to another user (root) and is not writable is none."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from servegate.provenance.codeorigin import writable_roots
from servegate.provenance.liveproc import Expectation
from tests.conftest import NOBODY, in_child_as


def _venv(base: Path) -> Path:
    venv = base / "venv"
    (venv / "lib" / "python3.12" / "site-packages").mkdir(parents=True)
    (venv / "bin").mkdir()
    for d in (venv, *venv.rglob("*")):
        d.chmod(0o755)
    return venv


def _findings_as(uid: int, venv: Path, read_only: bool) -> list[str]:
    """The checks of ``writable_roots`` for ``venv`` as a default root, run by ``uid``
    (the tests may run as root, who may write anything)."""

    def work() -> str:
        exp = Expectation(
            venv.parent / "rel", str(venv / "bin" / "python"), read_only_runtime=read_only
        )
        return json.dumps([f.check for f in writable_roots(exp, [venv])])

    return list(json.loads(in_child_as(uid, work)))


def test_a_venv_the_service_user_may_write_is_a_finding_only_when_asked() -> None:
    base = Path(tempfile.mkdtemp(prefix="sg-rort-"))  # pytest's own is root's alone
    try:
        base.chmod(0o755)
        venv = _venv(base)
        me = os.getuid()
        site = str(venv / "lib" / "python3.12" / "site-packages")
        found = _findings_as(me, venv, read_only=True)
        assert f"runtime root {venv}" in found
        assert f"runtime root {site}" in found
        assert _findings_as(me, venv, read_only=False) == []  # the default: as before
        if me == 0:  # a venv of root's, mode 755: the service's user cannot plant code
            assert _findings_as(NOBODY, venv, read_only=True) == []
            for d in (venv, *venv.rglob("*")):
                os.chown(d, NOBODY, NOBODY)
            # nobody's own venv: writable by the user the build runs as
            assert f"runtime root {site}" in _findings_as(NOBODY, venv, read_only=True)
    finally:
        shutil.rmtree(base)
