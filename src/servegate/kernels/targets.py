"""Build every configured GPU extension of a checkout, through the build cache."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from servegate.config import Config, KernelTarget
from servegate.errors import BuildFailed, CommandFailed
from servegate.kernels import recipes
from servegate.kernels.cache import BuildCache, Key, Miss, source_hashes, why_rebuild
from servegate.kernels.inspect import require_archs
from servegate.pipeline import proc


@dataclass
class TargetResult:
    name: str
    kind: str
    cached: bool
    reason: str
    seconds: float
    key: str
    toolchain: dict[str, str]
    commands: list[list[str]] = field(default_factory=list)
    #: output path relative to the checkout → SHA-256
    outputs: dict[str, str] = field(default_factory=dict)
    code_objects: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _recipe(target: KernelTarget) -> dict[str, Any]:
    recipe = asdict(target)
    recipe.pop("name")
    return recipe


def _compile(
    target: KernelTarget,
    checkout: Path,
    archs: tuple[str, ...],
    jobs: int,
    environ: Mapping[str, str],
    log: Path,
) -> list[list[str]]:
    commands: list[list[str]] = []
    text: list[str] = []
    if target.output:
        (checkout / target.output).parent.mkdir(parents=True, exist_ok=True)
    for step in recipes.steps(target, checkout, archs, jobs, environ):
        commands.append(list(step.argv))
        try:
            result = proc.run(step.argv, cwd=checkout, env=step.env, timeout=None)
        except CommandFailed as exc:
            log.parent.mkdir(parents=True, exist_ok=True)
            log.write_text("\n".join(text) + f"\n{exc}\n")
            raise BuildFailed(
                f"building {target.name} failed: {exc}\n  full log: {log}",
                hint="the full log says why; fix the sources or the target's recipe",
            ) from None
        text.append(f"$ {proc.quote(step.argv)}\n{result.output}")
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("\n".join(text))
    return commands


def build_target(
    target: KernelTarget,
    cfg: Config,
    checkout: Path,
    cache: BuildCache | None,
    environ: Mapping[str, str],
    log_dir: Path,
    cache_off: str = "cache off",
) -> TargetResult:
    start = time.monotonic()
    archs = cfg.build.archs
    tools = recipes.toolchain(target, archs, environ)
    sources = recipes.expand(checkout, target.sources)
    if not sources:
        raise BuildFailed(
            f"build target {target.name!r}: no file matches {list(target.sources)}",
            hint="fix the target's sources globs (relative to the checkout)",
        )
    hashes = source_hashes(checkout, sources)
    try:
        included = recipes.includes(target, checkout, archs, environ) if cache else {}
    except recipes.Unkeyable as exc:
        cache, included, cache_off = None, {}, f"not cached: {exc}"
    key = Key.make(
        _recipe(target),
        hashes,
        tools,
        archs,
        includes={name: h for name, h in included.items() if name not in hashes},
        environment=recipes.build_environment(environ, cfg.build.env, checkout),
    )
    result = TargetResult(
        target.name, recipes.compiler(target, archs), False, "", 0.0, key.digest, tools
    )
    expected = target.outputs if target.kind == "cmake" else (target.output,)
    restored = cache.restore(target.name, key, checkout, expected) if cache else Miss("")
    if not isinstance(restored, Miss):
        result.cached, result.outputs = True, restored
        result.reason = (
            "cache hit: sources, includes, toolchain, flags, environment and archs "
            "unchanged — not rebuilt"
        )
    else:
        result.reason = (
            restored.why or why_rebuild(cache.last(target.name), key) if cache else cache_off
        )
        result.commands = _compile(
            target, checkout, archs, cfg.build.jobs, environ, log_dir / f"{target.name}.log"
        )
        files = recipes.outputs(target, checkout)
        if not files:
            raise BuildFailed(
                f"build target {target.name!r} left no output "
                f"({target.output or list(target.outputs)})"
            )
        build_s = time.monotonic() - start
        result.outputs = (
            cache.store(target.name, key, checkout, files, build_s)
            if cache
            else source_hashes(checkout, files)
        )
    if archs:
        result.code_objects = {
            rel: [o.as_dict() for o in require_archs(checkout / rel, archs)]
            for rel in result.outputs
        }
    result.seconds = time.monotonic() - start
    return result


def build_all(
    cfg: Config, checkout: Path, cache_root: Path | None, environ: Mapping[str, str], log_dir: Path
) -> list[TargetResult]:
    cache, why = None, "cache off"
    if cache_root is not None and cfg.build.cache and cfg.build.targets:
        cache, why = BuildCache.open(cache_root)
    return [build_target(t, cfg, checkout, cache, environ, log_dir, why) for t in cfg.build.targets]
