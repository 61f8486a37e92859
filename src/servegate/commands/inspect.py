from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from servegate.archs import check_arch_names
from servegate.commands import args as common_args
from servegate.errors import BuildFailed, ConfigError
from servegate.kernels.inspect import Container, containers, gaps
from servegate.output import Output


def run(out: Output, files: list[Path], archs: tuple[str, ...]) -> int:
    check_arch_names(archs)
    report: dict[str, dict[str, Any]] = {}
    missing_any: list[str] = []
    for path in files:
        try:
            found = containers(path)
        except (OSError, ValueError) as exc:
            raise ConfigError(
                f"cannot inspect {path}: {exc}", hint="pass a built shared library (*.so)"
            ) from None
        missing = gaps(found, archs)
        report[str(path)] = {
            "code_objects": [o.as_dict() for c in found for o in c.objects],
            "missing": list(missing),
            "gaps": missing,
        }
        missing_any += [f"{path}: {w}" for ws in missing.values() for w in ws]
        if not out.json_mode:
            _list(out, path, found)
    error = None
    if missing_any:
        error = BuildFailed(
            "no code for: " + "; ".join(missing_any),
            hint="build every source and prebuilt object for the missing arch "
            "(--offload-arch / -arch)",
        )
    if out.json_mode:
        return out.emit(report, error.exit_code if error else 0, error)
    return out.error(error) if error else 0


def _list(out: Output, path: Path, found: list[Container]) -> None:
    out.line(f"{path}")
    for c in found:
        out.line(f"  {c.name}")
        for o in c.objects:
            note = f"  not counted: {o.problem}" if o.problem else ""
            out.line(
                f"    {o.vendor:<7}{o.arch:<16}{o.kind:<12}{o.size:>10} bytes  {o.triple}{note}"
            )
    if not found:
        out.line("  no GPU code objects")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("files", nargs="+", type=Path, metavar="FILE", help="built *.so files")
    p.add_argument(
        "--arch",
        action="append",
        default=[],
        metavar="ARCH",
        help="fail (exit 5) unless every file holds code for ARCH (repeatable)",
    )
    common_args.output(p)


def main(args: argparse.Namespace, out: Output) -> int:
    return run(out, args.files, tuple(args.arch))
