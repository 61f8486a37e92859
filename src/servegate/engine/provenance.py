"""Proof that the live service runs the release's checkout, read from the live processes.

For the service's main PID and every descendant (a vLLM server is an API process, an
EngineCore and its workers):

- **observed**: the working directory, the executable and its venv, the environment
  (with the dynamic-loader and start-up variables), every file mapped executable (the
  release's tracked files and hashed artifacts, an allowed runtime root, or foreign),
  the extension libraries by the SHA-256 of the mapped inode, and the files of the
  Python frames each process is running (:mod:`servegate.engine.frames`, py-spy);
- **inferred**: where the service's interpreter resolves the configured packages,
  reproduced in a new process started exactly as the live one (its flags, first path
  entry, working directory and environment, never its preloads or start-up file), and
  the start-up hooks (``.pth`` code, ``sitecustomize``) of its site directories.

Each process records which level its Python evidence reached. Any difference is a
finding with expected and found; docs/records.md says how to read and fix each.
"""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from servegate.engine import frames as frames_mod
from servegate.engine import ports
from servegate.pipeline import proc, redact
from servegate.pipeline.hashing import sha256_file

RESOLVE_SCRIPT = """
import importlib.util, json, sys
path0 = sys.argv[1]
if path0 != "-" and sys.path and sys.path[0] == "":
    sys.path[0] = path0  # a script's own directory, as the service got it
out = {}
for name in sys.argv[2:]:
    try:
        spec = importlib.util.find_spec(name)
    except Exception as exc:
        out[name] = None
        continue
    if spec is None:
        out[name] = None
    elif spec.origin and spec.origin not in ("built-in", "frozen", "namespace"):
        out[name] = spec.origin
    else:
        out[name] = next(iter(spec.submodule_search_locations or []), None)
print(json.dumps(out))
"""


@dataclass(frozen=True)
class Mapped:
    path: str
    span: str  # "start-end" as in /proc/PID/maps, the name under /proc/PID/map_files
    deleted: bool
    #: mapped with execute permission somewhere (code, not data such as weights or shm)
    executable: bool = False


@dataclass(frozen=True)
class ProcInfo:
    pid: int
    ppid: int
    cmdline: str
    cwd: str
    exe: str
    environ: Mapping[str, str]
    mapped: tuple[Mapped, ...]
    #: False when the process overwrote its environment block, as setproctitle does to
    #: make room for a title like "VLLM::EngineCore"; /proc/PID/environ is then blank
    environ_readable: bool = True


@dataclass(frozen=True)
class Expectation:
    release_dir: Path
    interpreter: str
    env: Mapping[str, str] = field(default_factory=dict)
    extensions: tuple[str, ...] = ()
    #: path relative to the release → SHA-256 recorded when it was built
    artifact_hashes: Mapping[str, str] = field(default_factory=dict)
    modules: tuple[str, ...] = ()
    #: directory holding every release; a mapping from another release in it is a finding
    releases_root: Path | None = None
    port: int | None = None
    #: the host's salt for redacted values in the report (:mod:`servegate.pipeline.redact`)
    salt: str = ""
    #: directories code may also come from (config ``provenance.runtime_roots``, the
    #: launch's compile caches); the interpreter's venv, its base and the system library
    #: directories always count
    runtime_roots: tuple[Path, ...] = ()
    #: the launch's whole environment: a loader or start-up variable it sets is declared
    declared_env: Mapping[str, str] = field(default_factory=dict)
    #: ``provenance.py_spy``: the py-spy to read frames with (empty: found)
    py_spy: str = ""
    #: a Python process whose frames could not be observed is a finding, not inference
    require_observed: bool = False


@dataclass(frozen=True)
class Finding:
    check: str
    expected: str
    found: str
    pid: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "check": self.check,
            "pid": self.pid,
            "expected": self.expected,
            "found": self.found,
        }

    def line(self) -> str:
        where = f"pid {self.pid}: " if self.pid else ""
        return f"{where}{self.check}\n      expected: {self.expected}\n      found:    {self.found}"


@dataclass
class Report:
    processes: list[dict[str, Any]] = field(default_factory=list)
    extensions: list[dict[str, Any]] = field(default_factory=list)
    modules: dict[str, str | None] = field(default_factory=dict)
    listeners: list[int] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    #: checks that ran on weaker evidence than they could (said in the output and record)
    weaker: list[str] = field(default_factory=list)
    #: module → "observed" (a live frame runs a file of it) or "inferred" (resolved)
    modules_evidence: dict[str, str] = field(default_factory=dict)
    #: ``.pth`` files that run code, ``sitecustomize``/``usercustomize`` of the live
    #: interpreter's site directories: path, kind, verdict (fail/warn), why
    hooks: list[dict[str, str]] = field(default_factory=list)
    #: files mapped by the tree by class: release, runtime, data (not executable)
    mapped_summary: dict[str, int] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.findings

    def as_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "processes": self.processes,
            "extensions": self.extensions,
            "modules": self.modules,
            "listeners": self.listeners,
            "findings": [f.as_dict() for f in self.findings],
            "weaker_evidence": self.weaker,
            "modules_evidence": self.modules_evidence,
            "modules_method": "inferred: resolved by the service's interpreter in a new process "
            "started as the live one (its flags, first path entry, cwd and environment; "
            "LD_PRELOAD, LD_AUDIT and PYTHONSTARTUP removed); observed where a live frame "
            "runs a file of the module",
            "startup_hooks": self.hooks,
            "mapped": self.mapped_summary,
            "evidence": self.evidence,
        }

    @property
    def evidence(self) -> str:
        """``observed`` when every Python process's frames were read, else ``inferred``."""
        levels = {p.get("evidence") for p in self.processes} - {"not python", "gone"}
        return "inferred" if "inferred" in levels else "observed"

    def explain(self, limit: int = 8) -> str:
        lines = [f"  - {f.line()}" for f in self.findings[:limit]]
        if len(self.findings) > limit:
            lines.append(f"  … and {len(self.findings) - limit} more (see the record)")
        return "\n".join(lines)


# -- reading /proc ----------------------------------------------------------------


def _children_map() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (ppid := proc.parent_of(int(entry))) is not None:
            children.setdefault(ppid, []).append(int(entry))
    return children


def descendants(root: int) -> list[int]:
    """``root`` and every process below it, parents first."""
    children = _children_map()
    order, queue = [], [root]
    while queue:
        pid = queue.pop(0)
        order.append(pid)
        queue.extend(sorted(children.get(pid, [])))
    return order


def _maps(pid: int) -> tuple[Mapped, ...]:
    seen: dict[str, Mapped] = {}
    for row in Path(f"/proc/{pid}/maps").read_text().splitlines():
        cols = row.split(maxsplit=5)
        if len(cols) < 6 or not cols[5].startswith("/"):
            continue
        path = cols[5]
        deleted = path.endswith(" (deleted)")
        path = path.removesuffix(" (deleted)")
        first = seen.setdefault(path, Mapped(path, cols[0], deleted, "x" in cols[1]))
        if "x" in cols[1] and not first.executable:
            seen[path] = Mapped(path, first.span, deleted, True)
    return tuple(seen.values())


def read_process(pid: int) -> ProcInfo | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        raw_env = Path(f"/proc/{pid}/environ").read_bytes()
        parts = raw_env.removesuffix(b"\0").split(b"\0")
        environ = dict(p.decode(errors="replace").split("=", 1) for p in parts if b"=" in p)
        # an intact block is NAME=value entries only; a rewritten title leaves NUL runs
        readable = bool(raw_env) and all(b"=" in p for p in parts)
        return ProcInfo(
            pid=pid,
            ppid=int(stat.rsplit(")", 1)[1].split()[1]),
            cmdline=ports.cmdline(pid),
            cwd=os.readlink(f"/proc/{pid}/cwd"),
            exe=os.readlink(f"/proc/{pid}/exe"),
            environ=environ,
            mapped=_maps(pid),
            environ_readable=readable,
        )
    except (FileNotFoundError, ProcessLookupError):
        return None  # it ended while we looked


def mapped_sha256(pid: int, mapped: Mapped) -> tuple[str, str]:
    """(hash, method). ``map_files``: the mapped inode itself, through
    /proc/PID/map_files (observed; needs root or CAP_SYS_ADMIN). ``path``: the file the
    path names now (inferred: a library replaced after it was loaded is not seen)."""
    try:
        return sha256_file(f"/proc/{pid}/map_files/{mapped.span}"), "map_files"
    except OSError:
        return sha256_file(mapped.path), "path"


def _inside(path: str, directory: Path) -> bool:
    real = os.path.realpath(path)
    base = os.path.realpath(directory)
    return real == base or real.startswith(base + os.sep)


# -- where code may come from -----------------------------------------------------------

#: system library directories, and the engine runtimes' usual homes
SYSTEM_LIBS = ("/usr/lib", "/usr/lib64", "/lib", "/lib64", "/usr/local/lib", "/opt/rocm",
               "/usr/local/cuda", "/usr/share")  # fmt: skip


def runtime_roots(exp: Expectation) -> list[Path]:
    """Where code outside the release may lie: the service interpreter's environment (its
    venv or prefix), the base installation that venv was made from, the system's library
    directories, and the configured roots (``provenance.runtime_roots``, the launch's
    compile caches)."""
    env_root = Path(os.path.abspath(exp.interpreter)).parent.parent
    roots = [env_root, Path(os.path.realpath(exp.interpreter)).parent.parent]
    cfg = env_root / "pyvenv.cfg"
    if cfg.is_file():
        for line in cfg.read_text(errors="replace").splitlines():
            key, _, value = line.partition("=")
            if key.strip() == "home" and value.strip():
                roots.append(Path(value.strip()).parent)
    roots += [Path(d) for d in SYSTEM_LIBS] + list(exp.runtime_roots)
    out: list[Path] = []
    for root in roots:
        if root not in out and str(root) != "/":
            out.append(root)
    return out


def tracked_files(release_dir: Path) -> set[str] | None:
    """Paths git tracks in the release (relative), or None when it is not a checkout."""
    try:
        done = subprocess.run(
            ["git", "-C", str(release_dir), "ls-files", "-z"],
            capture_output=True,
            timeout=60,
            check=False,
            env={
                "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                "GIT_OPTIONAL_LOCKS": "0",
                "HOME": os.environ.get("HOME", "/"),
            },
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return None
    return {p.decode(errors="surrogateescape") for p in done.stdout.split(b"\0") if p}


@dataclass
class _Where:
    """What a file of a live process is: the release's (tracked or a hashed artifact),
    a runtime root's, or foreign."""

    exp: Expectation
    roots: list[Path]
    tracked: set[str] | None
    #: top-level names of the checked modules: a copy of one outside the release is a finding
    packages: frozenset[str]
    #: file names of the release's extensions: a copy mapped from elsewhere is reported by
    #: the extension check, by name
    extension_names: frozenset[str] = frozenset()

    def classify(self, path: str) -> tuple[str, str]:
        """(class, detail): ``release`` / ``untracked`` (in the release, neither tracked
        nor built) / ``runtime`` (the root) / ``copy`` (a checked package's module
        outside the release) / ``foreign``."""
        real = os.path.realpath(path)
        base = os.path.realpath(self.exp.release_dir)
        if real == base or real.startswith(base + os.sep):
            rel = os.path.relpath(real, base)
            if self.tracked is None or rel in self.tracked or rel in self.exp.artifact_hashes:
                return "release", rel
            return "untracked", rel
        package = _site_package(path)
        if package in self.packages:
            return "copy", package
        for root in self.roots:
            if _inside(path, root):
                return "runtime", str(root)
        return "foreign", ""


SITE_DIR = re.compile(r"/(?:site|dist)-packages/([^/]+)")


def _site_package(path: str) -> str:
    """The top-level package a file in a site directory belongs to ('' elsewhere)."""
    match = SITE_DIR.search(path)
    if not match:
        return ""
    return match.group(1).removesuffix(".py").split(".", 1)[0]


# -- the checks -----------------------------------------------------------------------


#: loader and start-up variables: a finding in a live process unless the launch sets them
#: (paths outside the allowed roots for the path lists; any value for the rest)
LOADER_PATHS = ("LD_PRELOAD", "LD_AUDIT", "LD_LIBRARY_PATH")
STARTUP_VARS = ("PYTHONHOME", "PYTHONSTARTUP", "PYTHONUSERBASE", "PYTHONINSPECT")


def _check_process(
    info: ProcInfo, main_pid: int, exp: Expectation, where: _Where, report: Report
) -> None:
    def bad(check: str, expected: str, found: str) -> None:
        report.findings.append(Finding(check, expected, found, info.pid))

    if not _inside(info.cwd, exp.release_dir):
        bad("working directory", f"inside {exp.release_dir}", info.cwd)
    want_exe = os.path.realpath(exp.interpreter)
    if os.path.realpath(info.exe) != want_exe:
        bad("executable", f"{exp.interpreter} (→ {want_exe})", info.exe)
    elif info.pid == main_pid:
        _check_venv(info, exp, bad)
    _check_mapped(info, exp, where, report)
    if not info.environ_readable:
        if info.pid == main_pid:
            bad("environment", "readable in /proc/PID/environ", "blank (overwritten)")
        return
    trusted = [exp.release_dir, *where.roots]
    for name in LOADER_PATHS:
        value = info.environ.get(name)
        if not value or exp.declared_env.get(name) == value:
            continue
        for entry in value.replace(":", " ").split():
            if not any(_inside(entry, root) for root in trusted):
                bad(name, f"the release or an allowed runtime root ({_shown_roots(trusted)})",
                    entry)  # fmt: skip
    for name in STARTUP_VARS:
        value = info.environ.get(name)
        if value and exp.declared_env.get(name) != value:
            bad(name, "unset (the launch does not set it)", value)
    for key, value in exp.env.items():
        found = info.environ.get(key)
        if found != value:
            shown = "<unset>" if found is None else redact.value(key, found, exp.salt) or ""
            bad(f"environment {key}", redact.value(key, value, exp.salt) or "", shown)


def _shown_roots(roots: list[Path], n: int = 3) -> str:
    more = ", …" if len(roots) > n else ""
    return ", ".join(str(r) for r in roots[:n]) + more


def _check_venv(info: ProcInfo, exp: Expectation, bad: Any) -> None:
    """Two venvs on one base Python share /proc/PID/exe (a venv's python is a link to
    the base): the path the process was started with names its venv."""
    venv = Path(exp.interpreter).parent.parent
    if not (venv / "pyvenv.cfg").is_file():
        return
    started = info.cmdline.split(" ", 1)[0]
    if "/" not in started:
        return  # started by name through PATH: the environment check covers PATH
    here = os.path.realpath(Path(started).parent)
    if here != os.path.realpath(venv / "bin"):
        bad("interpreter environment", f"the venv {venv}", f"{started} (a venv in {here})")


def _needs_root(path: str) -> str:
    return f"add {os.path.dirname(path)} to provenance.runtime_roots if it is trusted"


def _check_mapped(info: ProcInfo, exp: Expectation, where: _Where, report: Report) -> None:
    """Every mapped file: another release's is a finding; code (mapped executable) must
    be the release's tracked file or hashed artifact, or lie in an allowed runtime root."""
    summary = report.mapped_summary
    for m in info.mapped:
        if (
            exp.releases_root is not None
            and _inside(m.path, exp.releases_root)
            and not _inside(m.path, exp.release_dir)
        ):
            report.findings.append(
                Finding(
                    "mapped file from another release",
                    f"inside {exp.release_dir}",
                    m.path,
                    info.pid,
                )
            )
            continue
        if not m.executable or _is_device(m.path):
            summary["data"] = summary.get("data", 0) + 1
            continue
        kind, detail = where.classify(m.path)
        summary[kind] = summary.get(kind, 0) + 1
        if kind in ("foreign", "copy") and Path(m.path).name in where.extension_names:
            continue  # "extension … mapped from outside the release"
        gone = " (deleted on disk: the process runs a file that is no longer there)"
        if kind == "release" and m.deleted:
            report.findings.append(
                Finding(f"mapped code {detail}", "the file on disk", m.path + gone, info.pid)
            )
        elif kind == "untracked":
            report.findings.append(
                Finding(
                    f"mapped code {detail}",
                    "a tracked file or a hashed build artifact of the release",
                    f"{m.path}: neither tracked nor recorded by the build",
                    info.pid,
                )
            )
        elif kind == "copy":
            report.findings.append(
                Finding(
                    f"module {detail} mapped from outside the release",
                    f"inside {exp.release_dir}",
                    m.path,
                    info.pid,
                )
            )
        elif kind == "foreign":
            report.findings.append(
                Finding(
                    "mapped code from outside the allowed roots",
                    f"the release or a runtime root ({_needs_root(m.path)})",
                    m.path + (gone if m.deleted else ""),
                    info.pid,
                )
            )
        elif kind == "runtime" and m.deleted:
            report.weaker.append(
                f"pid {info.pid} maps {m.path}, replaced on disk since it was loaded: "
                "restart the service to run the file that is there now"
            )


def _is_device(path: str) -> bool:
    """GPU device nodes (/dev/nvidia*, /dev/kfd, /dev/dri/*) are mapped, not code files."""
    try:
        return path.startswith("/dev/") and stat.S_ISCHR(os.stat(path).st_mode)
    except OSError:
        return False


def _check_frames(
    info: ProcInfo, seen: frames_mod.Frames, exp: Expectation, where: _Where, report: Report
) -> None:
    """The files of the frames the process is running, each classified like mapped code."""
    for file in seen.files:
        kind, detail = where.classify(file)
        if kind == "release":
            top = detail.split(os.sep, 1)[0].removesuffix(".py")
            for name in exp.modules:
                if name.split(".")[0] == top:
                    report.modules_evidence[name] = "observed"
            continue
        if kind == "runtime":
            continue
        expected = f"a file of {exp.release_dir} or a runtime root"
        if kind == "copy":
            check, found = f"module {detail} runs from outside the release", file
            expected = f"inside {exp.release_dir}"
        elif kind == "untracked":
            check, found = f"running code {detail}", f"{file}: not tracked by the release"
        else:
            check, found = "running code from outside the allowed roots", file
            expected += f" ({_needs_root(file)})"
        if not os.path.exists(file):
            found += " (no longer on disk: loaded before it was removed)"
        report.findings.append(Finding(check, expected, found, info.pid))


def _check_extensions(infos: list[ProcInfo], exp: Expectation, report: Report) -> None:
    for pattern in exp.extensions:
        files = sorted(exp.release_dir.glob(pattern))
        if not files:
            report.findings.append(
                Finding(
                    f"extension {pattern}", f"a built file in {exp.release_dir}", "no such file"
                )
            )
        names = {f.name for f in files}
        for info in infos:
            for m in info.mapped:
                if Path(m.path).name in names and not _inside(m.path, exp.release_dir):
                    report.findings.append(
                        Finding(
                            f"extension {Path(m.path).name} mapped from outside the release",
                            f"{exp.release_dir}/{pattern}",
                            m.path,
                            info.pid,
                        )
                    )
        for file in files:
            _check_one_extension(file, infos, exp, report)


def _check_one_extension(
    file: Path, infos: list[ProcInfo], exp: Expectation, report: Report
) -> None:
    rel = str(file.relative_to(exp.release_dir))
    want = exp.artifact_hashes.get(rel)
    if not want:  # comparing the file with itself would prove nothing
        report.findings.append(
            Finding(
                f"extension {rel} hash",
                "recorded by the build (build.artifacts)",
                "not recorded: the mapped library cannot be compared with what was built",
            )
        )
        return
    real = os.path.realpath(file)
    hits = [(i, m) for i in infos for m in i.mapped if os.path.realpath(m.path) == real]
    if not hits:
        report.findings.append(
            Finding(
                f"extension {rel}",
                f"mapped by a process of the service ({real})",
                "not mapped by any process",
            )
        )
        return
    for info, m in hits:
        got, method = mapped_sha256(info.pid, m)
        report.extensions.append(
            {"pid": info.pid, "path": m.path, "sha256": got, "expected_sha256": want,
             "method": method}
        )  # fmt: skip
        if method == "path":
            report.weaker.append(
                f"extension {rel} (pid {info.pid}) hashed by path, not by the mapped inode "
                "(/proc/PID/map_files needs root): a library replaced after loading is unseen"
            )
        if got != want:
            report.findings.append(
                Finding(
                    f"extension {rel} content",
                    f"sha256 {want}",
                    f"sha256 {got}{' (deleted on disk)' if m.deleted else ''}",
                    info.pid,
                )
            )


#: never run in servegate's own resolver: the loader's and the interactive start-up's code
RESOLVER_DROPS = ("LD_PRELOAD", "LD_AUDIT", "PYTHONSTARTUP", "PYTHONINSPECT")


def _check_modules(main: ProcInfo, exp: Expectation, report: Report) -> None:
    if not exp.modules:
        return
    # never run the service's preloads inside servegate's own check
    env = {k: v for k, v in main.environ.items() if k not in RESOLVER_DROPS}
    flags, path0 = interpreter_flags(ports.argv(main.pid), main.cwd)
    result = proc.run(
        [exp.interpreter, *flags, "-c", RESOLVE_SCRIPT, path0, *exp.modules],
        cwd=main.cwd,
        env=env,
        timeout=60,
        check=False,
    )
    try:
        origins: dict[str, str | None] = json.loads(result.output.strip().splitlines()[-1])
    except (ValueError, IndexError):
        report.findings.append(
            Finding("module resolution", "a JSON answer", proc.tail(result.output, 5))
        )
        return
    report.modules = origins
    for name, origin in origins.items():
        report.modules_evidence.setdefault(name, "inferred")
        if origin is None or not _inside(origin, exp.release_dir):
            report.findings.append(
                Finding(
                    f"module {name}",
                    f"resolved inside {exp.release_dir}",
                    origin or "not importable",
                )
            )


#: interpreter options that change where imports resolve (-I isolated = -E -P -s)
PATH_FLAGS = frozenset("IEPsS")


def interpreter_flags(argv: list[str], cwd: str) -> tuple[list[str], str]:
    """The live interpreter's import-relevant options (and its ``-X`` options), and what
    its ``sys.path[0]`` is: "-" for ``-m``/``-c`` (the working directory, as the
    resolver's own ``-c`` has it), or a script's directory (a console script's is the
    venv's ``bin``). ``python -I``/``-P`` launches ignore PYTHONPATH or the working
    directory, and the resolver must too."""
    flags: list[str] = []
    path0 = "-"
    args = iter(argv[1:])
    for arg in args:
        if arg in ("-m", "-c"):
            break
        if arg == "-X":
            flags += ["-X", next(args, "")]
            continue
        if arg.startswith("-X") and len(arg) > 2:
            flags += ["-X", arg[2:]]
            continue
        if arg in ("-W", "--check-hash-based-pycs"):
            next(args, None)
            continue
        if arg.startswith("-") and not arg.startswith("--"):
            flags += [f"-{c}" for c in arg[1:] if c in PATH_FLAGS]
            continue
        path0 = os.path.dirname(os.path.join(cwd, arg))  # a script
        break
    return flags, path0


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


def _venv_of(interpreter: str) -> tuple[str, bool]:
    """(the venv root or "", whether it includes the base's site-packages)."""
    root = Path(os.path.abspath(interpreter)).parent.parent
    cfg = root / "pyvenv.cfg"
    if not cfg.is_file():
        return "", False
    system = False
    for line in cfg.read_text(errors="replace").splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "include-system-site-packages":
            system = value.strip().lower() == "true"
    return str(root), system


#: a hook that reads the command line behaves one way for servegate's resolver and
#: another for the server: its effect cannot be inferred
READS_ARGV = re.compile(r"\bsys\.(?:orig_)?argv\b|/proc/self/cmdline|\bargv\b")


def _check_hooks(main: ProcInfo, exp: Expectation, report: Report) -> None:
    """Start-up hooks of the live interpreter: ``.pth`` lines that run code, and
    ``sitecustomize``/``usercustomize``. One that names a checked package or reads the
    command line fails (it can make the server import what no check of ours sees);
    the rest are listed as warnings. Read, never run: the interpreter is asked for its
    site directories with ``-I -S`` (no site, no environment, no hooks)."""
    venv, system_site = _venv_of(exp.interpreter)
    done = proc.run(
        [exp.interpreter, "-I", "-S", "-c", SITE_DIRS_SCRIPT, venv, "1" if system_site else "0"],
        timeout=60,
        check=False,
        env={"PATH": "/usr/bin:/bin"},
    )
    try:
        dirs: list[str] = json.loads(done.output.strip().splitlines()[-1])
    except (ValueError, IndexError):
        report.weaker.append(f"start-up hooks not listed: {proc.tail(done.output, 2)}")
        return
    if main.environ_readable:
        dirs += [d for d in main.environ.get("PYTHONPATH", "").split(":") if d]
    packages = {m.split(".")[0] for m in exp.modules}
    seen: set[str] = set()
    for directory in dirs:
        base = Path(directory if os.path.isabs(directory) else os.path.join(main.cwd, directory))
        if not base.is_dir() or str(base) in seen:
            continue
        seen.add(str(base))
        for path in sorted(base.glob("*.pth")):
            code = [ln for ln in _read(path).splitlines() if ln.startswith(("import ", "import\t"))]
            if code:
                _judge_hook(path, "pth", "\n".join(code), packages, main, report)
        for kind in ("sitecustomize", "usercustomize"):
            for path in (base / f"{kind}.py", base / kind / "__init__.py"):
                if path.is_file():
                    _judge_hook(path, kind, _read(path), packages, main, report)


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError as exc:
        return f"<unreadable: {exc}>"


def _judge_hook(
    path: Path, kind: str, code: str, packages: set[str], main: ProcInfo, report: Report
) -> None:
    named = sorted(p for p in packages if re.search(rf"\b{re.escape(p)}\b", code))
    why, verdict = "runs code at every start of the interpreter", "warn"
    if named:
        why, verdict = f"names the checked package {', '.join(named)}", "fail"
    elif READS_ARGV.search(code):
        why, verdict = "reads the command line: it may act only for the server", "fail"
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


def _start_time(pid: int) -> float | None:
    """When the process started, in seconds since the epoch (to about a second)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        boot = next(
            float(line.split()[1])
            for line in Path("/proc/stat").read_text().splitlines()
            if line.startswith("btime ")
        )
    except (OSError, StopIteration, IndexError):
        return None
    return boot + int(fields[19]) / os.sysconf("SC_CLK_TCK")


def _check_age(main: ProcInfo, exp: Expectation, tracked: set[str] | None, report: Report) -> None:
    """A process that started before the release's files last changed may run what was
    there before: the live process is judged, not the disk."""
    started = _start_time(main.pid)
    if started is None:
        return
    newest, which = 0.0, ""
    for rel in [*(tracked or ()), *exp.artifact_hashes]:
        try:
            mtime = os.lstat(exp.release_dir / rel).st_mtime
        except OSError:
            continue
        if mtime > newest:
            newest, which = mtime, rel
    if newest > started + 2.0:  # /proc/stat's boot time is whole seconds
        report.findings.append(
            Finding(
                "process older than the release's files",
                f"started after its files last changed ({which} at {_when(newest)})",
                f"started {_when(started)}: it may run what was there before; restart it",
                main.pid,
            )
        )


def _when(epoch: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))


def verify(main_pid: int | None, exp: Expectation) -> Report:
    report = Report()
    if main_pid is None:
        report.findings.append(Finding("service process", "a running main process", "none"))
        return report
    infos = [i for i in map(read_process, descendants(main_pid)) if i is not None]
    if not infos:
        report.findings.append(Finding("service process", f"pid {main_pid} running", "gone"))
        return report
    tracked = tracked_files(exp.release_dir)
    if tracked is None:
        report.weaker.append(
            f"{exp.release_dir} is not a git checkout: any file in it counts as the release's"
        )
    where = _Where(
        exp,
        runtime_roots(exp),
        tracked,
        frozenset(m.split(".")[0] for m in exp.modules),
        frozenset(f.name for p in exp.extensions for f in exp.release_dir.glob(p)),
    )
    py_spy = frames_mod.find_py_spy(exp.py_spy)
    for info in infos:
        seen = frames_mod.observe(info.pid, py_spy)
        report.processes.append(_process_entry(info, seen, exp))
        _check_process(info, main_pid, exp, where, report)
        if seen.observed:
            _check_frames(info, seen, exp, where, report)
        elif seen.status == "gone":
            report.weaker.append(
                f"pid {info.pid} ended while it was checked: its mapped files were read, "
                "its frames were not (nothing of it runs now)"
            )
        elif seen.status != "not-python":
            report.weaker.append(
                f"pid {info.pid}: Python evidence inferred, not observed — "
                f"{frames_mod.MEANING[seen.status]}" + (f" ({seen.detail})" if seen.detail else "")
            )
            if exp.require_observed:
                report.findings.append(
                    Finding(
                        "observed evidence",
                        "the frames read by py-spy (provenance.require_observed)",
                        seen.status,
                        info.pid,
                    )
                )
    _check_extensions(infos, exp, report)
    _check_modules(infos[0], exp, report)
    _check_hooks(infos[0], exp, report)
    _check_age(infos[0], exp, tracked, report)
    if exp.port is not None:
        pids = {i.pid for i in infos}
        owners = ports.listeners(exp.port)
        report.listeners = sorted(owners)
        if not owners or not owners <= pids:
            shown = [
                f"{p} ({' '.join(redact.argv(ports.argv(p), exp.salt))[:120]})"
                for p in sorted(owners)
            ]
            found = ", ".join(shown) or "nobody"
            report.findings.append(
                Finding(
                    f"port {exp.port} listener", f"a process of the service ({sorted(pids)})", found
                )
            )
    return report


def _process_entry(info: ProcInfo, seen: frames_mod.Frames, exp: Expectation) -> dict[str, Any]:
    level = {"observed": "observed", "not-python": "not python", "gone": "gone"}
    return {
        "pid": info.pid,
        "ppid": info.ppid,
        "cmdline": " ".join(redact.argv(ports.argv(info.pid), exp.salt))[:300],
        "cwd": info.cwd,
        "exe": info.exe,
        "env": (
            {k: redact.value(k, info.environ.get(k), exp.salt) for k in exp.env}
            if info.environ_readable
            else "unreadable: the process rewrote its title over it"
        ),
        "evidence": level.get(seen.status, "inferred"),
        "frames": list(seen.files[:60]),
        "frames_status": seen.status,
        "frames_note": frames_mod.MEANING[seen.status]
        + (f" ({seen.detail})" if seen.detail else ""),
    }
