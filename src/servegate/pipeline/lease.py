"""One GPU lease per host.

CI GPU jobs, ``servegate bench`` and ``release promote`` hold it for the whole window in
which the GPUs or the measurements matter, so a test never skews a benchmark and two
servers never share the cards. It is a :class:`HostLock` on ``<state dir>/gpu.lease``:
waiting shows who holds it and since when, a timeout ends the wait, and a holder that
died releases it (the kernel drops its flock). Children of the holder see
``SERVEGATE_GPU_LEASE`` and do not take it again (``servegate lease -- release promote``).
``servegate lease -- CMD`` hands the locked descriptor to CMD: killing the lease
process does not free the lease while CMD still runs.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

from servegate.errors import ConfigError
from servegate.pipeline import proc
from servegate.pipeline.lock import Holder, HostLock

ENV = "SERVEGATE_GPU_LEASE"


def state_dir(environ: Mapping[str, str]) -> Path:
    if environ.get("SERVEGATE_STATE_DIR"):
        return Path(environ["SERVEGATE_STATE_DIR"])
    base = environ.get("XDG_STATE_HOME") or str(Path(environ.get("HOME", "~")) / ".local" / "state")
    return Path(base) / "servegate"


def lease_path(environ: Mapping[str, str], configured: str = "") -> Path:
    """The host's one GPU lease: ``host.state_dir`` when the config sets it, else the
    state directory — the same file for promote, ``servegate bench`` and ``servegate lease``."""
    return (Path(configured) if configured else state_dir(environ)) / "gpu.lease"


def held_by_parent(path: Path, environ: Mapping[str, str]) -> bool:
    held = environ.get(ENV, "")
    where, _, pid = held.rpartition(":")
    return where == str(path) and pid.isdigit() and int(pid) in proc.lineage(os.getppid())


class WaitReporter:
    """Prints who holds the lease (or ``lock``), every 10 s of waiting."""

    def __init__(self, what: str, lock: str = "the GPU lease") -> None:
        self.what = what
        self.lock = lock
        self.last = -10.0

    def __call__(self, holder: Holder | None, waited: float) -> None:
        if waited - self.last >= 10:
            self.last = waited
            who = holder.describe() if holder else "a process that left no record"
            print(
                f"servegate: {self.what} waits for {self.lock}, held by {who} "
                f"({waited:.0f}s so far)",
                file=sys.stderr,
                flush=True,
            )


@contextmanager
def gpu_lease(
    path: Path, what: str, timeout: float, environ: Mapping[str, str] | None = None
) -> Iterator[dict[str, str]]:
    """Hold the lease (or rely on a parent that does); yields the environment to pass on."""
    env = os.environ if environ is None else environ
    if held_by_parent(path, env):
        yield {ENV: env[ENV]}
        return
    hint = (
        f"wait for the holder to finish or raise the timeout; a dead holder frees it "
        f"by itself; the lease file is {path}"
    )
    with HostLock(path, what, wait=timeout, on_wait=WaitReporter(what), hint=hint):
        yield {ENV: f"{path}:{os.getpid()}"}


def run_holding(
    path: Path, what: str, timeout: float, argv: Sequence[str], environ: Mapping[str, str]
) -> int:
    """Run ``argv`` holding the lease; its exit code is returned.

    The command inherits the locked descriptor, so the lease lasts as long as the command
    does: a ``kill -9`` of this process leaves it held by the command (named as the
    holder), and it is freed when the command ends. SIGTERM and SIGHUP are passed on to
    the command; SIGINT from a terminal reaches it through its process group."""
    env = dict(environ)
    if held_by_parent(path, env):
        return proc.run(argv, env=env, check=False, capture=False).returncode
    hint = (
        f"wait for the holder to finish or raise the timeout; a dead holder frees it "
        f"by itself; the lease file is {path}"
    )
    with HostLock(path, what, wait=timeout, on_wait=WaitReporter(what), hint=hint) as lock:
        env[ENV] = f"{path}:{os.getpid()}"
        try:
            child = subprocess.Popen(list(argv), env=env, pass_fds=(lock.fd,))
        except OSError as exc:
            raise ConfigError(f"cannot run {argv[0]!r}: {exc.strerror}",
                              hint="check the command after `--`") from None  # fmt: skip
        lock.hand_to(child.pid, what)

        def forward(signum: int, _frame: object) -> None:
            child.send_signal(signum)

        old = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGHUP)}
        old[signal.SIGINT] = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            code = child.wait()
            return 128 - code if code < 0 else code  # killed by a signal: 128 + its number
        finally:
            for signum, handler in old.items():
                signal.signal(signum, handler)
