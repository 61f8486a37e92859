"""How much fixture text makes a prompt of N tokens for the served model's tokenizer.

Each prompt is sized against the server's ``/tokenize`` (the chat template included);
the answer is cached per model, tokenizer fingerprint, fixture and tier. A server
without ``/tokenize`` gets an estimate, and the trial's own ``usage.prompt_tokens`` is
then checked against the tier's tolerance.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from servegate.bench import client
from servegate.bench.fixtures import Fixture
from servegate.engine.openai import Endpoint
from servegate.pipeline.atomic import write_text

#: characters per token used when the server cannot tokenize (conservative)
ESTIMATE_CHARS_PER_TOKEN = {"regular": 4.0, "coding": 3.3}
_PROBE = "servegate tokenizer fingerprint: The quick brown fox 0123456789 {}[]()<>\n\tdef f(x):"

Messages = Callable[[str], list[dict[str, Any]]]


@dataclass(frozen=True)
class Tokenizer:
    """What the server said about its tokenizer; ``fingerprint`` is empty without /tokenize."""

    fingerprint: str
    max_model_len: int | None

    @property
    def available(self) -> bool:
        return bool(self.fingerprint)


def probe(endpoint: Endpoint, model: str) -> Tokenizer:
    max_len: int | None = None
    try:
        for m in client.models(endpoint):
            if m.get("id") == model and isinstance(m.get("max_model_len"), int):
                max_len = m["max_model_len"]
    except (httpx.HTTPError, ValueError):
        pass
    try:
        answer = client.tokenize(endpoint, model, [{"role": "user", "content": _PROBE}])
    except (httpx.HTTPError, ValueError):
        return Tokenizer("", max_len)
    if not isinstance(answer, dict) or not isinstance(answer.get("count"), int):
        return Tokenizer("", max_len)  # something answered, but not a tokenizer
    tokens = answer.get("tokens") or []
    digest = hashlib.sha256(json.dumps(tokens).encode()).hexdigest()[:16]
    if isinstance(answer.get("max_model_len"), int):
        max_len = answer["max_model_len"]
    return Tokenizer(digest, max_len)


def cache_path(environ: Mapping[str, str]) -> Path:
    base = Path(environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "servegate" / "bench-sizing.json"


@dataclass(frozen=True)
class Sized:
    chars: int
    tokens: int | None
    method: str  # "tokenize", "cache", "estimate"


def size(
    endpoint: Endpoint,
    model: str,
    tok: Tokenizer,
    fixture: Fixture,
    nominal: int,
    messages: Messages,
    environ: Mapping[str, str] = os.environ,
) -> Sized:
    """Characters of ``fixture`` whose chat prompt is ``nominal`` tokens (±0.2 %)."""
    if not tok.available:
        return Sized(int(nominal * ESTIMATE_CHARS_PER_TOKEN[fixture.profile]), None, "estimate")
    probe_msgs = json.dumps(messages("TEXT"), sort_keys=True)
    key = "|".join(
        [model, tok.fingerprint, fixture.sha256[:16], str(nominal),
         hashlib.sha256(probe_msgs.encode()).hexdigest()[:12]]
    )  # fmt: skip
    path = cache_path(environ)
    cache = _read(path)
    if key in cache:
        hit = cache[key]
        return Sized(int(hit["chars"]), int(hit["tokens"]), "cache")

    def count(chars: int) -> int:
        answer = client.tokenize(endpoint, model, messages(fixture.head(chars)))
        return int(answer["count"])

    chars = int(nominal * 3.5)
    tokens = count(chars)
    slack = max(4, nominal // 500)
    for _ in range(12):
        if abs(tokens - nominal) <= slack or (tokens < nominal and chars >= len(fixture.text)):
            break
        chars = min(len(fixture.text), max(1, int(chars * nominal / tokens)))
        if abs(tokens - nominal) < nominal // 50:  # close: step by the line, not by ratio
            chars += int((nominal - tokens) * chars / max(tokens, 1) * 0.9)
        tokens = count(chars)
    cache[key] = {"chars": chars, "tokens": tokens}
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text(path, json.dumps(cache, indent=1, sort_keys=True) + "\n")
    return Sized(chars, tokens, "tokenize")


def _read(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
