"""The package's own layout rules, read from its source."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "servegate"
#: the modules that run git: the repositories (GitPython) and the one-off reads
GIT_MODULES = {SRC / "pipeline" / "git.py", SRC / "pipeline" / "gitenv.py"}


def test_every_git_command_goes_through_the_git_modules() -> None:
    """A git command anywhere else would run without the scrubbed environment (a leaked
    GIT_DIR redirects it; a checkout's core.fsmonitor runs a program of its choosing):
    an argv that starts with "git" appears only in pipeline/git.py and gitenv.py."""
    found = []
    for path in sorted(SRC.rglob("*.py")):
        if path in GIT_MODULES:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (
                isinstance(node, ast.List | ast.Tuple)
                and node.elts
                and isinstance(node.elts[0], ast.Constant)
                and node.elts[0].value == "git"
            ):
                found.append(f"{path.relative_to(SRC)}:{node.lineno}")
    assert not found, f"git run outside pipeline/git.py and gitenv.run: {found}"
