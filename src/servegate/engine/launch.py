"""The exact command and environment a release is launched with."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from servegate.config import Config, fill

SECRET_NAME = re.compile(r"(KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL)", re.IGNORECASE)
SECRET_FLAGS = ("--api-key", "--hf-token", "--token")
REDACTED = "<redacted>"


@dataclass(frozen=True)
class LaunchSpec:
    """argv + environment + working directory of one release's server."""

    unit: str
    argv: tuple[str, ...]
    env: Mapping[str, str]
    cwd: Path
    sha: str

    def redacted(self) -> dict[str, Any]:
        return {
            "argv": redact_argv(self.argv),
            "env": redact_env(self.env),
            "cwd": str(self.cwd),
        }


def redact_env(env: Mapping[str, str]) -> dict[str, str]:
    return {k: (REDACTED if SECRET_NAME.search(k) else v) for k, v in env.items()}


def redact_argv(argv: tuple[str, ...]) -> list[str]:
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next:
            out.append(REDACTED)
            hide_next = False
        elif arg in SECRET_FLAGS:
            out.append(arg)
            hide_next = True
        elif any(arg.startswith(flag + "=") for flag in SECRET_FLAGS):
            out.append(arg.split("=", 1)[0] + "=" + REDACTED)
        else:
            out.append(arg)
    return out


def placeholders(cfg: Config, release_dir: Path, sha: str) -> dict[str, str]:
    return {
        "release": str(release_dir),
        "port": str(cfg.service.port),
        "sha": sha,
        "short": sha[:12],
        "host_root": str(cfg.host_root),
    }


def launch_spec(cfg: Config, release_dir: Path, sha: str) -> LaunchSpec:
    places = placeholders(cfg, release_dir, sha)
    return LaunchSpec(
        unit=cfg.service.unit,
        argv=tuple(fill(a, **places) for a in cfg.service.command),
        env={k: fill(v, **places) for k, v in cfg.service.env.items()},
        cwd=release_dir,
        sha=sha,
    )
