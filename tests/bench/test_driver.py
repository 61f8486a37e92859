"""The bench's engine clock beside the client's: the engine's TTFT, the frontend's share."""

from __future__ import annotations

from servegate.bench import measure
from servegate.bench.driver import Bench
from servegate.bench.schema import Trial
from servegate.bench.sse import Stream


def trial(ttft: float | None) -> Trial:
    st = Stream(started=0.0)
    if ttft is not None:
        st.first_text_at = st.last_text_at = ttft
        st.early, st.text_chunks, st.text = [ttft], 1, ["x"]
    return measure.trial(st, measure.Rules())


def test_one_stream_keeps_the_part_of_its_ttft_outside_the_engines_clock() -> None:
    trials = [trial(0.245)]
    Bench._engine_ttft(trials, (0.2381, 1.0))
    assert trials[0]["engine_ttft_s"] == 0.2381
    assert trials[0]["frontend_ttft_s"] == 0.0069


def test_streams_started_together_get_the_engines_mean_and_no_share_each() -> None:
    trials = [trial(0.3), trial(0.5)]
    Bench._engine_ttft(trials, (0.39, 2.0))
    assert [t["engine_ttft_s"] for t in trials] == [0.39, 0.39]
    assert [t["frontend_ttft_s"] for t in trials] == [None, None]  # a mean is no one's


def test_a_clock_that_counted_other_requests_is_no_ones() -> None:
    trials = [trial(0.3)]
    Bench._engine_ttft(trials, (0.2, 2.0))  # another client's request in the window
    assert (trials[0]["engine_ttft_s"], trials[0]["frontend_ttft_s"]) == (None, None)
    Bench._engine_ttft(trials, None)  # no histogram (not vLLM)
    assert (trials[0]["engine_ttft_s"], trials[0]["frontend_ttft_s"]) == (None, None)


def test_a_stream_whose_client_timing_was_dropped_keeps_the_engines_ttft_only() -> None:
    trials = [trial(0.3)]
    trials[0]["ttft_s"] = None  # a burst: the client's timings dropped
    Bench._engine_ttft(trials, (0.29, 1.0))
    assert (trials[0]["engine_ttft_s"], trials[0]["frontend_ttft_s"]) == (0.29, None)
