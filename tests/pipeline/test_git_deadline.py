"""Every git command servegate runs has a deadline: a hung one (a stalled disk, a lock)
must not hold the host lock for ever."""

from __future__ import annotations

import time
from pathlib import Path

import git
import pytest

from servegate.pipeline import git as sg_git


def test_a_local_git_command_that_hangs_is_killed_at_its_deadline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    git.Repo.init(tmp_path)
    monkeypatch.setattr(sg_git, "LOCAL_TIMEOUT", 0.5)
    repo = sg_git.open_repo(tmp_path)
    # a real process standing in for a git command that never returns
    started = time.monotonic()
    with pytest.raises(git.GitCommandError, match="did not complete"):
        repo.git.execute(["sleep", "30"])
    assert time.monotonic() - started < 10
    # a network command keeps its own, longer deadline
    assert repo.git.execute(["sleep", "1"], kill_after_timeout=5) == ""
