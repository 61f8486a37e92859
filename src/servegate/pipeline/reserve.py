"""Space held back on the host root's filesystem for putting the live release back.

A disk that fills while a candidate starts (its logs, a neighbour's) leaves a rollback no
room for the unit it installs, the launch it keeps and the log lines it reads: the live
release would stay down for want of a few kilobytes. servegate keeps a file of
:data:`SIZE` bytes, allocated for real (``posix_fallocate``), in the host root; a restore
that fails for want of space gives it up and tries once more. It is made again by the
next command that finds room. The idea is the "ballast file" of database and log
servers; written here because it is a dozen lines of the standard library.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

#: bytes held back: a unit file, a kept launch, a state file and a record, many times over
SIZE = 8 * 1024 * 1024
#: the errors a full disk (or a full quota) answers with
FULL = (errno.ENOSPC, errno.EDQUOT)


def ensure(path: Path) -> bool:
    """The reserve is there (made now if there is room); False when it cannot be."""
    try:
        if path.stat().st_size >= SIZE:
            return True
    except FileNotFoundError:
        pass
    except OSError:
        return False
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.posix_fallocate(fd, 0, SIZE)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)
        return False
    return True


def release(path: Path) -> bool:
    """Give the reserve up (True when there was one to give)."""
    try:
        path.unlink()
    except OSError:
        return False
    return True


def is_full(exc: BaseException | str) -> bool:
    """``exc`` (or its text) says the disk or the quota is full."""
    if isinstance(exc, OSError) and exc.errno in FULL:
        return True
    text = str(exc)
    return any(s in text for s in ("No space left on device", "Out of diskspace",
                                   "Disk quota exceeded"))  # fmt: skip
