"""HTTP for the bench: one streaming chat request, ``/tokenize``, ``/metrics``."""

from __future__ import annotations

from typing import Any

import httpx

from servegate.bench.sse import Stream, now, parse_lines
from servegate.engine.openai import Endpoint


def stream_chat(endpoint: Endpoint, payload: dict[str, Any], timeout: float) -> Stream:
    """Send one streaming chat completion; every failure becomes ``Stream.error``."""
    body = {**payload, "stream": True, "stream_options": {"include_usage": True}}
    stream = Stream(started=now())
    try:
        with (
            endpoint.client(timeout) as client,
            client.stream("POST", "/v1/chat/completions", json=body) as resp,
        ):
            stream.http_status = resp.status_code
            if resp.status_code != 200:
                resp.read()
                stream.error = f"HTTP {resp.status_code}: {resp.text[:300]}"
                return stream
            parse_lines(resp.iter_lines(), stream, now)
    except httpx.TimeoutException:
        stream.error = f"no answer within {timeout:g}s"
    except httpx.ConnectError as exc:
        stream.error = f"cannot connect to {endpoint.base_url}: {exc}"
    except httpx.HTTPError as exc:
        stream.error = f"the stream broke off: {type(exc).__name__}: {exc}"
    if not stream.error and not stream.saw_done:
        stream.error = "the stream was cut off before [DONE]"
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


def metrics_text(endpoint: Endpoint, timeout: float = 10.0) -> str:
    """The Prometheus text of the engine's ``/metrics``; empty when the server has none."""
    path = endpoint.adapter.metrics_path
    if not path:
        return ""
    try:
        with endpoint.client(timeout) as client:
            resp = client.get(path)
    except httpx.HTTPError:
        return ""
    return resp.text if resp.status_code == 200 else ""


def models(endpoint: Endpoint, timeout: float = 10.0) -> list[dict[str, Any]]:
    with endpoint.client(timeout) as client:
        resp = client.get(endpoint.adapter.models_path)
        resp.raise_for_status()
        data = resp.json().get("data") or []
    return [m for m in data if isinstance(m, dict)]
