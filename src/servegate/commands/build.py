from __future__ import annotations

import dataclasses
from pathlib import Path

from servegate.archs import check_arch_names
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
