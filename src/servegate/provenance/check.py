"""Proof that the live service runs the release's checkout, read from the live processes.

For the service's main PID and every descendant (a vLLM server is an API process, an
EngineCore and its workers):

- **observed**: the working directory, the executable and its venv, the environment
  (with the dynamic-loader and start-up variables), every file mapped executable and
  the frames each Python process is running (:mod:`servegate.provenance.codeorigin`, read by
  py-spy through :mod:`servegate.provenance.frames`), the extension libraries by the SHA-256
  of the mapped inode;
- **inferred**: where the service's interpreter resolves the configured packages,
  reproduced in a new process started exactly as the live one (its flags, first path
  entry, working directory and environment, never its preloads or start-up file), and
  the start-up hooks of its site directories (:mod:`servegate.provenance.startup_hooks`).

Each process records which level its Python evidence reached. Any difference is a
finding with expected and found; docs/records.md says how to read and fix each.
"""

from __future__ import annotations

import json
import os
import secrets
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from servegate.engine import ports
from servegate.errors import CommandFailed
from servegate.pipeline import proc, redact
from servegate.provenance import codeorigin
from servegate.provenance import frames as frames_mod
from servegate.provenance import startup_hooks as hooks
from servegate.provenance.codeorigin import SYSTEM_LIBS, Where, runtime_roots, tracked_files
from servegate.provenance.liveproc import (
    Expectation,
    Finding,
    Mapped,
    ProcInfo,
    Report,
    descendants,
    inside,
    interpreter_flags,
    mapped_sha256,
    read_process,
    service_processes,
    started_at,
    started_path,
)

__all__ = [
    "SYSTEM_LIBS",
    "Expectation",
    "Finding",
    "Mapped",
    "ProcInfo",
    "Report",
    "descendants",
    "interpreter_flags",
    "read_process",
    "runtime_roots",
    "verify",
]

RESOLVE_SCRIPT = """
import sys
first = sys.path.pop(0) if sys.path and sys.path[0] in ("", ".") else None
import importlib.util, json  # servegate's own imports never from the release's directory
marker, path0 = sys.argv[1], sys.argv[2]
if first is not None:
    sys.path.insert(0, path0 if path0 != "-" else first)  # as the service's start had it
out = {}
for name in sys.argv[3:]:
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
print(marker + json.dumps(out), flush=True)
"""


# -- the checks -----------------------------------------------------------------------


#: loader and start-up variables: a finding in a live process unless the launch sets them
#: (paths outside the allowed roots for the path lists; any value for the rest)
LOADER_PATHS = ("LD_PRELOAD", "LD_AUDIT", "LD_LIBRARY_PATH", "PYTHONPATH")
STARTUP_VARS = ("PYTHONHOME", "PYTHONSTARTUP", "PYTHONUSERBASE", "PYTHONINSPECT",
                "PYTHONPYCACHEPREFIX")  # fmt: skip


def _check_process(
    info: ProcInfo, main_pid: int, exp: Expectation, where: Where, report: Report
) -> None:
    def bad(check: str, expected: str, found: str) -> None:
        report.findings.append(Finding(check, expected, found, info.pid))

    if not inside(info.cwd, exp.release_dir):
        bad("working directory", f"inside {exp.release_dir}", info.cwd)
    want_exe = os.path.realpath(exp.interpreter)
    if os.path.realpath(info.exe) != want_exe:
        bad("executable", f"{exp.interpreter} (→ {want_exe})", info.exe)
    else:
        _check_venv(info, exp, bad)
    codeorigin.check_mapped(info, exp, where, report)
    if not info.environ_readable:
        if info.pid == main_pid:
            bad("environment", "readable in /proc/PID/environ", "blank (overwritten)")
        return
    for name in info.env_twice:
        bad(f"environment {name}", "given once",
            "given more than once: getenv() reads the first, code that scans the block "
            "itself may read another")  # fmt: skip
    trusted = [exp.release_dir, *where.roots]
    for name in LOADER_PATHS:
        value = info.environ.get(name)
        if not value or exp.declared_env.get(name) == value:
            continue
        for entry in value.replace(":", " ").split():
            if not any(inside(entry, root) for root in trusted):
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
    the base): the path the process was started with names its venv — found through
    the live process's own PATH when it was started by name, as the kernel found it."""
    venv = Path(exp.interpreter).parent.parent
    if not (venv / "pyvenv.cfg").is_file():
        return
    started = started_path(info)
    if started is None:
        return  # a title (setproctitle: "VLLM::EngineCore"), not a path: the files it runs say
    here = os.path.realpath(Path(started).parent)
    if here != os.path.realpath(venv / "bin"):
        bad("interpreter environment", f"the venv {venv}", f"{started} (a venv in {here})")


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
                if Path(m.path).name in names and not inside(m.path, exp.release_dir):
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
    # sys.path's first entry was fixed when the process started, in the directory the
    # manager started it in (the launch's); the process may have changed directory since
    start_dir = str(exp.launch_cwd or main.cwd)
    if exp.launch_cwd and os.path.realpath(main.cwd) != os.path.realpath(exp.launch_cwd):
        report.weaker.append(
            f"pid {main.pid} works in {main.cwd}, not where it was started ({exp.launch_cwd}): "
            "its imports were resolved from the start directory; an -m/-c launch that must "
            "not import from it should use -P (PYTHONSAFEPATH)"
        )
    flags, path0 = interpreter_flags(list(main.argv) or ports.argv(main.pid), start_dir)
    marker = f"servegate-resolved-{secrets.token_hex(8)}:"
    try:
        result = proc.run(
            [exp.interpreter, *flags, "-c", RESOLVE_SCRIPT, marker, path0, *exp.modules],
            cwd=start_dir,
            env=env,
            timeout=60,
            check=False,
        )
        output = result.output
    except CommandFailed as exc:  # a start-up hook that never returns, a missing cwd
        output = str(exc)
    answers = [ln[len(marker) :] for ln in output.splitlines() if ln.startswith(marker)]
    try:
        if len(answers) != 1:  # a start-up hook that prints an answer of its own
            raise ValueError(f"{len(answers)} answers")
        origins: dict[str, str | None] = json.loads(answers[0])
    except ValueError:
        report.findings.append(
            Finding(
                "module resolution",
                "an answer from the service's interpreter, started as the service was",
                proc.tail(output, 5) or "none",
            )
        )
        return
    report.modules = origins
    if any(main.environ.get(n) for n in ("LD_PRELOAD", "LD_AUDIT")):
        report.weaker.append(
            "modules resolved without the service's LD_PRELOAD/LD_AUDIT libraries (they never "
            "run in servegate): a library that changes the interpreter's start is only seen "
            "in the frames"
        )
    for name, origin in origins.items():
        report.modules_evidence.setdefault(name, "inferred")
        if origin is None or not inside(origin, exp.release_dir):
            report.findings.append(
                Finding(
                    f"module {name}",
                    f"resolved inside {exp.release_dir}",
                    origin or "not importable",
                )
            )


def start_ticks(pid: int) -> int | None:
    """When the live process started, in clock ticks since boot (/proc/PID/stat): with
    the pid, the process's identity — a pid reused by a later process has a later start.
    None when there is no live process: gone, or dead and not yet reaped (a zombie)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return None if fields[0] in ("Z", "X") else int(fields[19])
    except (OSError, IndexError, ValueError):
        return None


def _check_age(main: ProcInfo, exp: Expectation, tracked: set[str] | None, report: Report) -> None:
    """A process that started before the release's files last changed may run what was
    there before: the live process is judged, not the disk."""
    started = started_at(main.pid)
    if started is None:
        return
    newest, which = 0.0, ""
    for rel in [*(tracked or ()), *exp.artifact_hashes]:
        try:
            # the change time: utime() can set a file's mtime back, nothing sets ctime
            mtime = os.lstat(exp.release_dir / rel).st_ctime
        except OSError:
            continue
        if mtime > newest:
            newest, which = mtime, rel
    if newest > started + 0.05:  # a clock tick, and the two clocks read a moment apart
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
    tree, outside, scope = service_processes(main_pid, exp.unit_cgroup)
    report.scope = scope
    if not outside and "no cgroup" in scope:
        report.weaker.append(
            "only the process tree was checked: a process that left it (a double fork) is "
            "not seen without a cgroup of the service's own (systemd gives each unit one)"
        )
    infos = [i for i in map(read_process, tree + outside) if i is not None]
    if not infos:
        report.findings.append(Finding("service process", f"pid {main_pid} running", "gone"))
        return report
    tracked = tracked_files(exp.release_dir, exp.sha)
    if tracked is None:
        report.weaker.append(
            f"{exp.release_dir} is not a git checkout: any file in it counts as the release's"
        )
    where = Where(
        exp,
        runtime_roots(exp),
        tracked,
        frozenset(m.split(".")[0] for m in exp.modules),
        frozenset(
            str(f.relative_to(exp.release_dir))
            for p in exp.extensions
            for f in exp.release_dir.glob(p)
        ),
    )
    report.findings += codeorigin.writable_roots(exp, where.roots)
    py_spy = frames_mod.find_py_spy(exp.py_spy)
    # every process sampled at once: the samples' pauses overlap (py-spy is a subprocess)
    with ThreadPoolExecutor(max_workers=min(16, len(infos))) as pool:
        observed = list(
            pool.map(lambda i: frames_mod.observe(i.pid, py_spy, samples=exp.samples), infos)
        )
    for info, seen in zip(infos, observed, strict=True):
        report.processes.append(_process_entry(info, seen, exp))
        if info.pid in outside:
            report.processes[-1]["outside_tree"] = True
        _check_process(info, main_pid, exp, where, report)
        if seen.observed:
            codeorigin.check_frames(info, seen, exp, where, report)
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
    codeorigin.check_untracked(exp, tracked, report)
    _check_modules(infos[0], exp, report)
    codeorigin.check_bytecode(infos[0], exp, tracked, report)
    hooks.check_hooks(infos, exp, report, where.roots)
    _check_age(infos[0], exp, tracked, report)
    if exp.port is not None:
        pids = {i.pid for i in infos}
        owners, hidden = ports.owners(exp.port)
        report.listeners = sorted(owners)
        if not owners or not owners <= pids or hidden:
            shown = [
                f"{p} ({' '.join(redact.argv(ports.argv(p), exp.salt))[:120]})"
                for p in sorted(owners)
            ]
            if hidden:
                shown.append(f"{hidden} socket(s) held by a process whose descriptors this "
                             "user cannot read (another user's, or one that hid them)")  # fmt: skip
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
        "frames_pseudo": list(seen.pseudo[:20]),
        "samples": seen.samples,
        "frames_status": seen.status,
        "frames_note": frames_mod.MEANING[seen.status]
        + (f" ({seen.detail})" if seen.detail else ""),
    }
