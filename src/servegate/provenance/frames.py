"""Which Python files a live process is running, read from outside it with py-spy.

py-spy (PyPI: ``py-spy``) reads the interpreter's thread states out of another process's
memory (``process_vm_readv``): nothing runs inside the service, and none of its
environment, preloads or start-up hooks ever run in servegate's own processes. The file
of every frame on every thread is what the process executes now, whatever its
``sys.path``, ``.pth`` files or import hooks said — and a file removed from disk after
it was loaded still shows under the name it was loaded from.

Reading another process needs ptrace permission: the same user with Yama's
``ptrace_scope`` at 0 or 1 and a dumpable target, or ``CAP_SYS_PTRACE``
(docs/box-setup.md says how to grant it to py-spy alone). Without it the answer says
so and provenance falls back to inference, recorded as such.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from servegate.pipeline.proc import pid_alive

Status = Literal["observed", "not-permitted", "no-py-spy", "not-python", "gone", "failed"]

#: what a status means, for the record and the output
MEANING: dict[str, str] = {
    "observed": "the files of its running frames, read by py-spy",
    "not-permitted": "py-spy may not read this process (ptrace permission): "
    "see docs/box-setup.md, 'Observed provenance'",
    "no-py-spy": "py-spy is not installed (pip install py-spy, or set provenance.py_spy)",
    "not-python": "not a Python process: judged by its executable and mapped files",
    "gone": "the process ended while it was checked",
    "failed": "py-spy could not read the process",
}


@dataclass(frozen=True)
class Frame:
    name: str  # the code object's name: a function, "<module>", "<lambda>", …
    file: str
    line: int

    @property
    def pseudo(self) -> bool:
        """Code with no file of its own: ``<string>`` (exec/compile), ``<frozen …>``, …"""
        return not self.file or self.file.startswith("<")


@dataclass(frozen=True)
class Frames:
    pid: int
    status: Status
    #: every distinct thread stack seen over the samples, outermost frame first
    stacks: tuple[tuple[Frame, ...], ...] = ()
    #: py-spy's own words when it did not observe
    detail: str = ""
    samples: int = 0

    @property
    def observed(self) -> bool:
        return self.status == "observed"

    @property
    def files(self) -> tuple[str, ...]:
        """Distinct real files of the frames, in the order first seen."""
        seen = dict.fromkeys(f.file for stack in self.stacks for f in stack if not f.pseudo)
        return tuple(seen)

    @property
    def pseudo(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(f.file for st in self.stacks for f in st if f.pseudo))


def find_py_spy(configured: str = "") -> str | None:
    """``provenance.py_spy`` when set (a path; missing is None, never a fallback), else the
    py-spy installed beside servegate's interpreter, else the first on PATH."""
    if configured:
        return configured if os.access(configured, os.X_OK) else None
    beside = Path(sys.executable).parent / "py-spy"
    if os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("py-spy")


def observe(
    pid: int, py_spy: str | None, samples: int = 1, interval: float = 0.1, timeout: float = 30.0
) -> Frames:
    """``samples`` dumps ``interval`` seconds apart, their stacks merged: code that runs
    only now and then is more likely seen (it is sampled, never proven absent)."""
    first = _dump(pid, py_spy, timeout)
    if not first.observed:
        return first
    stacks = dict.fromkeys(first.stacks)
    taken = 1
    for _ in range(samples - 1):
        time.sleep(interval)
        more = _dump(pid, py_spy, timeout)
        if not more.observed:
            break  # it ended or stopped answering: what was seen stands
        stacks.update(dict.fromkeys(more.stacks))
        taken += 1
    return Frames(pid, "observed", tuple(stacks), samples=taken)


def _dump(pid: int, py_spy: str | None, timeout: float) -> Frames:
    if py_spy is None:
        return Frames(pid, "no-py-spy")
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "RUST_BACKTRACE": "0",
           "RUST_LIB_BACKTRACE": "0"}  # fmt: skip
    detail = ""
    for _ in range(2):  # a read racing the interpreter's own bookkeeping is retried once
        try:
            done = subprocess.run(
                [py_spy, "dump", "--pid", str(pid), "--json"],
                capture_output=True,
                text=True,
                timeout=timeout,
                env=env,
                check=False,
            )
        except subprocess.TimeoutExpired:
            return Frames(pid, "failed", detail=f"py-spy did not answer in {timeout:.0f} s")
        except OSError as exc:
            return Frames(pid, "no-py-spy", detail=str(exc))
        if done.returncode == 0:
            return _parse(pid, done.stdout)
        detail = _error_text(done.stderr)
        status = _status_of(pid, detail)
        if status != "failed":
            return Frames(pid, status, detail=detail)
    return Frames(pid, "failed", detail=detail)


def _parse(pid: int, text: str) -> Frames:
    try:
        threads = json.loads(text)
    except ValueError:
        return Frames(pid, "failed", detail=f"unreadable py-spy output: {text[:200]!r}")
    stacks = []
    for thread in threads:
        frames = [
            Frame(str(f.get("name") or ""), str(f.get("filename") or ""), int(f.get("line") or 0))
            for f in thread.get("frames", [])
        ]
        stacks.append(tuple(reversed(frames)))  # py-spy lists the innermost first
    return Frames(pid, "observed", tuple(stacks), samples=1)


def _error_text(stderr: str) -> str:
    """py-spy's message and its causes, without the Rust backtrace after them."""
    text = stderr.split("Stack backtrace:", 1)[0]
    return " ".join(ln.strip() for ln in text.splitlines() if ln.strip())[:400]


def _status_of(pid: int, detail: str) -> Status:
    if not pid_alive(pid):  # an ended, unreaped process is a zombie: gone too
        return "gone"
    low = detail.lower()
    if "permission denied" in low or "operation not permitted" in low:
        return "not-permitted"
    if "failed to find python version" in low or "failed to find a python interpreter" in low:
        try:
            exe = os.path.basename(os.readlink(f"/proc/{pid}/exe"))
        except OSError:
            return "gone"
        # an interpreter py-spy cannot read is a failure, never "not Python"
        return "failed" if exe.startswith(("python", "pypy")) else "not-python"
    return "failed"
