"""``servegate gpu health``: is this box's GPU fit to run a job or measure a release?"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from servegate import config as config_mod
from servegate.commands import args as common_args
from servegate.errors import ConfigError, GpuUnhealthy
from servegate.gpu import health
from servegate.output import Output


def config_or_none(path: Path | None) -> config_mod.Config | None:
    """The config at ``path``, else ./servegate.toml where it exists, else none (a runner
    box may have no stack config: the defaults then)."""
    if path is not None and not path.exists():
        raise ConfigError(f"config {path} not found", hint="leave --config out for the defaults")
    path = path or (Path("servegate.toml") if Path("servegate.toml").exists() else None)
    return config_mod.load(path, os.environ) if path is not None else None


def failure(snap: health.Snapshot) -> GpuUnhealthy:
    return GpuUnhealthy(
        "the GPUs are not healthy: " + "; ".join(f.line() for f in snap.failures[:8]),
        hint="fix what each finding says, then `servegate gpu health` again",
    )


def main(args: argparse.Namespace, out: Output) -> int:
    cfg = config_or_none(args.config)
    if args.acknowledge:
        gone = health.acknowledge(health.last_check_file(os.environ))
        for fault in gone:
            out.line(f"  acknowledged: {fault['line']}")
        out.line(f"{len(gone)} kernel-log fault(s) acknowledged; checking again")
    snap = health.check(
        health.expect_of(cfg, busy_ok=not args.idle), last=health.last_check_file(os.environ)
    )
    if out.json_mode:
        return out.emit(
            snap.as_dict(),
            0 if snap.healthy else GpuUnhealthy.exit_code,
            None if snap.healthy else failure(snap),
        )
    rows = [
        [
            str(g.index),
            g.name,
            g.arch or "?",
            g.bus,
            f"{g.memory_used_mib or 0:.0f}/{g.memory_total_mib or 0:.0f} MiB",
            f"{g.temperature_c:.0f} C" if g.temperature_c is not None else "?",
            f"{g.power_w:.0f}/{g.power_limit_w or 0:.0f} W" if g.power_w is not None else "?",
            str(len(g.processes)),
        ]
        for g in snap.gpus
    ]
    out.table(
        f"GPUs ({snap.tool or 'no tool'}, driver {snap.driver or '?'}, runtime "
        f"{snap.runtime or '?'})",
        ["gpu", "name", "arch", "bus", "memory", "temp", "power", "procs"],
        rows,
    )
    for finding in snap.findings:
        out.line(f"  {finding.line()}")
    if not snap.healthy:
        return out.error(failure(snap))
    out.line(snap.summary())
    return 0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--config",
        type=Path,
        default=None,
        help="the config whose [gpu] and build.archs say what the box must have (default: "
        "./servegate.toml where it exists, else the defaults)",
    )
    p.add_argument(
        "--idle",
        action="store_true",
        help="the GPUs must also be idle (no process on them), as before a runner's job",
    )
    p.add_argument(
        "--acknowledge", action="store_true",
        help="forget the kernel-log faults (Xid, amdgpu RAS) seen so far, after the GPU was "
        "reset, then check",
    )  # fmt: skip
    common_args.output(p)
