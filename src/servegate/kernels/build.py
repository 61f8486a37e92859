"""Run the stack's build in a release directory and hash what it produced."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from servegate.config import Config, fill
from servegate.errors import BuildFailed, CommandFailed
from servegate.kernels.inspect import require_archs
from servegate.kernels.targets import build_all
from servegate.pipeline import proc
from servegate.pipeline.git import environ_without_git
from servegate.pipeline.hashing import sha256_file


@dataclass(frozen=True)
class BuildResult:
    seconds: float
    #: path relative to the release → SHA-256
    artifacts: Mapping[str, str]
    log: str
    #: path relative to the release → the GPU code objects found in it
    code_objects: Mapping[str, list[dict[str, Any]]] = field(default_factory=dict)
    #: each ``[[build.targets]]`` entry: cached or built, why, toolchain, commands
    targets: list[dict[str, Any]] = field(default_factory=list)
    #: processes the build left running, stopped when it ended (pid and command line)
    leftovers: list[str] = field(default_factory=list)


def hash_artifacts(release_dir: Path, globs: tuple[str, ...]) -> dict[str, str]:
    found: dict[str, str] = {}
    for pattern in globs:
        files = sorted(p for p in release_dir.glob(pattern) if p.is_file())
        if not files:
            raise BuildFailed(
                f"the build produced no file matching {pattern!r} in {release_dir}",
                hint="fix build.artifacts in the config, or the build command",
            )
        for file in files:
            found[str(file.relative_to(release_dir))] = sha256_file(file)
    return found


def inspect_artifacts(
    release_dir: Path, artifacts: Mapping[str, str], archs: tuple[str, ...]
) -> dict[str, list[dict[str, Any]]]:
    """Every built shared library must hold device code for each configured arch."""
    if not archs:
        return {}
    return {
        rel: [o.as_dict() for o in require_archs(release_dir / rel, archs)]
        for rel in artifacts
        if rel.endswith(".so") or ".so." in rel
    }


def run_build(
    cfg: Config,
    release_dir: Path,
    places: Mapping[str, str],
    log: Path,
    cache_root: Path | None = None,
) -> BuildResult:
    """Build the GPU extension targets (through the cache), then run ``build.command`` in
    ``release_dir``; hash every artifact and check it holds code for ``build.archs``. A
    disk that fills (or a directory servegate cannot write) is a failed build, said."""
    try:
        return _run_build(cfg, release_dir, places, log, cache_root)
    except OSError as exc:
        raise BuildFailed(
            f"the build could not write ({exc.strerror}: {exc.filename or release_dir}): a "
            "full disk or a directory servegate cannot write",
            hint=f"free space where the releases and logs live (df -h {release_dir.parent}) "
            "and promote again; the live service was not touched",
        ) from None


def _run_build(
    cfg: Config,
    release_dir: Path,
    places: Mapping[str, str],
    log: Path,
    cache_root: Path | None = None,
) -> BuildResult:
    start = time.monotonic()
    env = environ_without_git()
    env.update({k: fill(v, **places) for k, v in cfg.build.env.items()})
    with proc.stopping_leftovers() as leftovers:  # a daemon it starts would share the box
        targets = build_all(cfg, release_dir, cache_root, env, log.with_name(log.stem + "-targets"))
        if cfg.build.command:
            argv = [fill(a, **places) for a in cfg.build.command]
            try:
                proc.run(argv, cwd=release_dir, env=env, timeout=cfg.build.timeout, log_path=log)
            except CommandFailed as exc:
                raise BuildFailed(
                    f"{exc}\n  full log: {log}",
                    hint="fix the build on the branch and promote the fixed commit; "
                    "the live service was not touched",
                ) from None
    artifacts = {rel: digest for t in targets for rel, digest in t.outputs.items()}
    artifacts.update(hash_artifacts(release_dir, cfg.build.artifacts))
    objects = {rel: objs for t in targets for rel, objs in t.code_objects.items()}
    objects.update(inspect_artifacts(release_dir, artifacts, cfg.build.archs))
    return BuildResult(
        time.monotonic() - start,
        artifacts,
        str(log) if cfg.build.command else "",
        objects,
        [t.as_dict() for t in targets],
        leftovers,
    )
