"""Where the code a live process runs comes from: the release, a runtime root, or not.

Two kinds of evidence, both read from outside the process:

- every file mapped **executable** (``/proc/PID/maps``): the release's tracked file or
  hashed build artifact (hashed again through the mapped inode), a file under an
  allowed runtime root, or foreign. Kernel pseudo-files (``/memfd:…``, ``/SYSV…``) and
  executable anonymous memory have no file to trust: memfd/SysV code is foreign,
  anonymous code (JIT engines such as oneDNN make it) is counted;
- the **frames** py-spy read (:mod:`servegate.provenance.frames`): each frame's file is
  classified the same way, each frame must match its file (the function it names spans
  that line: code compiled under a borrowed file name, or a file changed since it was
  loaded, does not), and a thread whose own code has no file (``exec`` of a string)
  is a finding.
"""

from __future__ import annotations

import _imp
import functools
import glob
import json
import os
import re
import stat
import subprocess
import sys
import time
import types
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from servegate.pipeline import gitenv
from servegate.provenance import frames as frames_mod
from servegate.provenance.liveproc import (
    ANONYMOUS,
    Expectation,
    Finding,
    Mapped,
    ProcInfo,
    Report,
    interpreter_flags,
    mapped_sha256,
    pyvenv,
    started_at,
)

#: system library directories, and the engine runtimes' usual homes
SYSTEM_LIBS = ("/usr/lib", "/usr/lib64", "/lib", "/lib64", "/usr/local/lib", "/opt/rocm",
               "/usr/local/cuda", "/usr/share")  # fmt: skip


#: the dynamic loader's configuration, as ldconfig reads it
LD_SO_CONF = Path("/etc/ld.so.conf")


def loader_dirs(conf: Path | None = None, _depth: int = 0) -> list[Path]:
    """The library directories the dynamic loader is configured with (``/etc/ld.so.conf``
    and the files its ``include`` lines name, as ldconfig reads them): system library
    directories by the box's own configuration, such as a GPU driver mounted at
    ``/usr/local/nvidia/lib64``. A file that is not root's, or that group or others may
    write, is not the box's configuration and is skipped."""
    conf = conf or LD_SO_CONF
    try:
        info = conf.stat()
        lines = conf.read_text(errors="replace").splitlines()
    except OSError:
        return []
    if info.st_uid != 0 or info.st_mode & 0o022 or _depth > 4:
        return []
    out: list[Path] = []
    for raw in lines:
        line = raw.split("#", 1)[0].strip()
        if line.startswith("include"):
            for pattern in line.split()[1:]:
                full = pattern if pattern.startswith("/") else str(conf.parent / pattern)
                for name in sorted(glob.glob(full)):
                    out += loader_dirs(Path(name), _depth + 1)
        elif line.startswith("/") and not line.startswith("hwcap"):
            out.append(Path(line.split("=", 1)[0].strip()))
    return out


def runtime_roots(exp: Expectation) -> list[Path]:
    """Where code outside the release may lie: the service interpreter's venv (all of
    it), the libraries and executables of the installation it was made from (``lib``,
    ``lib64``, ``bin`` of its prefix — never the whole prefix: for /usr/bin/python that
    would be all of /usr), the system's library directories (the usual ones and those
    the dynamic loader is configured with), and the configured roots
    (``provenance.runtime_roots``, the launch's compile caches)."""
    bases = [Path(os.path.realpath(exp.interpreter)).parent.parent]
    roots: list[Path] = []
    venv = pyvenv(exp.interpreter)
    if venv is not None:
        roots.append(venv[0])
        if venv[1].get("home"):
            bases.append(Path(venv[1]["home"]).parent)
    else:
        bases.append(Path(os.path.abspath(exp.interpreter)).parent.parent)
    for base in bases:
        roots += [base / "lib", base / "lib64", base / "bin"]
    roots += [Path(d) for d in SYSTEM_LIBS] + loader_dirs() + list(exp.runtime_roots)
    return list(dict.fromkeys(r for r in roots if str(r) != "/"))


def tracked_files(release_dir: Path, sha: str = "") -> set[str] | None:
    """Paths of the release's commit (relative), or None when it is not a checkout.
    From the commit's tree when ``sha`` is known, never from the index a build could
    have added files to (``git update-index --add``)."""
    listing = (
        ["ls-tree", "-r", "-z", "--name-only", "--full-tree", sha] if sha else ["ls-files", "-z"]
    )
    out = _git_lines(release_dir, *listing)
    return None if out is None else set(out)


def _git_lines(release_dir: Path, *args: str) -> list[str] | None:
    """``git -C release_dir ARGS`` (``-z`` output) as names; None when git cannot answer.
    No optional locks and a minimal environment: a check must not change the checkout."""
    done = gitenv.run(
        # the release's own directory as the work tree, whatever its git configuration
        # says (core.worktree), and its commit's own tree (never a replace ref's)
        ["--work-tree", str(release_dir), "-C", str(release_dir), *args],
        minimal=True,
        env={"GIT_OPTIONAL_LOCKS": "0"},
    )
    if not done.ok:
        return None
    return [p for p in done.stdout.split("\0") if p]


#: below a runtime root (a venv, a prefix's lib): where Python code lies
CODE_DIRS = ("python3*", "python3*/*-packages", "lib/python3*", "lib/python3*/*-packages")


def code_dirs(root: Path) -> list[Path]:
    """What :data:`CODE_DIRS` match below ``root``, in their order: each directory listed
    once with ``os.scandir`` (pathlib's glob listed ``/usr/lib`` twice a pattern, in
    Python, about 30 ms each provenance check)."""

    def entries(where: Path) -> list[os.DirEntry[str]]:
        try:
            with os.scandir(where) as it:
                return list(it)
        except OSError:
            return []

    out: list[Path] = []
    for base in (root, root / "lib"):
        pythons = [e for e in entries(base) if e.name.startswith("python3")]
        out += [base / e.name for e in pythons]
        out += [
            base / e.name / p.name
            for e in pythons
            if _is_dir(e)
            for p in entries(base / e.name)
            if p.name.endswith("-packages")
        ]
    return out


def _is_dir(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_dir()
    except OSError:
        return False


def writable_roots(exp: Expectation, roots: list[Path] | None = None) -> list[Finding]:
    """A runtime root — configured, a compile cache, or a default one (the venv, its
    base's lib and bin, the system library directories) — that group or others may
    write, or that belongs to another user, lets a neighbour plant code the check would
    allow. A sticky directory is no exception: code roots are never shared drop boxes."""
    out = []
    candidates: list[Path] = []
    defaults: list[Path] = []
    for root in [*exp.runtime_roots, *(roots or [])]:
        # a venv's or a prefix's own code directories, below the root itself
        found = [Path(root), *code_dirs(Path(root))]
        candidates += found
        if root not in exp.runtime_roots:
            defaults += found
    if exp.read_only_runtime:
        out += [
            Finding(
                f"runtime root {root}",
                "not writable by the user that runs the service and its release's build "
                "(provenance.read_only_runtime)",
                f"this user ({os.getuid()}) may write it: a release's build or server could "
                "plant a library or module there before the service starts",
            )
            for root in dict.fromkeys(defaults)
            if root.is_dir() and os.access(root, os.W_OK)
        ]
    for root in dict.fromkeys(candidates):
        try:
            info = os.stat(root)
        except OSError:
            continue
        if info.st_mode & 0o022 or info.st_uid not in (0, os.getuid()):
            out.append(
                Finding(
                    f"runtime root {root}",
                    "writable only by this user (or root), as every code root must be",
                    f"mode {oct(stat.S_IMODE(info.st_mode))}, owner uid {info.st_uid}: a "
                    f"neighbour could plant code in it (chmod go-w {root})",
                )
            )
    return out


#: kernel pseudo-files that can be mapped executable: code with no file on disk
PSEUDO_CODE = ("/memfd:", "/SYSV", "/anon_hugepage", "/dev/zero")


@dataclass
class Where:
    """What a file of a live process is: the release's (tracked or a hashed artifact),
    a runtime root's, or foreign."""

    exp: Expectation
    roots: list[Path]
    tracked: set[str] | None
    #: top-level names of the checked modules: a copy of one outside the release is a finding
    packages: frozenset[str]
    #: the release's extensions (paths relative to it, matched by provenance.extensions):
    #: hashed by the extension check, and a copy mapped from elsewhere reported by name
    extensions: frozenset[str] = frozenset()
    #: parsed sources of frame files: path → functions (name → [(first, last line)]), or
    #: None when unreadable
    _sources: dict[str, dict[str, list[tuple[int, int]]] | None] = field(default_factory=dict)
    _classes: dict[str, tuple[str, str]] = field(default_factory=dict)
    _reals: dict[str, str] = field(default_factory=dict)
    _real_roots: list[tuple[Path, str]] = field(default_factory=list)

    def classify(self, path: str) -> tuple[str, str]:
        """(class, detail): ``release`` / ``untracked`` (in the release, neither tracked
        nor built) / ``runtime`` (the root) / ``copy`` (a checked package's module
        outside the release) / ``foreign``. Cached per path: a tree maps the same
        libraries in every process."""
        if path not in self._classes:
            self._classes[path] = self._classify(path)
        return self._classes[path]

    def real(self, path: str) -> str:
        if path not in self._reals:
            self._reals[path] = os.path.realpath(path)
        return self._reals[path]

    def _classify(self, path: str) -> tuple[str, str]:
        if path.startswith(PSEUDO_CODE):
            return "foreign", ""  # never resolved as a path: "/memfd:x/../../usr/lib/…"
        real = self.real(path)
        if not self._real_roots:
            self._real_roots = [(r, os.path.realpath(r)) for r in self.roots]
        base = os.path.realpath(self.exp.release_dir)
        if real == base or real.startswith(base + os.sep):
            rel = os.path.relpath(real, base)
            if self.tracked is None or rel in self.tracked or rel in self.exp.artifact_hashes:
                return "release", rel
            return "untracked", rel
        package = site_package(path) or self._package_in(real)
        if package in self.packages:
            return "copy", package
        for root, real_root in self._real_roots:
            if real == real_root or real.startswith(real_root + os.sep):
                return "runtime", str(root)
        return "foreign", ""

    def _package_in(self, real: str) -> str:
        """A checked package's name as a directory (or module file) on the path of a file
        outside the release: ``<venv>/src/stack-old/stackpkg/server.py`` is a copy of
        ``stackpkg`` wherever it lies, not runtime code."""
        for part in Path(real).parts[:-1]:
            if part in self.packages:
                return part
        name = Path(real).name
        stem = name.split(".", 1)[0]
        return stem if stem in self.packages and name.endswith((".py", ".so", ".pyc")) else ""

    def functions(self, path: str) -> dict[str, list[tuple[int, int]]] | None:
        if path not in self._sources:
            self._sources[path] = _functions(path)
        return self._sources[path]


SITE_DIR = re.compile(r"/(?:site|dist)-packages/([^/]+)")


def site_package(path: str) -> str:
    """The top-level package a file in a site directory belongs to ('' elsewhere)."""
    match = SITE_DIR.search(path)
    if not match:
        return ""
    return match.group(1).removesuffix(".py").split(".", 1)[0]


def _needs_root(path: str) -> str:
    return f"add {os.path.dirname(path)} to provenance.runtime_roots if it is trusted"


def check_mapped(info: ProcInfo, exp: Expectation, where: Where, report: Report) -> None:
    """Every mapped file: another release's is a finding; code (mapped executable) must
    be the release's tracked file or hashed artifact, or lie in an allowed runtime root."""
    summary = report.mapped_summary
    ext_names = {Path(f).name for f in where.extensions}
    others = os.path.realpath(exp.releases_root) + os.sep if exp.releases_root else None
    mine = os.path.realpath(exp.release_dir)
    started = started_at(info.pid)
    if started is None:
        report.weaker.append(
            f"pid {info.pid}: its start time (/proc/PID/stat) cannot be read: runtime code "
            "written after it started is not looked for"
        )
    own_view = _own_view(info.pid)
    if own_view is None:
        report.weaker.append(
            f"pid {info.pid}: its root and mount namespace (/proc/PID/root, ns/mnt) cannot be "
            "read: the files it maps are not compared in its own view"
        )
    for m in info.mapped:
        real = where.real(m.path)
        if others and real.startswith(others) and not (real == mine or real.startswith(mine + "/")):
            report.findings.append(
                Finding(
                    "mapped file from another release",
                    f"inside {exp.release_dir}",
                    m.path,
                    info.pid,
                )
            )
            continue
        if not m.executable or _is_device(m):
            summary["data"] = summary.get("data", 0) + 1
            continue
        if m.path == ANONYMOUS or m.path.startswith("/dev/zero"):  # no file: JIT code?
            summary["anonymous"] = summary.get("anonymous", 0) + 1
            if exp.anonymous_code == "fail":
                report.findings.append(
                    Finding(
                        "executable anonymous memory",
                        'no code without a file (provenance.anonymous_code = "fail")',
                        f"{m.path} at {m.span}",
                        info.pid,
                    )
                )
            continue
        kind, detail = where.classify(m.path)
        summary[kind] = summary.get(kind, 0) + 1
        if kind in ("foreign", "copy") and Path(m.path).name in ext_names:
            continue  # "extension … mapped from outside the release"
        _judge_mapping(info, m, kind, detail, exp, where, report)
        if kind == "runtime" and not m.deleted:
            _check_planted(info, m.path, started, exp, report)
        if own_view and not m.deleted:
            _check_same_file(info, m.path, report)


def _judge_mapping(
    info: ProcInfo,
    m: Mapped,
    kind: str,
    detail: str,
    exp: Expectation,
    where: Where,
    report: Report,
) -> None:
    gone = " (deleted on disk: the process runs a file that is no longer there)"
    if kind == "release" and m.deleted:
        report.findings.append(
            Finding(f"mapped code {detail}", "the file on disk", m.path + gone, info.pid)
        )
    elif kind == "release" and detail in exp.artifact_hashes and detail not in where.extensions:
        want = exp.artifact_hashes[detail]
        got, method = mapped_sha256(info.pid, m)
        if method == "path":
            note = (
                f"artifact {detail} (pid {info.pid}) hashed by path, not by the mapped inode "
                "(/proc/PID/map_files needs root): a library replaced after loading is unseen"
            )
            if note not in report.weaker:
                report.weaker.append(note)
        if got != want:
            report.findings.append(
                Finding(
                    f"artifact {detail} content",
                    f"sha256 {want} (recorded by the build)",
                    f"sha256 {got} (by {method})",
                    info.pid,
                )
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
        expected = f"the release or a runtime root ({_needs_root(m.path)})"
        if m.path.startswith(PSEUDO_CODE):
            expected = "code from a file of the release or a runtime root"
        report.findings.append(
            Finding(
                "mapped code from outside the allowed roots",
                expected,
                m.path + (gone if m.deleted else ""),
                info.pid,
            )
        )
    elif kind == "runtime" and m.deleted:
        # what was mapped is no longer on disk: a package upgraded under the running
        # service, or code planted in the venv and unlinked once loaded (or made nameless
        # with O_TMPFILE). Nothing is left to judge it by, so it is not vouched for.
        report.findings.append(
            Finding(
                "runtime code no longer on disk",
                "runtime code that is on disk as it was loaded",
                f"{m.path} (deleted): replaced or removed since the process loaded it, or "
                "never given a name; restart the service to run what is there now",
                info.pid,
            )
        )


def _own_view(pid: int) -> bool | None:
    """The process sees files through a mount namespace or root of its own (``unshare``,
    a chroot, systemd's ``PrivateTmp``): a path in its maps may then name another file
    than the same path here. None: its links are not ours to read (or it ended)."""
    try:
        if os.readlink(f"/proc/{pid}/root") != "/":
            return True
        return os.readlink(f"/proc/{pid}/ns/mnt") != os.readlink("/proc/self/ns/mnt")
    except OSError:
        return None


def _check_same_file(info: ProcInfo, path: str, report: Report) -> None:
    """The file the process maps, looked up in its own view (``/proc/PID/root``), must be
    the one servegate judged by the same path in its own: a service that unshares its
    mount namespace can bind foreign code over a system library's path, and its maps
    then name that trusted path while the code mapped is the foreign file."""
    try:
        here, there = os.stat(path), os.stat(f"/proc/{info.pid}/root{path}")
    except OSError:
        return  # gone here (judged as deleted), or not ours to read
    if (here.st_dev, here.st_ino) != (there.st_dev, there.st_ino):
        report.findings.append(
            Finding(
                "mapped code differs in the process's own view",
                f"{path} as servegate reads it (device {here.st_dev}, inode {here.st_ino})",
                f"another file under that path in the process's mount namespace or root "
                f"(device {there.st_dev}, inode {there.st_ino}): code bound over a trusted path",
                info.pid,
            )
        )


def _check_planted(
    info: ProcInfo, path: str, started: float | None, exp: Expectation, report: Report
) -> None:
    """Code of a default runtime root (the interpreter's venv and base, the system
    library directories) that was written after the process started: the venv is the
    service user's, so the release's own code can drop a library or module there and
    load it as "runtime". Compile caches and configured roots are written at run time
    by design (a JIT's output) and are not held to this."""
    if started is None or any(_within(path, root) for root in exp.runtime_roots):
        return
    try:
        changed = os.stat(path).st_ctime  # nothing sets a ctime back
    except OSError:
        return
    if changed > started:  # the start is read rounded down to a clock tick
        report.findings.append(
            Finding(
                "runtime code written after the process started",
                "code of the venv or the system as it was when the service started",
                f"{path} changed at {_when(changed)}, after the process started "
                f"({_when(started)}): written while the service ran",
                info.pid,
            )
        )


def _within(path: str, root: Path) -> bool:
    real, base = os.path.realpath(path), os.path.realpath(root)
    return real == base or real.startswith(base + os.sep)


def _when(epoch: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))


def _is_device(m: Mapped) -> bool:
    """GPU device nodes (/dev/nvidia*, /dev/kfd, /dev/dri/*) are mapped, not code files;
    a deleted mapping is never one (``/dev/zero (deleted)`` is anonymous memory)."""
    if m.deleted or not m.path.startswith("/dev/"):
        return False
    try:
        return stat.S_ISCHR(os.stat(m.path).st_mode) and m.path != "/dev/zero"
    except OSError:
        return False


COMPREHENSIONS = frozenset(["<listcomp>", "<dictcomp>", "<setcomp>"])
#: code objects compilers make under their source's file name: TorchDynamo's resume
#: functions (``torch_dynamo_resume_in_forward_at_57``) keep the compiled function's file
GENERATED_NAMES = ("torch_dynamo_resume_in_", "__resume_at_")
#: where a thread's own code starts: the frames below it belong to the interpreter
BOOTSTRAP = ("/threading.py", "/runpy.py", "<frozen runpy>")


def check_frames(
    info: ProcInfo,
    seen: frames_mod.Frames,
    exp: Expectation,
    where: Where,
    report: Report,
) -> None:
    """The frames the process is running: each file classified like mapped code, each
    frame checked against its file, and every thread's own code must have a file."""
    started = started_at(info.pid)
    for named in seen.files:
        file = generated_by(named) or named
        kind, detail = where.classify(file)
        if kind == "release":
            top = detail.split(os.sep, 1)[0].removesuffix(".py")
            for name in exp.modules:
                if name.split(".")[0] == top:
                    report.modules_evidence[name] = "observed"
            continue
        if kind == "runtime":
            if not _on_disk(file):
                report.findings.append(
                    Finding(
                        "running code that is not on disk",
                        f"{file} on disk",
                        "missing: loaded before it was removed, or a borrowed name",
                        info.pid,
                    )
                )
            else:
                _check_planted(info, file, started, exp, report)
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
        if not _on_disk(file):
            found += " (no longer on disk: loaded before it was removed)"
        report.findings.append(Finding(check, expected, found, info.pid))
    mismatched: set[tuple[str, str, int]] = set()
    # the same interpreter freezes the same modules: `<frozen NAME>` frames can be checked
    # against its own frozen code (another interpreter's may differ by a patch release)
    same_interpreter = hasattr(_imp, "get_frozen_object") and (
        os.path.realpath(info.exe) == os.path.realpath(sys.executable)
    )
    for stack in seen.stacks:
        _check_thread_root(info, stack, report)
        for frame in stack:
            name = frame.name.rsplit(".", 1)[-1]  # a qualified name: "Outer.<lambda>"
            if same_interpreter and frame.file.startswith("<frozen ") and name != "<module>":
                frozen = _frozen_functions(frame.file.removeprefix("<frozen ").rstrip(">"))
                if frozen is None or not any(a <= frame.line <= b for a, b in frozen.get(name, [])):
                    mismatched.add((frame.file, name, frame.line))
                continue
            if (
                frame.pseudo
                or frame.line <= 0
                or not frame.file.endswith(".py")
                or name == "<module>"  # spans the whole file: it tells nothing
                or name.startswith(GENERATED_NAMES)
            ):
                continue
            spans = where.functions(frame.file)
            if spans is None or (name in COMPREHENSIONS and name not in spans):
                continue  # a comprehension's own frame exists only before Python 3.12
            if not any(a <= frame.line <= b for a, b in spans.get(name, [])):
                mismatched.add((frame.file, name, frame.line))
    for file, name, line in sorted(mismatched):
        report.findings.append(
            Finding(
                "frame does not match its file",
                f"a def or class {name} spanning line {line} of {file}",
                "none there: code compiled under this file's name from other source, or the "
                "file changed since it was loaded",
                info.pid,
            )
        )


def _check_thread_root(info: ProcInfo, stack: tuple[frames_mod.Frame, ...], report: Report) -> None:
    """A thread's own first frame (after the interpreter's bootstrap) must have a file.
    ``<string>``'s ``<module>`` at the very bottom of a stack is the program of
    ``python -c`` (multiprocessing's spawn starts vLLM's EngineCore and workers so; a
    thread's stack starts in threading instead); code made by ``exec`` and called from a
    file (a dataclass's generated ``__init__``) is not a thread's root."""
    for i, frame in enumerate(stack):
        if frame.file.startswith("<frozen") or frame.file.endswith(BOOTSTRAP):
            continue
        if i == 0 and frame.file == "<string>" and frame.name == "<module>":
            continue  # the program of `python -c` (its title may hide the -c: setproctitle)
        if frame.pseudo:
            report.findings.append(
                Finding(
                    "thread runs code with no file",
                    "a thread's own code in a file of the release or a runtime root",
                    f"{frame.name} in {frame.file or '?'} (line {frame.line}): code made by "
                    "exec/compile from a string or from memory",
                    info.pid,
                )
            )
        return


#: names code generators give their code: torch's AOTAutograd compiles its wrappers as
#: ``…/subclass_codegen.py:codegen(runtime_wrapper…)`` (only this shape: a generic
#: ``file.py:anything`` would lend any file's trust to code compiled from elsewhere)
GENERATED_FILE = re.compile(r"^(/.+?\.py):codegen\(")


def generated_by(name: str) -> str | None:
    """The real file a code generator named its code after: torch compiles wrappers as
    ``…/subclass_codegen.py:codegen(runtime_wrapper…)``. None for an ordinary name."""
    match = GENERATED_FILE.match(name)
    if match is None or os.path.exists(name) or not os.path.isfile(match.group(1)):
        return None
    return match.group(1)


def _on_disk(path: str) -> bool:
    """The file exists — or lies inside an archive that does (zipimport)."""
    p = Path(path)
    return p.exists() or any(a.is_file() for a in p.parents)


def _functions(path: str) -> dict[str, list[tuple[int, int]]] | None:
    """Every code object a Python file compiles to: name → [(first line, last line)].
    Compiled, not walked as an AST: the interpreter's own names and line ranges (lambdas
    and comprehensions included), at C speed. Cached by path, size and mtime."""
    try:
        info = os.stat(path)
    except OSError:
        return None
    return _compiled_functions(path, info.st_size, info.st_mtime_ns)


@functools.lru_cache(maxsize=4096)
def _compiled_functions(
    path: str, size: int, mtime_ns: int
) -> dict[str, list[tuple[int, int]]] | None:
    try:
        code = compile(Path(path).read_bytes(), path, "exec", dont_inherit=True)
    except (OSError, SyntaxError, ValueError):
        return None
    return _spans(code)


@functools.lru_cache(maxsize=256)
def _frozen_functions(module: str) -> dict[str, list[tuple[int, int]]] | None:
    """The code objects of a module frozen into this interpreter (``<frozen NAME>``), as
    :func:`_functions` gives them for a file; None when this interpreter freezes no
    such module."""
    try:
        code = _imp.get_frozen_object(module)
    except ImportError:
        return None
    return _spans(code) if isinstance(code, types.CodeType) else None


def _spans(code: types.CodeType) -> dict[str, list[tuple[int, int]]]:
    out: dict[str, list[tuple[int, int]]] = {}
    todo = [code]
    while todo:
        co = todo.pop()
        lines = [line for _, _, line in co.co_lines() if line is not None]
        first = min([co.co_firstlineno, *lines])
        out.setdefault(co.co_name, []).append((first, max([first, *lines])))
        todo += [c for c in co.co_consts if isinstance(c, types.CodeType)]
    return out


#: run by the service's own interpreter (``-I -S -B``: no site, no environment, no
#: hooks, writes nothing): each cached bytecode file of a release source, as the import
#: system would pick it, against the source compiled afresh
BYTECODE_SCRIPT = """
import importlib.util, json, marshal, os, sys
root, prefix = sys.argv[1], sys.argv[2]
if prefix:
    sys.pycache_prefix = prefix
def same(a, b):
    # code equality leaves out the qualified name and the stack size: compare them too
    if a != b or a.co_stacksize != b.co_stacksize:
        return False
    if getattr(a, "co_qualname", None) != getattr(b, "co_qualname", None):
        return False
    inner = [c for c in a.co_consts if hasattr(c, "co_code")]
    other = [c for c in b.co_consts if hasattr(c, "co_code")]
    return len(inner) == len(other) and all(same(x, y) for x, y in zip(inner, other))
bad = []
for rel in json.loads(sys.stdin.read()):
    src = os.path.join(root, rel)
    for opt in ("", 1, 2):
        pyc = importlib.util.cache_from_source(src, optimization=opt)
        try:
            data = open(pyc, "rb").read()
        except OSError:
            continue
        if data[:4] != importlib.util.MAGIC_NUMBER:
            continue  # another interpreter's: this one never loads it
        try:
            code = marshal.loads(data[16:])
            ref = compile(open(src, "rb").read(), src, "exec", dont_inherit=True,
                          optimize=opt or 0)
        except Exception as exc:
            bad.append([rel, pyc, f"unreadable: {exc!r}"[:200]])
            continue
        if not same(code, ref):
            kind = int.from_bytes(data[4:8], "little")
            how = {0: "timestamp", 1: "unchecked hash", 3: "checked hash"}.get(kind, kind)
            bad.append([rel, pyc, f"compiled from other source ({how} bytecode)"])
print(json.dumps(bad))
"""


def check_bytecode(
    main: ProcInfo, exp: Expectation, tracked: set[str] | None, report: Report
) -> None:
    """Bytecode the interpreter would load for a release source must be that source
    compiled: a ``.pyc`` whose header matches the source (or an unchecked-hash one,
    which Python loads without looking at the source) runs other code under the
    source's name. Checked by the service's own interpreter, for every tracked ``.py``
    with cached bytecode, in ``__pycache__`` or under the live ``pycache_prefix``."""
    if tracked is None:
        return
    prefix = _pycache_prefix(main)
    files = sorted(
        rel for rel in tracked
        if rel.endswith(".py") and (prefix or (exp.release_dir / rel).parent.joinpath(
            "__pycache__").is_dir())
    )  # fmt: skip
    if not files:
        return
    try:
        done = subprocess.run(
            [exp.interpreter, "-I", "-S", "-B", "-c", BYTECODE_SCRIPT, str(exp.release_dir),
             prefix],
            input=json.dumps(files), capture_output=True, text=True, timeout=120, check=False,
            env={"PATH": "/usr/bin:/bin"},
        )  # fmt: skip
        bad = json.loads(done.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
        report.weaker.append("cached bytecode of the release not compared with its sources")
        return
    for rel, pyc, why in bad:
        report.findings.append(
            Finding(
                f"bytecode of {rel}",
                f"{rel} compiled (or no cached bytecode)",
                f"{pyc}: {why}; delete it and restart the service",
                main.pid,
            )
        )


def _pycache_prefix(main: ProcInfo) -> str:
    """Where the live interpreter keeps bytecode when not beside the source: ``-X
    pycache_prefix=DIR`` on its command line, else PYTHONPYCACHEPREFIX (unless -E/-I)."""
    flags, _ = interpreter_flags(list(main.argv) or main.cmdline.split(), main.cwd)
    for i, flag in enumerate(flags):
        if flag == "-X" and i + 1 < len(flags) and flags[i + 1].startswith("pycache_prefix="):
            return os.path.join(main.cwd, flags[i + 1].split("=", 1)[1])
    if main.environ_readable and not {"-E", "-I"} & set(flags):
        value = main.environ.get("PYTHONPYCACHEPREFIX", "")
        return os.path.join(main.cwd, value) if value else ""
    return ""


#: what Python can import or load from a directory on its path
IMPORTABLE = (".py", ".pyc", ".pyw", ".so", ".pth", ".zip", ".egg", ".whl")


def untracked_code(release_dir: Path, artifacts: Mapping[str, str]) -> list[str] | None:
    """Files (and nested repositories) in the release that Python could import, neither
    tracked nor hashed by the build; None when git cannot list them. A directory git
    will not look into (a nested repository: ``json/`` with its own ``.git``) is listed
    whole: it can hold a package that shadows the standard library's. So is any untracked
    symbolic link to a directory of code, whatever its name: git lists it as a plain
    name (``json``), and Python imports the package behind it."""
    others = _git_lines(release_dir, "ls-files", "--others", "-z")
    if others is None:
        return None
    return sorted(
        rel
        for rel in others
        if (rel.endswith("/") or rel.endswith(IMPORTABLE) or _linked_dir(release_dir / rel))
        # bytecode in __pycache__ is judged against its source; any other file there is
        # importable code (``pkg.__pycache__.mod``: a namespace package)
        and not ("__pycache__" in rel.split("/") and rel.endswith(".pyc"))
        and rel not in artifacts
    )


def _linked_dir(path: Path, most: int = 200_000) -> bool:
    """A symbolic link to a directory that holds code Python could import, through any
    link below it too (a link to weights or data alone is not code). What cannot be
    looked through — a directory it cannot list, a tree of more than ``most`` entries or
    a loop of links — counts as code: Python needs no listing to import a name."""
    if not (path.is_symlink() and path.is_dir()):
        return False
    failed: list[OSError] = []
    seen, places = 0, set()
    for top, dirs, files in os.walk(path, followlinks=True, onerror=failed.append):
        place = os.stat(top)
        if (place.st_dev, place.st_ino) in places:
            return True  # a loop
        places.add((place.st_dev, place.st_ino))
        seen += len(files) + len(dirs)
        if failed or seen > most or any(f.endswith(IMPORTABLE) for f in files):
            return True
    return bool(failed)


def check_untracked(exp: Expectation, tracked: set[str] | None, report: Report) -> None:
    """Code in the release that git does not track and the build did not hash: an
    ``-m`` launch puts the release first on ``sys.path``, so an untracked ``mmap.py``
    there replaces the standard module at the first import — and may then sit idle,
    unseen by any frame. Bytecode caches (``__pycache__``) are judged by the bytecode
    check against their tracked sources."""
    if tracked is None:
        return
    found = untracked_code(exp.release_dir, exp.artifact_hashes)
    if found is None:
        report.weaker.append(f"untracked files of {exp.release_dir} not listed")
        return
    for rel in found[:20]:
        report.findings.append(
            Finding(
                f"untracked code {rel}",
                "a tracked file or a hashed build artifact (build.artifacts) of the release",
                f"{exp.release_dir / rel}: Python can import it from the release, and git "
                "does not track it" + (" (a repository of its own)" if rel.endswith("/") else ""),
            )
        )
    if len(found) > 20:
        report.findings.append(
            Finding("untracked code", "none", f"{len(found) - 20} more untracked code files")
        )
