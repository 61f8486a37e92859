"""Run the stack's build in a release directory and hash what it produced."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from servegate.config import Config, fill
from servegate.errors import BuildFailed, CommandFailed
from servegate.pipeline import proc
from servegate.pipeline.git import environ_without_git
from servegate.pipeline.hashing import sha256_file


@dataclass(frozen=True)
class BuildResult:
    seconds: float
    #: path relative to the release → SHA-256
    artifacts: Mapping[str, str]
    log: str


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


def run_build(cfg: Config, release_dir: Path, places: Mapping[str, str], log: Path) -> BuildResult:
    """Run ``build.command`` in ``release_dir``; raise BuildFailed with the log's tail."""
    if not cfg.build.command:
        return BuildResult(0.0, hash_artifacts(release_dir, cfg.build.artifacts), "")
    argv = [fill(a, **places) for a in cfg.build.command]
    env = environ_without_git()
    env.update({k: fill(v, **places) for k, v in cfg.build.env.items()})
    try:
        result = proc.run(argv, cwd=release_dir, env=env, timeout=cfg.build.timeout, log_path=log)
    except CommandFailed as exc:
        raise BuildFailed(
            f"{exc}\n  full log: {log}",
            hint="fix the build on the branch and promote the fixed commit; "
            "the live service was not touched",
        ) from None
    return BuildResult(result.seconds, hash_artifacts(release_dir, cfg.build.artifacts), str(log))
