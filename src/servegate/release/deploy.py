"""How a SHA becomes a directory the service runs from — Git is the only carrier.

``worktree``: ``releases/<sha>`` is a git worktree of the host's bare clone and
``current`` a symlink swapped with one rename. ``in-place``: one checkout, switched and
fast-forwarded where it stands (the seeds' manual steps).
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Protocol

from servegate import hostpaths
from servegate.config import Config
from servegate.errors import GitRefusal
from servegate.pipeline import atomic
from servegate.pipeline.git import (
    HostRepo,
    InPlaceCheckout,
    StackRepo,
    dirty_files,
    worktree_head,
)


class Deployer(Protocol):
    repo: StackRepo
    #: a rollback to an earlier SHA must rebuild (its artifacts were overwritten)
    rebuilds_on_restore: bool

    def preflight(self) -> None: ...

    def prepare(self, sha: str) -> Path:
        """A clean directory with exactly ``sha`` checked out."""
        ...

    def activate(self, release_dir: Path) -> None: ...

    def restore(self, sha: str) -> Path:
        """The directory of an earlier release, checked out again if need be."""
        ...

    def release_dir(self, sha: str) -> Path: ...

    def prune(self, keep: set[str]) -> list[str]: ...

    @property
    def releases_root(self) -> Path | None: ...


class WorktreeDeploy:
    rebuilds_on_restore = False

    def __init__(self, cfg: Config) -> None:
        self.root = cfg.host_root
        self.paths = hostpaths.of(cfg)
        self.repo: StackRepo = HostRepo(hostpaths.of(cfg).repo, cfg.stack.remote, cfg.stack.branch)
        self.current = hostpaths.of(cfg).current

    @property
    def releases_root(self) -> Path:
        return self.paths.releases

    def release_dir(self, sha: str) -> Path:
        if not SHA.match(sha):  # a path servegate may delete is built from it
            raise GitRefusal(f"{sha[:60]!r} is not a full commit SHA", hint="pass a 40-hex SHA")
        return self.releases_root / sha

    def preflight(self) -> None:
        pass

    def prepare(self, sha: str) -> Path:
        path = self.release_dir(sha)
        if path.exists():
            if worktree_head(path) == sha and not dirty_files(path):
                return path
            remove_inside(path, self.releases_root)
        assert isinstance(self.repo, HostRepo)
        self.releases_root.mkdir(parents=True, exist_ok=True)
        self.repo.add_worktree(path, sha)
        return path

    def activate(self, release_dir: Path) -> None:
        atomic.replace_symlink(self.current, release_dir)

    def restore(self, sha: str) -> Path:
        return self.prepare(sha)

    def prune(self, keep: set[str]) -> list[str]:
        removed: list[str] = []
        if not self.releases_root.exists():
            return removed
        assert isinstance(self.repo, HostRepo)
        for path in sorted(self.releases_root.iterdir()):
            if path.name not in keep and path.is_dir() and not path.is_symlink():
                self.repo.remove_worktree(path)
                removed.append(path.name)
        return removed


class InPlaceDeploy:
    rebuilds_on_restore = True

    def __init__(self, cfg: Config) -> None:
        self.path = hostpaths.of(cfg).checkout
        self.checkout = InPlaceCheckout(self.path, cfg.stack.remote, cfg.stack.branch)
        self.repo: StackRepo = self.checkout

    @property
    def releases_root(self) -> Path | None:
        return None

    def release_dir(self, sha: str) -> Path:
        return self.path

    def preflight(self) -> None:
        self.checkout.require_clean()

    def prepare(self, sha: str) -> Path:
        self.checkout.require_clean()
        self.checkout.pull_to(sha)
        return self.path

    def activate(self, release_dir: Path) -> None:
        pass

    def restore(self, sha: str) -> Path:
        self.checkout.detach_to(sha)
        if self.checkout.head() != sha:
            raise GitRefusal(f"could not check out {sha[:12]} in {self.path}")
        return self.path

    def prune(self, keep: set[str]) -> list[str]:
        return []


SHA = re.compile(r"^[0-9a-f]{40}$")


def remove_inside(path: Path, root: Path) -> None:
    """``rmtree`` of ``path`` — only when it really lies inside ``root`` (links resolved)."""
    real, top = Path(os.path.realpath(path)), Path(os.path.realpath(root))
    if real == top or not real.is_relative_to(top) or path.is_symlink():
        raise GitRefusal(
            f"refusing to delete {path}: it is not a directory inside {root}",
            hint="something planted a link or a path there; inspect and remove it by hand",
        )
    shutil.rmtree(real)


def make_deployer(cfg: Config) -> Deployer:
    if cfg.host.strategy == "in-place":
        return InPlaceDeploy(cfg)
    return WorktreeDeploy(cfg)
