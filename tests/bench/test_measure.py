"""Measurement definitions and validity rules, on streams with known timestamps."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from servegate.bench import fixtures, measure
from servegate.bench.schema import metric_of
from servegate.bench.sse import Stream, parse_lines


class Clock:
    """Advances by ``step`` seconds on every read."""

    def __init__(self, step: float = 1.0) -> None:
        self.t = 0.0
        self.step = step

    def __call__(self) -> float:
        self.t += self.step
        return self.t


def sse(events: list[dict[str, object]], done: bool = True) -> Iterator[str]:
    for e in events:
        yield "data: " + json.dumps(e)
        yield ""
    if done:
        yield "data: [DONE]"


def varied(n: int) -> list[str]:
    """``n`` chunks of real prose (the regular fixture), a few words each."""
    words = fixtures.load("regular").text.split()
    return [" ".join(words[3 * i : 3 * i + 3]) + " " for i in range(n)]


def stream_of(pieces: list[str], prompt: int, completion: int, **usage: object) -> Stream:
    events: list[dict[str, object]] = [{"choices": [{"delta": {"role": "assistant"}}]}]
    events += [{"choices": [{"delta": {"content": p}}]} for p in pieces]
    events.append(
        {
            "choices": [],
            "usage": {"prompt_tokens": prompt, "completion_tokens": completion, **usage},
        }
    )
    return parse_lines(sse(events), Stream(started=0.0), Clock())


def test_definitions_follow_the_fields_rules() -> None:
    st = stream_of(varied(400), prompt=16384, completion=1024)
    t = measure.trial(st, measure.Rules(nominal_tokens=16384))
    # the role-only delta carries no text: first text at t=1, last at t=400, [DONE] at 401
    assert t["ttft_s"] == 1.0
    assert t["prefill_tps"] == 16384.0
    assert t["decode_window_s"] == 399.0
    assert t["generation_tps"] == pytest.approx(1023 / 399, rel=1e-4)
    assert t["mean_inter_token_latency_ms"] == pytest.approx(399_000 / 1023, rel=1e-4)
    assert t["output_tps_whole_request"] == pytest.approx(1024 / 401, rel=1e-4)
    assert t["tokens_per_chunk"] == pytest.approx(1024 / 400, rel=1e-4)
    assert t["token_count_source"] == "usage"
    assert t["performance_valid"], t["reason_details"]


def test_every_validity_rule_names_its_reason() -> None:
    rules = measure.Rules(nominal_tokens=16384)
    short = measure.trial(stream_of(varied(300), 16384, 731), rules)
    assert "output_length_mismatch" in short["invalid_reasons"]
    hyphens = measure.trial(stream_of(["- "] * 300, 16384, 1024), rules)
    assert {
        "dominant_repeated_token",
        "low_unique_token_ratio",
        "highly_compressible_repetition",
    } <= set(hyphens["invalid_reasons"])
    assert "'-'" in hyphens["reason_details"]["dominant_repeated_token"]
    few = measure.trial(stream_of(["a b c"] * 3, 16384, 1024), rules)
    assert "too_few_text_tokens" in few["invalid_reasons"]
    big = measure.trial(stream_of(varied(300), 18063, 1024), rules)
    assert "input_size_outside_tolerance" in big["invalid_reasons"]
    assert "+10.2%" in big["reason_details"]["input_size_outside_tolerance"]
    wide = measure.trial(
        stream_of(varied(300), 18063, 1024), measure.Rules(nominal_tokens=16384, tolerance_pct=12)
    )
    assert "input_size_outside_tolerance" not in wide["invalid_reasons"]
    cached = measure.trial(
        stream_of(varied(300), 16384, 1024, prompt_tokens_details={"cached_tokens": 16000}), rules
    )
    assert (
        cached["reason_details"]["prompt_cache_hit"]
        == "usage.prompt_tokens_details.cached_tokens=16000"
    )
    buffered = measure.trial(stream_of(["".join(varied(300))], 16384, 1024), rules)
    assert "stream_not_incremental" in buffered["invalid_reasons"]
    assert buffered["generation_tps"] is None  # no false decode rate from one flush


def test_token_counts_that_are_not_counts_make_no_valid_trial() -> None:
    """A float, a bool, a string or a negative number in usage is no count: 1024.0 is
    not the 1024 tokens asked for, and no rate is made from it."""
    rules = measure.Rules(nominal_tokens=16384)
    for bad in (1024.0, True, "1024", -1024):
        t = measure.trial(stream_of(varied(300), 16384, bad), rules)  # type: ignore[arg-type]
        assert t["completion_tokens"] is None
        assert "output_length_mismatch" in t["invalid_reasons"]
        assert not t["performance_valid"]
        assert t["generation_tps"] is None
    for bad in (16384.0, False, -16384):
        t = measure.trial(stream_of(varied(300), bad, 1024), rules)  # type: ignore[arg-type]
        assert t["prompt_tokens"] is None
        assert "prompt_tokens_not_reported" in t["invalid_reasons"]


def test_a_failed_stream_is_data_not_an_exception() -> None:
    st = parse_lines(
        iter(['{"error": {"message": "context length exceeded"}}']), Stream(0.0), Clock()
    )
    t = measure.trial(st, measure.Rules())
    assert t["invalid_reasons"] == ["request_failed"]
    assert "context length exceeded" in t["error"]
    cut = parse_lines(
        sse([{"choices": [{"delta": {"content": "x"}}]}], done=False), Stream(0.0), Clock()
    )
    assert not cut.saw_done


def test_group_totals_wait_for_the_slowest_stream() -> None:
    streams, trials = [], []
    for offset in (0.0, 4.0):
        st = Stream(
            started=0.0,
            first_text_at=2.0 + offset,
            last_text_at=12.0 + offset,
            done_at=12.5 + offset,
            text_chunks=500,
        )
        st.usage = {"prompt_tokens": 8192, "completion_tokens": 1024}
        st.text = varied(300)
        st.saw_done = True
        streams.append(st)
        trials.append(measure.trial(st, measure.Rules(nominal_tokens=8192)))
    g = measure.group(trials, 0.0, streams)
    assert g["ttft_max_s"] == 6.0
    assert g["prefill_tps_total"] == pytest.approx(2 * 8192 / 6.0, rel=1e-4)
    assert g["generating_window_s"] == 14.0  # first stream's first token → last stream's last
    assert g["token_generation_tps_total"] == pytest.approx(2 * 1023 / 14.0, rel=1e-4)
    assert g["group_valid"]
    measure.invalidate(trials[1], "compilation_in_window", "Compiling a graph for dynamic shape")
    g2 = measure.group(trials, 0.0, streams)
    assert not g2["group_valid"]
    assert g2["invalid_reason_totals"] == {"compilation_in_window": 1}


def test_a_stream_held_back_and_delivered_at_once_is_no_client_measurement() -> None:
    """512 tokens within 10 ms: the frontend or the client was starved, the engine was not.
    The client's timings are dropped (never a 50,000 tok/s decode); the trial stays valid
    for what the engine's own clock measured."""
    events: list[dict[str, object]] = [
        {"choices": [{"delta": {"content": p}}]} for p in varied(512)
    ]
    events.append({"choices": [], "usage": {"prompt_tokens": 2048, "completion_tokens": 512}})
    # the first text after 1.5 s, then every chunk 20 µs after the previous one
    stamps = iter([1.5 + i * 2e-5 for i in range(600)])
    st = parse_lines(sse(events), Stream(started=0.0), lambda: next(stamps))
    t = measure.trial(st, measure.Rules(max_tokens=512))
    assert t["performance_valid"], t["reason_details"]
    assert t["client_timing"].startswith("burst: 512 tokens arrived within")
    for key in measure.CLIENT_TIMINGS:
        assert metric_of(t, key) is None, key
    assert t["tokens_per_chunk"] == 1.0  # the stream itself was incremental
    steady = measure.trial(stream_of(varied(512), 2048, 512), measure.Rules(max_tokens=512))
    assert steady["client_timing"] == ""
    assert steady["generation_tps"] is not None


def test_one_chunk_out_of_its_streams_measure_is_text_never_decoded() -> None:
    """A dump of text at the end stands out of its stream; vLLM's ``--stream-interval``
    sends large chunks, but evenly, and a short answer's chunk is no dump."""
    assert measure.oversized(400, 400, 2000, 0.10) == ""  # every chunk that size
    assert measure.oversized(200, 5, 2000, 0.10) == ""  # under the 256-character floor
    assert measure.oversized(300, 5, 9000, 0.10) == ""  # a tenth of a long answer is more
    why = measure.oversized(400, 5, 2000, 0.10)
    assert "one chunk carried 400 of the answer's 2000 characters" in why


def test_a_stream_with_two_choices_is_malformed_whatever_their_index() -> None:
    """One choice was asked for: a second one, even one that says index 0, would be
    read as more text of the answer."""
    for second in ({"index": 0}, {}, {"index": 1}):
        event = {"choices": [{"index": 0, "delta": {"content": "a"}},
                             {**second, "delta": {"content": "b"}}]}  # fmt: skip
        lines = ["data: " + json.dumps(event), "data: [DONE]"]
        st = parse_lines(lines, Stream(started=0.0), lambda: 1.0)
        assert st.error.startswith("malformed stream event (2 choices"), st.error
        assert st.content == ""


def test_first_texts_the_engines_clock_disowns() -> None:
    """vLLM's TTFT histogram (arrival → first token) against the client's times (sent →
    first text): honest times are longer, one by one; a frontend that sends one stream's
    text early and holds the other's back keeps the mean but not the buckets."""
    metric = "vllm:time_to_first_token_seconds"
    # honest: each client time a little over its engine time (two clocks, 1 % + 5 ms)
    honest = measure.text_before_first_token(
        [1.004, 1.01], (1.0, 2), metric, [(0.5, 0), (1.0, 2), (2.5, 2)]
    )
    assert honest == ""
    # the mean lies
    mean = measure.text_before_first_token([0.05, 0.06], (1.0, 2), metric, [])
    assert "before the model had any" in mean
    # the mean holds (1.005 s), the buckets do not: one text came at 0.05 s, where the
    # engine made no first token within 0.06 s
    mixed = measure.text_before_first_token(
        [0.05, 1.96], (1.0, 2), metric, [(0.06, 0), (1.0, 2), (2.5, 2)]
    )
    assert "1 of the client's 2 first texts came within 0.06 s" in mixed
    # a count that is not the client's: nothing can be told (the caller fails closed)
    assert measure.text_before_first_token([0.05], (1.0, 2), metric, []) == ""
