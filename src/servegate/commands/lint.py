"""``servegate lint``: the launch checked against the lint rules (promote runs the same)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from servegate.commands import args as common_args
from servegate.commands.render import Target
from servegate.engine import lint as lint_mod
from servegate.engine.rules import RuleSet
from servegate.errors import LintFailed
from servegate.output import Output


def cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "servegate"


def run(out: Output, t: Target, ruleset: RuleSet) -> int:
    findings = lint_mod.lint(t.spec, ruleset, cache_dir())
    what = f"profile {t.spec.profile}" if t.spec.profile else "service.command"
    fails = [f for f in findings if f.severity == "fail"]
    if out.json_mode:
        code = LintFailed.exit_code if fails else 0
        return out.emit(
            {"launch": what, "findings": [f.as_dict() for f in findings], "notes": list(t.notes)},
            code,
        )
    rows = [[f.severity, f.rule, f.message, f.remedy] for f in findings]
    if rows:
        out.table(f"lint: {what}", ["severity", "rule", "finding", "remedy"], rows)
    checked = len(ruleset.of("lint"))
    out.line(f"{what}: {checked} lint rules, {len(fails)} fail, {len(findings) - len(fails)} warn")
    if fails:
        raise lint_mod.failure(findings, what)
    return 0


def list_rules(out: Output, ruleset: RuleSet) -> int:
    if out.json_mode:
        return out.emit(
            [
                {
                    "id": r.id,
                    "kind": r.kind,
                    "severity": r.severity,
                    "message": r.message,
                    "remedy": r.remedy,
                    "source": r.source,
                }
                for r in ruleset.rules
            ]
        )
    rows = [[r.kind, r.id, r.severity, r.message] for r in ruleset.rules]
    out.table("rules", ["kind", "id", "severity", "message"], rows)
    out.line("files: " + ", ".join(ruleset.files))
    return 0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--rules", action="store_true", help="list the rules instead")
    common_args.launch(p)


def main(args: argparse.Namespace, out: Output) -> int:
    from servegate import config as config_mod
    from servegate.commands.render import target
    from servegate.engine.lint import ruleset

    if args.rules:
        # the shipped rules need no config or profile; a config's [lint] files add to them
        base = config_mod.load(args.config, os.environ) if args.config.exists() else None
        return list_rules(out, ruleset(base or config_mod.bare()))
    t = target(args.config, args.profile, args.param, args.release, args.sha, args.port)
    return run(out, t, ruleset(t.cfg))
