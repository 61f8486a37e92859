from __future__ import annotations

import argparse
import os

from servegate.commands import args as common_args
from servegate.config import Config
from servegate.errors import ServegateError
from servegate.output import Output
from servegate.release.context import Context
from servegate.release.rollback import rollback


def run(cfg: Config, out: Output, to: str | None) -> int:
    ctx = Context.create(cfg, out.reporter(), os.environ)
    out.scrub = ctx.scrub
    try:
        result = rollback(ctx, to)
    except ServegateError as err:
        if out.json_mode:
            return out.emit({"stages": ctx.runner.as_list()}, err.exit_code, err)
        return out.error(err)
    if out.json_mode:
        return out.emit(result)
    out.stages(f"release rollback → {result['sha'][:12]}", result["stages"])
    out.line(f"{result['sha']} is live again and verified ({result['seconds']:.1f}s)")
    return 0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--to", metavar="SHA", help="an earlier release of this host")
    common_args.common(p)


def main(cfg: Config, args: argparse.Namespace, out: Output) -> int:
    return run(cfg, out, args.to)
