from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from servegate.output import Output
from servegate.runners import hooks
from servegate.runners.install import RunnerSpec, default_name, install, plan


def run_install(
    out: Output,
    url: str,
    labels: str,
    name: str | None,
    directory: Path,
    token_env: str,
    start: bool,
    dry_run: bool = False,
) -> int:
    spec = RunnerSpec(
        url,
        name or default_name(),
        tuple(label for label in labels.split(",") if label),
        directory.resolve(),
    )
    if dry_run:
        steps = plan(spec, os.environ)
        if out.json_mode:
            return out.emit({"dry_run": True, **dataclasses.asdict(steps)})
        out.line("dry run: nothing is registered, written or started")
        out.line(f"would register: {' '.join(steps.register)}")
        for hook in steps.hooks:
            out.line(f"would write hook: {hook}")
        out.line(f"would write unit: {steps.unit}")
        out.line(steps.unit_text)
        if start:
            out.line(f"would start: {' '.join(steps.start)}")
        return 0
    unit = install(spec, os.environ, token_env, start)
    if out.json_mode:
        return out.emit({"unit": str(unit), "name": spec.name, "labels": list(spec.labels)})
    out.line(f"runner {spec.name} registered (ephemeral) with labels {', '.join(spec.labels)}")
    out.line(f"unit: {unit}" + ("" if start else "  (not started: --no-start)"))
    return 0


def run_hook(event: str) -> int:
    return hooks.job_started(os.environ) if event == "started" else hooks.job_completed(os.environ)
