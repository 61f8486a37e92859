"""The release record: JSON in a git note on the released SHA, plus an annotated tag."""

from __future__ import annotations

import datetime as dt
import json
import socket
from pathlib import Path
from typing import Any

from servegate import __version__
from servegate.config import Config
from servegate.errors import CommandFailed
from servegate.pipeline.git import NOTES_REF, Identity, StackRepo

SCHEMA = 1


def now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def tag_name(pattern: str, sha: str, when: dt.datetime, n: int) -> str:
    return (
        pattern.replace("{date}", when.strftime("%Y%m%d"))
        .replace("{time}", when.strftime("%H%M%S"))
        .replace("{short}", sha[:12])
        .replace("{sha}", sha)
        .replace("{n}", str(n))
    )


def host_id(cfg: Config) -> str:
    """This host's identity, stable across restarts and hostname changes (containers get a
    new hostname each start): ``host.id``, else the machine id, else the hostname."""
    if cfg.host.id:
        return cfg.host.id
    try:
        machine = Path("/etc/machine-id").read_text().strip()
    except OSError:
        machine = ""
    return f"machine:{machine}" if machine else f"hostname:{socket.gethostname()}"


def base_record(cfg: Config, sha: str, previous: str | None, verdict: str) -> dict[str, Any]:
    return {
        "schema": SCHEMA,
        "kind": "servegate.release",
        "servegate_version": __version__,
        "verdict": verdict,
        "sha": sha,
        "previous_sha": previous,
        "host": socket.gethostname(),
        "host_id": host_id(cfg),
        "branch": cfg.stack.branch,
        "remote": cfg.stack.remote,
        "strategy": cfg.host.strategy,
        "at": now().isoformat(timespec="seconds"),
    }


def parse_notes(text: str) -> list[dict[str, Any]]:
    """A note holds one JSON record a line; ``git notes append`` adds blank lines between."""
    records = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                records.append(json.loads(line))
            except ValueError:
                continue
    return records


def publish(
    cfg: Config, repo: StackRepo, record: dict[str, Any], tag: str | None
) -> dict[str, Any]:
    """Note (and tag) locally, then push both. A failed push is reported, not fatal:
    the release is live and verified either way."""
    identity = Identity(cfg.release.identity_name, cfg.release.identity_email)
    sha = str(record["sha"])
    repo.append_note(sha, json.dumps(record, sort_keys=True), identity)
    refs = [f"{NOTES_REF}:{NOTES_REF}"]
    if tag:
        message = f"servegate release {sha[:12]} ({record['verdict']})"
        repo.tag(tag, sha, message, identity)
        refs.append(f"refs/tags/{tag}:refs/tags/{tag}")
    if not cfg.release.push:
        return {"pushed": False, "refs": refs, "error": "release.push = false"}
    try:
        repo.push(refs)
    except CommandFailed as exc:
        return {"pushed": False, "refs": refs, "error": str(exc)}
    return {"pushed": True, "refs": refs, "error": ""}
