"""HTTP for the bench: one streaming chat request, ``/tokenize``, ``/metrics``.

A bench run keeps one connection pool per endpoint (:func:`pool`): building an
``httpx.Client`` loads the TLS bundle (~30 ms) and a new connection costs a handshake,
and neither belongs inside a measured TTFT. The clock of a request starts when it is
sent, not before; how long the first text then waited for the reading thread to get a
CPU is noted beside it (:mod:`servegate.bench.cpuwait`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import httpx

from servegate.bench import cpuwait
from servegate.bench.sse import Stream, now
from servegate.engine.openai import Endpoint, WholeRequestTimeout


@contextlib.contextmanager
def pool(endpoint: Endpoint, timeout: float, connections: int = 64) -> Iterator[httpx.Client]:
    """One client (keep-alive connection pool) for every request of a run."""
    with endpoint.client(timeout, connections) as client:
        yield client


def stream_chat(
    endpoint: Endpoint,
    payload: dict[str, Any],
    timeout: float,
    http: httpx.Client | None = None,
    live: list[Stream] | None = None,
) -> Stream:
    """Send one streaming chat completion; every failure becomes ``Stream.error``.

    ``http``: the run's pooled client; without it a client is made first (outside the
    measured time). ``live``: the stream is added to it as soon as it exists, so a
    progress line can read it while it runs."""
    body = streaming(payload)
    with contextlib.ExitStack() as stack:
        if http is None:
            http = stack.enter_context(endpoint.client(timeout))
        return _stream(http, endpoint, body, timeout, live)


def streaming(payload: dict[str, Any]) -> dict[str, Any]:
    """The request body asking for a stream that ends with its usage."""
    return {**payload, "stream": True, "stream_options": {"include_usage": True}}


def _stream(
    http: httpx.Client,
    endpoint: Endpoint,
    body: dict[str, Any],
    timeout: float,
    live: list[Stream] | None = None,
) -> Stream:
    request = http.build_request("POST", "/v1/chat/completions", json=body, timeout=timeout)
    stream = Stream(started=now())
    if live is not None:
        live.append(stream)
    try:
        with contextlib.closing(http.send(request, stream=True)) as resp:
            stream.http_status = resp.status_code
            if resp.status_code != 200:
                resp.read()
                stream.error = f"HTTP {resp.status_code}: {resp.text[:300]}"
                return stream
            cpuwait.parse(_capped(resp.iter_lines()), stream)
    except WholeRequestTimeout as exc:
        stream.error = str(exc)
    except httpx.TimeoutException:
        stream.error = f"no answer within {timeout:g}s"
    except httpx.ConnectError as exc:
        stream.error = f"cannot connect to {endpoint.shown_url}: {exc}"
    except httpx.HTTPError as exc:
        stream.error = f"the stream broke off: {type(exc).__name__}: {exc}"
    return ended(stream, endpoint)


#: the longest SSE line read: one event of a token or a usage is a few hundred bytes
MAX_EVENT_BYTES = 1024 * 1024


class EventTooLarge(httpx.ReadError):
    """One SSE line longer than :data:`MAX_EVENT_BYTES`."""


def _capped(lines: Iterator[str]) -> Iterator[str]:
    for line in lines:
        if len(line) > MAX_EVENT_BYTES:
            raise EventTooLarge(f"one event of the stream is {len(line) >> 10} KiB: no token is")
        yield line


def ended(stream: Stream, endpoint: Endpoint) -> Stream:
    """A stream that stopped before its end (``[DONE]``, or on an engine that sends none
    its finish reason and usage) gets that as its error."""
    whole = stream.saw_done or (
        not endpoint.adapter.sends_done and bool(stream.finish_reason) and bool(stream.usage)
    )
    if not stream.error and not whole:
        stream.error = (
            "the stream was cut off before [DONE]"
            if endpoint.adapter.sends_done
            else "the stream was cut off before its finish reason and usage"
        )
    return stream


def tokenize(endpoint: Endpoint, model: str, messages: list[dict[str, Any]]) -> dict[str, Any]:
    """The engine's tokenizer for a chat prompt (vLLM's ``/tokenize``): ``count``,
    ``max_model_len``, ``tokens``. ValueError when the engine has none."""
    path = endpoint.adapter.tokenize_path
    if not path:
        raise ValueError(f"the {endpoint.adapter.name} engine has no tokenize endpoint")
    with endpoint.client(120.0) as client:
        resp = client.post(
            path,
            json={"model": model, "messages": messages, "add_generation_prompt": True},
        )
        resp.raise_for_status()
        result: dict[str, Any] = resp.json()
    return result


def tokenize_text(
    endpoint: Endpoint, model: str, text: str, http: httpx.Client | None = None
) -> int:
    """How many tokens ``text`` is for the engine's tokenizer, as it stands (no chat
    template, no special tokens added): vLLM's ``/tokenize`` with a ``prompt``, over the
    run's pooled ``http`` client when given. ValueError when the engine has none or the
    answer is no count."""
    path = endpoint.adapter.tokenize_path
    if not path:
        raise ValueError(f"the {endpoint.adapter.name} engine has no tokenize endpoint")
    with contextlib.ExitStack() as stack:
        if http is None:
            http = stack.enter_context(endpoint.client(120.0))
        resp = http.post(path, json={"model": model, "prompt": text, "add_special_tokens": False})
        resp.raise_for_status()
        body = resp.json()
    count = body.get("count") if isinstance(body, dict) else None
    if type(count) is not int or count < 0:
        raise ValueError(f"{path} answered {count!r}, not a token count")
    return count


def metrics_text(
    endpoint: Endpoint, timeout: float = 10.0, http: httpx.Client | None = None
) -> str:
    """The Prometheus text of the engine's ``/metrics``; empty when the server has none
    or the scrape failed (the caller decides what an unread scrape means)."""
    path = endpoint.adapter.metrics_path
    if not path:
        return ""
    try:
        with contextlib.ExitStack() as stack:
            if http is None:
                http = stack.enter_context(endpoint.client(timeout))
            resp = http.get(path, timeout=timeout)
    except httpx.HTTPError:
        return ""
    return resp.text if resp.status_code == 200 else ""


def models(endpoint: Endpoint, timeout: float = 10.0) -> list[dict[str, Any]]:
    with endpoint.client(timeout) as client:
        resp = client.get(endpoint.adapter.models_path)
        resp.raise_for_status()
        data = resp.json().get("data") or []
    return [m for m in data if isinstance(m, dict)]
