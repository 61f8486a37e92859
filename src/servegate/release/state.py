"""The host's own account of its releases: current, previous, history (one JSON file)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from servegate.pipeline import atomic

SCHEMA = 1


@dataclass(frozen=True)
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
        if not path.exists():
            return cls(path)
        data = json.loads(path.read_text())

        def entry(value: Any) -> Entry | None:
            return Entry.from_dict(value) if isinstance(value, dict) else None

        return cls(
            path,
            entry(data.get("current")),
            entry(data.get("previous")),
            [Entry.from_dict(e) for e in data.get("history", [])],
            data.get("pending") if isinstance(data.get("pending"), dict) else None,
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
