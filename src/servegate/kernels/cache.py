"""The build cache: a finished build is kept under a key made of everything that decides
its result — the contents of the sources and of every file the compiler includes, the
toolchain, the recipe (flags, CMake arguments), the build environment and the arch list.
Same key: the outputs are copied back, nothing compiles.

A cache hit puts files into a release that nothing compiled, so the cache is trusted no
further than who can write it. An entry is read only when the cache folder, every folder
above it, the entry and its files can be written by this user alone (root's folders and
sticky ones like /tmp allowed, as OpenSSH's StrictModes allows them), when its manifest
names the key it is read for, and when it holds exactly the target's outputs, inside the
checkout; each file is hashed as it is copied and must match. Anything else is a miss
that says why, and the target is compiled. Written here rather than taken from a library:
ccache and sccache cache compiler calls, not a target's finished libraries, and neither
checks who wrote an entry.
"""

from __future__ import annotations

import contextlib
import fnmatch
import hashlib
import json
import os
import shutil
import stat
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from servegate.kernels import inspect
from servegate.pipeline import atomic
from servegate.pipeline.hashing import sha256_file

PARTS = ("sources", "includes", "toolchain", "recipe", "environment", "archs")


@dataclass(frozen=True)
class Key:
    digest: str
    parts: dict[str, Any]

    @classmethod
    def make(
        cls,
        recipe: dict[str, Any],
        sources: dict[str, str],
        tools: dict[str, str],
        archs: tuple[str, ...],
        includes: dict[str, str] | None = None,
        environment: dict[str, str] | None = None,
    ) -> Key:
        parts = {
            "recipe": recipe,
            "sources": sources,
            "includes": includes or {},
            "toolchain": tools,
            "environment": environment or {},
            "archs": list(archs),
        }
        blob = json.dumps(parts, sort_keys=True)
        # compared later with the JSON of an earlier build: keep JSON's types (lists)
        return cls(hashlib.sha256(blob.encode()).hexdigest(), json.loads(blob))


def source_hashes(checkout: Path, files: list[Path]) -> dict[str, str]:
    return {str(f.relative_to(checkout)): sha256_file(f) for f in files}


def why_rebuild(previous: dict[str, Any] | None, key: Key) -> str:
    """Which of the inputs differ from the target's last build."""
    if previous is None:
        return "no earlier build of this target"
    old = previous.get("parts", {})
    changed = [part for part in PARTS if old.get(part, {}) != key.parts[part]]
    for part in ("sources", "includes", "environment"):
        if part in changed:
            before, after = old.get(part) or {}, key.parts[part]
            names = sorted(f for f in set(before) | set(after) if before.get(f) != after.get(f))
            changed[changed.index(part)] = f"{part} ({', '.join(names[:5])})"
    return "changed: " + ", ".join(changed) if changed else "the earlier entry is gone"


def _writable_by_others(info: os.stat_result, owners: tuple[int, ...]) -> str:
    if info.st_uid not in owners:
        return f"owned by uid {info.st_uid}"
    if info.st_mode & 0o022 and not (stat.S_ISDIR(info.st_mode) and info.st_mode & stat.S_ISVTX):
        return f"writable by others (mode {oct(stat.S_IMODE(info.st_mode))})"
    return ""


def untrusted(path: Path) -> str:
    """Why ``path`` (a folder) could be written by someone else ("": it cannot): it, or a
    folder above it (as written and as resolved), is another user's (root aside) or
    writable by group or others without the sticky bit."""
    me = os.geteuid()
    info = os.lstat(path)
    if stat.S_ISLNK(info.st_mode):
        if info.st_uid not in (0, me):  # its owner could point it elsewhere
            return f"{path} is a link of uid {info.st_uid}"
        info = os.stat(path)
    if not stat.S_ISDIR(info.st_mode):
        return f"{path} is not a folder"
    if info.st_uid != me or info.st_mode & 0o022:
        return (
            f"{path} is not this user's alone (owner uid {info.st_uid}, mode "
            f"{oct(stat.S_IMODE(info.st_mode))})"
        )
    absolute = Path(os.path.abspath(path))
    for above in absolute.parents:  # as written: a link's owner could point it elsewhere
        info = os.lstat(above)
        if stat.S_ISLNK(info.st_mode):
            if info.st_uid not in (0, me):
                return f"{above}, above it, is a link of uid {info.st_uid}"
        elif why := _writable_by_others(info, (0, me)):
            return f"{above}, a folder above it, is {why}"
    for above in (*absolute.resolve().parents, absolute.resolve()):
        why = _writable_by_others(os.stat(above), (0, me))
        if why:
            return f"{above}, a folder above it, is {why}"
    return ""


def _private(info: os.stat_result, kind: int) -> bool:
    return (
        stat.S_IFMT(info.st_mode) == kind
        and info.st_uid == os.geteuid()
        and not info.st_mode & 0o022
    )


def _inside(rel: str) -> bool:
    parts = PurePosixPath(rel).parts
    return bool(parts) and not PurePosixPath(rel).is_absolute() and ".." not in parts


@dataclass(frozen=True)
class Miss:
    """Why an entry was not used ("" : there was none)."""

    why: str


class BuildCache:
    def __init__(self, root: Path) -> None:
        self.root = root

    @classmethod
    def open(cls, root: Path) -> tuple[BuildCache | None, str]:
        """The cache at ``root`` (made private when missing), or None and why it is not
        used: a folder others can write could hand a release a library nothing built
        from it."""
        try:
            root.mkdir(parents=True, mode=0o700, exist_ok=True)
            why = untrusted(root)
        except OSError as exc:
            return None, f"cache not used: {root}: {exc.strerror or exc}"
        if why:
            return None, (
                f"cache not used: {why}; give servegate a folder only this user can write "
                f"(chmod go-w, or --cache-dir)"
            )
        return cls(root), ""

    def _entry(self, name: str, key: Key) -> Path:
        return self.root / f"{name}-{key.digest[:20]}"

    def _read_json(self, path: Path) -> Any:
        """A JSON file of this cache, read without following a link, or None when it is
        missing, not this user's alone, or not JSON."""
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            return None
        with os.fdopen(fd, "rb") as f:
            if not _private(os.fstat(f.fileno()), stat.S_IFREG):
                return None
            try:
                return json.loads(f.read())
            except ValueError:
                return None

    def last(self, name: str) -> dict[str, Any] | None:
        doc = self._read_json(self.root / f"{name}.last.json")
        return doc if isinstance(doc, dict) else None

    def restore(
        self, name: str, key: Key, checkout: Path, expected: tuple[str, ...]
    ) -> dict[str, str] | Miss:
        """Copy a cached build's outputs into ``checkout``: their hashes, or why not.
        ``expected``: the target's outputs (paths or globs, relative to the checkout)."""
        entry = self._entry(name, key)
        try:
            info = os.lstat(entry)
        except FileNotFoundError:
            return Miss("")
        if not _private(info, stat.S_IFDIR):
            return Miss(f"the cached entry {entry} is not this user's alone: not used")
        manifest = self._read_json(entry / "manifest.json")
        if not isinstance(manifest, dict):
            return Miss("the cached entry is damaged (no readable manifest of this user's)")
        if manifest.get("key") != key.digest or manifest.get("parts") != key.parts:
            return Miss("the cached entry was made for other inputs than its name says")
        outputs = manifest.get("outputs")
        if not isinstance(outputs, dict) or not outputs or not all(
            isinstance(r, str) and isinstance(d, str) and _inside(r)
            and any(fnmatch.fnmatchcase(r, g) for g in expected)
            for r, d in outputs.items()
        ):  # fmt: skip
            return Miss(f"the cached entry's outputs are not the target's ({', '.join(expected)})")
        staged: list[tuple[Path, Path]] = []
        try:
            for rel, digest in outputs.items():
                dest = checkout / rel
                if not dest.parent.resolve().is_relative_to(checkout.resolve()):
                    return Miss(f"the cached output {rel} would land outside the checkout")
                dest.parent.mkdir(parents=True, exist_ok=True)
                tmp = _copy_checked(entry / "files" / rel, dest.parent, digest)
                if tmp is None:
                    return Miss(f"the cached entry is damaged ({rel} is not what it recorded)")
                staged.append((tmp, dest))
            named = _names_its_checkout(manifest.get("checkout"), checkout, staged)
            if named:
                return Miss(
                    f"the cached {named[0]} names the folder it was built in "
                    f"({manifest['checkout']}: __FILE__, an assert or debug info): built here"
                )
            for tmp, dest in staged:
                tmp.replace(dest)
            staged.clear()
        finally:
            for tmp, _ in staged:
                tmp.unlink(missing_ok=True)
        return dict(outputs)

    def store(
        self, name: str, key: Key, checkout: Path, files: list[Path], seconds: float
    ) -> dict[str, str]:
        entry = self._entry(name, key)
        tmp = entry.with_name(entry.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        outputs = {}
        for f in files:
            rel = str(f.relative_to(checkout))
            kept = tmp / "files" / rel
            inner = kept.parent.relative_to(tmp)
            for folder in (*reversed(inner.parents), inner):
                (tmp / folder).mkdir(mode=0o700, exist_ok=True)  # this user's alone
            shutil.copy2(f, kept)
            os.chmod(kept, stat.S_IMODE(os.stat(kept).st_mode) & ~0o022)
            outputs[rel] = sha256_file(kept)
        manifest = {
            "schema": 1,
            "name": name,
            "key": key.digest,
            "parts": key.parts,
            "outputs": outputs,
            "checkout": str(checkout),
            "seconds": round(seconds, 3),
            "at": time.time(),
        }
        atomic.write_json(tmp / "manifest.json", manifest)
        shutil.rmtree(entry, ignore_errors=True)
        tmp.rename(entry)
        atomic.write_json(self.root / f"{name}.last.json", manifest)
        return outputs


def _names_its_checkout(
    built_in: object, checkout: Path, staged: list[tuple[Path, Path]]
) -> tuple[str, ...]:
    """The outputs that hold the folder they were built in (``built_in``), when that is
    not ``checkout``: a compiler given the sources by absolute path writes it into
    ``__FILE__`` and debug info, so such a library from another release's folder is not
    what a compile here gives. Compressed debug sections (``-gz``) and compressed CUDA
    fatbin entries are looked into too."""
    if not isinstance(built_in, str) or not built_in:
        return ()
    if built_in in (str(checkout), str(checkout.resolve())):
        return ()
    needle = os.fsencode(built_in)
    return tuple(
        dest.name
        for tmp, dest in staged
        if any(needle in view for view in inspect.unpacked_views(tmp.read_bytes()))
    )


def _copy_checked(cached: Path, folder: Path, digest: str) -> Path | None:
    """``cached`` copied (never through a link) to a new file in ``folder``, hashed as it
    is copied: the copy's path, or None when it is not this user's regular file or its
    bytes are not ``digest``."""
    try:
        fd = os.open(cached, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as src:
        info = os.fstat(src.fileno())
        if not _private(info, stat.S_IFREG):
            return None
        out_fd, name = tempfile.mkstemp(dir=folder, prefix=".servegate-restore-")
        tmp = Path(name)
        h = hashlib.sha256()
        with os.fdopen(out_fd, "wb") as out:
            while block := src.read(1 << 20):
                h.update(block)
                out.write(block)
        if h.hexdigest() != digest:
            tmp.unlink()
            return None
        os.chmod(tmp, stat.S_IMODE(info.st_mode))
        with contextlib.suppress(OSError):
            os.utime(tmp, ns=(info.st_atime_ns, info.st_mtime_ns))
        return tmp
