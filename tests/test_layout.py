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


#: the packages each package may import (docs/architecture.md); every package may use
#: the base modules
ALLOWED = {
    "pipeline": set(),
    "kernels": {"pipeline"},
    "engine": {"pipeline"},
    "provenance": {"engine", "pipeline"},
    "bench": {"engine", "pipeline"},
    "judging": {"bench", "pipeline"},
    "gpu": {"pipeline"},
    "runners": {"engine", "gpu", "pipeline"},
}
BASE = {
    "errors",
    "config",
    "flags",
    "documents",
    "hostpaths",
    "archs",
    "envfile",
    "about",
    "output",
    "__version__",
}


def _imports(path: Path) -> set[str]:
    """The servegate modules a file imports (``servegate.X`` for each X)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            parts = node.module.split(".")
            if parts[0] != "servegate":
                continue
            if len(parts) > 1:
                found.add(parts[1])
            else:
                found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] == "servegate" and len(parts) > 1:
                    found.add(parts[1])
    return found


def test_the_packages_import_one_way() -> None:
    """pipeline uses nothing of servegate; what is measured (bench) never imports how it
    is judged (judging) or the release flow; release and commands sit on top."""
    wrong = []
    for package, allowed in ALLOWED.items():
        for path in sorted((SRC / package).rglob("*.py")):
            for name in _imports(path) - allowed - BASE - {package}:
                wrong.append(f"{path.relative_to(SRC)} imports servegate.{name}")
    assert not wrong, wrong


def test_a_command_imports_no_library_only_some_of_its_work_needs() -> None:
    """`release promote` with a smoke gate, `status`, `verify`, `rollback` over SSH: each
    is a new process, and the suite and a fleet start hundreds. NumPy, SciPy and aiohttp
    (about 0.6 s of CPU together) are imported where the bench, the statistics or a
    load sweep run, securesystemslib where an attestation is signed or verified, and
    importlib.metadata where a record names the commit servegate came from, never by
    importing a command."""
    import subprocess
    import sys

    heavy = ("numpy", "scipy", "aiohttp", "securesystemslib", "importlib.metadata")
    probe = (
        "import sys\n"
        "import servegate.cli, servegate.commands.release, servegate.release.promote\n"
        "import servegate.release.rollback, servegate.commands.status\n"
        f"print([m for m in {heavy!r} if m in sys.modules])\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", done.stdout
