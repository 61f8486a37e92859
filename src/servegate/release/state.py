"""The host's own account of its releases: current, previous, history (one JSON file)."""

from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from servegate.errors import StateInvalid
from servegate.pipeline import atomic

SCHEMA = 1


@dataclass(frozen=True, kw_only=True)
class Entry:
    sha: str
    release_dir: str
    verdict: str  # released | rolled_back | rollback
    at: str
    tag: str = ""
    reason: str = ""
    startup_seconds: float = 0.0
    artifacts: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Entry:
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        return cls(**known)


SHA = re.compile(r"^[0-9a-f]{40}$")


def _invalid(path: Path, why: str) -> StateInvalid:
    return StateInvalid(
        f"the host state {path} cannot be trusted: {why}",
        hint="`release recover --rebuild-state` makes it again from this host's release "
        "notes and release directories (the damaged file is kept beside it), then "
        "`release verify`",
    )


def _check_sha(path: Path, sha: str, where: str) -> None:
    if not SHA.match(sha):
        raise _invalid(path, f"{where} {sha[:60]!r} is not a 40-hex commit SHA")


def _check_entry(path: Path, root: Path, e: Entry, where: str) -> None:
    _check_sha(path, e.sha, f"{where}.sha")
    _check_dir(path, root, e.release_dir, f"{where}.release_dir")


def _check_dir(path: Path, root: Path, release_dir: str, where: str) -> None:
    if "\0" in release_dir:
        raise _invalid(path, f"{where} holds a NUL character")
    if release_dir and not Path(os.path.realpath(release_dir)).is_relative_to(root):
        raise _invalid(path, f"{where} {release_dir!r} lies outside {root}")


#: what each field of an entry and of ``pending`` must be (a missing one takes its default)
ENTRY_TYPES: dict[str, tuple[type, ...]] = {
    "sha": (str,), "release_dir": (str,), "verdict": (str,), "at": (str,), "tag": (str,),
    "reason": (str,), "startup_seconds": (int, float), "artifacts": (dict,),
}  # fmt: skip
PENDING_TYPES: dict[str, tuple[type, ...]] = {
    "sha": (str,), "kind": (str,), "release_dir": (str,), "at": (str,), "pid": (int,),
    "run": (str,),
}  # fmt: skip


def _wrong_types(value: dict[str, Any], types: dict[str, tuple[type, ...]]) -> str:
    """The first field of ``value`` of the wrong type, said as "name is …"; "" if none."""
    for name, allowed in types.items():
        if name not in value:
            continue
        got = value[name]
        if isinstance(got, bool) or not isinstance(got, allowed):
            want = " or ".join({"str": "a string", "int": "a whole number", "float": "a number",
                                "dict": "an object"}[t.__name__] for t in allowed)  # fmt: skip
            return f"{name} is {type(got).__name__} {str(got)[:40]!r}, not {want}"
    artifacts = value.get("artifacts")
    if isinstance(artifacts, dict) and not all(
        isinstance(k, str) and isinstance(v, str) for k, v in artifacts.items()
    ):
        return "artifacts is not an object of path → sha256 strings"
    return ""


@dataclass
class HostState:
    path: Path
    current: Entry | None = None
    previous: Entry | None = None
    history: list[Entry] = field(default_factory=list)
    #: a promote or rollback past its switch and not yet recorded: {"sha", "kind",
    #: "release_dir", "at", "pid"}. Found by the next run when that one died half-way.
    pending: dict[str, Any] | None = None

    @classmethod
    def load(cls, path: Path) -> HostState:
        """The state file, validated: nothing in it is trusted as a path or a SHA before it
        is checked (a crafted file must not make servegate delete or start anything)."""
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            return cls(path)
        except (OSError, ValueError, RecursionError) as exc:
            why = str(exc)[:200] or "nested too deep"
            raise _invalid(path, f"it is not readable JSON ({why})") from None
        if not isinstance(data, dict) or data.get("schema") != SCHEMA:
            raise _invalid(path, f"it is not a host state of schema {SCHEMA}")
        root = path.parent.resolve()

        def entry(value: Any, where: str) -> Entry | None:
            if value is None:
                return None
            if not isinstance(value, dict):
                raise _invalid(path, f"{where} is not an object")
            why = _wrong_types(value, ENTRY_TYPES)
            if why:
                raise _invalid(path, f"{where}.{why}")
            try:
                e = Entry.from_dict(value)
            except TypeError as exc:
                raise _invalid(path, f"{where}: {exc}") from None
            _check_entry(path, root, e, where)
            return e

        history = data.get("history", [])
        if not isinstance(history, list):
            raise _invalid(path, "history is not a list")
        pending = data.get("pending")
        if pending is not None and not isinstance(pending, dict):
            raise _invalid(path, "pending is not an object")
        if pending is not None:
            why = _wrong_types(pending, PENDING_TYPES)
            if why:
                raise _invalid(path, f"pending.{why}")
            _check_sha(path, str(pending.get("sha", "")), "pending.sha")
            _check_dir(path, root, str(pending.get("release_dir", "")), "pending.release_dir")
        return cls(
            path,
            entry(data.get("current"), "current"),
            entry(data.get("previous"), "previous"),
            [e for i, v in enumerate(history) if (e := entry(v, f"history[{i}]")) is not None],
            pending,
        )

    def save(self) -> None:
        atomic.write_json(
            self.path,
            {
                "schema": SCHEMA,
                "current": asdict(self.current) if self.current else None,
                "previous": asdict(self.previous) if self.previous else None,
                "history": [asdict(e) for e in self.history],
                "pending": self.pending,
            },
        )

    def released(self, sha: str) -> Entry | None:
        """The newest successful release of ``sha`` (prefix allowed)."""
        for entry in reversed(self.history):
            if entry.verdict in ("released", "rollback") and entry.sha.startswith(sha.lower()):
                return entry
        return None

    def release_count(self) -> int:
        return sum(1 for e in self.history if e.verdict == "released")

    def protected(self, keep: int) -> set[str]:
        """SHAs whose release directories must stay: live, previous, the newest ``keep``."""
        shas = [e.sha for e in reversed(self.history) if e.verdict in ("released", "rollback")]
        keep_set = set(list(dict.fromkeys(shas))[:keep])
        for e in (self.current, self.previous):
            if e is not None:
                keep_set.add(e.sha)
        return keep_set
