"""The few OpenAI-compatible endpoints promote needs: health, models, one chat completion.

Every request made through :meth:`Endpoint.client` has a **whole-request deadline**:
httpx's timeouts bound each read, so a server that keeps sending (a stream that never
ends, a body trickled a byte at a time) would hold the caller — and the host lock and
the GPU lease a promote holds — forever. :class:`Deadline` wraps httpx's transport and
ends the response's body when the request has taken longer than its timeout in all
(:class:`WholeRequestTimeout`, a ``httpx.ReadTimeout``, so every caller's timeout
handling applies). httpx has no such setting by design (its docs: "total timeouts" are
left to the caller); the wrapper is the smallest place to put one for every caller.
It also caps a response's size (:data:`MAX_RESPONSE_BYTES`, :class:`ResponseTooLarge`): a
server that sends a 50 MB event or a 27 MB ``/metrics`` page must not take the gate's
memory with it.

Its clients share one TLS context per process and certificate setting
(:func:`tls_context`): httpx builds one for every transport, loading the CA bundle again
(about 22 ms of CPU), and a start-up's health polls every 50-500 ms each made one — a
few CPU-seconds a vLLM start on a two-core box where the engine starting is what the
CPUs are for.
"""

from __future__ import annotations

import functools
import os
import ssl
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx

from servegate.engine.adapters import VLLM, Engine
from servegate.errors import ConfigError
from servegate.pipeline import redact


@dataclass(frozen=True)
class Endpoint:
    base_url: str
    api_key: str = ""
    #: the engine's adapter; None: not named (the bench detects it from /v1/models)
    engine: Engine | None = None

    def __post_init__(self) -> None:
        if self.api_key and not (self.api_key.isascii() and self.api_key.isprintable()):
            raise ConfigError(
                "the API key holds characters an HTTP header cannot carry (only printable "
                "ASCII can be sent as 'Authorization: Bearer …')",
                hint="check the variable service.api_key_env (or --api-key-env) names: a "
                "key pasted with a stray character or line break",
            )

    @property
    def shown_url(self) -> str:
        """The URL as messages and result files show it: credentials in it redacted."""
        return redact.text(self.base_url, "")

    @property
    def adapter(self) -> Engine:
        """The named engine, or vLLM's paths and names for a server not yet identified."""
        return self.engine or VLLM

    @property
    def headers(self) -> dict[str, str]:
        """What every request carries (the API key, when there is one)."""
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def client(self, timeout: float, connections: int = 10) -> httpx.Client:
        """A client whose every request ends within ``timeout`` seconds, whole: each read
        and the request as a whole (:class:`Deadline`)."""
        limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
        inner = httpx.HTTPTransport(verify=tls_context(), limits=limits)
        return httpx.Client(
            base_url=self.base_url, timeout=timeout, headers=self.headers, limits=limits,
            transport=Deadline(inner, timeout),
        )  # fmt: skip


def tls_context() -> ssl.SSLContext:
    """The TLS context of every client: httpx's default (certifi's CA bundle, or
    ``SSL_CERT_FILE``/``SSL_CERT_DIR`` where set), made once per process and setting."""
    return _tls_context(os.environ.get("SSL_CERT_FILE"), os.environ.get("SSL_CERT_DIR"))


@functools.lru_cache(maxsize=4)
def _tls_context(cert_file: str | None, cert_dir: str | None) -> ssl.SSLContext:
    return httpx.create_ssl_context()


#: the largest response read: a 8k-token stream is about 1.5 MB of events, vLLM's
#: ``/metrics`` a few hundred KB, ``/tokenize`` of a 128k prompt under 1 MB
MAX_RESPONSE_BYTES = 16 * 1024 * 1024


class ResponseTooLarge(httpx.ReadError):
    """The response's body grew past :data:`MAX_RESPONSE_BYTES`."""


class WholeRequestTimeout(httpx.ReadTimeout):
    """The request took longer than its deadline in all (the server kept sending)."""


class Deadline(httpx.BaseTransport):
    """A transport whose responses end ``seconds`` after their request was sent."""

    def __init__(self, inner: httpx.BaseTransport, seconds: float) -> None:
        self.inner = inner
        self.seconds = seconds

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        deadline = time.monotonic() + self.seconds
        response = self.inner.handle_request(request)
        body = response.stream
        assert isinstance(body, httpx.SyncByteStream)
        response.stream = _Bounded(body, deadline, self.seconds, request)
        return response

    def close(self) -> None:
        self.inner.close()


class _Bounded(httpx.SyncByteStream):
    def __init__(
        self, inner: httpx.SyncByteStream, deadline: float, seconds: float, request: httpx.Request
    ) -> None:
        self.inner, self.deadline, self.seconds, self.request = inner, deadline, seconds, request

    def __iter__(self) -> Iterator[bytes]:
        read = 0
        for chunk in self.inner:
            read += len(chunk)
            if read > MAX_RESPONSE_BYTES:
                raise ResponseTooLarge(
                    f"{self.request.url.path} sent more than {MAX_RESPONSE_BYTES >> 20} MiB: "
                    "no answer servegate reads is that large",
                    request=self.request,
                )
            if time.monotonic() > self.deadline:
                raise WholeRequestTimeout(
                    f"{self.request.url.path} took longer than {self.seconds:g}s in all: the "
                    "server kept sending past the request's deadline",
                    request=self.request,
                )
            yield chunk

    def close(self) -> None:
        self.inner.close()


def health(endpoint: Endpoint, timeout: float = 5.0) -> tuple[bool, str]:
    """(healthy, why not): the engine's health path (vLLM: ``/health``) answers 200 and its
    model list (``/v1/models``) names a model."""
    engine = endpoint.adapter
    try:
        with endpoint.client(timeout) as client:
            if engine.health_path:
                resp = client.get(engine.health_path)
                if resp.status_code != 200:
                    return False, f"{engine.health_path} answered {resp.status_code}"
            models = client.get(engine.models_path)
            if models.status_code != 200:
                return False, f"{engine.models_path} answered {models.status_code}"
            if not model_ids(models.json()) and engine.lists_served_model:
                return False, "/v1/models lists no model"
    except (httpx.HTTPError, ValueError) as exc:
        return False, f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return True, ""


def model_ids(payload: Any) -> list[str]:
    data = payload.get("data") if isinstance(payload, dict) else None
    return [str(m["id"]) for m in data or [] if isinstance(m, dict) and "id" in m]


def first_model(endpoint: Endpoint, timeout: float = 10.0) -> str:
    with endpoint.client(timeout) as client:
        ids = model_ids(client.get(endpoint.adapter.models_path).json())
    return ids[0] if ids else ""


def chat(
    endpoint: Endpoint, model: str, prompt: str, max_tokens: int, timeout: float
) -> dict[str, Any]:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
    }
    with endpoint.client(timeout) as client:
        resp = client.post("/v1/chat/completions", json=body)
        resp.raise_for_status()
        result: dict[str, Any] = resp.json()
    return result
