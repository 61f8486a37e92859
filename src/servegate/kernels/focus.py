"""Run only the GPU tests a change touches.

The changed files since the merge base with ``focus.base`` are matched against the
focus map: each rule's source globs (``!glob`` excludes) select its tests; ignored
files (docs) select nothing; a changed file no rule covers selects the configured
wider set, never nothing; ``always`` tests join any non-empty selection. An
environment variable or a pull-request label runs everything.

The diff is read the way the build sees the tree, whatever the user's git config says:
a rename is its old path and its new one, a submodule whose commit moved is a change
(``ignore = all`` in ``.gitmodules`` notwithstanding), paths come NUL-separated and
unquoted, and a changed file that a tracked symbolic link points at (or lies under a
folder one points at) is a change of the link's path as well.
"""

from __future__ import annotations

import json
import posixpath
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import git

from servegate.config import Build, Focus
from servegate.errors import GitRefusal
from servegate.pipeline.git import head_of, open_repo


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
    #: a tracked symlink's path → the changed file it points at (or into)
    linked: dict[str, str] = field(default_factory=dict)
    #: the merge base the diff starts from and HEAD, as SHAs
    merge_base: str = ""
    head: str = ""

    def add(self, tests: tuple[str, ...], why: str) -> None:
        for test in tests:
            self.tests.setdefault(test, []).append(why)

    def as_dict(self) -> dict[str, Any]:
        return {
            "changed": self.changed,
            "run_all": self.run_all,
            "tests": self.tests,
            "warnings": self.warnings,
            "linked": self.linked,
            "merge_base": self.merge_base,
            "head": self.head,
        }


#: diff options that keep the user's git config out of the list of changed paths
DIFF_PLUMBING = (
    "--name-only",
    "-z",
    "--no-renames",
    "--ignore-submodules=none",
    "--no-ext-diff",
    "--no-textconv",
    "--no-relative",
)


def merge_base_of(checkout: Path, base: str) -> str:
    try:
        return str(open_repo(checkout).git.merge_base(base, "HEAD"))
    except git.GitCommandError:
        raise GitRefusal(
            f"the diff base {base!r} does not exist in {checkout}",
            hint="fetch it (git fetch origin) or pass --base with a branch, tag or SHA",
        ) from None


def changed_files(checkout: Path, base: str, built: tuple[str, ...] = ()) -> list[str]:
    """Files that differ from the merge base with ``base``: tracked changes (both paths
    of a rename, a moved submodule), and untracked files except what the build writes
    (``built``: globs of its outputs and logs) — a fresh ``servegate build`` is no
    change to test."""
    repo = open_repo(checkout)
    tracked = repo.git.diff(*DIFF_PLUMBING, merge_base_of(checkout, base), "--").split("\0")
    untracked = repo.git.ls_files("-z", "--others", "--exclude-standard").split("\0")
    untracked = [f for f in untracked if not (built and matches(f, built))]
    return sorted((set(tracked) | set(untracked)) - {""})


def symlinks(checkout: Path) -> dict[str, str]:
    """Tracked symbolic links → the path in the repository they point at (links that
    point outside it are left out)."""
    repo = open_repo(checkout)
    links = {}
    for entry in repo.git.ls_files("-s", "-z").split("\0"):
        mode, _, rest = entry.partition(" ")
        if mode != "120000":
            continue
        oid, path = rest.split(" ", 1)[0], rest.split("\t", 1)[1]
        target = repo.git.cat_file("blob", oid)
        resolved = posixpath.normpath(posixpath.join(posixpath.dirname(path), target))
        if not (target.startswith("/") or resolved == ".." or resolved.startswith("../")):
            links[path] = resolved
    return links


def _through(link: str, target: str, path: str) -> str:
    """``path`` as seen through ``link``, which points at ``target`` ("" if not there)."""
    if path == target:
        return link
    if target == ".":
        return f"{link}/{path}"
    return link + path[len(target) :] if path.startswith(target + "/") else ""


def linked_changes(changed: list[str], links: dict[str, str]) -> dict[str, str]:
    """Paths that change because a tracked link points at a changed file or into a
    changed folder's file (links of links followed, up to 8 deep) → that changed file."""
    found: dict[str, str] = {}
    todo = {path: path for path in changed}
    for _ in range(8):
        more = {}
        for path, origin in todo.items():
            for link, target in links.items():
                alias = _through(link, target, path)
                if alias and alias not in found and alias not in changed:
                    more[alias] = origin
        found.update(more)
        todo = more
    return found


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
    """Warnings for focus-map entries that match no file of the checkout: tracked, or
    untracked and not ignored (the changes focus selects on include those)."""
    files = (
        open_repo(checkout).git.ls_files("--cached", "--others", "--exclude-standard").splitlines()
    )
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
    sel.merge_base, sel.head = merge_base_of(checkout, base), head_of(open_repo(checkout))
    sel.linked = linked_changes(sel.changed, symlinks(checkout))
    relevant = [f for f in [*sel.changed, *sel.linked] if not matches(f, focus.ignore)]
    for path in relevant:
        name = f"{path} (links to changed {sel.linked[path]})" if path in sel.linked else path
        hits = [n for n, rule in enumerate(focus.rules, 1) if matches(path, rule.sources)]
        for n in hits:
            sel.add(focus.rules[n - 1].tests, f"{name} (rule {n})")
        if not hits:
            sel.add(focus.fallback, f"{name} matched no rule: fallback")
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
