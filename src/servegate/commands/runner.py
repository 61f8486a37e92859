from __future__ import annotations

import os
from pathlib import Path

from servegate.output import Output
from servegate.runners import hooks
from servegate.runners.install import RunnerSpec, default_name, install


def run_install(
    out: Output,
    url: str,
    labels: str,
    name: str | None,
    directory: Path,
    token_env: str,
    start: bool,
) -> int:
    spec = RunnerSpec(
        url,
        name or default_name(),
        tuple(label for label in labels.split(",") if label),
        directory.resolve(),
    )
    unit = install(spec, os.environ, token_env, start)
    if out.json_mode:
        return out.emit({"unit": str(unit), "name": spec.name, "labels": list(spec.labels)})
    out.line(f"runner {spec.name} registered (ephemeral) with labels {', '.join(spec.labels)}")
    out.line(f"unit: {unit}" + ("" if start else "  (not started: --no-start)"))
    return 0


def run_hook(event: str) -> int:
    return hooks.job_started(os.environ) if event == "started" else hooks.job_completed(os.environ)
