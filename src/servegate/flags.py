"""Settings declared once: a config field carries the command-line flag that overrides it.

A field of a config section (a frozen dataclass in :mod:`servegate.config`) that a command
may override is declared there with :func:`setting`: its default, its type (the field's
annotation), its flag and the flag's help sit in that one declaration. :func:`add` puts
every such flag of a section on a command's parser, with the section's default in its
help; :func:`overrides` reads back what was typed as field values, ready for
``dataclasses.replace``. A flag that was not typed is absent, so the config's own value
(or the field's default) stands. ``tests/test_cli.py`` holds docs/config.md to the same
declarations: each flag is named in its key's row.

nox declares its options the same way (``nox/_options.py``: one object with the default,
the flag, the help and the merge into the session's config). This is the small part of
that idea servegate needs on top of argparse, which every command already uses; no
library does "a dataclass field is also an argparse flag" without replacing the parser.
"""

from __future__ import annotations

import argparse
import dataclasses
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

#: the metadata key a declared flag is kept under
KEY = "servegate.flag"


@dataclass(frozen=True)
class Flag:
    """How the command line overrides one config field."""

    #: the option, e.g. ``--max-tokens``; a boolean field whose default is True takes a
    #: ``--no-…`` flag that sets it False, one whose default is False a flag that sets it
    name: str
    help: str
    metavar: str | None = None
    #: applied to each value as typed (e.g. ``str.lower`` for tier names)
    normalise: Callable[[str], str] | None = None


def setting(
    default: Any,
    flag: str,
    help: str,
    metavar: str | None = None,
    normalise: Callable[[str], str] | None = None,
) -> Any:
    """A config field with a default that ``flag`` overrides on the command line."""
    return field(default=default, metadata={KEY: Flag(flag, help, metavar, normalise)})


def declared(section: type[Any]) -> list[tuple[dataclasses.Field[Any], Flag]]:
    """The fields of ``section`` that carry a flag, in declaration order."""
    return [(f, f.metadata[KEY]) for f in dataclasses.fields(section) if KEY in f.metadata]


def add(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    section: type[Any],
    prefix: str | None,
    skip: tuple[str, ...] = (),
) -> None:
    """Every flag ``section`` declares (but the fields in ``skip``), on ``parser``.
    ``prefix`` is the config section whose values a flag not typed leaves standing, shown
    in the help ("default: bench.tiers, 16k"); None: the declared default stands."""
    hints = typing.get_type_hints(section)
    for f, flag in declared(section):
        if f.name in skip:
            continue
        tp = hints[f.name]
        key = f"{prefix}.{f.name}" if prefix else ""
        common: dict[str, Any] = {"dest": _dest(section, f.name), "default": None}
        if tp is bool:
            if f.default is True and not flag.name.startswith("--no-"):
                raise TypeError(f"{flag.name}: a flag that turns {f.name} off is --no-…")
            shown = "true" if not f.default else "false"
            parser.add_argument(
                flag.name,
                action="store_const",
                const=not f.default,
                help=f"{flag.help} ({key or 'default'} = {shown})",
                **common,
            )
            continue
        shown = ", ".join(v for v in (key, _shown(f.default)) if v)
        parser.add_argument(
            flag.name,
            type=_parser(tp, flag),
            metavar=flag.metavar or _metavar(tp),
            help=f"{flag.help} (default: {shown})" if shown else flag.help,
            **common,
        )


def overrides(section: type[Any], args: argparse.Namespace) -> dict[str, Any]:
    """The fields of ``section`` whose flags were typed, by field name."""
    out: dict[str, Any] = {}
    for f, _flag in declared(section):
        value = getattr(args, _dest(section, f.name), None)
        if value is not None:
            out[f.name] = value
    return out


def typed(section: type[Any], name: str, args: argparse.Namespace) -> Any:
    """What was typed for field ``name`` of ``section`` (None: nothing)."""
    return getattr(args, _dest(section, name), None)


def _dest(section: type[Any], name: str) -> str:
    # one namespace holds several sections' flags (bench load: [bench] and [load])
    return f"{section.__name__.lower()}__{name}"


def _shown(value: Any) -> str:
    """A default as the help shows it ("": nothing worth showing)."""
    if isinstance(value, tuple):
        return ",".join(str(v) for v in value)
    return str(value)


def _metavar(tp: Any) -> str:
    if typing.get_origin(tp) is typing.Literal:
        return "{" + ",".join(str(a) for a in typing.get_args(tp)) + "}"
    return {int: "N", float: "X"}.get(tp, "TEXT")


def _parser(tp: Any, flag: Flag) -> Callable[[str], Any]:
    """argparse's ``type=`` for a field of type ``tp``: a tuple is a comma-separated list;
    a bad value is argparse's error (exit 2) naming the flag and what to give."""
    origin = typing.get_origin(tp)
    if origin is typing.Literal:
        allowed = typing.get_args(tp)

        def choice(text: str) -> Any:
            if text not in allowed:
                raise argparse.ArgumentTypeError(
                    f"{text!r} is not one of {', '.join(str(a) for a in allowed)}"
                )
            return text

        return choice
    item = typing.get_args(tp)[0] if origin is tuple else tp
    if item not in (str, int, float):
        raise TypeError(f"{flag.name}: no command-line form for {tp}")
    example = {int: "whole numbers, e.g. 1,4", float: "numbers, e.g. 0.5,1"}

    def one(text: str) -> Any:
        text = flag.normalise(text) if flag.normalise else text
        try:
            return item(text)
        except ValueError:
            what = "a whole number" if item is int else "a number"
            raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None

    if origin is not tuple:
        return one

    def many(text: str) -> tuple[Any, ...]:
        try:
            return tuple(one(v.strip()) for v in text.split(",") if v.strip())
        except argparse.ArgumentTypeError:
            if item is str:
                raise
            raise argparse.ArgumentTypeError(f"{text!r}: give {example[item]}") from None

    return many
