"""Result files (own and llm-context-bench), fixtures, the image, Prometheus text."""

from __future__ import annotations

import dataclasses
import json
import zlib
from pathlib import Path

import pytest

from servegate.bench import fixtures, image, prom, results
from servegate.engine import adapters
from servegate.errors import ResultFileError


def lcb_trial(prefill: float, gen: float, valid: bool = True) -> dict[str, object]:
    return {
        "prefill_tps": prefill,
        "generation_tps": gen,
        "ttft_s": 16384 / prefill,
        "mean_inter_token_latency_ms": 1000 / gen,
        "output_tps_whole_request": gen * 0.9,
        "decode_window_s": 1023 / gen,
        "performance_valid": valid,
        "invalid_reasons": [] if valid else ["dominant_repeated_token"],
    }


def lcb_doc(schema: int) -> dict[str, object]:
    """The shape llm-context-bench 0.3 (schema 7) / 0.4 (schema 8) writes."""
    perf: dict[str, object] = {
        "max_tokens": 1024,
        "input_sha256": "ab" * 32,
        "trials": [lcb_trial(1957.8, 69.7), lcb_trial(1950.0, 68.9)],
        "summary": {"required_output_tokens": 1024},
    }
    if schema == 8:
        perf["concurrency"] = 1
        perf["groups"] = []
    return {
        "benchmark_schema_version": schema,
        "status": "complete",
        "suites": {
            "regular": {
                "suite_sha256": "cd" * 32,
                "performance_sampling": {"temperature": 1.0, "top_p": 0.95, "seed": 3407},
                "cases": [
                    {
                        "id": "regular-05-context-16k",
                        "nominal_input_tokens": 16384,
                        "performance": perf,
                    }
                ],
            },
            "coding": {
                "cases": [
                    {
                        "id": "coding-05-context-32k",
                        "nominal_input_tokens": 32768,
                        "performance": {"trials": [lcb_trial(1900, 60, valid=False)]},
                    }
                ]
            },
        },
        "performance_table": [],
    }


@pytest.mark.parametrize("schema", [7, 8])
def test_llm_context_bench_files_become_samples(tmp_path: Path, schema: int) -> None:
    path = tmp_path / "lcb.json"
    path.write_text(json.dumps(lcb_doc(schema)))
    s = results.load(path)
    assert s.harness == f"llm-context-bench/{schema}"
    assert s.cases["regular-16k"].metrics["generation_tps"] == [69.7, 68.9]
    assert not s.cases["coding-32k"].valid
    assert s.cases["coding-32k"].reasons == {"dominant_repeated_token": 1}


def test_an_llm_context_bench_file_is_read_as_it_was_written(tmp_path: Path) -> None:
    """Its output length is read (never assumed): a file that records none, or another
    than ours, is no baseline; at concurrency above 1 its streams are grouped by their
    group_id, one sample a group (streams of one group are not independent); fixtures
    and sampling are kept, and what differs is said when compared leniently."""
    doc = lcb_doc(8)
    s = results.load(_write(tmp_path / "a.json", doc))
    assert s.fingerprint["max_tokens"] == 1024
    assert s.fingerprint["fixtures"]["regular-16k"] == "ab" * 32
    assert s.fingerprint["sampling"]["regular"]["seed"] == 3407
    ours = results.Samples("ours", "servegate-bench/1", {"max_tokens": 512, "digest": "x"},
                           {"regular-16k": results.CaseSamples("regular-16k")})  # fmt: skip
    assert results.check_comparable(s, ours, lenient=True) == ["max_tokens 1024 vs 512"]
    unsaid = json.loads(json.dumps(doc))
    for suite in unsaid["suites"].values():
        for case in suite["cases"]:
            case["performance"].pop("max_tokens", None)
            case["performance"].pop("summary", None)
    blind = results.load(_write(tmp_path / "b.json", unsaid))
    (problem,) = results.check_comparable(blind, s, lenient=True)
    assert "does not record one output length" in problem
    assert "fixtures differ" in " ".join(
        results.lenient_differences(s, dataclasses.replace(ours, fingerprint={"max_tokens": 1024}))
    )
    grouped = json.loads(json.dumps(doc))
    perf = grouped["suites"]["regular"]["cases"][0]["performance"]
    perf["concurrency"] = 2
    perf["trials"] = [
        {**lcb_trial(1900.0 + 10 * i, 60.0 + i), "group_id": f"g{i // 2}"} for i in range(6)
    ]
    g = results.load(_write(tmp_path / "c.json", grouped)).cases["regular-16k-c2"]
    assert len(g.metrics["generation_tps"]) == 3  # three groups of two streams
    assert g.trials == 6


def _write(path: Path, doc: object) -> Path:
    path.write_text(json.dumps(doc))
    return path


def test_bad_result_files_say_what_is_wrong(tmp_path: Path) -> None:
    with pytest.raises(ResultFileError, match="not found"):
        results.load(tmp_path / "missing.json")
    (tmp_path / "cut.json").write_text('{"schema": 1, "kind": "servegate.bench", "cases": [')
    with pytest.raises(ResultFileError, match="not JSON"):
        results.load(tmp_path / "cut.json")
    (tmp_path / "other.json").write_text('{"hello": 1}')
    with pytest.raises(ResultFileError, match="neither"):
        results.load(tmp_path / "other.json")
    (tmp_path / "old.json").write_text('{"benchmark_schema_version": 5, "suites": {}}')
    with pytest.raises(ResultFileError, match="schema 5"):
        results.load(tmp_path / "old.json")
    (tmp_path / "new.json").write_text('{"schema": 99, "kind": "servegate.bench"}')
    with pytest.raises(ResultFileError, match="schema 99"):
        results.load(tmp_path / "new.json")
    (tmp_path / "fp.json").write_text(
        '{"schema": 1, "kind": "servegate.bench", "fingerprint": "abc", "cases": []}'
    )
    with pytest.raises(ResultFileError, match="fingerprint is a str, not an object"):
        results.load(tmp_path / "fp.json")
    (tmp_path / "case.json").write_text(
        '{"schema": 1, "kind": "servegate.bench", "cases": [{"groups": []}]}'
    )
    with pytest.raises(ResultFileError, match="wrong shape"):
        results.load(tmp_path / "case.json")


def test_fingerprints_must_match_unless_lenient() -> None:
    a = results.Samples(
        "a",
        "servegate-bench/1",
        {"digest": "1", "max_tokens": 1024, "sampling": {"seed": 1}},
        {"regular-16k": results.CaseSamples("regular-16k")},
    )
    b = results.Samples(
        "b",
        "servegate-bench/1",
        {"digest": "2", "max_tokens": 1024, "sampling": {"seed": 2}},
        {"regular-16k": results.CaseSamples("regular-16k")},
    )
    assert results.check_comparable(a, a) == []
    assert results.check_comparable(a, b) == ["fingerprints differ in: sampling"]
    assert results.check_comparable(a, b, lenient=True) == []


def test_fixtures_are_real_locked_and_not_filler() -> None:
    m = fixtures.manifest()
    for profile in fixtures.PROFILES:
        fx = fixtures.load(profile)
        assert fx.sha256 == m["fixtures"][profile]["sha256"]
        assert fx.gzip_ratio > 0.2  # prose/code, not repeated filler
        assert all(src["licence"] for src in fx.sources)
        assert len(fx.text) > 500_000
        head = fx.head(10_000)
        assert len(head) <= 10_000
        assert fx.text[len(head)] == "\n"  # cut at the end of a line
    assert "def " in fixtures.load("coding").text
    filler = ("lorem ipsum " * 10_000).encode()
    assert fixtures.gzip_ratio(filler) < fixtures.MIN_GZIP_RATIO
    # the ratio is zlib level 9 over the raw bytes, as the field computes it
    sample = fixtures.load("regular").text[:50_000].encode()
    assert fixtures.gzip_ratio(sample) == len(zlib.compress(sample, 9)) / len(sample)
    assert fixtures.gzip_ratio(b"") == 0.0


def test_generated_image_has_the_regions_it_claims() -> None:
    data = image.regions_png(120)
    w, h, rows = image.read_png_rgb(data)
    assert (w, h) == (120, 120)
    mid = rows[60]
    assert tuple(mid[3 * 10 : 3 * 10 + 3]) == image.BLUE
    assert tuple(mid[3 * 100 : 3 * 100 + 3]) == image.YELLOW
    assert tuple(rows[0][0:3]) == image.WHITE


def test_prometheus_sums_labels_and_deltas() -> None:
    before = prom.parse(
        '# HELP x\nvllm:prefix_cache_hits_total{engine="0",model_name="demo"} 100.0\n'
        'vllm:time_to_first_token_seconds_sum{m="a"} 2.0\nvllm:time_to_first_token_seconds_count{m="a"} 4\n'
    )
    after = prom.parse(
        'vllm:prefix_cache_hits_total{engine="0",model_name="demo"} 164.0\n'
        'vllm:time_to_first_token_seconds_sum{m="a"} 5.0\nvllm:time_to_first_token_seconds_count{m="a"} 6\n'
    )
    names = adapters.VLLM.metrics
    assert prom.delta(before, after, names.prefix_hits) == 64.0
    assert prom.histogram_mean_delta(before, after, names.ttft) == (1.5, 2.0)
    assert prom.delta(before, after, names.spec_accepted) is None
    assert adapters.OPENAI.metrics.prefix_hits == ()  # a generic server: nothing assumed


def test_prometheus_text_is_read_by_the_format_s_own_rules() -> None:
    """A label value may hold ``}``, a quote or a newline escape (a model named
    ``org/m{v2}``): its sample counts. One malformed line costs that line, not the page."""
    page = (
        "# HELP vllm:prefix_cache_hits_total hits\n# TYPE vllm:prefix_cache_hits_total counter\n"
        'vllm:prefix_cache_hits_total{model_name="org/m{v2}",engine="0"} 7\n'
        'vllm:prefix_cache_hits_total{model_name="say \\"hi\\"\\n"} 3\n'
        'vllm:ttft_bucket{le="0.5",model_name="a}b"} 2\n'
        'vllm:ttft_bucket{le="+Inf",model_name="a}b"} 5\n'
        "this line is not a sample\n"
        "vllm:num_requests_running 1\n"
    )
    got = prom.parse(page)
    assert got["vllm:prefix_cache_hits_total"] == 10.0
    assert got["vllm:ttft_bucket|le=0.5"] == 2.0
    assert got["vllm:ttft_bucket|le=+Inf"] == 5.0
    assert got["vllm:num_requests_running"] == 1.0


def test_a_damaged_trial_field_is_a_damaged_file_not_a_loss(tmp_path: Path) -> None:
    """A rate that is a string (a hand edit, another tool) is a result file of the wrong
    shape (exit 14), never judged as a measurement (a gate FAIL, exit 9)."""
    doc = {"schema": 1, "kind": "servegate.bench", "harness": {"name": "servegate-bench/1"},
           "cases": [{"id": "regular-16k", "groups": [{"start": 0, "trials": [
               {"performance_valid": True, "prefill_tps": "fast", "generation_tps": 60.0}]}]}]}  # fmt: skip
    with pytest.raises(ResultFileError, match="prefill_tps is a str") as caught:
        results.load(_write(tmp_path / "damaged.json", doc))
    assert caught.value.exit_code == 14
