"""``servegate release …`` (and ``release …``): the config is loaded once, a config of
remote hosts runs the command there over SSH, and the commands that switch the live
service turn SIGTERM and SIGHUP into Ctrl-C (after the switch, the previous release is
put back). Each subcommand's module is imported alone: ``release status`` does not load
what a promote needs."""

from __future__ import annotations

import argparse
import importlib
import os

from servegate import config as config_mod
from servegate.output import Output
from servegate.pipeline import interrupts

#: the release commands that switch the live service: SIGTERM and SIGHUP stop them as
#: Ctrl-C does, whatever SIGINT they inherited
SWITCHING = ("promote", "rollback", "recover")


def main(args: argparse.Namespace, out: Output) -> int:
    cfg = config_mod.load(args.config, os.environ)
    if cfg.remote_hosts:
        return _remote(cfg, args, out)
    command = importlib.import_module(f"servegate.commands.{args.release_command}")
    if args.release_command in SWITCHING:
        with interrupts.handled(f"release {args.release_command}"):
            return int(command.main(cfg, args, out))
    return int(command.main(cfg, args, out))


def _remote(cfg: config_mod.Config, args: argparse.Namespace, out: Output) -> int:
    """`release …` on hosts over SSH (host.ssh or [[fleet.hosts]])."""
    from servegate.commands import fleet

    sub = args.release_command
    if sub == "promote":
        return fleet.promote(cfg, out, args.sha, args.allow_non_ff)
    if sub == "status":
        return fleet.status(cfg, out)
    extra = {
        "rollback": ["--to", args.to] if getattr(args, "to", None) else [],
        "history": ["-n", str(getattr(args, "n", 20))],
        "verify": ["--attestation", args.attestation] if getattr(args, "attestation", "") else [],
        "recover": (["--rebuild-state"] if getattr(args, "rebuild_state", False) else [])
        + (["--wait", str(args.wait)] if getattr(args, "wait", 0) else []),
    }[sub]
    return fleet.each_command(cfg, out, [sub, *extra])
