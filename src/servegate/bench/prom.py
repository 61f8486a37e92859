"""Prometheus text → sums per metric name, and the deltas the bench reads across a window."""

from __future__ import annotations

import re
from collections.abc import Mapping

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")

PREFIX_HITS = ("vllm:prefix_cache_hits_total", "vllm:prefix_cache_hits")
PREFIX_QUERIES = ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_queries")
TTFT = "vllm:time_to_first_token_seconds"
ITL = ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds")
SPEC_ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
SPEC_DRAFT = "vllm:spec_decode_num_draft_tokens_total"


def parse(text: str) -> dict[str, float]:
    """Every sample summed over its labels (``name`` → value)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        m = _SAMPLE.match(line)
        if not m:
            continue
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        out[m.group(1)] = out.get(m.group(1), 0.0) + value
    return out


def first(sample: Mapping[str, float], names: tuple[str, ...] | str) -> float | None:
    for name in (names,) if isinstance(names, str) else names:
        if name in sample:
            return sample[name]
    return None


def delta(
    before: Mapping[str, float], after: Mapping[str, float], names: tuple[str, ...] | str
) -> float | None:
    a, b = first(after, names), first(before, names)
    return None if a is None or b is None else a - b


def histogram_mean_delta(
    before: Mapping[str, float], after: Mapping[str, float], names: tuple[str, ...] | str
) -> tuple[float, float] | None:
    """(mean, count) of a histogram's observations made between two scrapes."""
    for name in (names,) if isinstance(names, str) else names:
        s = delta(before, after, name + "_sum")
        c = delta(before, after, name + "_count")
        if s is not None and c:
            return s / c, c
    return None
