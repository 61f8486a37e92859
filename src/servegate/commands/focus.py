from __future__ import annotations

import os
import re
import sys
from pathlib import Path

from servegate.config import Config
from servegate.kernels import gpu
from servegate.kernels.focus import Selection, select
from servegate.output import Output
from servegate.pipeline import proc


def _pytest(selection: Selection, cfg: Config, extra: list[str]) -> list[str]:
    marker = ["-m", cfg.focus.marker] if cfg.focus.marker else []
    return [sys.executable, "-m", "pytest", *selection.tests, *marker, "-rs", *extra]


def _count(argv: list[str], checkout: Path) -> int:
    out = proc.run([*argv, "--collect-only", "-q"], cwd=checkout, check=False, timeout=600)
    found = re.search(r"(\d+)(?:/\d+)? tests? (?:collected|selected)", out.output)
    return int(found.group(1)) if found else 0


def run(
    cfg: Config,
    out: Output,
    checkout: Path,
    base: str | None,
    labels: list[str],
    execute: bool,
    extra: list[str],
) -> int:
    selection = select(cfg.focus, checkout, base or cfg.focus.base, os.environ, labels)
    if out.json_mode and not execute:
        return out.emit(selection.as_dict())
    for warning in selection.warnings:
        out.err.print(f"warning: {warning}", markup=False)
    out.line(
        f"{len(selection.changed)} file(s) changed since the merge base with "
        f"{base or cfg.focus.base}"
    )
    if selection.run_all:
        out.line(f"running everything ({selection.run_all})")
    for test, why in selection.tests.items():
        more = f" (+{len(why) - 3} more)" if len(why) > 3 else ""
        out.line(f"  {test:<40} ← {'; '.join(why[:3])}{more}")
    if not selection.tests:
        out.line("nothing selected: only ignored files (docs) changed")
        return 0
    if not execute:
        return 0
    argv = _pytest(selection, cfg, extra)
    if not gpu.detect():
        out.line(f"no GPU: {_count(argv, checkout)} tests skipped (they run on a machine with one)")
    return proc.run(argv, cwd=checkout, check=False, capture=False).returncode
