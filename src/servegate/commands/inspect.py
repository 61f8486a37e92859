from __future__ import annotations

from pathlib import Path
from typing import Any

from servegate.archs import check_arch_names
from servegate.errors import BuildFailed, ConfigError
from servegate.kernels.inspect import inspect, missing_archs
from servegate.output import Output


def run(out: Output, files: list[Path], archs: tuple[str, ...]) -> int:
    check_arch_names(archs)
    report: dict[str, dict[str, Any]] = {}
    missing_any: list[str] = []
    for path in files:
        try:
            objects = inspect(path)
        except (OSError, ValueError) as exc:
            raise ConfigError(
                f"cannot inspect {path}: {exc}", hint="pass a built shared library (*.so)"
            ) from None
        report[str(path)] = {
            "code_objects": [o.as_dict() for o in objects],
            "missing": missing_archs(objects, archs),
        }
        missing_any += [f"{path}: {a}" for a in report[str(path)]["missing"]]
        if not out.json_mode:
            out.line(f"{path}")
            for o in objects:
                out.line(f"  {o.vendor:<7}{o.arch:<10}{o.kind:<12}{o.size:>10} bytes  {o.triple}")
            if not objects:
                out.line("  no GPU code objects")
    error = None
    if missing_any:
        error = BuildFailed(
            "no code for: " + "; ".join(missing_any),
            hint="build for the missing arch (--offload-arch / -arch)",
        )
    if out.json_mode:
        return out.emit(report, error.exit_code if error else 0, error)
    return out.error(error) if error else 0
