"""Provenance read from /proc of real processes that map a real shared library."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from servegate.pipeline.hashing import sha256_file
from servegate.provenance.check import Expectation, descendants, verify

LOADER = """
import ctypes, os, subprocess, sys, time
ctypes.CDLL(sys.argv[1])
child = subprocess.Popen([sys.executable, "-c", "import ctypes, sys, time; ctypes.CDLL(sys.argv[1]); time.sleep(60)", sys.argv[1]])
while os.path.basename(sys.argv[1]) not in open(f"/proc/{child.pid}/maps").read():
    time.sleep(0.05)
print("ready", flush=True)
time.sleep(60)
"""


def build_lib(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    src = directory / "k.c"
    src.write_text("int k(void) { return 1; }\n")
    lib = directory / "build" / "libk.so"
    lib.parent.mkdir(exist_ok=True)
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(lib), str(src)], check=True)
    return lib


@pytest.fixture
def release(tmp_path: Path) -> Path:
    path = tmp_path / "releases" / "a"
    build_lib(path)
    (path / "pkg").mkdir()
    (path / "pkg" / "__init__.py").write_text("")
    commit_all(path, "k.c", "pkg")
    return path


def commit_all(path: Path, *what: str) -> None:
    """The release is a git checkout: its tracked files are what it may run."""
    git = ["git", "-C", str(path), "-c", "user.name=t", "-c", "user.email=t@example.invalid"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", *what], check=True)
    subprocess.run([*git, "commit", "-qm", "release"], check=True)


def start(
    release: Path, lib: Path, env: dict[str, str], python: tuple[str, ...] = (sys.executable,)
) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [*python, "-c", LOADER, str(lib)],
        cwd=release,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    return proc


@pytest.fixture
def running(release: Path) -> Iterator[subprocess.Popen[str]]:
    env = dict(os.environ, PYTHONPATH=str(release))
    proc = start(release, release / "build" / "libk.so", env)
    yield proc
    stop(proc)


def stop(proc: subprocess.Popen[str]) -> None:
    for pid in reversed(descendants(proc.pid)):
        os.kill(pid, 9)
    proc.wait()
    assert proc.stdout is not None
    proc.stdout.close()


def expect(release: Path, **kw: object) -> Expectation:
    base: dict[str, object] = {
        "release_dir": release,
        "interpreter": sys.executable,
        "env": {"PYTHONPATH": str(release)},
        "extensions": ("build/*.so",),
        "modules": ("pkg",),
        "releases_root": release.parent,
    }
    base.update(kw)
    if "artifact_hashes" not in base:
        base["artifact_hashes"] = {"build/libk.so": sha256_file(release / "build" / "libk.so")}
    return Expectation(**base)  # type: ignore[arg-type]


def test_every_process_of_the_tree_is_checked(
    release: Path, running: subprocess.Popen[str]
) -> None:
    report = verify(running.pid, expect(release))
    assert report.ok, report.explain()
    assert len(report.processes) == 2
    assert {e["pid"] for e in report.extensions} == {p["pid"] for p in report.processes}
    assert report.modules["pkg"] == str(release / "pkg" / "__init__.py")


def test_wrong_environment_is_a_finding(release: Path, running: subprocess.Popen[str]) -> None:
    report = verify(running.pid, expect(release, env={"PYTHONPATH": "/elsewhere"}))
    found = [f for f in report.findings if f.check == "environment PYTHONPATH"]
    assert len(found) == 2
    assert found[0].expected == "/elsewhere"
    assert found[0].found == str(release)


def test_hash_differs_from_the_build_record(release: Path, running: subprocess.Popen[str]) -> None:
    report = verify(running.pid, expect(release, artifact_hashes={"build/libk.so": "0" * 64}))
    assert any(f.check == "extension build/libk.so content" for f in report.findings)


def test_library_from_outside_the_release(release: Path, tmp_path: Path) -> None:
    outside = tmp_path / "cache" / "libk.so"
    outside.parent.mkdir()
    shutil.copy2(release / "build" / "libk.so", outside)
    proc = start(release, outside, dict(os.environ, PYTHONPATH=str(release)))
    try:
        report = verify(proc.pid, expect(release))
    finally:
        stop(proc)
    checks = {f.check for f in report.findings}
    assert "extension libk.so mapped from outside the release" in checks
    assert "extension build/libk.so" in checks  # the release's own copy is not mapped


def test_mapping_from_another_release(release: Path, tmp_path: Path) -> None:
    other = tmp_path / "releases" / "b"
    lib = build_lib(other)
    proc = start(release, lib, dict(os.environ, PYTHONPATH=str(release)))
    try:
        report = verify(proc.pid, expect(release, extensions=()))
    finally:
        stop(proc)
    assert any(
        f.check == "mapped file from another release" and f.found == str(lib)
        for f in report.findings
    )


def test_wrong_working_directory_and_interpreter(
    release: Path, running: subprocess.Popen[str], tmp_path: Path
) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    report = verify(
        running.pid,
        expect(
            elsewhere,
            extensions=(),
            modules=(),
            env={},
            interpreter="/usr/bin/true",
            artifact_hashes={},
        ),
    )
    checks = {f.check for f in report.findings}
    assert {"working directory", "executable"} <= checks


def test_no_process_is_a_finding(release: Path) -> None:
    report = verify(None, expect(release))
    assert not report.ok


EVIL = r"""
#include <stdio.h>
#include <string.h>
__attribute__((constructor)) static void hook(void) {
  char cmd[256] = {0};
  FILE *c = fopen("/proc/self/cmdline", "r");
  if (c) { size_t n = fread(cmd, 1, sizeof cmd - 1, c); fclose(c);
           for (size_t i = 0; i < n; i++) if (!cmd[i]) cmd[i] = ' '; }
  FILE *f = fopen(MARKER, "a");
  if (f) { fprintf(f, "%s\n", cmd); fclose(f); }
}
"""


def test_a_preload_from_outside_the_release_is_found_and_never_run_by_the_check(
    release: Path, tmp_path: Path
) -> None:
    """A hostile launcher exports LD_PRELOAD with a library outside the release. The
    library's constructor logs every process it runs in: the service's — never
    servegate's own module check."""
    marker = tmp_path / "ran-in.txt"
    src = tmp_path / "evil.c"
    src.write_text(EVIL)
    evil = tmp_path / "shared" / "libevil.so"
    evil.parent.mkdir()
    subprocess.run(["cc", "-shared", "-fPIC", f'-DMARKER="{marker}"', "-o", str(evil), str(src)],
                   check=True)  # fmt: skip
    env = dict(os.environ, PYTHONPATH=str(release), LD_PRELOAD=str(evil))
    proc = start(release, release / "build" / "libk.so", env)
    try:
        report = verify(proc.pid, expect(release))
    finally:
        stop(proc)
    preloads = [f for f in report.findings if f.check == "LD_PRELOAD"]
    assert preloads
    assert preloads[0].found == str(evil)
    ran_in = marker.read_text().splitlines()
    assert ran_in  # it did run in the service's processes
    assert not any("importlib.util" in line for line in ran_in), ran_in
    assert report.modules["pkg"] == str(release / "pkg" / "__init__.py")


def test_each_hash_says_how_it_was_taken_and_a_missing_build_hash_is_no_pass(
    release: Path, running: subprocess.Popen[str]
) -> None:
    report = verify(running.pid, expect(release))
    methods = {e["method"] for e in report.extensions}
    # root reads the mapped inode; anyone else hashes the path, and the report says so
    assert methods == ({"map_files"} if os.geteuid() == 0 else {"path"})
    assert any("hashed by path" in w for w in report.weaker) == (os.geteuid() != 0)
    unrecorded = verify(running.pid, expect(release, artifact_hashes={}))
    assert not unrecorded.ok
    assert any(f.check == "extension build/libk.so hash" for f in unrecorded.findings)


def test_a_second_venv_on_the_same_base_python_is_told_apart(release: Path, tmp_path: Path) -> None:
    """/proc/PID/exe is the base interpreter for every venv made from it: the path the
    service was started with names the venv it runs in."""
    other = tmp_path / "other-venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(other)], check=True)
    env = dict(os.environ, PYTHONPATH=str(release))
    proc = start(release, release / "build" / "libk.so", env, (str(other / "bin" / "python"),))
    try:
        report = verify(proc.pid, expect(release))
    finally:
        stop(proc)
    assert os.path.realpath(other / "bin" / "python") == os.path.realpath(sys.executable)
    found = [f for f in report.findings if f.check == "interpreter environment"]
    assert {f.pid for f in found} == {p["pid"] for p in report.processes}  # the child's too
    assert str(other) in found[0].found


def test_an_isolated_interpreter_is_resolved_as_isolated(release: Path) -> None:
    """`python -I` ignores PYTHONPATH (and the working directory): the service cannot
    import the release's package, and the check must not claim it does."""
    env = dict(os.environ, PYTHONPATH=str(release))
    proc = start(release, release / "build" / "libk.so", env, (sys.executable, "-I"))
    try:
        report = verify(proc.pid, expect(release))
    finally:
        stop(proc)
    assert report.modules["pkg"] is None
    assert any(f.check == "module pkg" and f.found == "not importable" for f in report.findings)


def test_interpreter_flags_and_the_first_path_entry() -> None:
    from servegate.provenance.check import interpreter_flags

    assert interpreter_flags(["/v/bin/python", "-m", "vllm.x", "-I"], "/r") == ([], "-")
    flags = interpreter_flags(["/v/bin/python", "-I", "-X", "dev", "-Xutf8", "-c", "x"], "/r")
    assert flags == (["-I", "-X", "dev", "-X", "utf8"], "-")
    assert interpreter_flags(["python", "-Es", "serve.py"], "/r") == (["-E", "-s"], "/r")
    assert interpreter_flags(["python", "-P", "app/serve.py", "-I"], "/r") == (["-P"], "/r/app")
    # as CPython parses them: an option's attached argument is no bundle of flags
    assert interpreter_flags(["python", "-Wignore::ImportWarning", "x.py"], "/r") == ([], "/r")
    assert interpreter_flags(["python", "-IW", "error", "-mpkg.srv"], "/r") == (["-I"], "-")
    assert interpreter_flags(["python", "-sXfrozen_modules=off", "x.py"], "/r") == (
        ["-s", "-X", "frozen_modules=off"], "/r")  # fmt: skip
    assert interpreter_flags(["python", "-E", "--", "-x.py"], "/r") == (["-E"], "/r")
    assert interpreter_flags(["python", "--check-hash-based-pycs", "never", "-S", "-"], "/r") == (
        ["-S"], "-")  # fmt: skip


def test_what_proc_will_not_show_is_said_never_skipped_in_silence(
    release: Path, running: subprocess.Popen[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where /proc will not show a process's root, mount namespace or start time (another
    user's process, a hardened /proc), the checks that need them cannot run: the report
    names each as weaker evidence instead of passing without them."""
    from servegate.provenance import codeorigin

    real_readlink = os.readlink

    def no_ns(path: str | os.PathLike[str]) -> str:
        where = str(path)
        if (
            where.startswith("/proc/")
            and not where.startswith("/proc/self/")
            and where.endswith(("/root", "/ns/mnt"))
        ):
            raise PermissionError(13, "Permission denied", where)
        return real_readlink(path)

    monkeypatch.setattr(os, "readlink", no_ns)
    monkeypatch.setattr(codeorigin, "started_at", lambda pid: None)
    report = verify(running.pid, expect(release))
    weaker = " ".join(report.weaker)
    assert "its root and mount namespace (/proc/PID/root, ns/mnt) cannot be read" in weaker
    assert "its start time (/proc/PID/stat) cannot be read" in weaker
