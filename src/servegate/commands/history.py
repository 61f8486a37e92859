from __future__ import annotations

from servegate import hostpaths
from servegate.config import Config
from servegate.output import Output
from servegate.release.state import HostState


def run(cfg: Config, out: Output, limit: int) -> int:
    state = HostState.load(hostpaths.of(cfg).state)
    entries = state.history[-limit:] if limit > 0 else state.history
    if out.json_mode:
        return out.emit(
            [
                {
                    "sha": e.sha,
                    "verdict": e.verdict,
                    "at": e.at,
                    "tag": e.tag,
                    "reason": e.reason,
                    "startup_seconds": e.startup_seconds,
                    "artifacts": e.artifacts,
                }
                for e in entries
            ]
        )
    rows = [
        [("▶ " if e == state.current else "  ") + e.sha[:12], e.verdict, e.at, e.tag, e.reason[:60]]
        for e in entries
    ]
    out.table("release history (newest last)", ["sha", "verdict", "at", "tag", "reason"], rows)
    return 0
