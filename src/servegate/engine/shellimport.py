"""A launch profile from a team's shell launch script (``servegate init --from-command``).

The script is read, never run. What it converts is the shape the field's launch
scripts have (``../shared/seeds``): shell variables, ``export NAME=VALUE`` lines, an
``args=( … )`` array and a final ``exec INTERPRETER "${args[@]}"`` (or any last command).

- every exported variable becomes the profile's ``[env]``, in the script's order;
- the interpreter and ``-m MODULE`` (or an executable and its positional arguments)
  become ``[launch]``, every ``--option`` an entry of ``[args]``;
- a shell variable the command or the environment uses becomes a parameter
  (``{runtime}``, ``{model}``) whose default is the script's value — except the
  checkout itself, which becomes ``{release}``, and ``--port``, which becomes
  ``{port}`` (the config's ``service.port``);
- every line it does not convert (``git``, ``test``, a pre-flight command) is listed
  with the reason, so nothing disappears silently.

Hand-written: a full bash parser (``bashlex``) would still leave every expansion and
every decision above to this module, and the subset is small. Known limits, said in the
result: command substitution ``$(…)`` is not evaluated, and ``$`` inside single quotes is
treated like ``$`` outside them.
"""

from __future__ import annotations

import json
import os
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from servegate.errors import ConfigError

ASSIGN = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$", re.S)
ARRAY_START = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=\((.*)$", re.S)
SPLICE = re.compile(r"^\$\{([A-Za-z_][A-Za-z0-9_]*)\[[@*]\]\}$")
REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)")
#: names a profile fills itself: a script variable of that name is not a parameter
BUILTIN = {"release", "port", "sha", "short", "host_root"}
#: commands servegate does itself, before the service starts
HANDLED = {
    "cd": "servegate starts the service in the release checkout ([launch] cwd)",
    "git": "servegate fetches and checks out the exact SHA itself",
    "test": "servegate checks the checkout (clean, at the SHA) itself",
    "set": "shell options",
    "echo": "output only",
    "printf": "output only",
    "source": "not followed: put what it sets into the script or the profile",
    ".": "not followed: put what it sets into the script or the profile",
}


@dataclass
class Converted:
    """The script as a profile's parts, templated."""

    env: dict[str, str] = field(default_factory=dict)
    params: dict[str, str] = field(default_factory=dict)
    interpreter: str = ""
    module: str = ""
    executable: str = ""
    positional: list[str] = field(default_factory=list)
    args: dict[str, Any] = field(default_factory=dict)
    port: int | None = None
    #: "line N: text — why" for each line not converted
    skipped: list[str] = field(default_factory=list)
    #: variables the command or environment uses that the script never sets
    unresolved: list[str] = field(default_factory=list)


@dataclass
class _Shell:
    checkout: str
    values: dict[str, str] = field(default_factory=dict)  # literal values
    templates: dict[str, str] = field(default_factory=dict)  # exported: templated values
    arrays: dict[str, list[str]] = field(default_factory=dict)  # templated elements
    used: dict[str, str] = field(default_factory=dict)  # parameter → default
    unresolved: list[str] = field(default_factory=list)

    def literal(self, text: str) -> str:
        """``text`` with every variable replaced by its literal value."""
        return REF.sub(lambda m: self.values.get(m.group(1) or m.group(2), m.group(0)), text)

    def template(self, text: str) -> str:
        """``text`` with variables as placeholders: ``{param}``, ``{release}``, or an
        exported variable's own template; braces of the text itself are kept (JSON)."""

        def one(m: re.Match[str]) -> str:
            name = m.group(1) or m.group(2)
            if name in self.templates:
                return self.templates[name]
            if name not in self.values:
                if name not in self.unresolved:
                    self.unresolved.append(name)
                return m.group(0)
            if _same_dir(self.values[name], self.checkout):
                return "{release}"
            if name in BUILTIN:
                return "{" + name + "}"
            self.used.setdefault(name, self.values[name])
            return "{" + name + "}"

        return REF.sub(one, text)


def _same_dir(value: str, checkout: str) -> bool:
    if not value.startswith("/"):
        return False
    return os.path.realpath(value) == os.path.realpath(checkout)


def _logical_lines(text: str) -> list[tuple[int, str]]:
    """(first line number, text) with backslash continuations joined and an array's
    ``( … )`` kept together."""
    out: list[tuple[int, str]] = []
    buf, start, in_array = "", 0, False
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.rstrip()
        if not buf:
            start = n
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        buf += line
        stripped = buf.strip()
        if ARRAY_START.match(stripped) and not _closes(stripped):
            in_array = True
        if in_array:
            if _closes(stripped):
                in_array = False
            else:
                buf += "\n"
                continue
        out.append((start, buf.strip()))
        buf = ""
    if buf.strip():
        out.append((start, buf.strip()))
    return out


def _closes(text: str) -> bool:
    """Whether an array assignment's text holds its closing parenthesis (its last word
    outside quotes ends with one)."""
    try:
        tokens = shlex.split(text.split("=", 1)[1][1:], comments=True)
    except ValueError:  # a quote still open: not closed yet
        return False
    return bool(tokens) and tokens[-1].endswith(")")


def convert(text: str, checkout: Path) -> Converted:
    """The launch of ``text`` (a shell script) as a profile's parts."""
    sh = _Shell(str(checkout))
    command: tuple[int, list[str]] | None = None
    others: list[tuple[int, str, list[str]]] = []
    for n, line in _logical_lines(text):
        if not line or line.startswith("#"):
            continue
        try:
            tokens = shlex.split(line, comments=True)
        except ValueError as exc:
            raise ConfigError(f"line {n}: cannot be read as shell ({exc}): {line[:80]}") from None
        if not tokens:
            continue
        array = ARRAY_START.match(line)
        if array:
            body = shlex.split(line.split("=", 1)[1].strip()[1:], comments=True)
            if body and body[-1] == ")":
                body = body[:-1]
            elif body and body[-1].endswith(")"):
                body[-1] = body[-1][:-1]
            sh.arrays[array.group(1)] = body
            continue
        if tokens[0] == "export":
            for tok in tokens[1:]:
                m = ASSIGN.match(tok)
                if m:
                    sh.values[m.group(1)] = sh.literal(m.group(2))
                    sh.templates[m.group(1)] = m.group(2)  # templated once all is known
            continue
        if len(tokens) == 1 and ASSIGN.match(tokens[0]):
            m = ASSIGN.match(tokens[0])
            assert m is not None
            sh.values[m.group(1)] = sh.literal(m.group(2))
            continue
        if tokens[0] == "exec":
            command = (n, tokens[1:])
            continue
        others.append((n, line, tokens))
    if command is None:
        launchers = [o for o in others if o[2][0] not in HANDLED]
        if not launchers:
            raise ConfigError(
                "the script starts no server: no `exec` line and no command to run",
                hint="the launch script must end with the command that starts the server "
                "(e.g. exec python -m vllm.entrypoints.openai.api_server …)",
            )
        n, _, tokens = launchers[-1]
        command = (n, tokens)
        others.remove(launchers[-1])
    result = Converted()
    for n, line, tokens in others:
        why = HANDLED.get(tokens[0], "a command before the server starts: run it in the build")
        result.skipped.append(f"line {n}: {line[:100]} — {why}")
    # exports are templated in order: a later one may use an earlier one
    exported = dict(sh.templates)
    sh.templates = {}
    for name, raw in exported.items():
        sh.templates[name] = sh.template(raw)
    result.env = dict(sh.templates)
    argv: list[str] = []
    for tok in command[1]:
        splice = SPLICE.match(tok)
        if splice and splice.group(1) in sh.arrays:
            argv += [sh.template(t) for t in sh.arrays[splice.group(1)]]
        else:
            argv.append(sh.template(tok))
    if not argv:
        raise ConfigError(f"line {command[0]}: `exec` without a command")
    _launch(result, argv)
    if result.port is not None:
        for name, value in result.env.items():
            if "PORT" in name and value == str(result.port):
                result.env[name] = "{port}"
    result.params = dict(sh.used)
    result.unresolved = list(sh.unresolved)
    return result


def _launch(result: Converted, argv: list[str]) -> None:
    rest = argv[1:]
    if len(rest) >= 2 and rest[0] == "-m":
        result.interpreter, result.module = argv[0], rest[1]
        rest = rest[2:]
    else:
        result.executable = argv[0]
        while rest and not rest[0].startswith("-"):
            result.positional.append(rest.pop(0))
    i = 0
    while i < len(rest):
        tok = rest[i]
        if not tok.startswith("-"):
            result.positional.append(tok)
            i += 1
            continue
        key, eq, inline = tok.lstrip("-").partition("=")
        values = [inline] if eq else []
        i += 1
        while not eq and i < len(rest) and not rest[i].startswith("--"):
            values.append(rest[i])
            i += 1
        if key == "port" and len(values) == 1 and values[0].isdigit():
            result.port = int(values[0])
            result.args[key] = "{port}"
        elif not values:
            result.args[key] = True
        elif len(values) == 1:
            v = values[0]
            result.args[key] = int(v) if re.fullmatch(r"-?[0-9]+", v) else v
        else:
            result.args[key] = values


def _toml_str(value: str) -> str:
    if '"' in value and "'" not in value and "\n" not in value:
        return f"'{value}'"
    return json.dumps(value)


def _toml_key(key: str) -> str:
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else json.dumps(key)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return _toml_str(str(value))


def profile_toml(c: Converted, source: str, engine: str = "vllm") -> str:
    """The profile file's text."""
    lines = [
        f"# Converted by `servegate init` from {source}: every exported variable and every",
        "# argument of its command, with its paths as parameters. `servegate render` shows",
        "# the command it makes; edit this file, not the script, from now on.",
    ]
    for note in c.skipped:
        lines.append(f"# not converted: {note}")
    lines += ["[profile]", f"description = {_toml_str('converted from ' + source)}",
              f"engine = {_toml_str(engine)}", ""]  # fmt: skip
    if c.params:
        lines.append("[params]")
        lines += [f"{_toml_key(k)} = {_toml_str(v)}" for k, v in c.params.items()]
        lines.append("")
    lines.append("[launch]")
    if c.module:
        lines += [f"interpreter = {_toml_str(c.interpreter)}", f"module = {_toml_str(c.module)}"]
    else:
        lines.append(f"executable = {_toml_str(c.executable)}")
    if c.positional:
        lines.append(f"positional = {_toml_value(c.positional)}")
    lines += ['cwd = "{release}"', ""]
    if c.env:
        lines.append("[env]")
        lines += [f"{_toml_key(k)} = {_toml_str(v)}" for k, v in c.env.items()]
        lines.append("")
    if c.args:
        lines.append("[args]")
        lines += [f"{_toml_key(k)} = {_toml_value(v)}" for k, v in c.args.items()]
        lines.append("")
    return "\n".join(lines)
