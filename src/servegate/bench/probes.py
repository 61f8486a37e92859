"""Probes: short real requests whose answers say whether a served model works."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from servegate.engine import openai


@dataclass(frozen=True)
class ProbeResult:
    name: str
    ok: bool
    reason: str
    seconds: float
    evidence: dict[str, Any] = field(default_factory=dict)


def smoke(
    endpoint: openai.Endpoint, model: str, prompt: str, max_tokens: int, timeout: float
) -> ProbeResult:
    """One chat completion must return text and usage counts."""
    start = time.monotonic()

    def done(ok: bool, reason: str, **evidence: Any) -> ProbeResult:
        return ProbeResult("smoke", ok, reason, time.monotonic() - start, evidence)

    try:
        body = openai.chat(endpoint, model, prompt, max_tokens, timeout)
    except (httpx.HTTPError, ValueError) as exc:
        return done(False, f"chat completion failed: {type(exc).__name__}: {exc}")
    choices = body.get("choices") or []
    text = choices[0].get("message", {}).get("content") if choices else None
    usage = body.get("usage") or {}
    prompt_tokens = int(usage.get("prompt_tokens") or 0)
    completion_tokens = int(usage.get("completion_tokens") or 0)
    evidence = {
        "model": model,
        "text": (text or "")[:200],
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
    }
    if not text:
        return done(False, "the completion carried no text", **evidence)
    if prompt_tokens <= 0 or completion_tokens <= 0:
        return done(False, f"usage counts missing or zero: {usage}", **evidence)
    return done(True, f"{completion_tokens} tokens of text", **evidence)
