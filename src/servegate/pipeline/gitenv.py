"""The environment git runs in: variables a hook or a parent git command leaks are removed
(they would redirect servegate's git calls to another repository), and :func:`run`, the
one way servegate runs a git command outside :mod:`servegate.pipeline.git` (which keeps
the repositories, through GitPython). This module imports no GitPython: ``servegate
--version`` and ``init`` read a HEAD through it without paying for that import."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from pathlib import Path

#: for every git command servegate runs in a checkout a release's build could have
#: written: never honour replace refs (``git replace SHA OTHER`` would make every tree
#: read of SHA give OTHER's), and never run a command the checkout's own config names
#: (``core.fsmonitor`` runs one on ``git status``; hooks run on checkout and merge):
#: config given in the environment wins over the repository's
SAFE_ENV = {
    "GIT_NO_REPLACE_OBJECTS": "1",
    "GIT_CONFIG_COUNT": "2",
    "GIT_CONFIG_KEY_0": "core.fsmonitor",
    "GIT_CONFIG_VALUE_0": "false",
    "GIT_CONFIG_KEY_1": "core.hooksPath",
    "GIT_CONFIG_VALUE_1": "/dev/null",
}

LEAKY = ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE", "GIT_OBJECT_DIRECTORY", "GIT_PREFIX")


def scrub_git_env(environ: MutableMapping[str, str]) -> None:
    for key in [k for k in environ if k in LEAKY or k.startswith("GIT_ALTERNATE")]:
        del environ[key]


@dataclass(frozen=True)
class Ran:
    """A git command's outcome: its exit code (None: it could not run or timed out), its
    stdout and stderr (decoded; bytes git does not write as UTF-8 kept as escapes)."""

    returncode: int | None
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.returncode == 0


def run(
    args: Sequence[str],
    cwd: str | Path | None = None,
    *,
    timeout: float = 60.0,
    minimal: bool = False,
    env: Mapping[str, str] | None = None,
) -> Ran:
    """``git ARGS``, for the one-off reads that need no repository object (servegate's
    repositories go through :mod:`servegate.pipeline.git`): the leaky ``GIT_*``
    variables removed and :data:`SAFE_ENV` set, so neither a parent git nor the checkout's
    own config redirects or runs anything. ``minimal``: only PATH and HOME of this
    process's environment (a check that must not depend on the caller's). ``env``: more
    variables. Never raises for git's own failure: the caller reads ``returncode``."""
    base: dict[str, str]
    if minimal:
        base = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": os.environ.get("HOME", "/"),
        }
    else:
        base = dict(os.environ)
        scrub_git_env(base)
    base.update(SAFE_ENV)
    base.update(env or {})
    try:
        done = subprocess.run(
            ["git", *args], cwd=cwd, env=base, capture_output=True, timeout=timeout, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return Ran(None, "", str(exc))
    return Ran(
        done.returncode,
        done.stdout.decode(errors="surrogateescape"),
        done.stderr.decode(errors="surrogateescape"),
    )
