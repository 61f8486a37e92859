"""``servegate render``: the exact command, environment and systemd unit of a launch."""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from servegate import config as config_mod
from servegate import hostpaths
from servegate.commands import args as common_args
from servegate.config import Config
from servegate.engine import render as render_mod
from servegate.engine.launch import LaunchSpec, launch_spec, load_profile
from servegate.errors import ConfigError
from servegate.output import Output
from servegate.release.state import HostState

FORMATS = ("all", "shell", "env", "unit", "json")
#: built-in placeholders a preview may leave open: where and at which SHA it will run
PREVIEW_OPEN = frozenset(["release", "sha", "short", "host_root"])


@dataclass(frozen=True)
class Target:
    cfg: Config
    spec: LaunchSpec
    files: tuple[str, ...]
    #: what the output should tell its reader (unkeyed caches, unfilled placeholders)
    notes: tuple[str, ...]


def parse_params(pairs: Sequence[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise ConfigError(f"--param {pair!r} is not NAME=VALUE", hint="e.g. --param model=/m")
        out[name] = value
    return out


def _config(
    config_path: Path, profile: str | None, params: Mapping[str, str], port: int | None
) -> Config:
    if profile and not config_path.exists():
        return config_mod.bare(profile, params, port or 8000)
    cfg = config_mod.load(config_path, os.environ, build_only=bool(profile))
    svc = cfg.service
    if profile:
        svc = dataclasses.replace(svc, profile=profile, command=(), params=dict(params))
    elif params:
        svc = dataclasses.replace(svc, params={**svc.params, **params})
    if port:
        svc = dataclasses.replace(svc, port=port)
    return dataclasses.replace(cfg, service=svc)


def target(
    config_path: Path,
    profile: str | None,
    params: Sequence[str],
    release: str | None,
    sha: str | None,
    port: int | None,
) -> Target:
    """The launch promote would make: from the config, or a profile given by name/path."""
    if sha is not None and not re.fullmatch(r"[0-9a-f]{7,64}", sha):
        raise ConfigError(
            f"--sha {sha[:80]!r} is not a commit id",
            hint="give the release's commit as hex (git rev-parse HEAD)",
        )
    cfg = _config(config_path, profile, parse_params(params), port)
    notes: list[str] = []
    if sha is None and cfg.host.root:
        live = HostState.load(hostpaths.of(cfg).state).current
        sha = live.sha if live else None
    if not sha:
        cfg = dataclasses.replace(
            cfg, service=dataclasses.replace(cfg.service, compile_cache=False)
        )
        notes.append(
            "compile caches as the launch sets them; promote keys them per release "
            "(pass --sha to see the keyed directories)"
        )
    unfilled: list[str] = []
    if release is None:
        release = str(hostpaths.of(cfg).current) if cfg.host.root else "{release}"
        unfilled += [] if cfg.host.root else ["release"]
    spec = launch_spec(cfg, Path(release), sha or "", strict=False)
    # a profile alone may leave where it will run ({release}, the SHA) open; a
    # parameter it needs, or a placeholder nothing defines, is an error as in promote
    open_ = [n for n in spec.unresolved if n not in PREVIEW_OPEN]
    if open_:
        known = ", ".join(sorted(load_profile(cfg).params)) if cfg.service.profile else ""
        raise ConfigError(
            "not filled in: "
            + ", ".join("{" + n + "}" for n in open_)
            + (f" (profile {cfg.service.profile})" if cfg.service.profile else ""),
            hint="pass --param NAME=VALUE for each"
            + (f"; the profile's parameters: {known}" if known else ""),
        )
    unfilled += spec.unresolved
    if unfilled:
        notes.append(
            "not filled in: "
            + ", ".join("{" + n + "}" for n in unfilled)
            + " (pass --param NAME=VALUE / --release DIR)"
        )
    files = load_profile(cfg).files if cfg.service.profile else (cfg.path,)
    return Target(cfg, spec, tuple(files), tuple(notes))


def title(t: Target) -> str:
    what = f"profile {t.spec.profile}" if t.spec.profile else f"service.command of {t.cfg.path}"
    return f"servegate render: {what}"


def run(out: Output, t: Target, fmt: str) -> int:
    spec = t.spec
    if out.json_mode or fmt == "json":
        out.json_mode = True
        return out.emit(
            {
                "profile": spec.profile,
                "files": list(t.files),
                "argv": list(spec.argv),
                "env": dict(spec.env),
                "cwd": str(spec.cwd),
                "unit": render_mod.unit(spec),
                "compile_cache_key": spec.cache_key,
                "notes": list(t.notes),
            }
        )
    for note in t.notes:
        out.err.print(f"note: {note}", markup=False)
    parts = {
        "shell": render_mod.shell(spec, title(t)),
        "env": render_mod.environment(spec),
        "unit": render_mod.unit(spec),
    }
    if fmt != "all":
        print(parts[fmt], end="")
        return 0
    print(parts["shell"])
    print(f"# --- environment ({len(spec.env)} variables) ---")
    print(parts["env"])
    print(f"# --- systemd unit {spec.unit}.service ---")
    print(parts["unit"], end="")
    return 0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--format", choices=("all", "shell", "env", "unit", "json"), default="all")
    common_args.launch(p)


def main(args: argparse.Namespace, out: Output) -> int:
    t = target(args.config, args.profile, args.param, args.release, args.sha, args.port)
    return run(out, t, args.format)
