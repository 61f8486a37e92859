"""How much fixture text makes a prompt of N tokens for the served model's tokenizer.

Each prompt is sized against the server's ``/tokenize`` (the chat template included);
the answer is cached per model, tokenizer fingerprint, fixture and tier. A server
without ``/tokenize`` (``transformers serve``, most OpenAI-compatible servers) is sized
with the model's own tokenizer files instead, when the bench is given them
(``--tokenizer DIR``): :class:`LocalTokenizer` applies the model's chat template and
counts, in a helper process of the Python that has ``transformers`` (the serving
environment's, ``--tokenizer-python``). Without either, an estimate; the trial's own
``usage.prompt_tokens`` is checked against the tier's tolerance in every case.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from servegate.bench import client
from servegate.bench.fixtures import Fixture
from servegate.engine.openai import Endpoint
from servegate.errors import BenchFailed
from servegate.pipeline.atomic import write_text

#: characters per token used when the server cannot tokenize (conservative)
ESTIMATE_CHARS_PER_TOKEN = {"regular": 4.0, "coding": 3.3}
_PROBE = "servegate tokenizer fingerprint: The quick brown fox 0123456789 {}[]()<>\n\tdef f(x):"

Messages = Callable[[str], list[dict[str, Any]]]


#: the helper that counts with the model's tokenizer files: one JSON request a line
_LOCAL = r"""
import sys
if sys.path and sys.path[0] == "":  # python -c: the working directory, first; not here
    del sys.path[0]
import json
from transformers import AutoTokenizer
tok = AutoTokenizer.from_pretrained(sys.argv[1])
print(json.dumps({"ready": True}), flush=True)
for line in sys.stdin:
    req = json.loads(line)
    if "text" in req:
        try:
            ids = tok(req["text"], add_special_tokens=False)["input_ids"]
        except Exception as exc:  # text no tokenizer takes (a lone surrogate): say so
            print(json.dumps({"error": repr(exc)[:300]}), flush=True)
            continue
        print(json.dumps({"count": len(ids)}), flush=True)
        continue
    ids = tok.apply_chat_template(req["messages"], add_generation_prompt=True, tokenize=True)
    if hasattr(ids, "keys"):
        ids = ids["input_ids"]
    print(json.dumps({"count": len(ids), "tokens": list(ids)}), flush=True)
"""


class LocalTokenizer:
    """The model's own tokenizer files, counted by ``python`` (which has transformers) in
    a helper process: a chat prompt as the server's template renders it, like /tokenize."""

    def __init__(self, path: Path, python: str) -> None:
        self.path = path
        # ``python -c`` puts its working directory first on sys.path: the helper's first
        # line takes it off, so no module there (a checkout's ``json.py`` or
        # ``transformers/``) stands in for the real ones. Nothing is made on disk for
        # it, so a bench killed outright leaves nothing behind: the helper ends with its
        # stdin
        try:
            self.proc = subprocess.Popen(
                [python, "-c", _LOCAL, str(path.resolve())],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        except OSError as exc:
            raise BenchFailed(
                f"cannot start {python} to read the tokenizer: {exc}",
                hint="--tokenizer-python: a Python that has transformers (the serving venv's)",
            ) from None
        self._read()

    def _read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            err = self.proc.stderr.read()[-600:] if self.proc.stderr else ""
            self.close()
            raise BenchFailed(
                f"the model's tokenizer in {self.path} could not be read: {err.strip()}",
                hint="--tokenizer: the model directory (tokenizer files and chat template); "
                "--tokenizer-python: a Python that has transformers",
            )
        try:
            answer = json.loads(line)
        except ValueError:
            answer = None
        if not isinstance(answer, dict):  # a stray line: every later answer would be off
            self.close()
            raise BenchFailed(
                f"the tokenizer helper for {self.path} printed {line[:200]!r}, not an answer",
                hint="--tokenizer-python: a Python whose startup prints nothing on stdout",
            )
        return answer

    def tokenize(self, messages: list[dict[str, Any]]) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"messages": messages}) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def count_text(self, text: str) -> int:
        """``text``'s tokens as it stands (no template, no special tokens added)."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"text": text}) + "\n")
        self.proc.stdin.flush()
        answer = self._read()
        count = answer.get("count")
        if type(count) is not int:
            raise ValueError(f"the tokenizer could not count the text: {answer.get('error')}")
        return count

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()


@dataclass(frozen=True)
class Tokenizer:
    """What counts the server's prompts: its /tokenize, or the model's own tokenizer files
    (``local``); ``fingerprint`` is empty when neither is there."""

    fingerprint: str
    max_model_len: int | None
    local: LocalTokenizer | None = None

    @property
    def available(self) -> bool:
        return bool(self.fingerprint)

    @property
    def source(self) -> str:
        if not self.available:
            return "estimate"
        return f"tokenizer files {self.local.path}" if self.local else "server /tokenize"

    def tokenize(
        self, endpoint: Endpoint, model: str, messages: list[dict[str, Any]]
    ) -> dict[str, Any]:
        if self.local is not None:
            return self.local.tokenize(messages)
        return client.tokenize(endpoint, model, messages)

    def count_text(
        self, endpoint: Endpoint, model: str, text: str, http: httpx.Client | None = None
    ) -> int:
        """A generated text counted again (what a server's ``usage`` is checked against).
        ValueError or an HTTP error when it cannot be counted."""
        if self.local is not None:
            return self.local.count_text(text)
        return client.tokenize_text(endpoint, model, text, http)


def probe(endpoint: Endpoint, model: str, local: LocalTokenizer | None = None) -> Tokenizer:
    max_len: int | None = None
    try:
        for m in client.models(endpoint):
            if m.get("id") == model and isinstance(m.get("max_model_len"), int):
                max_len = m["max_model_len"]
    except (httpx.HTTPError, ValueError):
        pass
    if local is not None:
        tokens = local.tokenize([{"role": "user", "content": _PROBE}])["tokens"]
        digest = hashlib.sha256(json.dumps(tokens).encode()).hexdigest()[:16]
        return Tokenizer(digest, max_len, local)
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
    method: str  # "tokenize", "tokenizer files", "cache", "estimate"


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
    slack = max(4, nominal // 500)

    def count(chars: int) -> int:
        answer = tok.tokenize(endpoint, model, messages(fixture.head(chars)))
        return int(answer["count"])

    hit = cache.get(key)
    if isinstance(hit, dict):
        # counted again, once: a tokenizer or chat template changed in a way the short
        # probe of the fingerprint does not show would leave a wrong size in the cache
        try:
            chars = int(hit["chars"])
            tokens = count(chars)
            if abs(tokens - nominal) <= slack or abs(tokens - int(hit["tokens"])) <= slack:
                return Sized(chars, tokens, "cache")
        except (KeyError, TypeError, ValueError):
            pass

    chars = int(nominal * 3.5)
    tokens = count(chars)
    seen = {chars: tokens}
    for _ in range(12):
        if abs(tokens - nominal) <= slack or (tokens < nominal and chars >= len(fixture.text)):
            break
        chars = min(len(fixture.text), max(1, int(chars * nominal / tokens)))
        if abs(tokens - nominal) < nominal // 50:  # close: step by the line, not by ratio
            chars += int((nominal - tokens) * chars / max(tokens, 1) * 0.9)
        tokens = seen[chars] = count(chars)
    chars, tokens = min(seen.items(), key=lambda ct: abs(ct[1] - nominal))
    # a prompt is cut at a line's end: where a long line kept the ratio steps from getting
    # closer, walk line by line from the closest cut below
    below = [ct for ct in seen.items() if ct[1] < nominal - slack]
    if abs(tokens - nominal) > slack and below:
        chars, tokens = max(below, key=lambda ct: ct[1])
        for _ in range(64):
            nxt = fixture.text.find("\n", len(fixture.head(chars)) + 1)
            if nxt < 0 or tokens >= nominal - slack:
                break
            chars = nxt + 1
            tokens = seen[chars] = count(chars)
        chars, tokens = min(seen.items(), key=lambda ct: abs(ct[1] - nominal))
    cache[key] = {"chars": chars, "tokens": tokens}
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text(path, json.dumps(cache, indent=1, sort_keys=True) + "\n")
    return Sized(chars, tokens, "tokenizer files" if tok.local else "tokenize")


def _read(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
