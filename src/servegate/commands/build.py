from __future__ import annotations

import argparse
import dataclasses
import os
from pathlib import Path

from servegate.archs import check_arch_names
from servegate.commands import args as common_args
from servegate.config import Config, fill
from servegate.engine.launch import placeholders
from servegate.kernels.targets import build_all
from servegate.output import Output
from servegate.pipeline import gitenv
from servegate.pipeline.git import environ_without_git


def default_cache(environ: dict[str, str]) -> Path:
    base = environ.get("XDG_CACHE_HOME") or str(Path(environ.get("HOME", "~")) / ".cache")
    return Path(base) / "servegate" / "build-cache"


def run(
    cfg: Config,
    out: Output,
    checkout: Path,
    cache_dir: Path | None,
    use_cache: bool,
    archs: tuple[str, ...] = (),
) -> int:
    if archs:
        check_arch_names(archs)
        cfg = dataclasses.replace(cfg, build=dataclasses.replace(cfg.build, archs=archs))
    environ = environ_without_git()
    cache = (cache_dir or default_cache(environ)) if use_cache else None
    # build.env as a promote applies it: what CI builds is what a release builds
    head = gitenv.run(["rev-parse", "HEAD"], checkout)
    sha = head.stdout.strip() if head.ok else ""
    places = placeholders(cfg, checkout.resolve(), sha)
    environ.update({k: fill(v, **places) for k, v in cfg.build.env.items()})
    results = build_all(cfg, checkout.resolve(), cache, environ, checkout / "build" / "logs")
    if out.json_mode:
        return out.emit(
            {
                "checkout": str(checkout.resolve()),
                "archs": list(cfg.build.archs),
                "cache": str(cache) if cache else None,
                "targets": [r.as_dict() for r in results],
            }
        )
    rows = []
    for r in results:
        built_for = sorted({o["arch"] for objs in r.code_objects.values() for o in objs})
        rows.append(
            [
                r.name,
                r.kind,
                "cache" if r.cached else "built",
                f"{r.seconds:.2f}",
                ", ".join(built_for) or "-",
                r.reason,
            ]
        )
    out.table(
        f"servegate build — {checkout.resolve()}",
        ["target", "kind", "how", "seconds", "GPU code for", "why"],
        rows,
    )
    for r in results:
        for rel, digest in r.outputs.items():
            out.line(f"  {rel}  sha256 {digest[:16]}…")
        for tool, version in r.toolchain.items():
            out.line(f"  {tool}: {version}")
    if not results:
        out.line("no [[build.targets]] in the config: nothing to build")
    return 0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dir", type=Path, default=Path("."), help="the stack checkout (default: .)")
    p.add_argument(
        "--cache-dir", type=Path, help="build cache (default: ~/.cache/servegate/build-cache)"
    )
    p.add_argument("--no-cache", action="store_true", help="always compile")
    p.add_argument(
        "--arch",
        action="append",
        default=[],
        metavar="ARCH",
        help="build for ARCH instead of build.archs (repeatable), e.g. sm_90",
    )
    common_args.common(p)


def main(args: argparse.Namespace, out: Output) -> int:
    from servegate import config as config_mod

    cfg = config_mod.load(args.config, os.environ, build_only=True)
    return run(cfg, out, args.dir, args.cache_dir, not args.no_cache, tuple(args.arch))
