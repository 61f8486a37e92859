"""Proof that the live service runs the release's checkout, read from /proc.

For the service's main PID and every descendant (a vLLM server is an API process, an
EngineCore and its workers): the working directory, the executable, the configured
environment variables, the extension libraries mapped into memory (by path and by the
SHA-256 of the mapped file itself), and where the service's interpreter resolves the
configured Python packages. Any difference is a finding with expected and found.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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
            "modules_method": "inferred: resolved by the service's interpreter in a new process "
            "(its cwd and environment, LD_PRELOAD/LD_AUDIT removed)",
        }

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
        seen.setdefault(path, Mapped(path, cols[0], deleted))
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


# -- the checks -----------------------------------------------------------------------


def _check_process(info: ProcInfo, main_pid: int, exp: Expectation, report: Report) -> None:
    def bad(check: str, expected: str, found: str) -> None:
        report.findings.append(Finding(check, expected, found, info.pid))

    if not _inside(info.cwd, exp.release_dir):
        bad("working directory", f"inside {exp.release_dir}", info.cwd)
    want_exe = os.path.realpath(exp.interpreter)
    if os.path.realpath(info.exe) != want_exe:
        bad("executable", f"{exp.interpreter} (→ {want_exe})", info.exe)
    elif info.pid == main_pid:
        _check_venv(info, exp, bad)
    if not info.environ_readable:
        if info.pid == main_pid:
            bad("environment", "readable in /proc/PID/environ", "blank (overwritten)")
        return _check_mapped_releases(info, exp, report)
    trusted = _preload_roots(exp)
    for lib in info.environ.get("LD_PRELOAD", "").replace(":", " ").split():
        if not any(_inside(lib, root) for root in trusted):
            where = ", ".join(str(r) for r in trusted[:2])
            bad("LD_PRELOAD", f"libraries of the release or its environment ({where}, …)", lib)
    for key, value in exp.env.items():
        found = info.environ.get(key)
        if found != value:
            shown = "<unset>" if found is None else redact.value(key, found, exp.salt) or ""
            bad(f"environment {key}", redact.value(key, value, exp.salt) or "", shown)
    _check_mapped_releases(info, exp, report)


#: system library directories a preload may come from (the engine's own preloads: vLLM
#: on CPU preloads PyTorch's libgomp and its bundled libtcmalloc from its environment)
SYSTEM_LIBS = ("/usr/lib", "/usr/lib64", "/lib", "/lib64", "/usr/local/lib", "/opt/rocm",
               "/usr/local/cuda")  # fmt: skip


def _preload_roots(exp: Expectation) -> list[Path]:
    """Where an LD_PRELOAD library may lie: the release, the service interpreter's own
    environment (its venv or prefix), the system's library directories."""
    env_root = Path(os.path.abspath(exp.interpreter)).parent.parent
    return [exp.release_dir, env_root, *(Path(d) for d in SYSTEM_LIBS)]


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


def _check_mapped_releases(info: ProcInfo, exp: Expectation, report: Report) -> None:
    if exp.releases_root is None:
        return
    for m in info.mapped:
        if _inside(m.path, exp.releases_root) and not _inside(m.path, exp.release_dir):
            report.findings.append(
                Finding(
                    "mapped file from another release",
                    f"inside {exp.release_dir}",
                    m.path,
                    info.pid,
                )
            )


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


def _check_modules(main: ProcInfo, exp: Expectation, report: Report) -> None:
    if not exp.modules:
        return
    # never run the service's preloads inside servegate's own check
    env = {k: v for k, v in main.environ.items() if k not in ("LD_PRELOAD", "LD_AUDIT")}
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
    """The live interpreter's import-relevant options, and what its ``sys.path[0]`` is:
    "-" for ``-m``/``-c`` (the working directory, as the resolver's own ``-c`` has it),
    or a script's directory. ``python -I``/``-P`` launches ignore PYTHONPATH or the
    working directory, and the resolver must too."""
    flags: list[str] = []
    path0 = "-"
    args = iter(argv[1:])
    for arg in args:
        if arg in ("-m", "-c"):
            break
        if arg in ("-X", "-W", "--check-hash-based-pycs"):
            next(args, None)
            continue
        if arg.startswith("-") and not arg.startswith("--"):
            flags += [f"-{c}" for c in arg[1:] if c in PATH_FLAGS]
            continue
        path0 = os.path.dirname(os.path.join(cwd, arg))  # a script
        break
    return flags, path0


def verify(main_pid: int | None, exp: Expectation) -> Report:
    report = Report()
    if main_pid is None:
        report.findings.append(Finding("service process", "a running main process", "none"))
        return report
    infos = [i for i in map(read_process, descendants(main_pid)) if i is not None]
    if not infos:
        report.findings.append(Finding("service process", f"pid {main_pid} running", "gone"))
        return report
    for info in infos:
        report.processes.append(
            {
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
            }
        )
        _check_process(info, main_pid, exp, report)
    _check_extensions(infos, exp, report)
    _check_modules(infos[0], exp, report)
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
