"""``service.env_file``: the secrets a service's ``${NAME}`` references are filled from,
kept on the box in a file only its owner can read, never in servegate.toml.

The format is the plain subset that systemd's ``EnvironmentFile=`` and ``docker
--env-file`` agree on: ``NAME=value`` a line, an optional ``export``, blank lines and
``#`` comments, a value optionally in one pair of single or double quotes (taken as
written inside them: no escapes, no ``$`` expansion). Anything else is refused with its
line rather than read one way here and another by a shell. This is written here rather
than taken from python-dotenv because dotenv expands ``${…}`` inside values and accepts
multi-line values by default: a secret file should mean exactly what it says.

The file must be a regular file (not a link), owned by the user servegate runs as (or
root), and readable by nobody else (mode 0600 or 0400): a secret readable by a
neighbour on the box is a secret leaked.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Mapping
from pathlib import Path

from servegate.errors import ConfigError

NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
#: larger than any file of variables
MAX_BYTES = 1 << 20


def environ_with(path: str, environ: Mapping[str, str]) -> dict[str, str]:
    """What ``${NAME}`` in the service's environment (and ``service.api_key_env``) is
    filled from: the file at ``path`` (``service.env_file``; ``~`` expands) first, then
    servegate's own environment. No path: the environment alone."""
    if not path:
        return dict(environ)
    return {**environ, **load(os.path.expanduser(path))}


def load(path: str | Path) -> dict[str, str]:
    """The file's names and values, checked (mode, owner, format)."""
    return parse(read_private(path, "service.env_file"), str(path))


def read_private(path: str | Path, what: str, fix: str = "") -> str:
    """The text of a secret file, refused unless it is a regular file (not a link, not
    a FIFO), owned by this user or root, readable by nobody else and small; ``what``
    names it in the errors (``service.env_file``, ``--token-file``)."""
    where = str(path)
    try:
        # non-blocking: a FIFO planted at the path must not hang the open (it is refused
        # below as not a regular file)
        fd = os.open(where, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        raise ConfigError(
            f"{what} {where} does not exist",
            hint=fix or f"create it with one NAME=value a line, then: chmod 600 {where}",
        ) from None
    except OSError as exc:
        raise ConfigError(
            f"{what} {where} cannot be opened: {exc.strerror}"
            + (" (a symbolic link is refused)" if os.path.islink(where) else ""),
            hint=f"point {what} at the file itself, owned by this user, mode 0600",
        ) from None
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fh.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError(f"{what} {where} is not a regular file")
        if st.st_uid not in (os.geteuid(), 0):
            raise ConfigError(
                f"{what} {where} belongs to uid {st.st_uid}, not to the user "
                f"servegate runs as (uid {os.geteuid()})",
                hint=f"chown {os.geteuid()} {where}",
            )
        if st.st_mode & 0o077:
            raise ConfigError(
                f"{what} {where} is readable or writable by others "
                f"(mode {stat.S_IMODE(st.st_mode):04o}): its secrets are not secret",
                hint=f"chmod 600 {where}",
            )
        if st.st_size > MAX_BYTES:
            raise ConfigError(
                f"{what} {where} is {st.st_size} bytes: more than a file of "
                f"secrets ({MAX_BYTES} bytes at most)",
                hint=f"point {what} at the right file",
            )
        raw = fh.read(MAX_BYTES + 1)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"{what} {where} is not UTF-8 text") from None


def parse(text: str, where: str = "service.env_file") -> dict[str, str]:
    out: dict[str, str] = {}
    odd = sorted({c for c in text if c != "\n" and c != "\t" and not c.isprintable()})
    if odd:  # Python's splitlines() and a shell or systemd would split it differently
        raise ConfigError(
            f"{where}: holds control or line-separator characters "
            f"({', '.join(repr(c) for c in odd[:3])}), which tools read differently",
            hint="one NAME=value a line, ended by a plain newline",
        )
    for number, line in enumerate(text.split("\n"), 1):
        body = line.strip()
        if not body or body.startswith("#"):
            continue
        if body.startswith("export ") or body.startswith("export\t"):
            body = body[len("export") :].lstrip()
        name, eq, value = body.partition("=")
        if not eq or not NAME.fullmatch(name):
            raise ConfigError(
                f"{where}:{number}: not a NAME=value line",
                hint="one NAME=value a line; # starts a comment line",
            )
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        elif value[:1] in ("'", '"') or value[-1:] in ("'", '"'):
            raise ConfigError(
                f"{where}:{number}: {name}'s value has an unmatched quote",
                hint="put the whole value in one pair of quotes, or none",
            )
        if "\x00" in value:
            raise ConfigError(f"{where}:{number}: {name}'s value holds a NUL byte")
        out[name] = value
    return out
