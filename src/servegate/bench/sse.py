"""A streaming chat completion, timestamped chunk by chunk.

The parser is deliberately small: it reads ``data:`` lines, stamps every chunk that
carries text, keeps the last ``usage`` and notes how the stream ended. Token counts
always come from ``usage``; chunk stamps only bound the decode window. The text is the
answer's reasoning (``reasoning_content``, or ``reasoning`` as newer vLLM names it) and
its content, in that order; only the one choice asked for (``index`` 0) is read: a
stream that carries another is malformed, not twice the text.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

#: text chunks whose times every stream keeps (``Stream.early``)
EARLY_CHUNKS = 64
_WORD = re.compile(r"\w")


@dataclass
class Stream:
    started: float
    first_text_at: float | None = None
    #: the times of the first ``EARLY_CHUNKS`` text chunks: a stream's start, where text
    #: sent ahead of the prefill would show (``measure.first_text_ahead``)
    early: list[float] = field(default_factory=list)
    #: the chunk after them (the wait before it belongs to the stream's start too)
    after_early_at: float | None = None
    #: the first text chunk that carries a word character (not only spaces, punctuation
    #: or invisible characters)
    first_word_at: float | None = None
    last_text_at: float | None = None
    done_at: float | None = None
    text_chunks: int = 0
    events: int = 0
    text: list[str] = field(default_factory=list)
    usage: dict[str, Any] = field(default_factory=dict)
    timings: dict[str, Any] = field(default_factory=dict)
    finish_reason: str | None = None
    saw_done: bool = False
    error: str = ""
    http_status: int = 0
    #: the time of every text chunk, when asked for (the load bench's inter-token gaps)
    stamps: list[float] | None = None
    #: how long the first text may have waited for the client's thread to get a CPU
    #: before it was read (``servegate.bench.cpuwait``); None: not known
    client_wait: float | None = None

    @property
    def content(self) -> str:
        return "".join(self.text)

    @property
    def second_text_at(self) -> float | None:
        return self.early[1] if len(self.early) > 1 else None

    @property
    def largest_chunk(self) -> int:
        """The most characters one text chunk carried."""
        return max(map(len, self.text), default=0)


def parse_lines(lines: Iterable[str], stream: Stream, clock: Callable[[], float]) -> Stream:
    """Feed SSE lines (without their line ends) into ``stream``."""
    for line in lines:
        if feed(line, stream, clock):
            break
    return stream


def feed(line: str, stream: Stream, clock: Callable[[], float]) -> bool:
    """One SSE line (without its line end) into ``stream``; True: the stream has ended
    (``[DONE]``, an error event, or a body that is not SSE)."""
    if not line.startswith("data:"):
        if line.startswith("{") and not stream.events:  # an error body, not SSE
            stream.error = _error_text(line)
            return True
        return False
    payload = line[5:].strip()
    if payload == "[DONE]":
        stream.saw_done = True
        stream.done_at = clock()
        return True
    try:
        event = json.loads(payload)
    except ValueError:
        stream.error = f"malformed stream event: {payload[:120]}"
        return True
    if not isinstance(event, dict):
        stream.error = f"malformed stream event (not an object): {payload[:120]}"
        return True
    stream.events += 1
    if "error" in event:
        stream.error = _error_text(payload)
        return True
    shape = _shape_error(event)
    if shape:
        stream.error = f"malformed stream event ({shape}): {payload[:120]}"
        return True
    for choice in event.get("choices") or ():
        delta = choice.get("delta") or {}
        thought = delta.get("reasoning_content") or delta.get("reasoning") or ""
        piece = thought + (delta.get("content") or "")
        if piece:
            now = clock()
            if stream.first_text_at is None:
                stream.first_text_at = now
            if len(stream.early) < EARLY_CHUNKS:
                stream.early.append(now)
            elif stream.after_early_at is None:
                stream.after_early_at = now
            if stream.first_word_at is None and _WORD.search(piece):
                stream.first_word_at = now
            stream.last_text_at = now
            stream.text_chunks += 1
            stream.text.append(piece)
            if stream.stamps is not None:
                stream.stamps.append(now)
        if choice.get("finish_reason"):
            stream.finish_reason = choice["finish_reason"]
    if event.get("usage"):
        stream.usage = event["usage"]
    if event.get("timings"):
        stream.timings = event["timings"]
    return False


def _shape_error(event: dict[str, Any]) -> str:
    """What is wrong with a chat-completion chunk's shape ("": nothing): a server whose
    chunks are not what the API says is a broken stream, not an exception."""
    choices = event.get("choices") or []
    if not isinstance(choices, list):
        return "choices is not a list"
    if len(choices) > 1:
        return f"{len(choices)} choices: one was asked for"
    for choice in choices:
        if not isinstance(choice, dict):
            return "a choice is not an object"
        if choice.get("index", 0) != 0:
            return f"a choice of index {choice.get('index')!r}: one (index 0) was asked for"
        delta = choice.get("delta") or {}
        if not isinstance(delta, dict):
            return "delta is not an object"
        for key in ("content", "reasoning_content", "reasoning"):
            if delta.get(key) is not None and not isinstance(delta[key], str):
                return f"{key} is not text"
        reason = choice.get("finish_reason")
        if reason is not None and not isinstance(reason, str):
            return "finish_reason is not text"
    for key in ("usage", "timings"):
        if event.get(key) is not None and not isinstance(event[key], dict):
            return f"{key} is not an object"
    return ""


def _error_text(payload: str) -> str:
    try:
        body = json.loads(payload)
    except ValueError:
        return payload[:300]
    err = body.get("error", body) if isinstance(body, dict) else body
    if isinstance(err, dict):
        return str(err.get("message") or err)[:300]
    return str(err)[:300]


def now() -> float:
    return time.perf_counter()
