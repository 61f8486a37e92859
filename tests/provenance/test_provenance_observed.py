"""Observed provenance: what the live processes run, read by py-spy, against hostile
launches — a stale copy in site-packages, start-up hooks that act only for the server,
a hijack removed from disk after it loaded, foreign and untracked code, a C engine —
and the boxes where py-spy is missing or may not read the process. Every process, venv,
library and hook here is real."""

from __future__ import annotations

import base64
import hashlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from servegate.pipeline.hashing import sha256_file
from servegate.provenance import frames
from servegate.provenance.check import Expectation, Report, descendants, verify

SERVER = """
import ctypes, mmap, os, shutil, subprocess, sys, threading, time

def hostile(how, foreign):
    # what a hostile commit does besides serving (HOSTILE=how, FOREIGN=a file)
    if how in ("exec-string", "exec-borrowed"):
        name = "<string>" if how == "exec-string" else __file__
        scope = {}
        exec(compile(open(foreign).read(), name, "exec"), scope)
        threading.Thread(target=scope["spin"], daemon=True).start()
    elif how == "memfd":
        fd = os.memfd_create("x/../../usr/lib/libfoo.so")
        os.write(fd, open(foreign, "rb").read())
        ctypes.CDLL(f"/proc/self/fd/{fd}")
    elif how == "plant":  # into the service's venv, a runtime root the user may write
        dest = os.path.join(sys.prefix, "lib", "libplanted.so")
        shutil.copy(foreign, dest)
        ctypes.CDLL(dest)
        sys.path.insert(0, os.path.join(sys.prefix, "lib"))
        open(os.path.join(sys.prefix, "lib", "planted.py"), "w").write(
            "import time\\ndef spin():\\n    while True:\\n        time.sleep(0.01)\\n")
        threading.Thread(target=__import__("planted").spin, daemon=True).start()
    elif how == "anonymous":
        global PAGE
        PAGE = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)

def serve(lib, role):
    ctypes.CDLL(lib)
    hostile(os.environ.get("HOSTILE", ""), os.environ.get("FOREIGN", ""))
    if role == "main":
        if os.environ.get("NONDUMPABLE"):
            ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0: needs CAP_SYS_PTRACE
        child = subprocess.Popen(sys.orig_argv + ["child"])
        while os.path.basename(lib) not in open(f"/proc/{child.pid}/maps").read():
            time.sleep(0.05)
        print("ready", flush=True)
    while True:
        time.sleep(0.05)

def main():
    serve(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "main")

if __name__ == "__main__":
    main()
"""

#: what pip writes for a console script ``stack-serve = stackpkg.server:main``
CONSOLE_SCRIPT = """#!{python}
import re, sys
from stackpkg.server import main
if __name__ == "__main__":
    sys.argv[0] = re.sub(r"(-script\\.pyw|\\.exe)?$", "", sys.argv[0])
    sys.exit(main())
"""

ENGINE_C = r"""
#include <dlfcn.h>
#include <stdio.h>
#include <unistd.h>
int main(int argc, char **argv) {
    if (!dlopen(argv[1], RTLD_NOW)) { fprintf(stderr, "%s\n", dlerror()); return 1; }
    printf("ready\n"); fflush(stdout);
    for (;;) pause();
}
"""


def cc(out: Path, src: str, *flags: str) -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    source = out.with_suffix(".c")
    source.write_text(src)
    subprocess.run(["cc", *flags, "-o", str(out), str(source)], check=True)
    return out


def git(path: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(path), "-c", "user.name=t", "-c",
                    "user.email=t@example.invalid", *args], check=True)  # fmt: skip


@pytest.fixture
def release(tmp_path: Path) -> Path:
    return make_release(tmp_path, SERVER)


def make_release(tmp_path: Path, server: str) -> Path:
    """A committed release whose ``stackpkg.server`` is ``server``, with a built library."""
    path = tmp_path / "releases" / "a"
    (path / "stackpkg").mkdir(parents=True)
    (path / "stackpkg" / "__init__.py").write_text("")
    (path / "stackpkg" / "server.py").write_text(server)
    cc(path / "build" / "libk.so", "int k(void) { return 1; }\n", "-shared", "-fPIC")
    shutil.move(path / "build" / "libk.c", path / "k.c")
    git(path, "init", "-q")
    git(path, "add", "stackpkg", "k.c")
    git(path, "commit", "-qm", "release")
    return path


def expect(release: Path, **kw: object) -> Expectation:
    base: dict[str, object] = {
        "release_dir": release,
        "interpreter": sys.executable,
        "extensions": ("build/*.so",),
        "modules": ("stackpkg",),
        "releases_root": release.parent,
        "artifact_hashes": {"build/libk.so": sha256_file(release / "build" / "libk.so")},
    }
    base.update(kw)
    return Expectation(**base)  # type: ignore[arg-type]


class Service:
    def __init__(self, argv: list[str], cwd: Path, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().strip()
        assert line == "ready", f"the service did not start: {line!r}"

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self) -> None:
        for pid in reversed(descendants(self.proc.pid)):
            os.kill(pid, 9)
        self.proc.wait()
        assert self.proc.stdout is not None
        self.proc.stdout.close()


@pytest.fixture
def services() -> Iterator[list[Service]]:
    started: list[Service] = []
    yield started
    for s in started:
        s.stop()


def serve(
    services: list[Service], release: Path, *, python: str = sys.executable,
    argv: list[str] | None = None, **env: str,
) -> Service:  # fmt: skip
    """``python -m stackpkg.server`` in the release: sys.path[0] is the working directory,
    as the seeds' launch has it."""
    run = argv or [python, "-m", "stackpkg.server"]
    s = Service([*run, str(release / "build" / "libk.so")], release, dict(os.environ, **env))
    services.append(s)
    return s


def checks(report: Report) -> list[str]:
    return [f.check for f in report.findings]


def make_venv(path: Path) -> Path:
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True)
    site = next(path.glob("lib/python3*/site-packages"))
    return site


needs_py_spy = pytest.mark.skipif(
    frames.find_py_spy() is None, reason="py-spy is not installed (it is a dependency)"
)


@needs_py_spy
def test_every_python_process_is_observed_running_the_release(
    release: Path, services: list[Service]
) -> None:
    s = serve(services, release)
    report = verify(s.pid, expect(release))
    assert report.ok, report.explain()
    assert [p["evidence"] for p in report.processes] == ["observed", "observed"]
    server = str(release / "stackpkg" / "server.py")
    assert all(server in p["frames"] for p in report.processes)
    assert report.modules_evidence == {"stackpkg": "observed"}
    assert report.evidence == "observed"
    assert report.mapped_summary["release"] == 2  # libk.so in both processes, hashed


@needs_py_spy
def test_a_stale_copy_in_site_packages_launched_through_a_console_script(
    release: Path, services: list[Service], tmp_path: Path
) -> None:
    """The service venv holds a non-editable copy of the package; the console script
    puts the venv's bin first on sys.path, so the working directory (the release) is
    never searched: the live process runs the copy."""
    venv = tmp_path / "venv"
    site = make_venv(venv)
    shutil.copytree(release / "stackpkg", site / "stackpkg")
    script = venv / "bin" / "stack-serve"
    script.write_text(CONSOLE_SCRIPT.format(python=venv / "bin" / "python"))
    script.chmod(0o755)
    s = serve(services, release, argv=[str(script)])
    report = verify(s.pid, expect(release, interpreter=str(venv / "bin" / "python")))
    copy = [
        f for f in report.findings if f.check == "module stackpkg runs from outside the release"
    ]
    assert {f.pid for f in copy} == {p["pid"] for p in report.processes}
    assert copy[0].found == str(site / "stackpkg" / "server.py")
    # the inference, started as the live one (a script: its directory first), agrees
    assert report.modules["stackpkg"] == str(site / "stackpkg" / "__init__.py")


#: imports the package from elsewhere before the server's own import can look, only
#: when the command line is the server's, and never names the package
HOOK = """import os, sys
if any(a.endswith(".server") for a in sys.orig_argv):
    sys.path.insert(0, {evil!r})
    __import__(os.listdir({evil!r})[0])
    sys.path.pop(0)
"""


@pytest.fixture
def hijacked(release: Path, tmp_path: Path) -> tuple[Path, Path]:
    """A service venv whose sitecustomize redirects the import only for the server's
    command line, to a copy of the package that lies outside the release."""
    venv = tmp_path / "venv"
    site = make_venv(venv)
    evil = tmp_path / "evil"
    shutil.copytree(release / "stackpkg", evil / "stackpkg")
    (site / "sitecustomize.py").write_text(HOOK.format(evil=str(evil)))
    return venv, evil


@needs_py_spy
def test_a_hook_acting_only_for_the_server_and_a_hijack_removed_from_disk(
    release: Path, services: list[Service], hijacked: tuple[Path, Path]
) -> None:
    venv, evil = hijacked
    python = str(venv / "bin" / "python")
    s = serve(services, release, python=python)
    exp = expect(release, interpreter=python)
    report = verify(s.pid, exp)
    # the resolver runs with -c: the hook stays quiet for it, and it alone would say OK
    assert report.modules["stackpkg"] == str(release / "stackpkg" / "__init__.py")
    assert "start-up hook sitecustomize.py" in checks(report)
    assert [h["verdict"] for h in report.hooks if h["kind"] == "sitecustomize"] == ["fail"]
    # a copy of the checked package, wherever it lies
    running = [
        f for f in report.findings if f.check == "module stackpkg runs from outside the release"
    ]
    assert running
    assert running[0].found == str(evil / "stackpkg" / "server.py")

    # the hijack is removed from disk; the process still runs what it loaded
    shutil.rmtree(evil)
    next(venv.glob("lib/python3*/site-packages/sitecustomize.py")).unlink()
    again = verify(s.pid, exp)
    assert not again.ok
    assert not any(f.check.startswith("start-up hook") for f in again.findings)
    gone = [f for f in again.findings if f.check == "module stackpkg runs from outside the release"]
    assert gone
    assert "no longer on disk" in gone[0].found


def test_hooks_are_judged_without_py_spy(
    release: Path, services: list[Service], hijacked: tuple[Path, Path], tmp_path: Path
) -> None:
    """Where py-spy cannot observe, inference must not lie: the hook that reads the
    command line fails the check, and the evidence says it was inferred."""
    venv, _ = hijacked
    python = str(venv / "bin" / "python")
    site = next(venv.glob("lib/python3*/site-packages"))
    (site / "named.pth").write_text("import stackpkg_helper_is_not_it; import stackpkg\n")
    (site / "plain.pth").write_text("import os\n")  # written here, by no package
    # one a package installed (its RECORD lists it, with its hash), and one edited since
    for name, text, listed in (("kept.pth", "import os\n", "import os\n"),
                               ("edited.pth", "import os, sys\n", "import os\n")):  # fmt: skip
        (site / name).write_text(text)
        info = site / f"{name.split('.')[0]}-1.0.dist-info"
        info.mkdir()
        digest = base64.urlsafe_b64encode(hashlib.sha256(listed.encode()).digest())
        (info / "RECORD").write_text(f"{name},sha256={digest.decode().rstrip('=')},{len(listed)}\n")
    # the command-line check and the load from /tmp spelled so that no word gives them away
    (site / "obscure.pth").write_text(
        "import sys; a = sys.__dict__['orig_' + 'ar' + 'gv']; a[-1:] == ['x'] and "
        "__import__('importlib.machinery').machinery.SourceFileLoader('p', '/tmp/p.py')"
        ".load_module()\n"
    )
    payload = tmp_path / "payload.py"
    payload.write_text("")
    reader = site / "zz_reader.pth"
    reader.write_text(f"import os; exec(open({str(payload)!r}).read())\n")
    s = serve(services, release, python=python)
    report = verify(s.pid, expect(release, interpreter=python, py_spy=str(tmp_path / "none")))
    assert [p["evidence"] for p in report.processes] == ["inferred", "inferred"]
    assert report.evidence == "inferred"
    assert any("py-spy is not installed" in w for w in report.weaker)
    verdicts = {Path(h["path"]).name: (h["verdict"], h["why"]) for h in report.hooks}
    assert verdicts["sitecustomize.py"][0] == "fail"
    assert verdicts["named.pth"] == ("fail", "names the checked package stackpkg")
    assert verdicts["plain.pth"] == (
        "fail",
        "no installed package lists it (no .dist-info/RECORD in its directory): code put "
        "there, not installed",
    )
    assert verdicts["kept.pth"] == ("warn", "runs code at every start of the interpreter")
    assert verdicts["edited.pth"][0] == "fail"
    assert "differs from what its package installed" in verdicts["edited.pth"][1]
    assert verdicts["obscure.pth"][0] == "fail"
    assert "what it does cannot be read from its text" in verdicts["obscure.pth"][1]
    assert verdicts["zz_reader.pth"] == (
        "fail",
        "runs code it reads or decodes (exec, open, marshal, …)",
    )
    assert not report.ok
    allowed = verify(s.pid, expect(release, interpreter=python, py_spy=str(tmp_path / "none"),
                                   allowed_hooks=(str(reader),)))  # fmt: skip
    assert "start-up hook zz_reader.pth" not in checks(allowed)
    assert [h["verdict"] for h in allowed.hooks if h["path"] == str(reader)] == ["allowed"]


@needs_py_spy
def test_py_spy_missing_or_not_permitted_is_said_and_can_be_required(
    release: Path, services: list[Service], tmp_path: Path
) -> None:
    s = serve(services, release, NONDUMPABLE="1")
    missing = verify(s.pid, expect(release, py_spy=str(tmp_path / "no-such-py-spy")))
    assert missing.ok, missing.explain()  # inferred: the module resolves in the release
    assert {p["frames_status"] for p in missing.processes} == {"no-py-spy"}
    required = verify(s.pid, expect(release, py_spy=str(tmp_path / "x"), require_observed=True))
    assert checks(required) == ["observed evidence", "observed evidence"]

    # a py-spy without CAP_SYS_PTRACE may not read a non-dumpable process
    real = frames.find_py_spy()
    wrapper = tmp_path / "py-spy-unprivileged"
    drop = "setpriv --bounding-set=-sys_ptrace --inh-caps=-sys_ptrace " if os.geteuid() == 0 else ""
    wrapper.write_text(f'#!/bin/sh\nexec {drop}{real} "$@"\n')
    wrapper.chmod(0o755)
    denied = verify(s.pid, expect(release, py_spy=str(wrapper)))
    main = denied.processes[0]
    assert main["frames_status"] == "not-permitted", main["frames_note"]
    assert main["evidence"] == "inferred"
    assert any("box-setup.md" in w for w in denied.weaker)
    strict = verify(s.pid, expect(release, py_spy=str(wrapper), require_observed=True))
    assert "observed evidence" in checks(strict)


@needs_py_spy
def test_a_process_that_ends_during_the_check(
    release: Path, services: list[Service], tmp_path: Path
) -> None:
    """py-spy is about to read the child when it is killed: the record says it ended,
    and nothing about it is claimed as observed."""
    s = serve(services, release)
    child = descendants(s.pid)[1]
    wrapper = tmp_path / "py-spy-racing"
    wrapper.write_text(
        f'#!/bin/sh\n[ "$3" = "{child}" ] && kill -9 {child} && sleep 0.2\n'
        f'exec {frames.find_py_spy()} "$@"\n'
    )
    wrapper.chmod(0o755)
    report = verify(s.pid, expect(release, py_spy=str(wrapper)))
    by_pid = {p["pid"]: p for p in report.processes}
    assert by_pid[child]["evidence"] == "gone"
    assert by_pid[child]["frames"] == []
    assert by_pid[s.pid]["evidence"] == "observed"


def test_a_c_engine_is_judged_by_its_executable_and_mapped_code(
    release: Path, tmp_path: Path
) -> None:
    engine = cc(release / "build" / "engine", ENGINE_C)
    lib = release / "build" / "libk.so"
    hashes = {"build/libk.so": sha256_file(lib), "build/engine": sha256_file(engine)}
    exp = expect(release, interpreter=str(engine), modules=(), artifact_hashes=hashes)
    clean = Service([str(engine), str(lib)], release, dict(os.environ))
    try:
        report = verify(clean.pid, exp)
    finally:
        clean.stop()
    assert report.ok, report.explain()
    if frames.find_py_spy():
        assert report.processes[0]["evidence"] == "not python"

    foreign = cc(tmp_path / "elsewhere" / "libother.so", "int o(void) { return 2; }\n",
                 "-shared", "-fPIC")  # fmt: skip
    dirty = Service([str(engine), str(foreign)], release, dict(os.environ))
    try:
        report = verify(dirty.pid, exp)
    finally:
        dirty.stop()
    found = [f for f in report.findings if f.check == "mapped code from outside the allowed roots"]
    assert [f.found for f in found] == [str(foreign)]
    assert "provenance.runtime_roots" in found[0].expected


def test_untracked_code_in_the_release_and_a_process_older_than_its_files(
    release: Path, services: list[Service]
) -> None:
    extra = cc(release / "build" / "libextra.so", "int e(void) { return 3; }\n",
               "-shared", "-fPIC")  # fmt: skip
    s = Service([sys.executable, "-m", "stackpkg.server", str(extra)], release, dict(os.environ))
    services.append(s)
    # the file swapped after the start and put back with its old mtime: the change time
    # (which no one can set) still says it changed under the running process
    source = release / "stackpkg" / "server.py"
    before = source.stat()
    time.sleep(0.3)
    source.write_text(source.read_text())
    os.utime(source, ns=(before.st_atime_ns, before.st_mtime_ns))
    report = verify(s.pid, expect(release))
    untracked = [f for f in report.findings if f.check == "mapped code build/libextra.so"]
    assert len(untracked) == 2
    assert "neither tracked nor recorded by the build" in untracked[0].found
    older = [f for f in report.findings if f.check == "process older than the release's files"]
    assert len(older) == 1
    assert "stackpkg/server.py" in older[0].expected


ESCAPING_SERVER = """
import os, sys, time
from stackpkg.server import serve

if __name__ == "__main__":
    if os.fork() == 0:  # double fork: the worker is reparented to PID 1, out of the tree
        os.setsid()
        if os.fork() == 0:
            os.execv(sys.executable, [sys.executable, sys.argv[2]])
        os._exit(0)
    os.wait()
    serve(sys.argv[1], "solo")
"""

WORKER = "import time\ndef work():\n    while True:\n        time.sleep(0.05)\nwork()\n"


def _cgroup2_root() -> Path | None:
    from servegate.provenance.liveproc import CGROUP2_MOUNTS

    for mount in CGROUP2_MOUNTS:
        if (Path(mount) / "cgroup.procs").is_file() and os.access(mount, os.W_OK):
            return Path(mount)
    return None


@needs_py_spy
@pytest.mark.skipif(
    os.geteuid() != 0 or _cgroup2_root() is None,
    reason="making a cgroup needs root and a writable cgroup v2 hierarchy",
)
def test_a_worker_that_double_forks_out_of_the_tree_is_found_in_the_units_cgroup(
    release: Path, tmp_path: Path
) -> None:
    """systemd gives each unit a cgroup; a process that leaves the tree stays in it."""
    (release / "stackpkg" / "escape.py").write_text(ESCAPING_SERVER)
    git(release, "add", "stackpkg/escape.py")
    git(release, "commit", "-qm", "escape")
    worker = tmp_path / "elsewhere" / "worker.py"
    worker.parent.mkdir()
    worker.write_text(WORKER)
    root = _cgroup2_root()
    assert root is not None
    unit = f"sg-test-{os.getpid()}.service"
    group = root / unit
    group.mkdir()
    shell = (f'echo $$ > {group}/cgroup.procs && exec {sys.executable} -m stackpkg.escape '
             f'{release / "build" / "libk.so"} {worker}')  # fmt: skip
    main = subprocess.Popen(["sh", "-c", shell], cwd=release)
    try:
        deadline = time.monotonic() + 30
        while len((group / "cgroup.procs").read_text().split()) < 2:
            assert time.monotonic() < deadline, "the worker did not start"
            time.sleep(0.05)
        time.sleep(0.3)
        tree_only = verify(main.pid, expect(release))
        assert tree_only.ok, tree_only.explain()  # what the tree alone shows: a lie
        assert any("only the process tree was checked" in w for w in tree_only.weaker)
        report = verify(main.pid, expect(release, unit_cgroup=unit))
        assert report.scope == f"process tree and cgroup /{unit}"
        (escaped,) = [p for p in report.processes if p.get("outside_tree")]
        found = [f for f in report.findings if f.pid == escaped["pid"]]
        assert any(f.check == "running code from outside the allowed roots"
                   and f.found == str(worker) for f in found), report.explain()  # fmt: skip
    finally:
        for pid in (group / "cgroup.procs").read_text().split():
            os.kill(int(pid), 9)
        main.wait()
        deadline = time.monotonic() + 10
        while (group / "cgroup.procs").read_text().split() and time.monotonic() < deadline:
            time.sleep(0.05)
        group.rmdir()


SPIN = "import time\ndef spin():\n    while True:\n        time.sleep(0.01)\n"


@needs_py_spy
def test_a_thread_of_code_with_no_file_or_under_a_borrowed_name(
    release: Path, services: list[Service], tmp_path: Path
) -> None:
    """Foreign source read and exec'd: under "<string>" its thread has no file; under
    the release's own server.py its frames name functions that file does not have."""
    foreign = tmp_path / "payload.py"
    foreign.write_text(SPIN)
    s = serve(services, release, HOSTILE="exec-string", FOREIGN=str(foreign))
    report = verify(s.pid, expect(release))
    rooted = [f for f in report.findings if f.check == "thread runs code with no file"]
    assert rooted
    assert "spin in <string>" in rooted[0].found
    s2 = serve(services, release, HOSTILE="exec-borrowed", FOREIGN=str(foreign))
    borrowed = verify(s2.pid, expect(release))
    mismatch = [f for f in borrowed.findings if f.check == "frame does not match its file"]
    assert mismatch
    assert "spin spanning line" in mismatch[0].expected
    assert str(release / "stackpkg" / "server.py") in mismatch[0].expected


def test_code_from_a_memfd_and_executable_anonymous_memory(
    release: Path, services: list[Service], tmp_path: Path
) -> None:
    foreign = cc(tmp_path / "libforeign.so", "int f(void) { return 4; }\n", "-shared", "-fPIC")
    s = serve(services, release, HOSTILE="memfd", FOREIGN=str(foreign))
    report = verify(s.pid, expect(release))
    memfd = [f for f in report.findings if f.check == "mapped code from outside the allowed roots"]
    assert memfd
    assert memfd[0].found.startswith("/memfd:x/../../usr/lib/libfoo.so")  # never resolved

    jit = serve(services, release, HOSTILE="anonymous")
    counted = verify(jit.pid, expect(release))
    assert counted.ok, counted.explain()  # a JIT's code (oneDNN in vLLM's CPU worker)
    assert counted.mapped_summary["anonymous"] >= 1
    strict = verify(jit.pid, expect(release, anonymous_code="fail"))
    assert "executable anonymous memory" in checks(strict)


def test_a_hashed_artifact_outside_the_extension_globs_is_hashed_too(
    release: Path, services: list[Service]
) -> None:
    helper = cc(release / "build" / "libhelper.so", "int h(void) { return 5; }\n",
                "-shared", "-fPIC")  # fmt: skip
    recorded = sha256_file(helper)
    s = Service([sys.executable, "-m", "stackpkg.server", str(helper)], release, dict(os.environ))
    services.append(s)
    hashes = {"build/libk.so": sha256_file(release / "build" / "libk.so"),
              "build/libhelper.so": recorded}  # fmt: skip
    exp = expect(release, extensions=(), artifact_hashes=hashes)
    assert verify(s.pid, exp).ok
    replaced = dict(hashes, **{"build/libhelper.so": "0" * 64})
    differs = verify(s.pid, expect(release, extensions=(), artifact_hashes=replaced))
    assert "artifact build/libhelper.so content" in checks(differs)
    # rebuilt under the running service: it still runs the old inode, gone from disk
    cc(release / "build" / "libhelper.so", "int h(void) { return 6; }\n", "-shared", "-fPIC")
    rebuilt = verify(s.pid, exp)
    assert sorted(checks(rebuilt)) == [
        *["mapped code build/libhelper.so"] * 2,
        "process older than the release's files",
    ]
    assert "deleted on disk" in rebuilt.findings[0].found


@needs_py_spy
def test_a_python_c_launcher_that_execs_foreign_source(
    release: Path, services: list[Service], tmp_path: Path
) -> None:
    """The program of `python -c` is the bottom frame of its main thread (vLLM's
    EngineCore starts so); what it execs from elsewhere is not."""
    foreign = tmp_path / "payload.py"
    foreign.write_text("import time\nprint('ready', flush=True)\n" + SPIN + "spin()\n")
    s = Service([sys.executable, "-c", f"exec(open({str(foreign)!r}).read())"], release,
                dict(os.environ))  # fmt: skip
    services.append(s)
    report = verify(s.pid, expect(release, extensions=(), modules=()))
    (rooted,) = [f for f in report.findings if f.check == "thread runs code with no file"]
    assert rooted.found.startswith("<module> in <string> (line 7)")  # the spin() call


GENERATED = """
import threading, time
def run_generated(path):
    source = "def wrapper():\\n    while True:\\n        time.sleep(0.01)\\n"
    scope = {"time": time}
    exec(compile(source, path + ":codegen(wrapper)", "exec"), scope)
    (lambda: scope["wrapper"]())()
"""


@needs_py_spy
def test_code_a_runtime_generator_names_after_its_file_and_a_qualified_lambda(
    release: Path, services: list[Service], tmp_path: Path
) -> None:
    """What torch does under load: AOTAutograd's wrappers run under
    "…/subclass_codegen.py:codegen(…)", and a lambda's frame is named "f.<lambda>".
    Neither is a finding; the same suffix on a file outside the roots still is."""
    import threading as threading_mod

    helper = tmp_path / "gen.py"
    helper.write_text(GENERATED)
    runner = (f"import sys, threading; sys.path.insert(0, {str(tmp_path)!r}); import gen; "
              f"threading.Thread(target=gen.run_generated, args=({threading_mod.__file__!r},),"
              " daemon=True).start(); print('ready', flush=True); import time; time.sleep(60)")  # fmt: skip
    s = Service([sys.executable, "-c", runner], release, dict(os.environ))
    services.append(s)
    exp = expect(release, extensions=(), modules=(), runtime_roots=(tmp_path,))
    report = verify(s.pid, exp)
    frame_checks = [f for f in report.findings if "frame" in f.check or "code" in f.check]
    assert frame_checks == [], report.explain()
    assert any(":codegen(wrapper)" in f for p in report.processes for f in p["frames"])


@needs_py_spy
def test_code_the_release_writes_into_the_venv_while_it_runs(
    release: Path, services: list[Service], tmp_path: Path
) -> None:
    """The service's venv is a runtime root, and the service user may write it: the
    release's server copies a foreign library and module into it after it started and
    loads them. Runtime code that changed after the process started is not the runtime
    the service was started with."""
    venv = tmp_path / "venv"
    make_venv(venv)
    foreign = cc(tmp_path / "evil" / "libevil.so", "int evil(void) { return 6; }\n",
                 "-shared", "-fPIC")  # fmt: skip
    python = str(venv / "bin" / "python")
    s = serve(services, release, python=python, HOSTILE="plant", FOREIGN=str(foreign))
    report = verify(s.pid, expect(release, interpreter=python))
    planted = {
        f.found.split(" ")[0]
        for f in report.findings
        if f.check == "runtime code written after the process started" and f.pid == s.pid
    }
    assert planted == {str(venv / "lib" / "libplanted.so"), str(venv / "lib" / "planted.py")}
    # the venv as it was when the service started is still runtime code
    clean = tmp_path / "clean"
    shutil.copytree(release, clean)
    fresh = serve(services, clean, python=python)
    report = verify(fresh.pid, expect(clean, interpreter=python, releases_root=tmp_path))
    assert report.ok, report.explain()
