"""Run only the GPU tests a change touches.

The changed files since the merge base with ``focus.base`` are matched against the
focus map: each rule's source globs (``!glob`` excludes) select its tests; ignored
files (docs) select nothing; a changed file no rule covers selects the configured
wider set, never nothing; ``always`` tests join any non-empty selection. An
environment variable or a pull-request label runs everything.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import git

from servegate.config import Build, Focus
from servegate.errors import GitRefusal
from servegate.pipeline.git import open_repo


@cache
def _regex(pattern: str) -> re.Pattern[str]:
    out, i = "", 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        elif pattern[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif pattern[i] == "?":
            out, i = out + "[^/]", i + 1
        else:
            out, i = out + re.escape(pattern[i]), i + 1
    return re.compile(out + r"\Z")


def matches(path: str, globs: tuple[str, ...]) -> bool:
    """True when ``path`` matches a glob and no ``!glob`` after it."""
    hit = False
    for glob in globs:
        if glob.startswith("!"):
            if hit and _regex(glob[1:]).match(path):
                hit = False
        elif _regex(glob).match(path):
            hit = True
    return hit


@dataclass
class Selection:
    changed: list[str]
    run_all: str = ""  # why everything runs, if it does
    #: test path → why it was chosen
    tests: dict[str, list[str]] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)

    def add(self, tests: tuple[str, ...], why: str) -> None:
        for test in tests:
            self.tests.setdefault(test, []).append(why)

    def as_dict(self) -> dict[str, Any]:
        return {
            "changed": self.changed,
            "run_all": self.run_all,
            "tests": self.tests,
            "warnings": self.warnings,
        }


def changed_files(checkout: Path, base: str, built: tuple[str, ...] = ()) -> list[str]:
    """Files that differ from the merge base with ``base``: tracked changes, and untracked
    files except what the build writes (``built``: globs of its outputs and logs) — a
    fresh ``servegate build`` is no change to test."""
    repo = open_repo(checkout)
    try:
        merge_base = repo.git.merge_base(base, "HEAD")
    except git.GitCommandError:
        raise GitRefusal(
            f"the diff base {base!r} does not exist in {checkout}",
            hint="fetch it (git fetch origin) or pass --base with a branch, tag or SHA",
        ) from None
    tracked = repo.git.diff("--name-only", merge_base).splitlines()
    untracked = repo.git.ls_files("--others", "--exclude-standard").splitlines()
    untracked = [f for f in untracked if not (built and matches(f, built))]
    return sorted(set(tracked) | set(untracked))


def labels_from(environ: Mapping[str, str], given: list[str]) -> set[str]:
    """Labels passed on the command line, in SERVEGATE_PR_LABELS, or in the GitHub event."""
    labels = set(given) | {
        x.strip() for x in environ.get("SERVEGATE_PR_LABELS", "").split(",") if x.strip()
    }
    event = environ.get("GITHUB_EVENT_PATH")
    if event and Path(event).is_file():
        pr = json.loads(Path(event).read_text()).get("pull_request") or {}
        labels |= {str(label.get("name")) for label in pr.get("labels", [])}
    return labels


def check_map(focus: Focus, checkout: Path) -> list[str]:
    """Warnings for focus-map entries that match no file of the checkout."""
    files = open_repo(checkout).git.ls_files().splitlines()
    warnings = []
    for n, rule in enumerate(focus.rules, 1):
        for glob in rule.sources:
            if not glob.startswith("!") and not any(matches(f, (glob,)) for f in files):
                warnings.append(f"focus rule {n}: source glob {glob!r} matches no file")
        for test in rule.tests:
            if not (checkout / test.split("::")[0]).exists():
                warnings.append(f"focus rule {n}: test {test!r} does not exist")
    return warnings


def run_all_reason(focus: Focus, environ: Mapping[str, str], labels: list[str]) -> str:
    if environ.get(focus.run_all_env, "") not in ("", "0"):
        return f"{focus.run_all_env}={environ[focus.run_all_env]}"
    if focus.run_all_label in labels_from(environ, labels):
        return f"label {focus.run_all_label!r}"
    return ""


def select(
    focus: Focus,
    checkout: Path,
    base: str,
    environ: Mapping[str, str],
    labels: list[str],
    built: tuple[str, ...] = (),
) -> Selection:
    run_all = run_all_reason(focus, environ, labels)
    if run_all:  # no diff needed (nor a git checkout)
        sel = Selection([], run_all=run_all)
        sel.add(focus.all_tests, f"run all: {run_all}")
        return sel
    sel = Selection(changed_files(checkout, base, built), warnings=check_map(focus, checkout))
    relevant = [f for f in sel.changed if not matches(f, focus.ignore)]
    for path in relevant:
        hits = [n for n, rule in enumerate(focus.rules, 1) if matches(path, rule.sources)]
        for n in hits:
            sel.add(focus.rules[n - 1].tests, f"{path} (rule {n})")
        if not hits:
            sel.add(focus.fallback, f"{path} matched no rule: fallback")
    if relevant:
        sel.add(focus.always, "always")
    return sel


def build_outputs(build: Build) -> tuple[str, ...]:
    """Globs of what ``servegate build`` and the build command write into a checkout:
    the artifacts, every target's library, and the build logs."""
    out = [*build.artifacts, "build/logs/**"]
    for target in build.targets:
        out += [target.output] if target.output else []
        out += list(target.outputs)
    return tuple(dict.fromkeys(o for o in out if o))
