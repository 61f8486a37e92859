"""The host's own account of its releases: current, previous, history (one JSON file)."""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from servegate import documents
from servegate.errors import StateInvalid
from servegate.pipeline import atomic

SCHEMA = 1


@dataclass(frozen=True, kw_only=True)
class Entry:
    sha: str
    release_dir: str
    verdict: str  # released | rolled_back | rollback | failed
    at: str
    tag: str = ""
    reason: str = ""
    startup_seconds: float = 0.0
    artifacts: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class Pending:
    """A promote or rollback past its switch and not yet recorded: found by the next run
    when that one died half-way (:func:`servegate.release.rollback.recover`)."""

    sha: str
    kind: str = "promote"
    release_dir: str = ""
    at: str = ""
    pid: int = 0
    #: the run's name (its records carry it); "" in a marker from before runs were named
    run: str = ""


@dataclass(frozen=True, kw_only=True)
class StateDocument:
    """The file as written: :class:`HostState` without where it lives."""

    schema: int
    current: Entry | None = None
    previous: Entry | None = None
    history: list[Entry] = field(default_factory=list)
    pending: Pending | None = None


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


@dataclass
class HostState:
    path: Path
    current: Entry | None = None
    previous: Entry | None = None
    history: list[Entry] = field(default_factory=list)
    pending: Pending | None = None

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
        try:
            doc = documents.read(StateDocument, data)
        except documents.DocumentError as exc:
            raise _invalid(path, str(exc)) from None
        root = path.parent.resolve()
        named = [("current", doc.current), ("previous", doc.previous)]
        named += [(f"history[{i}]", e) for i, e in enumerate(doc.history)]
        for where, e in named:
            if e is not None:
                _check_entry(path, root, e, where)
        if doc.pending is not None:
            _check_sha(path, doc.pending.sha, "pending.sha")
            _check_dir(path, root, doc.pending.release_dir, "pending.release_dir")
        return cls(path, doc.current, doc.previous, list(doc.history), doc.pending)

    def save(self) -> None:
        doc = StateDocument(schema=SCHEMA, current=self.current, previous=self.previous,
                            history=list(self.history), pending=self.pending)  # fmt: skip
        atomic.write_json(self.path, documents.plain(doc))

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
