"""docs/box-setup.md's walkthrough, run line for line in a fresh home directory: install
servegate from this checkout's commit into a venv of its own, make the demo stack with
its launch and build scripts, ``servegate init``, commit and push the config, and
``release promote`` it on real vLLM — then ``status`` and ``verify`` must say it serves.

Needs what the demo needs (hipcc, vLLM's CPU build: `.ci/run` provides both) and the
package registry for the install's dependencies.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from servegate.demo import vllm_env
from tests.conftest import REAL_HOME

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(
        os.environ.get("SERVEGATE_SKIP_VLLM") == "1" and os.environ.get("CI") != "true",
        reason="SERVEGATE_SKIP_VLLM=1: the real-vLLM walkthrough was left out",
    ),
]

REPO = Path(__file__).resolve().parents[1]
BLOCK = re.compile(r"<!-- walkthrough -->\s*```sh\n(.*?)```\s*<!-- /walkthrough -->", re.S)


def walkthrough() -> str:
    found = BLOCK.search((REPO / "docs" / "box-setup.md").read_text())
    assert found, "docs/box-setup.md has no walkthrough block"
    return found.group(1)


def test_the_walkthrough_promotes_the_demo_stack_from_a_fresh_home(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    real = {k: v for k, v in os.environ.items() if not k.startswith("XDG_")}
    real["HOME"] = str(REAL_HOME)
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "SERVEGATE_SRC": str(REPO),
        # what a newcomer's machine already has: vLLM's CPU build from an earlier run
        # (else two minutes more) and pip's download cache; git's identity
        "SERVEGATE_DEMO_VENV": str(vllm_env.venv_dir(real)),
        "PIP_CACHE_DIR": str(REAL_HOME / ".cache" / "pip"),
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        "GIT_AUTHOR_NAME": "New User", "GIT_AUTHOR_EMAIL": "new@user.invalid",
        "GIT_COMMITTER_NAME": "New User", "GIT_COMMITTER_EMAIL": "new@user.invalid",
    }  # fmt: skip
    for key in ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS", "PIP_TRUSTED_HOST"):
        if key in os.environ:
            env[key] = os.environ[key]
    script = walkthrough()
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        cwd=home, env=env, capture_output=True, text=True, timeout=1800,
    )  # fmt: skip
    try:
        out = done.stdout + done.stderr
        assert done.returncode == 0, out[-6000:]
        assert re.search(r"servegate \S+ \(commit [0-9a-f]{12}, git URL file://", out), out[-3000:]
        assert "released " in out
        assert "provenance OK" in out
        assert (home / "servegate" / "bin" / "release").exists()  # where the docs say
        # the team's launch compiles (vLLM's default): the code torch.compile wrote to
        # the release's compile cache passed provenance
        cache = home / "try" / "host" / "compile-cache"
        assert any(p.is_file() for p in cache.rglob("*")), sorted(cache.rglob("*"))[:20]
    finally:
        conf = home / "try" / "host" / "supervisor" / "supervisord.conf"
        if conf.exists():
            subprocess.run(
                [str(home / "servegate" / "bin" / "supervisorctl"), "-c", str(conf), "shutdown"],
                env=env, capture_output=True, timeout=120, check=False,
            )  # fmt: skip
