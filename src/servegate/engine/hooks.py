"""Start-up hooks of the service's interpreters: ``.pth`` files and ``sitecustomize``.

Python runs them at every start, before the server's own code: a hook can redirect an
import for the server alone (it sees ``sys.orig_argv``), which no resolver started by
servegate with another command line reproduces. They are read here, never run, and
judged by what their text does (docs/records.md lists the rules); the frames py-spy
reads show the effect of any hook that slips past the text.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from servegate.engine.liveproc import Expectation, Finding, ProcInfo, Report, pyvenv
from servegate.pipeline import proc

#: the site directories of an interpreter started with -I -S (no site module ran, so a
#: venv is not applied yet): the venv's from sysconfig, the base's where the venv
#: includes them, and the user's
SITE_DIRS_SCRIPT = """
import json, site, sys, sysconfig
venv, system_site = sys.argv[1], sys.argv[2] == "1"
out = []
if venv:
    v = {"base": venv, "platbase": venv}
    out += [sysconfig.get_path("purelib", vars=v), sysconfig.get_path("platlib", vars=v)]
if not venv or system_site:
    out += site.getsitepackages()
out.append(site.getusersitepackages())
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


def check_hooks(infos: list[ProcInfo], exp: Expectation, report: Report) -> None:
    """Start-up hooks of every interpreter the tree runs: ``.pth`` lines that run code,
    and ``sitecustomize``/``usercustomize``. One that names a checked package, reads the
    command line or runs code it reads (``exec``, ``open``, ``marshal``, …) fails — it
    can make the server run what no check of ours sees — unless
    ``provenance.allowed_hooks`` lists it; the rest are listed as warnings. Read, never
    run: each interpreter is asked for its site directories with ``-I -S`` (no site, no
    environment, no hooks), and only when it is the configured interpreter's binary."""
    packages = {m.split(".")[0] for m in exp.modules}
    want = os.path.realpath(exp.interpreter)
    seen: set[str] = set()
    judged: set[str] = set()
    for info in infos:
        started = info.cmdline.split(" ", 1)[0]
        python = started if started.startswith("/") else exp.interpreter
        if os.path.realpath(python) != want or os.path.realpath(info.exe) != want:
            continue  # another binary: the executable check has said so
        venv, system_site = venv_of(python)
        key = f"{venv}|{system_site}|{python if not venv else ''}"
        dirs: list[str] = []
        if key not in seen:
            seen.add(key)
            done = proc.run(
                [python, "-I", "-S", "-c", SITE_DIRS_SCRIPT, venv, "1" if system_site else "0"],
                timeout=60,
                check=False,
                env={"PATH": "/usr/bin:/bin"},
            )
            try:
                dirs = json.loads(done.output.strip().splitlines()[-1])
            except (ValueError, IndexError):
                report.weaker.append(f"start-up hooks not listed: {proc.tail(done.output, 2)}")
        if info.environ_readable and not _ignores_env(info):
            dirs += [d for d in info.environ.get("PYTHONPATH", "").split(":") if d]
        for directory in dirs:
            base = Path(
                directory if os.path.isabs(directory) else os.path.join(info.cwd, directory)
            )
            if not base.is_dir() or str(base) in judged:
                continue
            judged.add(str(base))
            for path in sorted(base.glob("*.pth")):
                code = [
                    ln for ln in _read(path).splitlines() if ln.startswith(("import ", "import\t"))
                ]
                if code:
                    _judge_hook(path, "pth", "\n".join(code), packages, exp, info, report)
            for kind in ("sitecustomize", "usercustomize"):
                for path in (base / f"{kind}.py", base / kind / "__init__.py"):
                    if path.is_file():
                        _judge_hook(path, kind, _read(path), packages, exp, info, report)


def _ignores_env(info: ProcInfo) -> bool:
    """Started with -E or -I: PYTHONPATH does not reach its sys.path."""
    args = info.cmdline.split()[1:3]
    return any(a.startswith("-") and not a.startswith("--") and ("E" in a or "I" in a)
               for a in args)  # fmt: skip


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
    if named:
        why, verdict = f"names the checked package {', '.join(named)}", "fail"
    elif READS_ARGV.search(code):
        why, verdict = "reads the command line: it may act only for the server", "fail"
    elif RUNS_WHAT_IT_READS.search(code):
        why, verdict = "runs code it reads or decodes (exec, open, marshal, …)", "fail"
    if verdict == "fail" and str(path) in exp.allowed_hooks:
        why, verdict = f"{why}; allowed by provenance.allowed_hooks", "allowed"
    if any(h["path"] == str(path) for h in report.hooks):
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
