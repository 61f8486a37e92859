"""Untracked symbolic links in a release: a link to a directory of code is untracked
code whatever its name, through links below it too, and when it cannot be looked
through; a link to data alone is not. Real git checkouts, real imports."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from servegate.provenance.codeorigin import untracked_code
from tests.conftest import NOBODY, in_child_as

GIT = ["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid"]


def _release(path: Path) -> Path:
    path.mkdir(parents=True)
    (path / "app.py").write_text("")
    for args in (["init", "-q"], ["add", "app.py"], ["commit", "-qm", "r"]):
        subprocess.run([*GIT, "-C", str(path), *args], check=True)
    return path


def test_code_behind_a_link_inside_a_linked_directory(tmp_path: Path) -> None:
    """plugins -> e, e/sub -> f (a package): Python imports plugins.sub (plugins a
    namespace package), as a namespace package such as google.* can be shadowed."""
    rel = _release(tmp_path / "rel")
    f, e = tmp_path / "f", tmp_path / "e"
    f.mkdir()
    (f / "__init__.py").write_text("print('FOREIGN CODE RAN')\n")
    e.mkdir()
    (e / "sub").symlink_to(f)
    (rel / "plugins").symlink_to(e)
    ran = subprocess.run([sys.executable, "-c", "import plugins.sub"], cwd=rel,
                         capture_output=True, text=True)  # fmt: skip
    assert "FOREIGN CODE RAN" in ran.stdout
    assert untracked_code(rel, {}) == ["plugins"]


def test_a_loop_of_links_is_not_looked_through_forever(tmp_path: Path) -> None:
    rel = _release(tmp_path / "rel")
    e = tmp_path / "e"
    e.mkdir()
    (e / "again").symlink_to(e)
    (rel / "data").symlink_to(e)
    assert untracked_code(rel, {}) == ["data"]  # what cannot be looked through counts


def test_a_link_to_a_large_data_directory_is_data(tmp_path: Path) -> None:
    rel = _release(tmp_path / "rel")
    ds = tmp_path / "dataset"
    for i in range(21):
        shard = ds / f"shard{i:02d}"
        shard.mkdir(parents=True)
        for j in range(1000):
            (shard / f"{j}.jpg").touch()
    (rel / "data").symlink_to(ds)
    assert untracked_code(rel, {}) == []


def test_a_linked_directory_its_reader_cannot_list_counts_as_code() -> None:
    """A servegate that is not root (nobody, when the tests run as root), in a forked
    child: the directory can be entered, not listed; Python only needs to stat
    mmap/__init__.py to run it ahead of the standard module."""
    base = Path(tempfile.mkdtemp(prefix="sg-links-"))  # pytest's own is root's alone
    try:
        _as_another_user(base)
    finally:
        (base / "e").chmod(0o755)
        shutil.rmtree(base)


def _as_another_user(base: Path) -> None:
    if os.getuid() == 0:
        os.chown(base, NOBODY, NOBODY)

    def work() -> str:
        os.environ["HOME"] = str(base)
        rel = _release(base / "rel")
        e = base / "e"
        e.mkdir()
        (e / "__init__.py").write_text("print('FOREIGN MMAP RAN')\n")
        e.chmod(0o311)  # enter, not list
        (rel / "mmap").symlink_to(e)
        return json.dumps(untracked_code(rel, {}))

    out = in_child_as(NOBODY if os.getuid() == 0 else os.getuid(), work)
    assert json.loads(out) == ["mmap"]
    ran = subprocess.run([sys.executable, "-c", "import mmap"], cwd=base / "rel",
                         capture_output=True, text=True)  # fmt: skip
    assert ran.stdout.strip() == "FOREIGN MMAP RAN"  # what the link would have run
