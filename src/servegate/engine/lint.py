"""Lint a launch: the rules of :mod:`servegate.engine.rules` over a :class:`LaunchSpec`."""

from __future__ import annotations

import dataclasses
import glob
import os
from pathlib import Path
from typing import Any

from servegate.config import Config
from servegate.engine import rules, vllm_envs
from servegate.engine.launch import LaunchSpec
from servegate.engine.rules import CheckContext, Finding, RuleSet
from servegate.errors import LintFailed

ROCBLAS_DIRS = ("/opt/rocm*/lib", "/opt/rocm*/lib64", "/usr/lib/x86_64-linux-gnu")


def ruleset(cfg: Config) -> RuleSet:
    base = Path(cfg.path).parent if cfg.path and not cfg.path.startswith("<") else Path(".")
    extra = [base / p for p in cfg.lint.rules]
    return rules.load(extra, cfg.lint.disable, cfg.lint.severity)


def facts(spec: LaunchSpec) -> dict[str, Any]:
    """What rule paths reach: env, args, unit, expect, engine, profile."""
    return {
        "env": dict(spec.env),
        "args": dict(spec.args),
        "unit": dataclasses.asdict(spec.limits),
        "expect": dataclasses.asdict(spec.expect),
        "engine": spec.engine,
        "profile": spec.profile,
    }


def rocblas_candidates(spec: LaunchSpec) -> list[Path]:
    if spec.expect.rocblas_library:
        return [Path(spec.expect.rocblas_library)]
    dirs = [d for d in spec.env.get("LD_LIBRARY_PATH", "").split(":") if d]
    for pattern in ROCBLAS_DIRS:
        dirs += sorted(glob.glob(pattern))
    out: list[Path] = []
    for d in dirs:
        out.append(Path(d) / "librocblas.so")
        out += sorted(Path(p) for p in glob.glob(os.path.join(d, "librocblas.so.*")))
    return out


def check_context(spec: LaunchSpec, cache_dir: Path) -> CheckContext:
    known = vllm_envs.snapshot()
    if spec.engine == "vllm" and "-m" in spec.argv[:2]:
        known = vllm_envs.known(spec.argv[0], spec.env, str(spec.cwd), cache_dir)
    return CheckContext(
        known_env=known.names,
        known_source=known.source,
        known_installed=known.installed,
        rocblas_candidates=rocblas_candidates(spec),
    )


def lint(spec: LaunchSpec, ruleset_: RuleSet, cache_dir: Path) -> list[Finding]:
    return rules.lint(ruleset_, facts(spec), check_context(spec, cache_dir))


def failure(findings: list[Finding], what: str) -> LintFailed:
    fails = [f for f in findings if f.severity == "fail"]
    lines = "\n".join(f"  - {f.rule}: {f.message}\n      remedy: {f.remedy}" for f in fails)
    return LintFailed(
        f"{len(fails)} lint finding(s) of severity fail in {what}:\n{lines}",
        hint="fix the profile (or the config); a rule that does not apply to this box can be "
        'turned off with [lint] disable = ["id"]',
    )
