"""Start-up hooks of the service's interpreters: ``.pth`` files and ``sitecustomize``.

Python runs them at every start, before the server's own code: a hook can redirect an
import for the server alone (it sees ``sys.orig_argv``), which no resolver started by
servegate with another command line reproduces. They are read here, never run, and
judged by what their text does (docs/records.md lists the rules); the frames py-spy
reads show the effect of any hook that slips past the text.
"""

from __future__ import annotations

import ast
import base64
import csv
import functools
import hashlib
import json
import os
import pwd
import re
from pathlib import Path

from servegate.pipeline import proc
from servegate.provenance.liveproc import (
    Expectation,
    Finding,
    ProcInfo,
    Report,
    inside,
    interpreter_flags,
    pyvenv,
    started_path,
)

#: the site directories of an interpreter started with -I -S (no site module ran, so a
#: venv is not applied yet): the venv's from sysconfig, the base's where the venv
#: includes them, and the user's
SITE_DIRS_SCRIPT = """
import json, site, sys, sysconfig
venv, system_site, userbase = sys.argv[1], sys.argv[2] == "1", sys.argv[3]
out = []
if venv:
    v = {"base": venv, "platbase": venv}
    out += [sysconfig.get_path("purelib", vars=v), sysconfig.get_path("platlib", vars=v)]
if not venv or system_site:
    out += site.getsitepackages()
if userbase:
    scheme = f"{sysconfig.get_default_scheme().split('_')[0]}_user"
    out.append(sysconfig.get_path("purelib", scheme, vars={"userbase": userbase}))
print(json.dumps(out))
"""


def venv_of(interpreter: str) -> tuple[str, bool]:
    """(the venv root or "", whether it includes the base's site-packages)."""
    venv = pyvenv(interpreter)
    if venv is None:
        return "", False
    root, keys = venv
    return str(root), keys.get("include-system-site-packages", "").lower() == "true"


#: a hook that reads the command line behaves one way for servegate's resolver and
#: another for the server: its effect cannot be inferred
READS_ARGV = re.compile(r"\bsys\.(?:orig_)?argv\b|/proc/self/cmdline|\bargv\b|orig_a")
#: a hook that runs code it reads or decodes hides what it runs from this check
RUNS_WHAT_IT_READS = re.compile(
    r"\b(?:exec|eval|compile|open|getattr)\s*\(|\bmarshal\b|\bbase64\b|\bzlib\b|\bcodecs\b"
    r"|\brunpy\b|spec_from_file_location|\bimport_module\b"
)


#: calls that take a name as an argument (its position): computed, it hides what the
#: hook imports, reads or patches — ``getattr(sys, "orig_" + "argv")``
NAMED_BY_ARG = {"__import__": 0, "import_module": 0, "getattr": 1, "setattr": 1, "hasattr": 1,
                "delattr": 1}  # fmt: skip
#: what no hook whose text says what it does needs: a namespace as a dict, a file loaded
#: as a module, the import system's hooks
HIDING = {"__dict__", "__builtins__", "builtins", "SourceFileLoader", "SourcelessFileLoader",
          "ExtensionFileLoader", "load_module", "exec_module", "module_from_spec", "meta_path",
          "path_hooks", "path_importer_cache", "zipimporter"}  # fmt: skip
#: setuptools' editable-install finders: they map the installed packages to their source
#: through the import system by design; where those packages load from is the module
#: check's to judge
EDITABLE_FINDER = re.compile(r"__editable___.*_finder\.py$")


def hidden(code: str, path: Path | None = None) -> str:
    """What in a hook's ``code`` keeps its text from saying what it does, however it is
    spelled ("" when nothing): a name computed for ``__import__``, ``getattr`` and the
    like, a namespace read as a dict (``vars()``, ``globals()``, ``__dict__``), a file
    loaded as a module, the import system's hooks changed, ``sys.path`` or
    ``sys.modules`` changed in code. Read with :mod:`ast`, never run."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError):
        return "is not Python this check can read"
    finder = path is not None and EDITABLE_FINDER.search(path.name) is not None
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            name = (func.id if isinstance(func, ast.Name)
                    else func.attr if isinstance(func, ast.Attribute) else "")  # fmt: skip
            at = NAMED_BY_ARG.get(name)
            if at is not None and (
                len(node.args) <= at or not isinstance(node.args[at], ast.Constant)
            ):
                return f"computes the name it passes to {name}()"
            if name in ("vars", "globals", "locals"):
                return f"reads a namespace as a dict ({name}())"
            changed = _sys_attr(func.value) if isinstance(func, ast.Attribute) else ""
            mutates = name in ("insert", "append", "extend", "update", "setdefault", "__setitem__")
            if mutates and changed in ("path", "modules") and not finder:
                return f"changes sys.{changed} in code"
        elif isinstance(node, (ast.Assign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                base = target.value if isinstance(target, ast.Subscript) else target
                if _sys_attr(base) in ("path", "modules"):
                    return f"changes sys.{_sys_attr(base)} in code"
        word = (node.attr if isinstance(node, ast.Attribute)
                else node.id if isinstance(node, ast.Name) else "")  # fmt: skip
        if word in HIDING and not (finder and word in ("meta_path", "path_importer_cache")):
            return f"uses {word}"
    return ""


@functools.cache
def _records(site: str) -> dict[str, str]:
    """What the packages of a site directory installed: each file any ``*.dist-info/RECORD``
    there lists (resolved) → its ``sha256=`` digest as RECORD writes it."""
    out: dict[str, str] = {}
    for record in Path(site).glob("*.dist-info/RECORD"):
        try:
            rows = list(csv.reader(record.read_text(errors="replace").splitlines()))
        except (OSError, csv.Error):
            continue
        for row in rows:
            if len(row) >= 2 and row[1].startswith("sha256="):
                out[os.path.normpath(os.path.join(site, row[0]))] = row[1][len("sha256=") :]
    return out


def not_installed(path: Path) -> str:
    """Why the start-up hook ``path`` was put there by no package ("" when its package's
    RECORD lists it with this content): pip, uv and their kin list every file they
    install, with its hash, in the distribution's ``.dist-info/RECORD``. A ``.pth`` or a
    module a build or a neighbour writes into the venv is in none of them, however it is
    spelled — and a listed one edited since no longer has its hash. A directory no
    package manager of that kind keeps (no RECORD at all there: a distribution's own
    ``dist-packages`` under apt) is not judged this way."""
    records = _records(str(path.parent))
    if not records:
        return ""
    listed = records.get(os.path.normpath(str(path)))
    if listed is None:
        return "no installed package lists it (no .dist-info/RECORD in its directory)"
    try:
        digest = base64.urlsafe_b64encode(hashlib.sha256(path.read_bytes()).digest())
    except OSError as exc:
        return f"it cannot be read ({exc.strerror})"
    if digest.decode().rstrip("=") != listed.rstrip("="):
        return "it differs from what its package installed (its RECORD hash)"
    return ""


def _sys_attr(node: ast.expr) -> str:
    """``path`` for ``sys.path`` (and the like); "" for anything else."""
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        return node.attr if node.value.id == "sys" else ""
    return ""


def check_hooks(infos: list[ProcInfo], exp: Expectation, report: Report, roots: list[Path]) -> None:
    """Start-up hooks of every interpreter the tree runs: ``.pth`` lines that run code
    (and the modules they import), ``.pth`` lines that add a directory to ``sys.path``,
    and ``sitecustomize``/``usercustomize`` — in the venv's, the base's and the service
    user's own site directories (its HOME or PYTHONUSERBASE, not servegate's). One that
    names a checked package, reads the command line or runs code it reads (``exec``,
    ``open``, ``marshal``, …) fails — it can make the server run what no check of ours
    sees — unless ``provenance.allowed_hooks`` lists it; a directory outside the release
    and the allowed roots fails; the rest are listed as warnings. Read, never run: each
    interpreter is asked for its site directories with ``-I -S`` (no site, no
    environment, no hooks), and only when it is the configured interpreter's binary."""
    packages = {m.split(".")[0] for m in exp.modules}
    want = os.path.realpath(exp.interpreter)
    trusted = [exp.release_dir, *roots]
    seen: set[str] = set()
    judged: set[str] = set()
    for info in infos:
        python = started_path(info) or exp.interpreter
        if os.path.realpath(python) != want or os.path.realpath(info.exe) != want:
            continue  # another binary: the executable check has said so
        flags = _flags(info)
        venv, system_site = venv_of(python)
        userbase = "" if {"-s", "-I"} & set(flags) or (venv and not system_site) else (
            _userbase(info, flags))  # fmt: skip
        key = f"{venv}|{system_site}|{python if not venv else ''}|{userbase}"
        dirs: list[str] = []
        if key not in seen:
            seen.add(key)
            done = proc.run(
                [python, "-I", "-S", "-c", SITE_DIRS_SCRIPT, venv, "1" if system_site else "0",
                 userbase],
                timeout=60,
                check=False,
                env={"PATH": "/usr/bin:/bin"},
            )  # fmt: skip
            try:
                dirs = json.loads(done.output.strip().splitlines()[-1])
            except (ValueError, IndexError):
                report.weaker.append(f"start-up hooks not listed: {proc.tail(done.output, 2)}")
        if info.environ_readable and not {"-E", "-I"} & set(flags):
            dirs += [d for d in info.environ.get("PYTHONPATH", "").split(":") if d]
        for directory in dirs:
            base = Path(
                directory if os.path.isabs(directory) else os.path.join(info.cwd, directory)
            )
            if not base.is_dir() or str(base) in judged:
                continue
            judged.add(str(base))
            for path in sorted(base.glob("*.pth")):
                _judge_pth(path, base, packages, exp, info, report, trusted)
            for kind in ("sitecustomize", "usercustomize"):
                for path in (base / f"{kind}.py", base / kind / "__init__.py"):
                    if path.is_file():
                        _judge_hook(path, kind, _read(path), packages, exp, info, report)


def _flags(info: ProcInfo) -> list[str]:
    return interpreter_flags(list(info.argv) or info.cmdline.split(), info.cwd)[0]


def _userbase(info: ProcInfo, flags: list[str]) -> str:
    """The service user's base for user site-packages: its PYTHONUSERBASE (unless -E),
    else ~/.local of its HOME, else of its uid's home directory."""
    env = info.environ if info.environ_readable else {}
    if env.get("PYTHONUSERBASE") and "-E" not in flags:
        return env["PYTHONUSERBASE"]
    home = env.get("HOME")
    if not home:
        try:
            home = pwd.getpwuid(os.stat(f"/proc/{info.pid}").st_uid).pw_dir
        except (OSError, KeyError):
            return ""
    return os.path.join(home, ".local")


def _judge_pth(
    path: Path,
    base: Path,
    packages: set[str],
    exp: Expectation,
    info: ProcInfo,
    report: Report,
    trusted: list[Path],
) -> None:
    """A ``.pth`` file: its ``import`` lines run at every start (and so does the module
    each one imports, judged by its own text); every other line that names a directory
    puts that directory on ``sys.path``, and it must be the release's or an allowed root's."""
    code: list[str] = []
    lines = _read(path).splitlines()
    places = [base]
    for line in lines:
        entry = line.rstrip()
        if not entry or entry.startswith("#") or line.startswith(("import ", "import\t")):
            continue
        target = Path(os.path.realpath(os.path.join(base, entry)))
        if not target.is_dir():
            continue
        places.append(target)
        if any(inside(str(target), root) for root in trusted):
            continue
        held = sorted(
            p for p in packages if (target / p).is_dir() or (target / f"{p}.py").is_file()
        )
        if held:
            why, verdict = f"puts {target}, which holds {', '.join(held)}, on sys.path", "fail"
        else:
            why, verdict = f"puts {target} on sys.path, outside the release and the roots", "warn"
        _record(report, path, "pth", verdict, why, info, exp.allowed_hooks)
    for line in lines:
        if not line.startswith(("import ", "import\t")):
            continue
        code.append(line)
        for module in _imported(line):  # the module it imports runs at every start too
            for place in places:
                for file in (place / f"{module}.py", place / module / "__init__.py"):
                    if file.is_file():
                        _judge_hook(file, f"imported by {path.name}", _read(file), packages,
                                    exp, info, report)  # fmt: skip
    if code:
        _judge_hook(path, "pth", "\n".join(code), packages, exp, info, report)


IMPORTED = re.compile(r"\bimport\s+([A-Za-z_][\w.]*(?:\s*,\s*[A-Za-z_][\w.]*)*)")


def _imported(line: str) -> list[str]:
    """Top-level modules an ``import a, b.c; import d`` line imports."""
    return [
        name.strip().split(".")[0]
        for match in IMPORTED.finditer(line)
        for name in match.group(1).split(",")
    ]


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError as exc:
        return f"<unreadable: {exc}>"


def _judge_hook(
    path: Path,
    kind: str,
    code: str,
    packages: set[str],
    exp: Expectation,
    main: ProcInfo,
    report: Report,
) -> None:
    named = sorted(p for p in packages if re.search(rf"\b{re.escape(p)}\b", code))
    why, verdict = "runs code at every start of the interpreter", "warn"
    planted = "" if inside(str(path), exp.release_dir) else not_installed(path)
    if named:
        why, verdict = f"names the checked package {', '.join(named)}", "fail"
    elif READS_ARGV.search(code):
        why, verdict = "reads the command line: it may act only for the server", "fail"
    elif RUNS_WHAT_IT_READS.search(code):
        why, verdict = "runs code it reads or decodes (exec, open, marshal, …)", "fail"
    elif hides := hidden(code, path):
        why, verdict = f"{hides}: what it does cannot be read from its text", "fail"
    elif planted:
        why, verdict = f"{planted}: code put there, not installed", "fail"
    _record(report, path, kind, verdict, why, main, exp.allowed_hooks)


def _record(
    report: Report,
    path: Path,
    kind: str,
    verdict: str,
    why: str,
    main: ProcInfo,
    allowed: tuple[str, ...] = (),
) -> None:
    if verdict == "fail" and str(path) in allowed:
        why, verdict = f"{why}; allowed by provenance.allowed_hooks", "allowed"
    if any(h["path"] == str(path) and h["why"] == why for h in report.hooks):
        return
    report.hooks.append({"path": str(path), "kind": kind, "verdict": verdict, "why": why})
    if verdict == "fail":
        report.findings.append(
            Finding(
                f"start-up hook {path.name}",
                "no start-up hook that can redirect the checked packages",
                f"{path} {why}",
                main.pid,
            )
        )
