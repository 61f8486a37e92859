"""Measurements and validity of one trial and one concurrency group.

Definitions (the ones llm-context-bench and the seeds use):

- ``ttft_s``: request sent → first chunk carrying text
- ``client_wait_s``: how long that chunk may have waited for the client's thread to get
  a CPU before it was read (``servegate.bench.cpuwait``)
- ``first_gap_s``: first text chunk → second (one inter-token gap on an honest stream)
- ``prefill_tps``: ``prompt_tokens / ttft_s``
- ``decode_window_s``: first text chunk → last text chunk
- ``generation_tps``: ``(completion_tokens - 1) / decode_window_s``
- ``mean_inter_token_latency_ms``: ``decode_window_s / (completion_tokens - 1)`` in ms
- ``output_tps_whole_request``: ``completion_tokens / wall time``
- ``tokens_per_chunk``: ``completion_tokens / text chunks``
- ``engine_prefill_tps``, ``engine_generation_tps``: the same rates by the engine's own
  clock (vLLM's ``request_prefill_time`` and ``request_decode_time`` histograms, read
  across the group): they do not move when the frontend or the client is starved
- ``engine_ttft_s``: the engine's own TTFT (vLLM's ``time_to_first_token`` histogram:
  the request's arrival in the frontend, before its chat template and tokenizer, → its
  first token); ``frontend_ttft_s``: ``ttft_s - engine_ttft_s`` at concurrency 1, the
  part of the client's TTFT outside the engine's clock (the frontend's HTTP and request
  handling before the arrival, its output path after the first token, the network)

A stream that arrives in a burst (mean inter-token latency below ``min_itl_ms``) was held
back between the engine and the client, and a first text that waited for the client to
get a CPU (``client_wait_s`` above ``max_client_wait_share`` of the TTFT) was read late:
their client-side timings are not measurements and are dropped (``client_timing``), the
engine's clock still counts.

Token counts come from ``usage`` only.
"""

from __future__ import annotations

import itertools
import re
import statistics
import zlib
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from servegate.bench.schema import GroupTotals, Trial
from servegate.bench.sse import Stream

_WORDS = re.compile(r"\w+|[^\w\s]")

CACHE_FIELDS = (
    ("timings.cache_n", ("timings", "cache_n")),
    (
        "usage.prompt_tokens_details.cached_tokens",
        ("usage", "prompt_tokens_details", "cached_tokens"),
    ),
    ("usage.cached_tokens", ("usage", "cached_tokens")),
    ("usage.cache_read_input_tokens", ("usage", "cache_read_input_tokens")),
    ("usage.prompt_cache_hit_tokens", ("usage", "prompt_cache_hit_tokens")),
)


@dataclass(frozen=True)
class Rules:
    """What makes a performance trial valid (see docs/bench.md)."""

    max_tokens: int = 1024
    nominal_tokens: int = 0
    tolerance_pct: float = 2.0
    min_text_tokens: int = 128
    min_unique_ratio: float = 0.08
    max_dominant_ratio: float = 0.20
    min_zlib_ratio: float = 0.15
    #: a mean inter-token latency below this (ms) is a burst, not a decode: the stream
    #: was held back (a stalled client or frontend) and arrived at once
    min_itl_ms: float = 0.25
    #: how far a server's ``usage.completion_tokens`` may exceed its streamed text counted
    #: again by the tokenizer (a fraction; see ``Bench._recount``)
    max_usage_excess: float = 0.02
    #: the largest share of the answer's text one chunk may carry (beyond
    #: ``CHUNK_FLOOR`` characters): text that arrives at once was not decoded in the
    #: window the rate divides by
    max_chunk_share: float = 0.10
    #: the longest wait in a stream's start, as a share of the time to its first text,
    #: before that text counts as sent ahead of the prefill (``first_text_ahead``)
    max_first_gap_share: float = 0.5
    #: the longest the first text may wait for the client to get a CPU, as a share of
    #: the time to it (beyond ``CLIENT_WAIT_FLOOR``), before the client's timings are
    #: its own (``waited``)
    max_client_wait_share: float = 0.01


#: characters any one chunk may carry whatever the answer's length (a speculative step's
#: tokens, a run of spaces in code)
CHUNK_FLOOR = 256
#: times the stream's median chunk one chunk may carry
CHUNK_SPREAD = 8
#: times the stream's mean inter-token gap a wait in its start may last before its first
#: text counts as sent ahead of the prefill (with ``Rules.max_first_gap_share``)
FIRST_GAP_SPREAD = 10
#: seconds a wait in a stream's start may last whatever its pace
FIRST_GAP_FLOOR = 0.05
#: seconds the first text may wait for the client to get a CPU whatever the TTFT
CLIENT_WAIT_FLOOR = 0.001


def content_stats(text: str) -> dict[str, Any]:
    words = _WORDS.findall(text.lower())
    counts = Counter(words)
    raw = text.encode()
    return {
        "chars": len(text),
        "text_tokens": len(words),
        "unique_ratio": round(len(counts) / len(words), 6) if words else 0.0,
        "dominant_ratio": round(max(counts.values()) / len(words), 6) if words else 1.0,
        "dominant_token": counts.most_common(1)[0][0] if words else "",
        "zlib_ratio": round(len(zlib.compress(raw, 9)) / len(raw), 6) if raw else 0.0,
    }


def cached_tokens(stream: Stream) -> dict[str, int]:
    """Every cached-prompt-token field the engine reported (value > 0 or not)."""
    found: dict[str, int] = {}
    doc = {"usage": stream.usage, "timings": stream.timings}
    for name, path in CACHE_FIELDS:
        node: Any = doc
        for key in path:
            node = node.get(key) if isinstance(node, dict) else None
        if isinstance(node, int | float) and not isinstance(node, bool):
            found[name] = int(node)
    return found


def _r(value: float | None, places: int = 6) -> float | None:
    return None if value is None else round(value, places)


def token_count(value: Any) -> int | None:
    """A token count as the server reported it: an int of 0 or more (a float, a bool, a
    negative number or a string is not a count: the trial has none)."""
    if type(value) is not int or value < 0:
        return None
    return value


def trial(stream: Stream, rules: Rules) -> Trial:
    """One streamed request → its measurements, validity and reasons."""
    usage = stream.usage
    prompt = token_count(usage.get("prompt_tokens"))
    done = stream.done_at or stream.last_text_at
    wall = (done - stream.started) if done else None
    out: Trial = {
        "ok": not stream.error,
        "error": stream.error,
        "http_status": stream.http_status,
        "prompt_tokens": prompt,
        "completion_tokens": token_count(usage.get("completion_tokens")),
        "token_count_source": "usage" if usage else "none",
        "finish_reason": stream.finish_reason,
        "text_chunks": stream.text_chunks,
        "events": stream.events,
        "wall_s": _r(wall),
        "ttft_s": None,
        "first_gap_s": None,
        "prefill_tps": None,
        "decode_window_s": None,
        "generation_tps": None,
        "mean_inter_token_latency_ms": None,
        "output_tps_whole_request": None,
        "tokens_per_chunk": None,
        "largest_chunk_chars": stream.largest_chunk,
        "median_chunk_chars": median_chunk(stream),
        "recounted_tokens": None,
        "engine_prefill_tps": None,
        "engine_generation_tps": None,
        "client_wait_s": None,
        "engine_ttft_s": None,
        "frontend_ttft_s": None,
        "stream_delivery": "none",
        "cached_tokens": cached_tokens(stream),
        "content": content_stats(stream.content),
        "output_excerpt": stream.content[:160],
        "client_timing": "",
        "invalid_reasons": [],
        "reason_details": {},
        "performance_valid": False,
    }
    completion = out["completion_tokens"] if isinstance(out["completion_tokens"], int) else None
    first, last = stream.first_text_at, stream.last_text_at
    if first is not None:
        ttft = first - stream.started
        out["ttft_s"] = _r(ttft)
        out["client_wait_s"] = _r(stream.client_wait)
        if prompt and ttft > 0:
            out["prefill_tps"] = _r(prompt / ttft, 4)
        if stream.second_text_at is not None:
            out["first_gap_s"] = _r(stream.second_text_at - first)
    if first is not None and last is not None:
        window = last - first
        out["stream_delivery"] = "incremental" if stream.text_chunks > 1 else "buffered"
        if stream.text_chunks > 1 and window > 0:
            out["decode_window_s"] = _r(window)
            if completion and completion > 1:
                out["generation_tps"] = _r((completion - 1) / window, 4)
                out["mean_inter_token_latency_ms"] = _r(window * 1000 / (completion - 1), 4)
    if completion and wall:
        out["output_tps_whole_request"] = _r(completion / wall, 4)
    if completion and stream.text_chunks:
        out["tokens_per_chunk"] = _r(completion / stream.text_chunks, 4)
    out["client_timing"] = waited(out, rules) or _burst(out, rules) or held(stream, rules)
    if out["client_timing"]:  # what the client's clock measured is dropped
        out["ttft_s"] = out["prefill_tps"] = out["decode_window_s"] = out["first_gap_s"] = None
        out["generation_tps"] = out["mean_inter_token_latency_ms"] = None
        out["output_tps_whole_request"] = None
    reasons = _reasons(out, rules)
    out["invalid_reasons"] = sorted(reasons)
    out["reason_details"] = reasons
    out["performance_valid"] = not reasons
    return out


#: what the client's clock measured (dropped from a burst)
CLIENT_TIMINGS = (
    "ttft_s",
    "first_gap_s",
    "prefill_tps",
    "decode_window_s",
    "generation_tps",
    "mean_inter_token_latency_ms",
    "output_tps_whole_request",
)


def _burst(t: Mapping[str, Any], rules: Rules) -> str:
    return burst(t["mean_inter_token_latency_ms"], t["completion_tokens"],
                 t["decode_window_s"], rules)  # fmt: skip


def burst(itl_ms: float | None, completion: Any, window_s: float | None, rules: Rules) -> str:
    """Why a stream whose mean inter-token latency is ``itl_ms`` arrived in a burst ("":
    it did not): its text was held back between the engine and the client and came at
    once, so the client's clock did not see its decode."""
    if itl_ms is None or itl_ms >= rules.min_itl_ms:
        return ""
    return (
        f"burst: {completion} tokens arrived within {window_s} s (mean "
        f"ITL {itl_ms} ms < {rules.min_itl_ms} ms): held back between engine and client"
    )


def _reasons(t: Mapping[str, Any], rules: Rules) -> dict[str, str]:
    r: dict[str, str] = {}
    if not t["ok"]:
        r["request_failed"] = t["error"]
        return r
    completion = t["completion_tokens"]
    if completion != rules.max_tokens:
        r["output_length_mismatch"] = (
            f"{completion} output tokens, not {rules.max_tokens} (finish: {t['finish_reason']})"
        )
    prompt = t["prompt_tokens"]
    if prompt is None:
        r["prompt_tokens_not_reported"] = "usage carried no prompt_tokens"
    elif rules.nominal_tokens:
        drift = (prompt - rules.nominal_tokens) / rules.nominal_tokens * 100
        if abs(drift) > rules.tolerance_pct:
            r["input_size_outside_tolerance"] = (
                f"{prompt} prompt tokens is {drift:+.1f}% from {rules.nominal_tokens} "
                f"(tolerance ±{rules.tolerance_pct:g}%)"
            )
    c = t["content"]
    if c["text_tokens"] < rules.min_text_tokens:
        r["too_few_text_tokens"] = f"{c['text_tokens']} < {rules.min_text_tokens}"
    if c["unique_ratio"] < rules.min_unique_ratio:
        r["low_unique_token_ratio"] = f"{c['unique_ratio']:.3f} < {rules.min_unique_ratio}"
    if c["dominant_ratio"] > rules.max_dominant_ratio:
        r["dominant_repeated_token"] = (
            f"{c['dominant_token']!r} is {c['dominant_ratio']:.1%} of the output "
            f"(> {rules.max_dominant_ratio:.0%})"
        )
    if c["zlib_ratio"] < rules.min_zlib_ratio:
        r["highly_compressible_repetition"] = f"zlib ratio {c['zlib_ratio']:.3f}"
    hits = {k: v for k, v in t["cached_tokens"].items() if v > 0}
    if hits:
        r["prompt_cache_hit"] = ", ".join(f"{k}={v}" for k, v in hits.items())
    if t["stream_delivery"] != "incremental":
        r["stream_not_incremental"] = f"{t['text_chunks']} text chunk(s): no decode window"
    why = oversized(t["largest_chunk_chars"], t["median_chunk_chars"], t["content"]["chars"],
                    rules.max_chunk_share)  # fmt: skip
    if why:
        r["oversized_chunk"] = why
    return r


def start_waits(stream: Stream) -> tuple[list[tuple[float, float]], float | None]:
    """The waits in a stream's start, ``(from, to)``: between each two of its first
    ``EARLY_CHUNKS`` text chunks and before the one after them, and the lead from its
    first text to its first word (text of spaces, punctuation or invisible characters
    before it); and its pace there: the median of those gaps but the longest (None: too
    few chunks to tell)."""
    stamps = [*stream.early, *([stream.after_early_at] if stream.after_early_at else [])]
    gaps = list(itertools.pairwise(stamps))
    if len(gaps) < 2:
        return [], None
    lengths = sorted(b - a for a, b in gaps)
    pace = statistics.median(lengths[:-1])
    waits = gaps
    word = stream.first_word_at
    if word is not None and stamps and word > stamps[0]:
        waits = [*gaps, (stamps[0], word)]
    return waits, pace


def first_text_ahead(
    stream: Stream, t: Mapping[str, Any], rules: Rules, anchors: Sequence[float] = ()
) -> str:
    """Why the stream's first text looks sent before the prefill ended ("": it does not).

    The first chunk is what ``ttft_s`` times, so a frontend that sends text (a space,
    a dot, a few of them, a drip) as soon as a request arrives, and the model's tokens
    only after the prefill, would pass a slower prefill as a faster one. The prefill it
    hid is spent somewhere in the stream's start (:func:`start_waits`), where an honest
    stream spends a few inter-token gaps. The text counts as sent ahead when the
    longest wait there is longer than ``rules.max_first_gap_share`` of the time to the
    first text, than ``FIRST_GAP_SPREAD`` times the stream's pace there, and than
    ``FIRST_GAP_FLOOR``. In a group of streams started together, a wait that ends as
    another stream's first text comes (``anchors``: the first texts of the group's
    streams that passed this check on their own) is that stream's prefill, not a lie.
    A start whose pace is a burst is not judged here: the client's timings of such a
    stream are dropped (:func:`held`).

    This is the check where the engine has no clock of its own: words a frontend makes
    up ahead of the model cannot be told from the model's by the client alone, and a
    neighbour can stall an honest stream at any token. Where the engine has a clock
    (vLLM's TTFT histogram), the bench asks it instead (``Bench._first_token_check``)."""
    ttft = t["ttft_s"]
    waits, pace = start_waits(stream)
    if ttft is None or pace is None or pace * 1000 < rules.min_itl_ms:
        return ""
    slack = max(FIRST_GAP_FLOOR, 2 * pace)
    waits = [(a, b) for a, b in waits if not any(a < o <= b + slack for o in anchors)]
    if not waits:
        return ""
    start, end = max(waits, key=lambda w: w[1] - w[0])
    hidden = end - start
    if hidden > max(rules.max_first_gap_share * ttft, FIRST_GAP_SPREAD * pace, FIRST_GAP_FLOOR):
        return (
            f"the stream waited {hidden:.3f} s at its start ({start - stream.started:.3f} s to "
            f"{end - stream.started:.3f} s after the request), after a first text at "
            f"{ttft:.3f} s (its pace there: {pace * 1000:.1f} ms a chunk): the first text was "
            "sent ahead of the prefill, so the time to it is not a TTFT"
        )
    return ""


def waited(t: Mapping[str, Any], rules: Rules) -> str:
    """Why the client's time to the first text is its own ("": it is not): the text was
    there, and the client's thread waited for a CPU before it could read it, longer than
    ``rules.max_client_wait_share`` of that time and ``CLIENT_WAIT_FLOOR`` (a busy box:
    the engine, its frontend or a neighbour on the client's core). The time to the text
    and the decode window that starts there measured the client."""
    wait, ttft = t["client_wait_s"], t["ttft_s"]
    if wait is None or ttft is None or wait <= max(CLIENT_WAIT_FLOOR,
                                                   rules.max_client_wait_share * ttft):  # fmt: skip
        return ""
    return (
        f"client wait: its first text waited {wait:.3f} s for the client's thread to get a CPU "
        f"before it was read, {wait / ttft:.0%} of the {ttft:.3f} s to it "
        f"(> {rules.max_client_wait_share:.0%} and {CLIENT_WAIT_FLOOR * 1000:g} ms)"
    )


def held(stream: Stream, rules: Rules) -> str:
    """Why the stream's start arrived in a burst though the stream as a whole did not
    ("": it did not): its first text, then a wait, then the rest at once. The client's
    timings of such a stream measure whatever held it back, and a frontend could hold
    the model's text back behind text of its own to hide a prefill: they are dropped
    as a burst's are."""
    _, pace = start_waits(stream)
    if pace is None or pace * 1000 >= rules.min_itl_ms:
        return ""
    return (
        f"burst: the stream's start came at {pace * 1000:.3f} ms a chunk (< {rules.min_itl_ms} "
        "ms) after its first text: held back between engine and client"
    )


#: (seconds, share) by which the client's mean time to its first text may fall short of
#: the engine's own TTFT before that text counts as sent ahead of the model
FIRST_TOKEN_SLACK = (0.005, 0.01)


def text_before_first_token(
    seen: Sequence[float],
    engine: tuple[float, float] | None,
    metric: str,
    buckets: Sequence[tuple[float, float]] = (),
) -> str:
    """Why the client's first texts (``seen``: each request's sent → first text) came
    before the model had any ("": they did not, or it cannot be told). The client cannot
    see a token before the engine made it: vLLM's TTFT histogram (``engine``: its mean
    and count over the same requests; ``buckets``: how many were at or under each
    bound) times each request from its arrival at the server to its first token, so on
    an honest server every client's time is longer. So the mean is, and at every bound
    at most as many client times fall under it as engine times do: a frontend that
    sends one request's text early and holds another's back to keep the mean shows in
    the buckets. ``FIRST_TOKEN_SLACK`` covers the two clocks (the server's wall clock,
    the client's monotonic one). A histogram that counted fewer requests tells nothing
    (the caller decides what that means); one that counted more (requests cut off before
    the client saw their first text) still bounds the buckets, as each extra first token
    only adds to the engine's side, but not the mean."""
    if not engine or not seen or engine[1] < len(seen):
        return ""
    slack, share = FIRST_TOKEN_SLACK
    client = statistics.fmean(seen)
    if engine[1] == len(seen) and client < engine[0] * (1 - share) - slack:
        return (
            f"the client got its first text {client:.3f} s after sending (the mean of "
            f"{len(seen)}), the engine made its first token {engine[0]:.3f} s after the "
            f"request arrived ({metric}): the stream carried text before the model had any"
        )
    for bound, made in buckets:
        early = sum(1 for s in seen if s * (1 + share) + slack <= bound)
        if early > made:
            return (
                f"{early} of the client's {len(seen)} first texts came within {bound:g} s "
                f"of sending, where the engine made {made:.0f} first tokens within {bound:g} s "
                f"of a request's arrival ({metric}): text came before the model had any"
            )
    return ""


def median_chunk(stream: Stream) -> float:
    return statistics.median(len(p) for p in stream.text) if stream.text else 0.0


def oversized(largest: int, median: float, chars: int, share: float) -> str:
    """Why one chunk carried text that was not decoded within the window ("": none did):
    more than ``share`` of the answer, more than ``CHUNK_FLOOR`` characters and more than
    ``CHUNK_SPREAD`` times the stream's median chunk. A server that sends every N tokens
    at once (vLLM's ``--stream-interval``) has large chunks, evenly; a dump at the end
    stands out of its stream."""
    if largest > max(CHUNK_FLOOR, share * chars, CHUNK_SPREAD * median):
        return (
            f"one chunk carried {largest} of the answer's {chars} characters (> {share:.0%}, "
            f"> {CHUNK_FLOOR} and > {CHUNK_SPREAD}x the median chunk's {median:g}): text "
            "that arrived at once, not decoded within the window"
        )
    return ""


def invalidate(t: Trial, code: str, detail: str) -> None:
    """Mark a trial invalid for a reason found outside its own stream."""
    t["reason_details"][code] = detail
    t["invalid_reasons"] = sorted(t["reason_details"])
    t["performance_valid"] = False


def group(trials: Sequence[Trial], started: float, stamps: Sequence[Stream]) -> GroupTotals:
    """Whole-load totals of streams started together."""
    firsts = [s.first_text_at for s in stamps if s.first_text_at is not None]
    lasts = [s.last_text_at for s in stamps if s.last_text_at is not None]
    dones = [s.done_at or s.last_text_at for s in stamps]
    prompts = [t["prompt_tokens"] for t in trials]
    completions = [t["completion_tokens"] for t in trials]
    complete = all(isinstance(p, int) for p in prompts) and all(
        isinstance(c, int) for c in completions
    )
    out: GroupTotals = {
        "requests": len(trials),
        "valid_requests": sum(1 for t in trials if t["performance_valid"]),
        "wall_s": None,
        "prompt_tokens_total": None,
        "output_tokens_total": None,
        "prefill_tps_total": None,
        "generating_window_s": None,
        "token_generation_tps_total": None,
        "requests_per_minute": None,
        "ttft_max_s": None,
        "invalid_reason_totals": {},
        "group_valid": False,
    }
    if all(d is not None for d in dones) and dones:
        wall = max(d for d in dones if d is not None) - started
        out["wall_s"] = _r(wall)
        out["requests_per_minute"] = _r(len(trials) / wall * 60, 3) if wall > 0 else None
    if complete and len(firsts) == len(trials):
        total_prompt = sum(p for p in prompts if isinstance(p, int))
        total_out = sum(c for c in completions if isinstance(c, int))
        out["prompt_tokens_total"] = total_prompt
        out["output_tokens_total"] = total_out
        slowest_first = max(firsts) - started
        out["ttft_max_s"] = _r(slowest_first)
        out["prefill_tps_total"] = _r(total_prompt / slowest_first, 3) if slowest_first else None
        if len(lasts) == len(trials):
            window = max(lasts) - min(firsts)
            out["generating_window_s"] = _r(window)
            if window > 0:
                out["token_generation_tps_total"] = _r((total_out - len(trials)) / window, 3)
    reasons = Counter(code for t in trials for code in t["invalid_reasons"])
    out["invalid_reason_totals"] = dict(sorted(reasons.items()))
    out["group_valid"] = out["valid_requests"] == len(trials) and out["wall_s"] is not None
    return out
