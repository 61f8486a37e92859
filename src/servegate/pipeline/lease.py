"""One GPU lease per host.

CI GPU jobs, ``servegate bench`` and ``release promote`` hold it for the whole window in
which the GPUs or the measurements matter, so a test never skews a benchmark and two
servers never share the cards. It is a :class:`HostLock` on ``<state dir>/gpu.lease``:
waiting shows who holds it and since when, a timeout ends the wait, and a holder that
died releases it (the kernel drops its flock). Children of the holder see
``SERVEGATE_GPU_LEASE`` and do not take it again (``servegate lease -- release promote``).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

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
    """Prints who holds the lease, every 10 s of waiting."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.last = -10.0

    def __call__(self, holder: Holder | None, waited: float) -> None:
        if waited - self.last >= 10:
            self.last = waited
            who = holder.describe() if holder else "a process that left no record"
            print(
                f"servegate: {self.what} waits for the GPU lease, held by {who} "
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
