"""``release recover --rebuild-state``: the host state made again from what cannot lie
as easily — this host's release records in the notes and the release directories.

The damaged file is kept beside the new one (``state.json.bad-<time>``), never
deleted. ``current`` is the release the service directory points at now (the
``current`` link of the worktree layout, the checkout's HEAD in place) when a
``released``/``rollback`` record of this host says it was verified; ``previous`` the
newest verified release before it. An interrupted run's ``pending`` mark cannot be
rebuilt: the output says to check the service with ``release verify``.
"""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path
from typing import Any

from servegate import hostpaths
from servegate.config import Config
from servegate.pipeline import redact
from servegate.release import record as rec
from servegate.release.deploy import InPlaceDeploy, WorktreeDeploy, make_deployer
from servegate.release.state import SHA, Entry, HostState

VERIFIED = ("released", "rollback")


def live_sha(cfg: Config) -> str | None:
    """The release the service directory points at now."""
    deployer = make_deployer(cfg)
    if isinstance(deployer, WorktreeDeploy):
        try:
            target = Path(os.readlink(deployer.current))
        except OSError:
            return None
        name = target.name
        inside = Path(os.path.realpath(target)).parent == Path(
            os.path.realpath(deployer.releases_root)
        )
        return name if SHA.match(name) and inside else None
    assert isinstance(deployer, InPlaceDeploy)
    try:
        return deployer.checkout.head()
    except Exception:  # no checkout: nothing is live
        return None


def rebuild(cfg: Config) -> dict[str, Any]:
    path = hostpaths.of(cfg).state
    deployer = make_deployer(cfg)
    entries: list[Entry] = []
    skipped: list[str] = []
    mine = rec.host_id(cfg)
    salt = redact.host_salt(cfg.host_root)
    noted = set(deployer.repo.noted())
    own = rec.logged(cfg)
    logged = {str(r.get("sha")) for r in own}  # a note origin removed included
    for sha in sorted(s for s in noted | logged if SHA.match(s)):
        text = deployer.repo.notes(sha) if sha in noted else ""
        sealed, unread = rec.sealed_records(cfg, text, sha, own)
        skipped += unread
        unsealed = [r for r in rec.parse_notes(text) if r.get("host_id") == mine
                    and not rec.sealed(r, salt)]  # fmt: skip
        if unsealed:
            skipped.append(
                f"{len(unsealed)} record(s) of {sha[:12]} name this host but carry no "
                "seal of its key (written elsewhere, or before servegate sealed records): "
                "not used"
            )
        # a released record that a later one supersedes (recover found the run that wrote
        # it died before its state said so, and rolled it back) is no release
        overridden = {str(r.supersedes.get("at")) for r in sealed if r.supersedes}
        for r in sealed:
            if r.verdict == "released" and r.at in overridden:
                continue
            release_dir = deployer.release_dir(sha)
            entries.append(
                Entry(
                    sha=sha,
                    release_dir=str(release_dir) if release_dir.is_dir() else "",
                    verdict=r.verdict,
                    at=r.at,
                    tag=r.tag or (r.supersedes or {}).get("tag", ""),
                    reason=r.reason or "",
                    startup_seconds=r.startup_seconds or 0.0,
                    artifacts=dict(r.artifacts or {}),
                )
            )
    entries.sort(key=lambda e: e.at)
    # a rollback record carries no build hashes: an entry takes its SHA's from the newest
    # released record of this host (what the release was built and proven with)
    built = {e.sha: e.artifacts for e in entries if e.verdict == "released" and e.artifacts}
    entries = [
        dataclasses.replace(e, artifacts=dict(built[e.sha]))
        if not e.artifacts and e.sha in built
        else e
        for e in entries
    ]
    live = live_sha(cfg)
    current = next(
        (e for e in reversed(entries) if e.sha == live and e.verdict in VERIFIED and e.release_dir),
        None,
    )
    previous = None
    if current is not None:
        # records of older servegates carry their time to the second only: one written in
        # the same second as the live release's is before it too (the notes list by SHA)
        before = [e for e in entries if e is not current and e.at <= current.at]
        previous = next(
            (e for e in reversed(before) if e.verdict in VERIFIED and e.sha != current.sha), None
        )
    kept = None
    if path.exists() or path.is_symlink():
        kept = path.with_name(f"state.json.bad-{time.strftime('%Y%m%dT%H%M%S')}")
        os.replace(path, kept)
    state = HostState(path, current, previous, entries, None)
    state.save()
    return {
        "state": str(path),
        "kept": str(kept) if kept else None,
        "records": len(entries),
        "live_directory_sha": live,
        "current": current.sha if current else None,
        "previous": previous.sha if previous else None,
        "skipped": skipped,
    }
