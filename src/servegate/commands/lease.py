from __future__ import annotations

import argparse
import os
import shlex
from pathlib import Path

from servegate import config as config_mod
from servegate.errors import ConfigError
from servegate.output import Output
from servegate.pipeline.lease import lease_path, run_holding


def run(
    out: Output, argv: list[str], timeout: float, what: str | None, config: Path | None = None
) -> int:
    """Run ``argv`` holding the host's GPU lease; its exit code is ours."""
    argv = argv[1:] if argv[:1] == ["--"] else argv
    if not argv:
        raise ConfigError("no command to run", hint="servegate lease [--timeout S] -- COMMAND ...")
    state = ""
    if config is not None and not config.exists():
        raise ConfigError(
            f"config {config} not found: the lease would be taken in the default directory, "
            "not the one a config names (two users, two leases)",
            hint="pass the config that names host.state_dir, or leave --config out",
        )
    config = config or (Path("servegate.toml") if Path("servegate.toml").exists() else None)
    if config is not None:
        state = config_mod.load(config, os.environ, build_only=True).host.state_dir
    path = lease_path(os.environ, state)
    return run_holding(path, what or shlex.join(argv), timeout, argv, os.environ)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--timeout", type=float, default=3600.0, help="seconds to wait for the lease (default 3600)"
    )
    p.add_argument("--what", help="how the holder is named to those who wait")
    p.add_argument(
        "--config",
        type=Path,
        default=None,
        help="the config whose host.state_dir holds the lease (default: ./servegate.toml "
        "where it exists; a --config that does not exist is an error)",
    )
    p.add_argument("argv", nargs=argparse.REMAINDER, metavar="-- COMMAND ...")
    p.add_argument("-v", "--verbose", action="store_true", help=argparse.SUPPRESS)


def main(args: argparse.Namespace, out: Output) -> int:
    return run(out, args.argv, args.timeout, args.what, args.config)
