"""A launch as text: the shell block a person would run, the environment, the unit."""

from __future__ import annotations

import shlex

from servegate.engine.launch import LaunchSpec
from servegate.engine.managers.systemd import render_unit


def shell(spec: LaunchSpec, title: str = "") -> str:
    """``export`` lines, an ``args=( … )`` array, ``exec`` — the seed's run-command shape."""
    program, rest = spec.argv[0], spec.argv[1:]
    lines = [f"# {title}"] if title else []
    lines += ["set -euo pipefail", "", f"cd {shlex.quote(str(spec.cwd))}", ""]
    lines += [f"export {k}={shlex.quote(v)}" for k, v in spec.env.items()]
    lines += ["", "args=("]
    lines += [f"  {' '.join(shlex.quote(w) for w in group)}" for group in _groups(rest)]
    lines += [")", "", f'exec {shlex.quote(program)} "${{args[@]}}"', ""]
    return "\n".join(lines)


def _groups(words: tuple[str, ...]) -> list[list[str]]:
    """One line per option with its values; ``-m module`` and positionals on their own."""
    groups: list[list[str]] = []
    for word in words:
        module_done = bool(groups) and groups[-1][0] == "-m" and len(groups[-1]) == 2
        if word.startswith("-") or not groups or module_done:
            groups.append([word])
        else:
            groups[-1].append(word)
    return groups


def environment(spec: LaunchSpec) -> str:
    """``NAME=value`` per line, shell-quoted (an EnvironmentFile or ``env`` input)."""
    return "".join(f"{k}={shlex.quote(v)}\n" for k, v in spec.env.items())


def unit(spec: LaunchSpec) -> str:
    return render_unit(spec)
