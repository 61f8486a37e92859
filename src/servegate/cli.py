"""Command line: ``servegate …`` and its shorthand ``release …``.

A registry: each command's module (``servegate.commands.*``) declares its options
(``add_arguments``) and runs it (``main``); only the chosen command's module is imported,
so ``release status`` starts without what a promote or a bench needs.

One top-level handler turns every ServegateError into its message and exit code, Ctrl-C
into 130, and anything unexpected into 70 with a traceback file to attach to a bug
report.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import logging
import os
import sys
import tempfile
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from servegate.about import version_line
from servegate.errors import INTERNAL_ERROR, INTERRUPTED, ConfigError, ServegateError
from servegate.output import Output
from servegate.pipeline.gitenv import scrub_git_env


class _Version(argparse.Action):
    """``--version``: the version and the commit servegate was installed from
    (:mod:`servegate.about`), worked out only when asked."""

    def __call__(self, parser: argparse.ArgumentParser, *_: object) -> None:
        from servegate.about import version_line

        print(version_line())
        parser.exit()


@dataclass(frozen=True)
class Command:
    """A command and the module that owns it: ``add_arguments(parser)`` declares its
    options, ``main(args, out)`` runs it (a release command's ``main`` also gets the
    config). Only the chosen command's module is imported."""

    name: str
    help: str
    module: str


@dataclass(frozen=True)
class Group:
    """A command of commands (``release …``, ``config …``); ``module``'s ``main`` runs
    whichever was chosen (its name under ``dest``)."""

    name: str
    help: str
    dest: str
    module: str
    commands: tuple[Command, ...]


RELEASE = Group("release", "promote, rollback, status, history, verify, recover",
                "release_command", "release", (
    Command("promote", "deploy, verify and mark a SHA; roll back on failure", "promote"),
    Command("rollback", "make the previous (or a given) release live again", "rollback"),
    Command("status", "the live and previous release and the service's state", "status"),
    Command("history", "every promote and rollback on this host", "history"),
    Command("verify", "prove the live service runs the live release's checkout", "verify"),
    Command("recover", "undo a promote or rollback that was interrupted after its switch",
            "recover"),
))  # fmt: skip

COMMANDS: tuple[Command | Group, ...] = (
    RELEASE,
    Group("config", "config file tools", "config_command", "config_check", (
        Command("check", "validate a config file, and what this box shows", "config_check"),
    )),
    Group("gpu", "the box's GPUs", "gpu_command", "gpu", (
        Command("health", "is every GPU fit to run a job or measure a release (exit 23 if not)",
                "gpu"),
    )),
    Command("build", "build the stack's GPU extensions for build.archs (cached)", "build"),
    Command("focus", "select (and run) the GPU tests a change touches", "focus"),
    Command("lease", "run a command holding the host's GPU lease", "lease"),
    Command("runner", "the self-hosted GitHub Actions runner on this box", "runner"),
    Command("summary", "a promote's --json output as Markdown (CI job summary)", "summary"),
    Command("inspect", "list the GPU code objects inside built libraries", "inspect"),
    Command("init", "write servegate.toml (and a launch profile) for this stack checkout",
            "init"),
    Command("bench", "long-context bench of an OpenAI-compatible server (or: bench compare / "
            "bench gate)", "bench"),
    Command("report", "bench history of the stack as a PNG and an HTML page", "report"),
    Command("render", "the exact command, environment and unit of a launch", "render"),
    Command("lint", "check a launch against the lint rules (exit 15 on fail)", "lint"),
    Command("demo", "promote, promote, fail and roll back on a local sandbox", "demo"),
)  # fmt: skip


def _module(name: str) -> Any:
    return importlib.import_module(f"servegate.commands.{name}")


def _words(argv: Sequence[str]) -> list[str]:
    """The command words typed (no option of the top level or a group takes a value)."""
    return [a for a in argv if not a.startswith("-")][:2]


def _add(
    sub: argparse._SubParsersAction[argparse.ArgumentParser],
    entries: Sequence[Command | Group],
    words: Sequence[str],
) -> None:
    """Every entry's parser, with the options of the chosen one only (its module's
    ``add_arguments``): the others are not imported."""
    for entry in entries:
        p = sub.add_parser(entry.name, help=entry.help)
        chosen = bool(words) and words[0] == entry.name
        if isinstance(entry, Group):
            gsub = p.add_subparsers(dest=entry.dest, required=True, metavar="COMMAND")
            _add(gsub, entry.commands, words[1:] if chosen else [])
        elif chosen:
            _module(entry.module).add_arguments(p)


def release_parser(prog: str = "release", argv: Sequence[str] = ()) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description="servegate releases")
    sub = parser.add_subparsers(dest="release_command", required=True, metavar="COMMAND")
    _add(sub, RELEASE.commands, _words(argv))
    return parser


def servegate_parser(argv: Sequence[str] = ()) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="servegate", description="Git-centric release pipeline for LLM serving stacks"
    )
    parser.add_argument("--version", "-V", action=_Version, nargs=0, help="version and commit")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add(sub, COMMANDS, _words(argv))
    return parser


def _dispatch(args: argparse.Namespace, out: Output) -> int:
    (entry,) = [e for e in COMMANDS if e.name == args.command]
    return int(_module(entry.module).main(args, out))


def _crash_log(command: str) -> Path:
    fd, name = tempfile.mkstemp(
        prefix=f"servegate-crash-{time.strftime('%Y%m%d-%H%M%S')}-", suffix=".log"
    )
    with os.fdopen(fd, "w") as handle:
        handle.write(f"{version_line()}\ncommand: {command}\npython: {sys.version}\n\n")
        handle.write(traceback.format_exc())
    return Path(name)


def run(
    parser: argparse.ArgumentParser, argv: Sequence[str] | None, default_command: str = ""
) -> int:
    seen = list(sys.argv[1:] if argv is None else argv)
    said = io.StringIO()
    try:
        with contextlib.redirect_stderr(said):
            args = parser.parse_args(argv)
    except SystemExit as exc:
        sys.stderr.write(said.getvalue())
        if "--json" in seen and exc.code not in (0, None):  # one JSON document, always
            words = [w for w in seen if not w.startswith("-")][:3]
            lines = said.getvalue().strip().splitlines()
            Output(json_mode=True, command=" ".join(words)).emit(
                None, 2, ConfigError(lines[-1] if lines else "the command line was not "
                                     "understood", hint=f"{parser.prog} --help")
            )  # fmt: skip
        raise
    sys.stderr.write(said.getvalue())
    args.argv_seen = seen
    if default_command:
        args.command = default_command
    scrub_git_env(os.environ)
    logging.basicConfig(
        level=logging.DEBUG if getattr(args, "verbose", False) else logging.WARNING,
        format="%(message)s",
        stream=sys.stderr,
    )
    # Paramiko logs every failed handshake with a traceback; servegate says it once, plainly
    logging.getLogger("paramiko").setLevel(
        logging.DEBUG if getattr(args, "verbose", False) else logging.CRITICAL
    )
    name = " ".join(
        filter(
            None,
            [
                args.command,
                getattr(args, "release_command", None),
                getattr(args, "config_command", None),
                getattr(args, "gpu_command", None),
                getattr(args, "runner_command", None),
                getattr(args, "bench_command", None),
            ],
        )
    )
    out = Output(json_mode=getattr(args, "json", False), command=name)
    try:
        return _dispatch(args, out)
    except ServegateError as err:
        return out.error(err)
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return INTERRUPTED
    except Exception as exc:
        log = _crash_log(name)
        print(
            # the type only: an exception's text may quote what it was handling (a
            # request's headers, an API key); the full traceback is in the 0600 log
            f"servegate hit an unexpected error: {type(exc).__name__}\n"
            f"  the traceback is in {log} — please attach it to a bug report",
            file=sys.stderr,
        )
        return INTERNAL_ERROR


def main(argv: Sequence[str] | None = None) -> int:
    return run(servegate_parser(sys.argv[1:] if argv is None else argv), argv)


def release_main(argv: Sequence[str] | None = None) -> int:
    return run(
        release_parser(argv=sys.argv[1:] if argv is None else argv), argv, default_command="release"
    )
