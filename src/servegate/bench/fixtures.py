"""The bench's input text: real prose and real source code, hash-locked.

``FIXTURES.json`` (written by ``tools/make_fixtures.py``) names every source and its
licence and locks the SHA-256 of each fixture; :func:`load` refuses bytes that do not
match, and text that compresses like filler.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import json
import zlib
from dataclasses import dataclass
from importlib import resources
from typing import Any

from servegate.errors import ConfigError

PROFILES = ("regular", "coding")
#: real text compresses to 25-35 % under gzip; repeated filler to a few percent
MIN_GZIP_RATIO = 0.15

#: what the model is asked to do with each profile's context; part of the fingerprint
INSTRUCTIONS = {
    "regular": (
        "Read the documents below. Then write a long, detailed explanation in plain prose of "
        "what they describe, section by section, in your own words. Do not stop early."
    ),
    "coding": (
        "Read the source code below. Then write a new, complete Python module that "
        "reimplements its main ideas with type hints and docstrings. Output only code."
    ),
}


@dataclass(frozen=True)
class Fixture:
    profile: str
    text: str
    sha256: str
    gzip_ratio: float
    sources: tuple[dict[str, Any], ...]

    def head(self, chars: int) -> str:
        """The first ``chars`` characters, cut back to the end of a line."""
        if chars >= len(self.text):
            return self.text
        cut = self.text.rfind("\n", 0, chars)
        return self.text[: cut if cut > chars // 2 else chars]


def manifest() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(
        resources.files("servegate.bench").joinpath("fixtures/FIXTURES.json").read_text()
    )
    return data


@functools.cache
def load(profile: str) -> Fixture:
    if profile not in PROFILES:
        raise ConfigError(
            f"unknown bench profile {profile!r}", hint=f"profiles: {', '.join(PROFILES)}"
        )
    entry = manifest()["fixtures"][profile]
    packed = resources.files("servegate.bench").joinpath(f"fixtures/{entry['file']}").read_bytes()
    raw = gzip.decompress(packed)
    digest = hashlib.sha256(raw).hexdigest()
    if digest != entry["sha256"]:
        raise ConfigError(
            f"bench fixture {profile!r} does not match its locked SHA-256 "
            f"({digest[:12]} != {entry['sha256'][:12]})",
            hint="reinstall servegate; fixtures are never edited by hand",
        )
    ratio = gzip_ratio(raw)
    if ratio < MIN_GZIP_RATIO:
        raise ConfigError(f"bench fixture {profile!r} compresses like filler (ratio {ratio:.3f})")
    return Fixture(profile, raw.decode(), digest, ratio, tuple(entry["sources"]))


def gzip_ratio(raw: bytes) -> float:
    return len(zlib.compress(raw, 9)) / len(raw) if raw else 0.0


def hashes() -> dict[str, str]:
    return {p: load(p).sha256 for p in PROFILES}
