"""The few OpenAI-compatible endpoints promote needs: health, models, one chat completion."""

from __future__ import annotations

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
        limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
        return httpx.Client(
            base_url=self.base_url, timeout=timeout, headers=self.headers, limits=limits
        )


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
