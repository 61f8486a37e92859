"""The environment git runs in: variables a hook or a parent git command leaks are removed
(they would redirect servegate's git calls to another repository)."""

from __future__ import annotations

from collections.abc import MutableMapping

LEAKY = ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE", "GIT_OBJECT_DIRECTORY", "GIT_PREFIX")


def scrub_git_env(environ: MutableMapping[str, str]) -> None:
    for key in [k for k in environ if k in LEAKY or k.startswith("GIT_ALTERNATE")]:
        del environ[key]
