"""Every path servegate keeps on a host, in one place.

All of them lie under ``host.root`` except the GPU lease, which is shared by every user
of the GPUs on the box (``host.state_dir``, else the user's state directory). The host
root itself must be this user's and closed to others' writes (checked before any
promote or rollback); docs/records.md says what each file holds.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from servegate.pipeline.lease import lease_path

if TYPE_CHECKING:
    from servegate.config import Config


@dataclass(frozen=True)
class HostPaths:
    root: Path
    #: ``host.state_dir`` (empty: the user's state directory) — where the lease lives
    state_dir: str = ""

    @property
    def state(self) -> Path:
        return self.root / "state.json"

    @property
    def lock(self) -> Path:
        return self.root / "servegate.lock"

    @property
    def unpushed(self) -> Path:
        return self.root / "unpushed.json"

    @property
    def records(self) -> Path:
        """Every record this host wrote, sealed, one a line: its own copy of them, which
        no push to origin can remove."""
        return self.root / "records.jsonl"

    @property
    def attestations(self) -> Path:
        """The signed attestations this host wrote, one envelope a line: its own copy,
        which no push to origin can remove (``release verify --attestation`` reads it
        with the note)."""
        return self.root / "attestations.jsonl"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def supervisor(self) -> Path:
        return self.root / "supervisor"

    @property
    def cache(self) -> Path:
        """servegate's own caches (the installed vLLM's variable list, …)."""
        return self.root / "cache"

    @property
    def build_cache(self) -> Path:
        return self.root / "build-cache"

    @property
    def compile_cache(self) -> Path:
        return self.root / "compile-cache"

    @property
    def bench(self) -> Path:
        return self.root / "bench"

    @property
    def repo(self) -> Path:
        return self.root / "repo.git"

    @property
    def releases(self) -> Path:
        return self.root / "releases"

    @property
    def current(self) -> Path:
        return self.root / "current"

    @property
    def checkout(self) -> Path:
        return self.root / "checkout"

    @property
    def reserve(self) -> Path:
        """Space held back for a rollback on a full disk (:mod:`servegate.pipeline.reserve`)."""
        return self.root / "reserve"

    def launch(self, sha: str) -> Path:
        """The launch ``sha`` was last installed with, values in clear and sealed: what a
        rollback to it installs again."""
        return self.root / "launches" / f"{sha}.json"

    def service_log(self, unit: str) -> Path:
        return self.logs / f"{unit}.log"

    def run_log(self, sha: str, what: str) -> Path:
        return self.logs / f"{sha[:12]}-{what}.log"

    def lease(self, environ: Mapping[str, str]) -> Path:
        return lease_path(environ, self.state_dir)


def of(cfg: Config) -> HostPaths:
    return HostPaths(Path(cfg.host.root), cfg.host.state_dir)
