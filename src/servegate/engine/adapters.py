"""What each serving engine answers where: health, model list, ``/tokenize``, and the
names of its ``/metrics`` series (prefix cache, speculative decoding, latency histograms).

Promote, the probes and the bench ask the engine's adapter instead of guessing a path or
a metric name; a generic OpenAI-compatible server (``openai``) is asked only what the
OpenAI API defines, and the measurements that need more are recorded as unavailable.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from servegate.errors import ConfigError


@dataclass(frozen=True)
class MetricNames:
    """Prometheus series, each as the names it has had across engine versions."""

    prefix_hits: tuple[str, ...] = ()
    prefix_queries: tuple[str, ...] = ()
    ttft: tuple[str, ...] = ()
    itl: tuple[str, ...] = ()
    spec_accepted: tuple[str, ...] = ()
    spec_draft: tuple[str, ...] = ()
    #: the engine's own clock: scheduled → first token, first → last token
    prefill_time: tuple[str, ...] = ()
    decode_time: tuple[str, ...] = ()
    #: the engine's own token counts, per finished request (histograms)
    prompt_tokens: tuple[str, ...] = ()
    generation_tokens: tuple[str, ...] = ()
    #: gauges: requests queued and running (the load bench's evidence of a queue)
    waiting: tuple[str, ...] = ()
    running: tuple[str, ...] = ()


@dataclass(frozen=True)
class Engine:
    name: str
    #: a path that answers 200 when the engine is up ("" : only the model list counts)
    health_path: str
    models_path: str
    #: chat-template-aware token counting ("" : none; the bench estimates)
    tokenize_path: str
    #: Prometheus text ("" : none)
    metrics_path: str
    metrics: MetricNames
    #: the engine takes extra sampling fields (top_k, min_p) and a per-request cache_salt
    extended_sampling: bool
    #: ``owned_by`` in /v1/models that identifies the engine
    owned_by: str = ""
    #: /v1/models names the model it serves (``transformers serve`` pinned to a local
    #: model lists only its download cache: the model is the path it was started with)
    lists_served_model: bool = True
    #: a stream ends with ``data: [DONE]``; without it (``transformers serve``) a stream is
    #: whole when it carried a finish reason and the usage chunk
    sends_done: bool = True


VLLM = Engine(
    name="vllm",
    health_path="/health",
    models_path="/v1/models",
    tokenize_path="/tokenize",
    metrics_path="/metrics",
    metrics=MetricNames(
        prefix_hits=("vllm:prefix_cache_hits_total", "vllm:prefix_cache_hits"),
        prefix_queries=("vllm:prefix_cache_queries_total", "vllm:prefix_cache_queries"),
        ttft=("vllm:time_to_first_token_seconds",),
        itl=("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"),
        spec_accepted=("vllm:spec_decode_num_accepted_tokens_total",),
        spec_draft=("vllm:spec_decode_num_draft_tokens_total",),
        prefill_time=("vllm:request_prefill_time_seconds",),
        decode_time=("vllm:request_decode_time_seconds",),
        prompt_tokens=("vllm:request_prompt_tokens",),
        generation_tokens=("vllm:request_generation_tokens",),
        waiting=("vllm:num_requests_waiting",),
        running=("vllm:num_requests_running",),
    ),
    extended_sampling=True,
    owned_by="vllm",
)

#: ``transformers serve`` (Hugging Face): /health, no /tokenize (the bench sizes prompts
#: with the model's tokenizer files: ``bench.tokenizer``), no metrics; pinned to a local
#: model (``transformers serve /path``) it answers only for that path, which its model
#: list does not name
TRANSFORMERS = Engine(
    name="transformers",
    health_path="/health",
    models_path="/v1/models",
    tokenize_path="",
    metrics_path="",
    metrics=MetricNames(),
    extended_sampling=False,
    lists_served_model=False,
    sends_done=False,
)

OPENAI = Engine(
    name="openai",
    health_path="",
    models_path="/v1/models",
    tokenize_path="",
    metrics_path="",
    metrics=MetricNames(),
    extended_sampling=False,
)

ENGINES = {e.name: e for e in (VLLM, TRANSFORMERS, OPENAI)}


def by_name(name: str) -> Engine:
    try:
        return ENGINES[name]
    except KeyError:
        raise ConfigError(
            f"no engine adapter named {name!r}", hint=f"engines: {', '.join(ENGINES)}"
        ) from None


def detect(models: Iterable[Mapping[str, Any]]) -> Engine:
    """The engine a server's /v1/models entries name (``owned_by``); generic otherwise."""
    owners = {str(m.get("owned_by")) for m in models}
    return next((e for e in ENGINES.values() if e.owned_by and e.owned_by in owners), OPENAI)
