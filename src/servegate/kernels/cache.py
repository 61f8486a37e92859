"""The build cache: a finished build is kept under a key made of everything that decides
its result — the sources' contents, the toolchain versions, the recipe (flags, CMake
arguments) and the arch list. Same key: the outputs are copied back, nothing compiles."""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from servegate.pipeline import atomic
from servegate.pipeline.hashing import sha256_file


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
    ) -> Key:
        parts = {"recipe": recipe, "sources": sources, "toolchain": tools, "archs": list(archs)}
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
    changed = [
        part
        for part in ("sources", "toolchain", "recipe", "archs")
        if old.get(part) != key.parts[part]
    ]
    if "sources" in changed:
        before, after = old.get("sources", {}), key.parts["sources"]
        files = sorted(f for f in set(before) | set(after) if before.get(f) != after.get(f))
        changed[changed.index("sources")] = "sources (" + ", ".join(files[:5]) + ")"
    return "changed: " + ", ".join(changed) if changed else "the earlier entry is gone"


class BuildCache:
    def __init__(self, root: Path) -> None:
        self.root = root

    def _entry(self, name: str, key: Key) -> Path:
        return self.root / f"{name}-{key.digest[:20]}"

    def last(self, name: str) -> dict[str, Any] | None:
        path = self.root / f"{name}.last.json"
        return json.loads(path.read_text()) if path.exists() else None

    def restore(self, name: str, key: Key, checkout: Path) -> dict[str, str] | None:
        """Copy a cached build's outputs into ``checkout``; their hashes, or None on a miss."""
        entry = self._entry(name, key)
        manifest = entry / "manifest.json"
        if not manifest.exists():
            return None
        outputs: dict[str, str] = json.loads(manifest.read_text())["outputs"]
        for rel, digest in outputs.items():
            cached = entry / "files" / rel
            if not cached.is_file() or sha256_file(cached) != digest:
                return None  # damaged entry: rebuild
        for rel in outputs:
            dest = checkout / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(entry / "files" / rel, dest)
        return outputs

    def store(
        self, name: str, key: Key, checkout: Path, files: list[Path], seconds: float
    ) -> dict[str, str]:
        entry = self._entry(name, key)
        tmp = entry.with_name(entry.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        outputs = {}
        for f in files:
            rel = str(f.relative_to(checkout))
            (tmp / "files" / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(f, tmp / "files" / rel)
            outputs[rel] = sha256_file(f)
        manifest = {
            "schema": 1,
            "name": name,
            "key": key.digest,
            "parts": key.parts,
            "outputs": outputs,
            "seconds": round(seconds, 3),
            "at": time.time(),
        }
        atomic.write_json(tmp / "manifest.json", manifest)
        shutil.rmtree(entry, ignore_errors=True)
        tmp.rename(entry)
        atomic.write_json(self.root / f"{name}.last.json", manifest)
        return outputs
