"""``release recover``: finish what an interrupted promote or rollback left half done."""

from __future__ import annotations

import argparse
import os

from servegate import hostpaths
from servegate.commands import args as common_args
from servegate.config import Config
from servegate.output import Output
from servegate.pipeline.lease import WaitReporter
from servegate.pipeline.lock import HostLock
from servegate.release import rebuild
from servegate.release.context import Context
from servegate.release.rollback import recover


def run(cfg: Config, out: Output, rebuild_state: bool = False, wait: float = 0.0) -> int:
    if rebuild_state:
        return _rebuild(cfg, out)
    ctx = Context.create(cfg, out.reporter(), os.environ)
    out.scrub = ctx.scrub
    waiting = WaitReporter("release recover", "the host lock")
    with HostLock(ctx.lock_path, "release recover", wait=wait, on_wait=waiting):
        result = recover(ctx)
    if out.json_mode:
        return out.emit({"recovered": result})
    if result is None:
        out.line("nothing to recover: no promote or rollback was interrupted on this host")
    elif not result.get("ok", True):
        out.line(f"could not undo the interrupted release of {result['recovered'][:12]}: "
                 f"{result.get('reason', '')}")  # fmt: skip
        return 10
    elif result.get("sha") is None:
        out.line(f"undid the interrupted release of {result['recovered'][:12]}: no release "
                 "was released on this host before it, so the service is stopped; nothing "
                 "was lost. Fix the release and promote it again")  # fmt: skip
    else:
        out.line(f"undid the interrupted release of {result['recovered'][:12]}: "
                 f"{str(result.get('sha'))[:12]} is live again and verified")  # fmt: skip
    return 0


def _rebuild(cfg: Config, out: Output) -> int:
    with HostLock(hostpaths.of(cfg).lock, "release recover --rebuild-state"):
        result = rebuild.rebuild(cfg)
    if out.json_mode:
        return out.emit({"rebuilt": result})
    for line in result["skipped"]:
        out.err.print(f"warning: {line}", markup=False, soft_wrap=True)
    if result["kept"]:
        out.line(f"the damaged host state is kept as {result['kept']}")
    out.line(f"rebuilt {result['state']} from {result['records']} release record(s) of this host")
    live = result["live_directory_sha"]
    if result["current"]:
        out.line(f"  current:  {result['current'][:12]} (the service directory points at it)")
    else:
        shown = live[:12] if live else "nothing"
        out.line(f"  current:  none — the service directory points at {shown}, with no "
                 "verified release record of this host")  # fmt: skip
    if result["previous"]:
        out.line(f"  previous: {result['previous'][:12]}")
    out.line("check the live service with `release verify`; `release history` shows the rest")
    return 0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--rebuild-state",
        action="store_true",
        help="make the host state again from this host's release notes and release "
        "directories (the damaged file is kept aside)",
    )
    p.add_argument(
        "--wait",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="wait up to this long for a promote or rollback still running on this host to "
        "end, then recover what it left (default: fail at once, exit 4)",
    )
    common_args.common(p)


def main(cfg: Config, args: argparse.Namespace, out: Output) -> int:
    return run(cfg, out, args.rebuild_state, args.wait)
