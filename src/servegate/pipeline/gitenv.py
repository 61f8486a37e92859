"""The environment git runs in: variables a hook or a parent git command leaks are removed
(they would redirect servegate's git calls to another repository)."""

from __future__ import annotations

from collections.abc import MutableMapping

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
