"""The live processes of a service as read from /proc, and what a check of them finds.

The types every provenance check shares (:mod:`servegate.provenance.check` runs them,
:mod:`servegate.provenance.codeorigin` and :mod:`servegate.provenance.startup_hooks` are
two of them).
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from servegate.engine import ports
from servegate.pipeline import proc
from servegate.pipeline.hashing import sha256_file


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
    #: the words of /proc/PID/cmdline (a path with spaces stays one word)
    argv: tuple[str, ...] = ()
    #: names the environment block gives more than once: ``environ`` keeps the first, as
    #: getenv() and Python's os.environ read it, but code that scans the block itself
    #: may take another
    env_twice: tuple[str, ...] = ()


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
    #: ``provenance.read_only_runtime``: the default runtime roots must not be writable by
    #: this user (the release's build runs as it and could plant code there)
    read_only_runtime: bool = False
    #: py-spy dumps per process, 0.1 s apart, their stacks merged
    samples: int = 3
    #: start-up hooks (paths) accepted although they run code the check cannot see
    allowed_hooks: tuple[str, ...] = ()
    #: the name of the service's own cgroup (systemd: ``<unit>.service``); empty: none
    unit_cgroup: str = ""
    #: executable anonymous memory (JIT code: oneDNN makes it in vLLM's CPU workers):
    #: "record" counts it, "fail" makes it a finding (for engines that never JIT)
    anonymous_code: str = "record"
    #: the directory the service manager starts the process in (the launch's ``cwd``)
    launch_cwd: Path | None = None
    #: the release's commit: what "tracked" means (its tree, not the checkout's index)
    sha: str = ""


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
    #: which processes were checked: the tree, and the service's cgroup where it has one
    scope: str = ""

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
            "scope": self.scope,
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


#: the path of an executable anonymous region in :class:`Mapped`
ANONYMOUS = "[anonymous]"


def cgroup_of(pid: int) -> str | None:
    """The process's cgroup v2 path ("0::/…" in /proc/PID/cgroup), None when unknown."""
    try:
        text = Path(f"/proc/{pid}/cgroup").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("0::"):
            return line[3:] or "/"
    return None


#: where the cgroup v2 hierarchy is mounted: alone, or beside v1 controllers (hybrid)
CGROUP2_MOUNTS = ("/sys/fs/cgroup", "/sys/fs/cgroup/unified")


def cgroup_members(path: str) -> list[int] | None:
    """Every process in the cgroup ``path``; None when it cannot be read."""
    for mount in CGROUP2_MOUNTS:
        procs = Path(mount + path.rstrip("/")) / "cgroup.procs"
        try:
            return sorted(int(p) for p in procs.read_text().split())
        except (OSError, ValueError):
            continue
    return None


def service_processes(main: int, unit_cgroup: str = "") -> tuple[list[int], list[int], str]:
    """(the tree under ``main``, processes outside it in the service's own cgroup, the
    scope said in the record). A process that double-forked out of the tree (reparented
    to PID 1) is still in its service's cgroup: systemd gives every unit one, named
    ``unit_cgroup`` (``<unit>.service``). Any other cgroup may be shared (a login
    session, the supervisor's): only the tree is taken then."""
    tree = descendants(main)
    group = cgroup_of(main)
    if not unit_cgroup or not group or group.rstrip("/").rsplit("/", 1)[-1] != unit_cgroup:
        return tree, [], "process tree (the service has no cgroup of its own)"
    members = cgroup_members(group)
    if members is None:
        return tree, [], f"process tree (its cgroup {group} could not be read)"
    extra = [p for p in members if p not in set(tree)]
    return tree, extra, f"process tree and cgroup {group}"


def _maps(pid: int) -> tuple[Mapped, ...]:
    """Each mapped file once (executable if any of its rows is); executable anonymous
    memory (a JIT's code, or code written at run time) as one entry per region, named
    ``[anonymous]``."""
    seen: dict[str, Mapped] = {}
    for row in Path(f"/proc/{pid}/maps").read_text().splitlines():
        cols = row.split(maxsplit=5)
        if len(cols) == 5 and "x" in cols[1]:
            seen[f"[anonymous {cols[0]}]"] = Mapped(ANONYMOUS, cols[0], False, True)
            continue
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
        environ: dict[str, str] = {}
        twice: list[str] = []
        for name, value in (p.decode(errors="replace").split("=", 1) for p in parts if b"=" in p):
            if name in environ:
                twice.append(name)
            environ.setdefault(name, value)
        # an intact block is NAME=value entries only; a rewritten title leaves NUL runs
        readable = bool(raw_env) and all(b"=" in p for p in parts)
        return ProcInfo(
            pid=pid,
            ppid=int(stat.rsplit(")", 1)[1].split()[1]),
            cmdline=ports.cmdline(pid),
            argv=tuple(ports.argv(pid)),
            cwd=os.readlink(f"/proc/{pid}/cwd"),
            exe=os.readlink(f"/proc/{pid}/exe"),
            environ=environ,
            mapped=_maps(pid),
            environ_readable=readable,
            env_twice=tuple(dict.fromkeys(twice)),
        )
    except (FileNotFoundError, ProcessLookupError):
        return None  # it ended while we looked


def started_at(pid: int) -> float | None:
    """When the process started, in seconds since the epoch, to a clock tick: its start
    in ticks since boot (/proc/PID/stat) placed on the wall clock through the boot clock
    now (/proc/stat's whole-second btime would blur it by a second)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    since_boot = int(fields[19]) / os.sysconf("SC_CLK_TCK")
    return time.time() - (time.clock_gettime(time.CLOCK_BOOTTIME) - since_boot)


def mapped_sha256(pid: int, mapped: Mapped) -> tuple[str, str]:
    """(hash, method). ``map_files``: the mapped inode itself, through
    /proc/PID/map_files (observed; needs root or CAP_SYS_ADMIN). ``path``: the file the
    path names now (inferred: a library replaced after it was loaded is not seen)."""
    try:
        return sha256_file(f"/proc/{pid}/map_files/{mapped.span}"), "map_files"
    except OSError:
        return sha256_file(mapped.path), "path"


def pyvenv(interpreter: str) -> tuple[Path, dict[str, str]] | None:
    """The venv an interpreter path lies in (``bin/..``) and its ``pyvenv.cfg`` keys, or
    None when it is no venv's."""
    root = Path(os.path.abspath(interpreter)).parent.parent
    try:
        text = (root / "pyvenv.cfg").read_text(errors="replace")
    except OSError:
        return None
    pairs = (line.partition("=") for line in text.splitlines())
    return root, {k.strip(): v.strip() for k, sep, v in pairs if sep}


def inside(path: str, directory: Path) -> bool:
    real = os.path.realpath(path)
    base = os.path.realpath(directory)
    return real == base or real.startswith(base + os.sep)


#: interpreter options that change where imports resolve (-I isolated = -E -P -s)
PATH_FLAGS = frozenset("IEPsS")
#: options that take an argument, attached (``-Wignore``) or as the next word
ARG_OPTIONS = frozenset("cmWX")


def interpreter_flags(argv: list[str], cwd: str) -> tuple[list[str], str]:
    """The live interpreter's import-relevant options (and its ``-X`` options), and what
    its ``sys.path[0]`` is: "-" for ``-m``/``-c``/stdin (the working directory, as the
    resolver's own ``-c`` has it), or a script's directory with symbolic links resolved
    (a console script's is the venv's ``bin``). Parsed as CPython parses them: letters
    bundle (``-IsE``), and ``-c -m -W -X`` take the rest of their word or the next word
    (``-Wignore::ImportWarning`` sets no ``-I``). ``python -I``/``-P`` launches ignore
    PYTHONPATH or the working directory, and the resolver must too."""
    flags: list[str] = []
    i = 1
    while i < len(argv):
        arg = argv[i]
        i += 1
        if arg == "--check-hash-based-pycs":
            i += 1
            continue
        if arg == "--":
            break
        if arg.startswith("--"):
            continue  # --help, --version: no server would start
        if arg == "-" or not arg.startswith("-"):
            if arg == "-":
                return flags, "-"
            return flags, os.path.dirname(os.path.realpath(os.path.join(cwd, arg)))
        letters = arg[1:]
        for k, letter in enumerate(letters):
            if letter in ARG_OPTIONS:
                value = letters[k + 1 :]
                if not value:
                    value = argv[i] if i < len(argv) else ""
                    i += 1
                if letter == "X":
                    flags += ["-X", value]
                if letter in "cm":
                    return flags, "-"
                break
            if letter in PATH_FLAGS:
                flags.append(f"-{letter}")
    if i < len(argv):  # after "--": the script
        return flags, os.path.dirname(os.path.realpath(os.path.join(cwd, argv[i])))
    return flags, "-"


def started_path(info: ProcInfo) -> str | None:
    """The file the process was started as: argv[0] as a path (against its working
    directory), or looked up on its own PATH when it names no directory."""
    first = info.argv[0] if info.argv else info.cmdline.split(" ", 1)[0]
    if "/" in first:
        return os.path.join(info.cwd, first)
    path = info.environ.get("PATH", "") if info.environ_readable else ""
    for directory in path.split(":"):
        candidate = os.path.join(info.cwd, directory or ".", first)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None
