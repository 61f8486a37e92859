"""The ``VLLM_*`` variables vLLM reads: from the installed vLLM when the service's
interpreter can find it, else from the list shipped with servegate (a vLLM snapshot).

The installed list is read without importing vLLM: ``vllm/envs.py`` is parsed for the keys
of its ``environment_variables`` table, and the answer is cached per file.
"""

from __future__ import annotations

import ast
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from servegate.pipeline import proc

SNAPSHOT = "vllm-envs.txt"
FIND = "import importlib.util as u; s = u.find_spec('vllm'); print(s.origin if s else '')"


@dataclass(frozen=True)
class Known:
    names: frozenset[str]
    #: "vLLM 0.x at /path/vllm/envs.py" or "the shipped snapshot (vLLM 0.32.0)"
    source: str
    installed: bool


def from_file(envs_py: Path) -> frozenset[str]:
    tree = ast.parse(envs_py.read_text(), str(envs_py))
    for node in tree.body:
        target: ast.expr | None = node.target if isinstance(node, ast.AnnAssign) else None
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
        value = getattr(node, "value", None)
        if (
            isinstance(target, ast.Name)
            and target.id == "environment_variables"
            and isinstance(value, ast.Dict)
        ):
            return frozenset(
                k.value
                for k in value.keys
                if isinstance(k, ast.Constant) and isinstance(k.value, str)
            )
    return frozenset()


def snapshot() -> Known:
    text = resources.files("servegate.engine").joinpath("rules", SNAPSHOT).read_text()
    lines = [line.strip() for line in text.splitlines()]
    header = next((line for line in lines if line.startswith("# vLLM")), "# vLLM ?")
    names = frozenset(line for line in lines if line and not line.startswith("#"))
    return Known(names, f"the shipped snapshot ({header.lstrip('# ')})", False)


def locate(interpreter: str, env: Mapping[str, str], cwd: str) -> Path | None:
    """vllm/envs.py as ``interpreter`` resolves it with the service's environment."""
    if not interpreter or not os.access(interpreter, os.X_OK):
        return None
    full = {"PATH": os.environ.get("PATH", ""), **env}
    result = proc.run(
        [interpreter, "-I" if "PYTHONPATH" not in env else "-s", "-c", FIND],
        env=full,
        cwd=cwd if os.path.isdir(cwd) else None,
        check=False,
        timeout=30,
    )
    origin = result.output.strip().splitlines()[-1] if result.ok and result.output.strip() else ""
    path = Path(origin).parent / "envs.py" if origin else None
    return path if path and path.is_file() else None


def known(interpreter: str, env: Mapping[str, str], cwd: str, cache_dir: Path) -> Known:
    envs_py = locate(interpreter, env, cwd)
    if envs_py is None:
        return snapshot()
    stat = envs_py.stat()
    cache = cache_dir / "vllm-envs.json"
    key = f"{envs_py}:{stat.st_mtime_ns}:{stat.st_size}"
    try:
        cached = json.loads(cache.read_text())
    except (OSError, ValueError):
        cached = {}
    if key not in cached:
        cached = {key: sorted(from_file(envs_py))}
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_suffix(".tmp")
        tmp.write_text(json.dumps(cached))
        os.replace(tmp, cache)
    return Known(frozenset(cached[key]), f"the installed vLLM ({envs_py})", True)
