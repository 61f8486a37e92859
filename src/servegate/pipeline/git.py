"""All git work in one place: the repositories servegate keeps, through GitPython, here;
the one-off reads that need no repository object through :func:`servegate.pipeline.
gitenv.run` (both with the same scrubbed environment; ``tests/test_layout.py`` holds
every other module to it).

The host keeps one bare clone of the stack's remote (``repo.git`` under the host root);
each release is a worktree of it. ``InPlaceCheckout`` covers the other strategy, a plain
clone that is switched and fast-forwarded where it stands.
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import git

from servegate.errors import CommandFailed, GitRefusal
from servegate.pipeline import proc
from servegate.pipeline.gitenv import SAFE_ENV, scrub_git_env

NOTES_REF = "refs/notes/servegate"
#: origin's notes as last fetched; merged into NOTES_REF, never written over it
ORIGIN_NOTES_REF = "refs/notes/servegate-origin"
#: the signed in-toto attestations of the releases (``servegate.release.attest``), one
#: DSSE envelope a line, beside the records and merged and pushed like them
ATTEST_REF = "refs/notes/servegate-attestations"
#: origin's notes refs as last fetched: each merged into its own, never written over it
ORIGIN_OF = {NOTES_REF: ORIGIN_NOTES_REF, ATTEST_REF: "refs/notes/servegate-attestations-origin"}
#: seconds a git command that talks to the remote may take (the host lock is held)
NETWORK_TIMEOUT = 300.0
#: the largest release note merged from origin (one commit's records, a few kB each)
MAX_NOTE = 1024 * 1024
#: all of origin's release notes together, at most
MAX_NOTES = 64 * 1024 * 1024
#: who merges notes (the merge commit needs a committer; the records keep their authors)
NOTES_MERGER = ("servegate", "servegate@localhost")
SHA_RE = re.compile(r"^[0-9a-fA-F]{4,40}$")


#: seconds a local git command may take (status, notes, tags, worktrees): a hung one
#: (a lock held on a stalled disk) must not hold the host lock for ever
LOCAL_TIMEOUT = 120.0


class _TimedGit(git.Git):
    """Every git command servegate runs has a deadline: the network's where the caller
    gives one (``kill_after_timeout``), ``LOCAL_TIMEOUT`` otherwise."""

    def execute(self, command: Any, *args: Any, **kwargs: Any) -> Any:
        if not kwargs.get("as_process"):
            kwargs.setdefault("kill_after_timeout", LOCAL_TIMEOUT)
        try:
            return super().execute(command, *args, **kwargs)
        except KeyboardInterrupt:
            _end_watched_commands()
            raise


def _end_watched_commands() -> None:
    """Ctrl-C during a git command: GitPython's deadline is a non-daemon timer thread
    that is not cancelled when the wait is interrupted, so the interpreter would wait
    out the whole deadline (minutes) before exiting, with git still running. End the
    command now, as the timer would have, and cancel the timer."""
    for thread in threading.enumerate():
        if (
            isinstance(thread, threading.Timer)
            and getattr(thread.function, "__module__", "") == git.cmd.__name__
        ):
            thread.cancel()
            with suppress(Exception):
                thread.function(*thread.args)


class _TimedRepo(git.Repo):
    GitCommandWrapperType = _TimedGit


def open_repo(path: Path) -> git.Repo:
    """A Repo for git commands, each with a deadline (:class:`_TimedGit`). servegate asks
    git (rev-parse, log, merge-base) rather than reading objects through GitPython, so no
    long-lived ``git cat-file`` children outlive a command. Its commands run with
    :data:`SAFE_ENV`."""
    repo = _TimedRepo(path)
    repo.git.update_environment(**SAFE_ENV)
    return repo


def head_of(repo: git.Repo, rev: str = "HEAD") -> str:
    return str(repo.git.rev_parse("--verify", f"{rev}^{{commit}}"))


def _fail(action: str, exc: git.GitCommandError) -> CommandFailed:
    detail = (exc.stderr or exc.stdout or "").strip().removeprefix("stderr:").strip(" '\n")
    return CommandFailed(f"git {action} failed: {detail}")


@contextmanager
def _git_errors(action: str) -> Iterator[None]:
    try:
        yield
    except git.GitCommandError as exc:
        raise _fail(action, exc) from exc


def check_sha_syntax(sha: str) -> str:
    if not SHA_RE.match(sha):
        raise GitRefusal(
            f"{sha!r} is not a commit SHA",
            hint="pass a full 40-character SHA or an unambiguous prefix (`git rev-parse`)",
        )
    return sha.lower()


class Identity:
    """Who tags and notes are made by; git refuses both without one."""

    def __init__(self, name: str, email: str) -> None:
        self.env = {
            "GIT_AUTHOR_NAME": name,
            "GIT_AUTHOR_EMAIL": email,
            "GIT_COMMITTER_NAME": name,
            "GIT_COMMITTER_EMAIL": email,
        }


class StackRepo:
    """A local repository of the stack with its remote ``origin``: the checks and records
    shared by both deploy strategies."""

    repo: git.Repo

    def __init__(self, path: Path, remote_url: str, branch: str) -> None:
        self.path = path
        self.remote_url = remote_url
        self.branch = branch
        #: why origin's notes were left unmerged at the last fetch ("" when they were not)
        self.notes_warning = ""

    @property
    def branch_ref(self) -> str:
        return f"refs/remotes/origin/{self.branch}"

    def fetch(self) -> None:
        """Fetch every branch (to tell "not on the branch" from "unknown") and the notes."""
        with _git_errors(f"fetch from {self.remote_url}"):
            self.repo.git.fetch(
                "--prune", "origin", "+refs/heads/*:refs/remotes/origin/*", "--no-tags",
                kill_after_timeout=NETWORK_TIMEOUT,
            )  # fmt: skip
            self.fetch_notes()
        if not self._exists(self.branch_ref):
            raise GitRefusal(
                f"branch {self.branch!r} does not exist on {self.remote_url}",
                hint="fix [stack] branch in the config, or push the branch",
            )

    def fetch_notes(self) -> None:
        """Origin's release notes and attestations, merged into ours: a record made here
        and not yet pushed (origin was down, the push was refused) is never written over.
        One ``ls-remote`` and one fetch for both refs."""
        with _git_errors(f"fetch notes from {self.remote_url}"):
            listed = str(
                self.repo.git.ls_remote("origin", *ORIGIN_OF, kill_after_timeout=NETWORK_TIMEOUT)
            )
            there = [ref for ref in ORIGIN_OF if any(
                line.split("\t")[-1] == ref for line in listed.splitlines())]  # fmt: skip
            if there:
                self.repo.git.fetch("origin", *[f"+{ref}:{ORIGIN_OF[ref]}" for ref in there],
                                    kill_after_timeout=NETWORK_TIMEOUT)  # fmt: skip
        warnings = [w for ref in there if (w := self._merge_notes(ref))]
        self.notes_warning = "; ".join(warnings)

    def _merge_notes(self, ref: str) -> str:
        """Merge origin's ``ref`` as fetched into ours; why it was left unmerged ("" when it
        was merged)."""
        origin_ref = ORIGIN_OF[ref]
        warning = self._oversized_notes(origin_ref)
        if warning:
            return warning  # origin's notes stay unmerged: ours, and the records in them, unchanged
        if not self._ref_exists(ref):
            self.repo.git.update_ref(ref, origin_ref)
            return ""
        merger = Identity(*NOTES_MERGER)
        with _git_errors("notes merge"), self.repo.git.custom_environment(**merger.env):
            # one JSON document a line: the union of both sides' lines loses none
            self.repo.git.notes("--ref", ref, "merge", "-q", "-s", "cat_sort_uniq", origin_ref)
        return ""

    def _oversized_notes(self, origin_ref: str = ORIGIN_NOTES_REF) -> str:
        """Why origin's notes are not merged ("" when they are fit to be): a note larger
        than :data:`MAX_NOTE` or all of them beyond :data:`MAX_NOTES` — anyone who may push
        to origin writes that ref, and every command that reads records would read it."""
        what = "attestations" if origin_ref == ORIGIN_OF[ATTEST_REF] else "release notes"
        with _git_errors("notes size"):
            listing = str(self.repo.git.ls_tree("-r", "-l", "-z", origin_ref))
        total, biggest, where = 0, 0, ""
        for entry in listing.split("\0"):
            meta, _, path = entry.partition("\t")
            parts = meta.split()
            if len(parts) != 4 or not parts[3].isdigit():
                continue
            size = int(parts[3])
            total += size
            if size > biggest:
                biggest, where = size, path.replace("/", "")
        if biggest > MAX_NOTE:
            return (
                f"origin's {what} were not merged: the note on {where[:12]} holds "
                f"{biggest:,} bytes (a record is a few kB; at most {MAX_NOTE:,} are read)"
            )
        if total > MAX_NOTES:
            return (
                f"origin's {what} were not merged: they hold {total:,} bytes (at most "
                f"{MAX_NOTES:,} are read)"
            )
        return ""

    def _ref_exists(self, ref: str) -> bool:
        try:
            self.repo.git.rev_parse("--verify", "--quiet", ref)
        except git.GitCommandError:
            return False
        return True

    def _exists(self, rev: str) -> bool:
        try:
            self.repo.git.rev_parse("--verify", "--quiet", f"{rev}^{{commit}}")
        except git.GitCommandError:
            return False
        return True

    def has_ref(self, ref: str) -> bool:
        """Whether ``ref`` (a full ``refs/…`` name) resolves in this repository."""
        try:
            self.repo.git.rev_parse("--verify", "--quiet", "--end-of-options", ref)
        except git.GitCommandError:
            return False
        return True

    def resolve(self, sha: str) -> str:
        sha = check_sha_syntax(sha)
        try:
            full = str(self.repo.git.rev_parse("--verify", "--quiet", f"{sha}^{{commit}}"))
        except git.GitCommandError:
            raise GitRefusal(
                f"commit {sha} does not exist on {self.remote_url} (after fetching every branch)",
                hint="push the commit to the configured branch first, or check the SHA for typos",
            ) from None
        return full

    def require_on_branch(self, sha: str) -> None:
        if not self.is_ancestor(sha, self.branch_ref):
            raise GitRefusal(
                f"commit {sha[:12]} is not on branch {self.branch!r} of {self.remote_url}",
                hint=f"merge it into {self.branch!r} first; only commits on the configured "
                "branch are released",
            )

    def is_ancestor(self, ancestor: str, descendant: str) -> bool:
        try:
            self.repo.git.merge_base("--is-ancestor", ancestor, descendant)
        except git.GitCommandError as exc:
            if exc.status == 1:
                return False
            raise _fail("merge-base --is-ancestor", exc) from exc
        return True

    def subject(self, sha: str) -> str:
        return str(self.repo.git.log("-1", "--format=%s", sha))

    def tag(self, name: str, sha: str, message: str, identity: Identity) -> None:
        with _git_errors(f"tag {name}"), self.repo.git.custom_environment(**identity.env):
            self.repo.git.tag("-a", "-f", name, sha, "-m", message)

    def append_note(self, sha: str, text: str, identity: Identity, ref: str = NOTES_REF) -> None:
        with tempfile.NamedTemporaryFile("w", suffix=".json") as handle:
            handle.write(text)
            handle.flush()
            with _git_errors("notes append"), self.repo.git.custom_environment(**identity.env):
                self.repo.git.notes("--ref", ref, "append", "-F", handle.name, sha)

    def notes(self, sha: str, ref: str = NOTES_REF) -> str:
        """The note on ``sha``; "" when it has none. Any other failure raises."""
        try:
            return str(self.repo.git.notes("--ref", ref, "show", sha))
        except git.GitCommandError as exc:
            if "no note found" in str(exc.stderr):
                return ""
            raise _fail(f"notes show {sha[:12]}", exc) from exc

    def noted(self) -> list[str]:
        """Every commit that carries a release note (``git notes list``)."""
        with _git_errors("notes list"):
            text = str(self.repo.git.notes("--ref", NOTES_REF, "list"))
        return [line.split()[1] for line in text.splitlines() if len(line.split()) == 2]

    def show_file(self, rev: str, path: str) -> bytes | None:
        """``path`` at ``rev`` (``git show rev:path``); None when it is not there."""
        try:
            blob = self.repo.git.cat_file("blob", f"{rev}:{path}", stdout_as_string=False)
        except git.GitCommandError:
            return None
        return bytes(blob)

    def push(self, refs: list[str]) -> None:
        with _git_errors(f"push to {self.remote_url}"):
            self.repo.git.push("origin", *refs, kill_after_timeout=NETWORK_TIMEOUT)
            for ref, origin_ref in ORIGIN_OF.items():
                if f"{ref}:{ref}" in refs:  # origin now holds what we hold
                    self.repo.git.update_ref(origin_ref, ref)


class HostRepo(StackRepo):
    """The bare clone under the host root that every release worktree comes from."""

    def __init__(self, path: Path, remote_url: str, branch: str) -> None:
        super().__init__(path, remote_url, branch)
        self._repo: git.Repo | None = None

    @property
    def repo(self) -> git.Repo:
        """Opened — made, on a new host — when first used: a command that only reads
        (verify, status, a rollback with nothing to go back to) leaves a bare host bare."""
        if self._repo is None:
            self._repo = self._open()
        return self._repo

    @repo.setter
    def repo(self, value: git.Repo) -> None:
        self._repo = value

    def _open(self) -> git.Repo:
        with _git_errors("init"):
            if not (self.path / "HEAD").exists():
                self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)  # the host root
                repo = git.Repo.init(self.path, bare=True)
                repo.create_remote("origin", self.remote_url)
                return repo
            repo = open_repo(self.path)
            if repo.remote("origin").url != self.remote_url:
                repo.remote("origin").set_url(self.remote_url)
            return repo

    def add_worktree(self, path: Path, sha: str) -> None:
        with _git_errors(f"worktree add {path}"):
            self.repo.git.worktree("prune")
            self.repo.git.worktree("add", "--detach", "--force", str(path), sha)

    def remove_worktree(self, path: Path) -> None:
        with _git_errors(f"worktree remove {path}"):
            self.repo.git.worktree("remove", "--force", str(path))


def worktree_head(path: Path) -> str:
    return head_of(open_repo(path))


def worktree_top(path: Path) -> str:
    """The directory git reads as the checkout's work tree: ``path`` itself, unless the
    checkout's configuration (``core.worktree``, a ``.git`` file naming another gitdir
    that sets it) points git at another directory."""
    return str(open_repo(path).git.rev_parse("--show-toplevel")).strip()


def dirty_files(path: Path, rev: str = "HEAD") -> list[str]:
    """Tracked files that are not what commit ``rev`` holds, one ``XY path`` a line:
    ``git status`` (the index's view) and, because a build can rewrite the index
    (``update-index --skip-worktree`` or ``--assume-unchanged`` hide an edit from
    ``status``), every file of ``rev``'s tree hashed from disk as a Git blob, with no
    filters and no index (:func:`tree_changes`)."""
    with _git_errors("status"):
        out = open_repo(path).git.status("--porcelain", "--untracked-files=no")
    lines = [line for line in str(out).splitlines() if line.strip()]
    seen = {line[3:] for line in lines}
    return lines + [line for line in tree_changes(path, rev) if line[3:] not in seen]


def tree_changes(path: Path, rev: str = "HEAD") -> list[str]:
    """Files of ``rev``'s tree whose content, kind or executable bit on disk differs:
    `` M path`` (content or mode), `` D path`` (missing), `` T path`` (a link for a
    file or the other way). Hashed here, not asked of git's index or its stat cache."""
    repo = open_repo(path)
    fmt = str(repo.git.rev_parse("--show-object-format")).strip() or "sha1"
    listing = str(repo.git.ls_tree("-r", "-z", "--full-tree", rev))
    root = Path(str(repo.git.rev_parse("--show-toplevel")).strip())
    changes: list[str] = []
    for entry in listing.split("\0"):
        if not entry:
            continue
        meta, _, rel = entry.partition("\t")
        mode, kind, oid = meta.split()
        if kind != "blob":
            continue  # a submodule's commit
        full = root / rel
        try:
            if mode == "120000":
                if not full.is_symlink():
                    changes.append(f" T {rel}")
                    continue
                data = os.fsencode(os.readlink(full))
            else:
                if full.is_symlink() or not full.is_file():
                    changes.append(f" {'T' if full.exists() else 'D'} {rel}")
                    continue
                data = full.read_bytes()
                if (mode == "100755") != bool(full.stat().st_mode & 0o100):
                    changes.append(f" M {rel}")
                    continue
        except OSError:
            changes.append(f" D {rel}")
            continue
        blob = hashlib.new(fmt, b"blob %d\0" % len(data) + data).hexdigest()
        if blob != oid:
            changes.append(f" M {rel}")
    return changes


def escaping_links(path: Path, rev: str = "HEAD") -> list[str]:
    """Symbolic links ``rev`` tracks whose target, followed on this box, lies outside the
    work tree: ``rel -> target`` each. Git hashes a link's text, never what it points
    at, so the file behind ``pkg/hook.py -> /tmp/x.py`` is in no commit, no tree hash and
    no provenance check, and can change after the release; a link that stays inside
    the tree points at a tracked (or built) file, which they do cover."""
    repo = open_repo(path)
    root = os.path.realpath(str(repo.git.rev_parse("--show-toplevel")).strip())
    listing = str(repo.git.ls_tree("-r", "-z", "--full-tree", rev))
    out = []
    for entry in listing.split("\0"):
        meta, _, rel = entry.partition("\t")
        if not meta.startswith("120000 "):
            continue
        full = os.path.join(root, rel)
        if not os.path.islink(full):
            continue  # not a link on disk: tree_changes reports it
        resolved = os.path.realpath(full)
        if resolved != root and not resolved.startswith(root + os.sep):
            out.append(f"{rel} -> {os.readlink(full)}")
    return out


class InPlaceCheckout(StackRepo):
    """A plain clone that the service runs from directly (the seeds' "in-place" way)."""

    def __init__(self, path: Path, remote_url: str, branch: str) -> None:
        super().__init__(path, remote_url, branch)
        if not (path / ".git").exists():  # GitPython's clone_from takes no deadline
            proc.run(["git", "clone", "--branch", branch, "--", remote_url, str(path)],
                     timeout=NETWORK_TIMEOUT)  # fmt: skip
        self.repo = open_repo(path)

    def require_clean(self) -> None:
        dirty = dirty_files(self.path)
        if dirty:
            shown = "\n".join(f"    {line}" for line in dirty[:20])
            raise GitRefusal(
                f"the in-place checkout {self.path} has uncommitted changes:\n{shown}",
                hint="commit and push them through Git, or discard them "
                "(`git -C PATH checkout -- .`); servegate only deploys what is in Git",
            )

    def pull_to(self, expected: str) -> None:
        """The seed's exact steps: switch, pull --ff-only, HEAD must equal ``expected``."""
        with _git_errors(f"switch/pull {self.branch}"):
            self.repo.git.switch(self.branch)
            self.repo.git.pull(
                "--ff-only", "origin", self.branch, kill_after_timeout=NETWORK_TIMEOUT
            )
        head = self.head()
        if head != expected:
            raise GitRefusal(
                f"after `git pull --ff-only` HEAD is {head[:12]}, not the expected {expected[:12]}",
                hint=f"in-place deploys release the tip of {self.branch!r}; promote the tip, or "
                "use the worktree strategy to release an older commit",
            )

    def detach_to(self, sha: str) -> None:
        with _git_errors(f"switch --detach {sha[:12]}"):
            self.repo.git.switch("--detach", sha)

    def head(self) -> str:
        return head_of(self.repo)


def environ_without_git() -> dict[str, str]:
    env = dict(os.environ)
    scrub_git_env(env)
    return env


def init_repo(path: Path, bare: bool = False, branch: str = "main") -> git.Repo:
    path.mkdir(parents=True, exist_ok=True)
    return git.Repo.init(path, bare=bare, initial_branch=branch)


def commit_all(path: Path, message: str, identity: Identity) -> str:
    """Stage everything in the work tree of ``path`` and commit it; returns the SHA."""
    repo = open_repo(path)
    with repo.git.custom_environment(**identity.env):
        repo.git.add("--all")
        repo.git.commit("--quiet", "--allow-empty", "-m", message)
    return head_of(repo)


def push_branch(path: Path, branch: str = "main") -> None:
    with _git_errors(f"push {branch}"):
        open_repo(path).git.push("--quiet", "origin", f"HEAD:refs/heads/{branch}")
