"""The result document of a bench run, typed: what a result file holds, key by key.

A result file is JSON (``docs/bench.md`` describes it for readers in other languages);
these ``TypedDict`` s are the same structure for servegate's own code, so a producer that
forgets a key, or a reader that asks for one that does not exist, fails the type check
instead of a run. Readers of files from elsewhere (an older servegate, llm-context-bench)
still go through :mod:`servegate.bench.results`, which checks what it reads.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NotRequired, TypedDict, cast


class Trial(TypedDict):
    """One streamed request: its measurements, validity and reasons."""

    ok: bool
    error: str
    http_status: int | None
    prompt_tokens: int | None
    completion_tokens: int | None
    #: "usage" (the server's count) or "none"
    token_count_source: str
    finish_reason: str | None
    text_chunks: int
    events: int
    wall_s: float | None
    ttft_s: float | None
    #: first text chunk → second (one inter-token gap on an honest stream)
    first_gap_s: float | None
    prefill_tps: float | None
    decode_window_s: float | None
    generation_tps: float | None
    mean_inter_token_latency_ms: float | None
    output_tps_whole_request: float | None
    tokens_per_chunk: float | None
    #: the most characters one text chunk carried
    largest_chunk_chars: int
    median_chunk_chars: float
    #: the streamed text counted again by the tokenizer that sized the prompts (null:
    #: none did, or the request failed)
    recounted_tokens: int | None
    #: by the engine's own clock (vLLM's request prefill/decode time histograms)
    engine_prefill_tps: float | None
    engine_generation_tps: float | None
    #: how long the first text may have waited for the client's thread to get a CPU
    #: before it was read (an upper bound; null: no text, or the OS does not say)
    client_wait_s: float | None
    #: the engine's own TTFT (vLLM: arrival → first token; the group's mean above
    #: concurrency 1) and, at concurrency 1, ``ttft_s`` less it: the frontend's share
    engine_ttft_s: float | None
    frontend_ttft_s: float | None
    #: "incremental", "buffered" or "none"
    stream_delivery: str
    cached_tokens: dict[str, int]
    content: dict[str, Any]
    output_excerpt: str
    #: why the client's timings were dropped ("" when kept)
    client_timing: str
    invalid_reasons: list[str]
    reason_details: dict[str, str]
    performance_valid: bool
    request_tag: NotRequired[str]
    stream_index: NotRequired[int]
    ignore_eos: NotRequired[bool]


class GroupTotals(TypedDict):
    """Whole-load totals of the streams of one group (started together)."""

    requests: int
    valid_requests: int
    wall_s: float | None
    prompt_tokens_total: int | None
    output_tokens_total: int | None
    prefill_tps_total: float | None
    generating_window_s: float | None
    token_generation_tps_total: float | None
    requests_per_minute: float | None
    ttft_max_s: float | None
    invalid_reason_totals: dict[str, int]
    group_valid: bool


class GroupReference(TypedDict):
    """The box's speed beside a group (the reference workload)."""

    before_gflops: float
    after_gflops: float
    rate: float
    workload: str


class ServerMetrics(TypedDict):
    """The engine's own counters around a group (``/metrics`` deltas)."""

    prefix_cache_hits: float | None
    prefix_cache_queries: float | None
    spec_accepted: float | None
    spec_draft: float | None
    ttft_mean_s: float | None
    itl_mean_s: float | None


class Group(TypedDict):
    group: int
    #: which service start measured it (0: the first; the gate may spread its groups)
    start: int
    trials: list[Trial]
    totals: GroupTotals
    server_metrics: ServerMetrics
    reference: GroupReference | None
    #: GPU clocks, power, temperature, memory, use while the group ran (None: no GPU
    #: tool; see ``servegate.bench.telemetry``)
    telemetry: NotRequired[dict[str, Any] | None]
    #: what showed the first texts were the model's: "engine clock" (vLLM's TTFT
    #: histogram) or "stream pace" (an engine without one)
    first_text_check: NotRequired[str]


class Case(TypedDict):
    id: str
    profile: str
    tier: str
    nominal_tokens: int
    concurrency: int
    required: bool
    groups: list[Group]
    #: medians of the valid trials per metric, validity and reason totals
    summary: dict[str, Any]


class Start(TypedDict):
    """A service start the run went on in (the gate restarted the service)."""

    start: int
    at: str


class Result(TypedDict):
    """A whole bench run (schema :data:`servegate.bench.cases.SCHEMA`)."""

    schema: int
    kind: str
    #: running, complete, failed or interrupted
    status: str
    harness: dict[str, str]
    started_at: str
    finished_at: str | None
    error: str
    run: dict[str, Any]
    fixtures: dict[str, dict[str, Any]]
    #: what must match for two runs' samples to be compared (``digest`` sums it up)
    fingerprint: dict[str, Any]
    engine: dict[str, Any]
    sizing: dict[str, dict[str, Any]]
    warmup: dict[str, Any] | None
    cases: list[Case]
    performance_table: list[dict[str, Any]]
    starts: NotRequired[list[Start]]
    #: the gate's decision table, when a gate judged this run
    gate: NotRequired[dict[str, Any]]
    probes: NotRequired[list[dict[str, Any]]]
    #: which GPU tool was read beside the groups, or why none
    telemetry: NotRequired[dict[str, Any]]


def metric_of(trial: Trial, name: str) -> float | None:
    """A trial's value of the metric ``name`` (one of ``cases.METRICS``), or None."""
    value = cast(Mapping[str, object], trial).get(name)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)
