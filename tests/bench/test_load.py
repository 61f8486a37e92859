"""The load sweep's arithmetic: arrivals, percentiles, goodput, saturation, the knee, and
the exports; GPU telemetry parsing. The real-server sweep is in test_bench_vllm.py."""

from __future__ import annotations

import asyncio
import csv
import io
import json
import random
import statistics
import sys
from pathlib import Path
from typing import Any

import pytest

from servegate.bench import export, load, loadreport, loadspec, sse, telemetry
from servegate.errors import ConfigError, ResultFileError


def test_poisson_arrivals_have_the_rate_and_the_spread_of_a_poisson_process() -> None:
    rng = random.Random(7)
    offsets = loadspec.arrivals(20.0, 500.0, 1.0, rng)
    gaps = [b - a for a, b in zip([0.0, *offsets], offsets, strict=False)]
    assert 9500 < len(offsets) < 10500  # 20/s for 500 s
    mean = statistics.fmean(gaps)
    assert mean == pytest.approx(0.05, rel=0.05)
    # exponential gaps: the coefficient of variation is 1
    assert statistics.stdev(gaps) / mean == pytest.approx(1.0, rel=0.08)
    assert offsets == sorted(offsets)
    assert offsets[-1] < 500.0


def test_burstiness_changes_the_spread_not_the_rate() -> None:
    for shape, cv in ((0.25, 2.0), (4.0, 0.5)):
        offsets = loadspec.arrivals(10.0, 1000.0, shape, random.Random(3))
        gaps = [b - a for a, b in zip([0.0, *offsets], offsets, strict=False)]
        assert statistics.fmean(gaps) == pytest.approx(0.1, rel=0.08)
        assert statistics.stdev(gaps) / statistics.fmean(gaps) == pytest.approx(cv, rel=0.12)


def test_the_same_seed_draws_the_same_arrivals() -> None:
    a = loadspec.arrivals(5.0, 60.0, 1.0, random.Random(11))
    b = loadspec.arrivals(5.0, 60.0, 1.0, random.Random(11))
    assert a == b
    assert a != loadspec.arrivals(5.0, 60.0, 1.0, random.Random(12))


def test_percentiles_match_numpys_linear_rule() -> None:
    values = [float(v) for v in range(1, 101)]
    p = loadreport.percentiles(values)
    assert p is not None
    assert p["p50"] == pytest.approx(50.5)
    assert p["p90"] == pytest.approx(90.1)
    assert p["p99"] == pytest.approx(99.01)
    assert p["max"] == 100.0
    assert p["mean"] == pytest.approx(50.5)
    assert loadreport.percentiles([]) is None
    one = loadreport.percentiles([3.0])
    assert one == {"p50": 3.0, "p90": 3.0, "p99": 3.0, "max": 3.0, "mean": 3.0}


def test_goodput_slos_parse_with_units() -> None:
    slo = loadspec.parse_goodput("ttft:2s,itl:80ms,tpot:50,e2el:1500ms")
    assert slo == loadspec.Slo(ttft_s=2.0, itl_ms=80.0, tpot_ms=50.0, e2el_s=1.5)
    assert loadspec.parse_goodput("") == loadspec.Slo()
    for bad, said in (
        ("ttft", "not KEY:VALUE"),
        ("ttft:fast", "'fast' is not a positive time"),
        ("ttft:2h", "'2h' is not a positive time"),
        ("ttft:-1s", "'-1s' is not a positive time"),
        ("latency:2s", "no SLO named 'latency'"),
        ("TTFT:2s", "no SLO named 'TTFT' — did you mean 'ttft'?"),
        ("ttft:0", "no request can meet a limit of 0"),
        ("ttft:1s,ttft:2s", "gives ttft twice"),
    ):
        with pytest.raises(ConfigError, match="--goodput") as err:
            loadspec.parse_goodput(bad)
        assert said in str(err.value)
        assert "ttft:2s,itl:80ms" in (err.value.hint or "")
    with pytest.raises(ConfigError, match=r"^\[load\] goodput 'ttft:0'"):
        loadspec.parse_goodput("ttft:0", "[load] goodput")


def _req(ok: bool = True, ttft: float = 0.5, itl: float | None = 40.0, **kw: Any) -> dict[str, Any]:
    return {"ok": ok, "ttft_s": ttft, "itl_ms": itl, "tpot_ms": itl, "e2el_s": 2.0, **kw}


def test_a_request_meets_the_slos_only_when_every_one_holds() -> None:
    slo = loadspec.parse_goodput("ttft:1s,itl:50ms")
    assert slo.met(_req())
    assert not slo.met(_req(ttft=1.2))
    assert not slo.met(_req(itl=60.0))
    assert not slo.met(_req(ok=False))
    assert not slo.met(_req(itl=None))  # not measured is not met
    assert loadspec.Slo().met(_req())  # no SLO: every completed request


def _record(
    i: int, in_flight: int, ttft: float = 0.2, ok: bool = True, step: float = 0.5
) -> dict[str, Any]:
    return {
        "ok": ok, "error": "" if ok else "HTTP 503: busy", "ttft_s": ttft if ok else None,
        "itl_ms": 30.0, "tpot_ms": 31.0, "e2el_s": 1.0, "lag_ms": 0.1 * (i % 7),
        "in_flight_at_send": in_flight, "completion_tokens": 32, "prompt_tokens": 1024,
        "full_length": True, "ended_s": 1.0 + i * step, "due_s": i * step,
    }  # fmt: skip


def _point(spec: loadspec.LoadSpec, value: float, records: list[dict[str, Any]]) -> dict[str, Any]:
    return loadreport.summarize(records, [30.0] * 10, spec, value, 20.0)


def test_point_summary_counts_goodput_throughput_and_lag() -> None:
    spec = loadspec.LoadSpec("rate", (2.0,), slo=loadspec.parse_goodput("ttft:0.3s"))
    records = [_record(i, 1, ttft=0.2 if i % 4 else 0.5) for i in range(40)]
    p = _point(spec, 2.0, records)
    assert p["requests"] == p["completed"] == 40
    assert p["duration_s"] == pytest.approx(20.5)  # to the last request's end
    assert p["request_throughput"] == pytest.approx(40 / 20.5, rel=1e-3)
    assert p["output_throughput"] == pytest.approx(40 * 32 / 20.5, rel=1e-3)
    assert p["good_requests"] == 30  # every fourth missed its TTFT
    assert p["goodput_rps"] == pytest.approx(30 / 20.5, rel=1e-3)
    assert p["lag_ms"]["max"] == pytest.approx(0.6)
    assert p["ttft_s"]["max"] == 0.5


def test_a_request_task_starts_before_the_callbacks_already_queued() -> None:
    """An arrival's clock starts when it is due, not after the stream chunks that became
    ready meanwhile: on Python 3.12+ the task runs at once up to its first wait; before
    3.12 it runs on the loop's next turn, after what was queued (the sweep then yields)."""
    order: list[str] = []

    async def request() -> None:
        order.append("request started")
        await asyncio.sleep(0)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        loop.call_soon(order.append, "queued chunk")
        task = load._start(request())
        order.append("returned")
        await task

    asyncio.run(main())
    if sys.version_info >= (3, 12):
        assert load._EAGER is not None
        assert order == ["request started", "returned", "queued chunk"]
    else:
        assert load._EAGER is None
        assert order == ["returned", "queued chunk", "request started"]


@pytest.mark.parametrize("wait", [0.0005, 0.01, 0.25, 1.0, 4.0, 30.0])
def test_an_arrival_wait_hands_over_to_yielding_before_the_kernel_can_overshoot(
    monkeypatch: pytest.MonkeyPatch, wait: float
) -> None:
    """The selector's sleep ends up to 1 ms (its rounding) plus a thousandth of the wait
    (Linux's timer slack) late: at 0.5 req/s that was 4 ms, the low rates' lag. The
    sleep must end before the arrival however late the kernel wakes it, and yielding
    (which does not overshoot) carry it to the due time, never past it by a sleep."""
    clock = [100.0]
    coarse: list[tuple[float, float]] = []  # (asked, ended - due)
    due = clock[0] + wait

    async def sleep(seconds: float) -> None:
        if seconds > 0:
            clock[0] += seconds + 0.001 + seconds / 1000  # the kernel's worst case
            coarse.append((seconds, clock[0] - due))
        else:
            clock[0] += 0.00001  # a turn of the loop

    monkeypatch.setattr(sse, "now", lambda: clock[0])
    monkeypatch.setattr(asyncio, "sleep", sleep)
    asyncio.run(load._until(due))
    assert due <= clock[0] < due + 0.00002
    assert len(coarse) == (1 if wait > 0.002 else 0)
    for _, late in coarse:
        assert late < 0, f"the selector's sleep ended {late * 1000:.2f} ms past the arrival"


def test_open_loop_saturation_is_a_growing_queue_or_exploding_ttft_or_failures() -> None:
    spec = loadspec.LoadSpec("rate", (1.0, 2.0, 4.0))
    calm = _point(spec, 1.0, [_record(i, i % 2) for i in range(30)])
    assert loadreport.saturation(calm, None, None, spec) == ""
    growing = _point(spec, 4.0, [_record(i, i // 3) for i in range(30)])
    why = loadreport.saturation(growing, calm, calm, spec)
    assert "the queue grew through the point" in why
    slow = _point(spec, 2.0, [_record(i, 1, ttft=1.5) for i in range(30)])
    assert "TTFT p50" in loadreport.saturation(slow, calm, calm, spec)
    failing = _point(spec, 2.0, [_record(i, 1, ok=i % 5 != 0) for i in range(30)])
    assert "request(s) failed: HTTP 503" in loadreport.saturation(failing, calm, calm, spec)


def test_a_saturated_point_whose_own_e2e_spans_most_of_it_is_still_seen_growing() -> None:
    """12 req/s for 10 s on a server that serves 3: the queue grows linearly, each
    request's E2E grows with it, and the median E2E (6 s) would end the point's ramp late
    and hide the growth. The ramp ends by the E2E of the point's first arrivals (they met
    no queue), and by the lightest point's: the arrivals show the queue that grew, on the
    lightest point of a sweep too (there the knee says the sweep began past it)."""
    spec = loadspec.LoadSpec("rate", (0.5, 12.0), duration_s=10)
    records = [_record(i, int(i / 12 * 9), step=1 / 12) for i in range(120)]
    records = [{**r, "e2el_s": 1.0 + r["due_s"]} for r in records]  # each waits longer
    median_e2e = sorted(r["e2el_s"] for r in records)[60]
    assert median_e2e > 5
    own = _point(spec, 12.0, records)
    assert own["in_flight"]["steady_from_s"] < 1.1  # the first arrivals' E2E
    why = loadreport.saturation(own, None, None, spec)
    assert "the queue grew through the point" in why
    alone = {**own, "saturated": True, "why": why}
    verdict = loadreport.knee([alone])
    assert verdict is not None
    assert verdict["what"] == "the lightest point already saturated the server"
    capped = loadreport.summarize(records, [30.0] * 10, spec, 12.0, 20.0, ramp_cap=1.0)
    assert capped["in_flight"]["steady_from_s"] == 1.0
    assert "the queue grew through the point" in loadreport.saturation(capped, None, None, spec)


def test_the_ramp_of_a_long_request_is_not_a_growing_queue() -> None:
    """A server with room to spare and 15 s requests at 0.5 req/s: the requests in flight
    rise from none to 7 over the first 15 s and stay there. Not saturated."""
    spec = loadspec.LoadSpec("rate", (0.5,), duration_s=60)
    records = []
    for i in range(30):
        r = _record(i, min(i, 7), step=2.0)
        r["e2el_s"] = 15.0
        records.append(r)
    p = _point(spec, 0.5, records)
    assert p["in_flight"]["steady_from_s"] == 15.0
    assert loadreport.saturation(p, None, None, spec) == ""
    # the same arrivals whose queue keeps growing after the ramp: saturated
    for i, r in enumerate(records):
        r["in_flight_at_send"] = i
    grown = _point(spec, 0.5, records)
    assert "the queue grew" in loadreport.saturation(grown, None, None, spec)
    # too few arrivals after the ramp to tell: the rule says nothing
    short = _point(spec, 0.5, records[:10])
    assert short["in_flight"]["steady_arrivals"] < loadspec.MIN_STEADY
    assert loadreport.saturation(short, None, None, spec) == ""


def test_closed_loop_saturation_is_no_more_throughput_for_more_clients() -> None:
    spec = loadspec.LoadSpec("concurrency", (1, 2, 4))
    one = _point(spec, 1, [_record(i, 1) for i in range(20)])
    two = _point(spec, 2, [_record(i, 2, step=0.25) for i in range(40)])
    assert loadreport.saturation(two, one, one, spec) == ""
    four = _point(spec, 4, [_record(i, 4, step=0.25) for i in range(41)])
    assert "4 clients bought" in loadreport.saturation(four, one, two, spec)


def test_the_knee_is_the_last_point_before_the_first_saturated_one() -> None:
    points = [{"value": v, "saturated": s, "why": "w" if s else "", "request_throughput": v}
              for v, s in ((1, False), (2, False), (4, True))]  # fmt: skip
    k = loadreport.knee(points)
    assert k is not None
    assert k["value"] == 2
    assert k["saturated_at"] == 4
    assert loadreport.knee(points[:2]) is None  # not reached
    first = loadreport.knee(points[2:])
    assert first is not None
    assert first["value"] is None


def test_a_sweep_spec_that_cannot_run_is_refused_before_anything_is_sent() -> None:
    bad = (
        loadspec.LoadSpec("rate", ()),
        loadspec.LoadSpec("rate", (0.0,)),
        loadspec.LoadSpec("concurrency", (1.5,)),
        loadspec.LoadSpec("rate", (1.0,), duration_s=0),
        loadspec.LoadSpec("rate", (1.0,), workload="shared-prefix", prefix_share=1.2),
        loadspec.LoadSpec("rate", (float("nan"),)),
        loadspec.LoadSpec("rate", (1.0, float("inf"))),
        loadspec.LoadSpec("concurrency", (float("inf"),)),
        loadspec.LoadSpec("rate", (1.0,), duration_s=float("nan")),
        loadspec.LoadSpec("rate", (1.0,), burstiness=float("inf")),
        loadspec.LoadSpec("rate", (8.0, 4.0, 2.0)),  # the knee would be read backwards
        loadspec.LoadSpec("concurrency", (4, 4)),
        loadspec.LoadSpec("rate", (0.05,), duration_s=10),  # no arrival expected
        loadspec.LoadSpec("rate", (1.0,), duration_s=10, prefix_share=0.5),  # cold shares none
    )
    for spec in bad:
        with pytest.raises(ConfigError):
            spec.check()
    # named as the user gave them: the command's options, or the config's keys
    short = loadspec.LoadSpec("rate", (0.1,), duration_s=10)
    with pytest.raises(ConfigError) as err:
        short.check()
    assert "a longer --duration" in (err.value.hint or "")
    with pytest.raises(ConfigError) as err:
        short.check(config=True)
    assert "a longer [load] duration" in (err.value.hint or "")
    with pytest.raises(ConfigError) as err:
        loadspec.LoadSpec("rate", (1.0,), duration_s=10, prefix_share=0.5).check(config=True)
    assert str(err.value).startswith("[load] prefix_share 0.5 is for the shared-prefix workload")
    assert 'workload = "shared-prefix", prefix_share = 0.5' in (err.value.hint or "")


def _load_doc() -> dict[str, Any]:
    spec = loadspec.LoadSpec("rate", (1.0, 2.0), slo=loadspec.parse_goodput("ttft:1s"))
    points = []
    for v in (1.0, 2.0):
        p = _point(spec, v, [_record(i, 1) for i in range(10)])
        p.update(saturated=v == 2.0, why="x" if v == 2.0 else "", prefix_hit_rate=0.0)
        points.append(p)
    return {"kind": loadspec.KIND, "schema": 1,
            "run": {"model": "demo", "workload": "cold", "burstiness": 1.0},
            "harness": {"name": "servegate-bench/1"}, "points": points}  # fmt: skip


def test_pytorch_export_of_a_load_file_is_one_metric_a_record_a_line() -> None:
    text = export.pytorch(_load_doc())
    records = [json.loads(line) for line in text.splitlines()]
    names = {r["metric"]["name"] for r in records}
    assert {"median_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "p99_itl_ms", "median_e2el_ms",
            "request_throughput", "output_throughput", "request_goodput"} <= names  # fmt: skip
    for r in records:
        assert set(r) == {"benchmark", "model", "metric"}
        assert r["model"]["name"] == "demo"
        assert isinstance(r["metric"]["benchmark_values"], list)
        assert r["metric"]["extra_info"]["load"] in (1.0, 2.0)
    ttft = [r for r in records if r["metric"]["name"] == "median_ttft_ms"]
    assert [r["metric"]["benchmark_values"] for r in ttft] == [[200.0], [200.0]]


def test_csv_export_of_a_load_file_is_one_row_a_point(tmp_path: Path) -> None:
    rows = list(csv.DictReader(io.StringIO(export.to_csv(_load_doc()))))
    assert [r["load"] for r in rows] == ["1.0", "2.0"]
    assert rows[1]["saturated"] == "True"
    assert float(rows[0]["median_ttft_ms"]) == 200.0
    bad = tmp_path / "x.json"
    bad.write_text('{"kind": "something"}')
    with pytest.raises(ResultFileError, match="not a servegate result file"):
        export.read(bad)


NVIDIA_SMI = "0, NVIDIA H200, 1980, 3201, 118.52, 34, 1024, 143771, 7\n"
ROCM_SMI = json.dumps({
    "card0": {"Temperature (Sensor edge) (C)": "52.0", "Temperature (Sensor junction) (C)": "55.0",
              "Average Graphics Package Power (W)": "37.0", "GPU use (%)": "3",
              "GPU Memory Allocated (VRAM%)": "12", "sclk clock speed:": "(500Mhz)",
              "mclk clock speed:": "(96Mhz)", "Card series": "Radeon PRO V620"},
    "system": {"Driver version": "6.8.5"},
})  # fmt: skip


def test_vendor_tool_output_parses_into_one_reading_a_gpu() -> None:
    (nv,) = telemetry.parse_nvidia(NVIDIA_SMI + "garbage line\n")
    assert nv == {"gpu": "0", "name": "NVIDIA H200", "sm_clock_mhz": 1980.0,
                  "mem_clock_mhz": 3201.0, "power_w": 118.52, "temperature_c": 34.0,
                  "memory_used_mib": 1024.0, "memory_total_mib": 143771.0,
                  "utilization_pct": 7.0}  # fmt: skip
    (na,) = telemetry.parse_nvidia("0, X, [N/A], 3201, [Not Supported], 34, 1, 2, 3\n")
    assert na["sm_clock_mhz"] is None
    assert na["power_w"] is None
    (amd,) = telemetry.parse_rocm(ROCM_SMI)
    assert amd["name"] == "Radeon PRO V620"
    assert (amd["sm_clock_mhz"], amd["mem_clock_mhz"], amd["power_w"]) == (500.0, 96.0, 37.0)
    assert (amd["temperature_c"], amd["utilization_pct"], amd["memory_used_pct"]) == (
        52.0, 3.0, 12.0,
    )  # fmt: skip


def test_no_vendor_tool_says_so_and_a_sampler_records_nothing() -> None:
    assert telemetry.find(lambda _: None) is None
    said = telemetry.describe(None)
    assert said["source"] is None
    assert "a CPU server" in said["why"]
    sampler = telemetry.Sampler(None).start()
    assert sampler.stop() is None


def test_a_sampler_reads_a_real_tool_and_keeps_its_error(tmp_path: Path) -> None:
    """A real executable on PATH answers like nvidia-smi, then fails: the readings made
    stay, and the error is recorded."""
    tool = tmp_path / "nvidia-smi"
    count = tmp_path / "count"
    tool.write_text(
        "#!/bin/sh\n"
        f"n=$(cat {count} 2>/dev/null || echo 0); echo $((n+1)) > {count}\n"
        f'[ "$n" -ge 3 ] && {{ echo "driver gone" >&2; exit 9; }}\n'
        f"echo '{NVIDIA_SMI.strip()}'\n"
    )
    tool.chmod(0o755)
    source = telemetry.find(lambda name: str(tool) if name == "nvidia-smi" else None)
    assert source is not None
    sampler = telemetry.Sampler(source, interval=0.05).start()
    import time

    time.sleep(0.5)
    got = sampler.stop()
    assert got is not None
    assert got["readings"] == 3
    assert "exited 9: driver gone" in got["error"]
    assert got["gpus"]["0"]["power_w"] == {"min": 118.52, "mean": 118.52, "max": 118.52}


def _report_json(files: list[str], tmp_path: Path) -> Any:
    """``servegate report FILES --json`` into ``tmp_path/rep``, without a config."""
    import subprocess
    import sys

    return subprocess.run(
        [sys.executable, "-m", "servegate", "report", *files, "--out", str(tmp_path / "rep"),
         "--json"],  # no config here: the files alone
        capture_output=True, text=True, timeout=120, check=False, cwd=tmp_path,
    )  # fmt: skip


def test_report_draws_latency_against_throughput_one_curve_a_release(tmp_path: Path) -> None:
    """Two releases' sweeps through `servegate report`: a PNG of the curves and a page
    whose table has every point, the saturated one and the knee named."""

    files = []
    for sha, slow in (("a" * 40, 1.0), ("b" * 40, 3.0)):
        doc = _load_doc()
        doc["run"]["release"] = sha
        doc["started_at"] = "2026-12-03T18:00:00+00:00"
        for p in doc["points"]:
            p["ttft_s"] = {k: v * slow for k, v in p["ttft_s"].items()}
        if slow == 1.0:  # a GPU server: nvidia-smi read beside every point
            doc["telemetry"] = {"source": "nvidia-smi", "gpus": [{"gpu": "0", "name": "H200"}]}
            for i, p in enumerate(doc["points"]):
                clock = {"min": 1980.0 - 500 * i, "mean": 1980.0 - 250 * i, "max": 1980.0}
                p["telemetry"] = {"source": "nvidia-smi", "readings": 3, "error": "",
                                  "gpus": {"0": {"sm_clock_mhz": clock,
                                                 "power_w": {"min": 120, "mean": 121, "max": 124}}}}  # fmt: skip
        else:  # a CPU server: none, and why
            doc["telemetry"] = {"source": None, "why": "neither nvidia-smi nor rocm-smi on PATH"}
        doc["knee"] = loadreport.knee(doc["points"])
        path = tmp_path / f"{sha[:4]}-load.json"
        path.write_text(json.dumps(doc))
        files.append(str(path))
    run = _report_json(files, tmp_path)
    assert run.returncode == 0, run.stderr
    said = json.loads(run.stdout)["result"]
    assert said["load_curves"] == 2
    assert said["points"] == 0
    assert Path(said["load_png"]).read_bytes()[:4] == b"\x89PNG"
    page = Path(said["load_html"]).read_text()
    assert "aaaaaaaaaaaa" in page
    assert "bbbbbbbbbbbb" in page
    assert page.count("<td>saturated</td>") == 2
    assert page.count("<td>knee</td>") == 2
    assert "<td>0.600</td>" in page  # release b's TTFT p99 in seconds: 0.2 s x 3
    # the telemetry beside every point, and where none was read, why
    assert "aaaaaaaaaaaa: nvidia-smi (H200)" in page
    assert "bbbbbbbbbbbb: none — neither nvidia-smi nor rocm-smi on PATH" in page
    assert "<td>1480 to 1980 (1730)</td>" in page  # the clock that dropped under load
    assert "<td>120 to 124 (121)</td>" in page


def test_report_says_which_sweeps_failed_and_draws_no_made_up_figure(tmp_path: Path) -> None:
    """A sweep whose server went away keeps the points it finished, marked failed with
    why; one that finished none is listed, not dropped; a point whose answers all came
    in a burst has no ITL to draw ("-"), not a perfect 0."""

    died = _load_doc()
    died.update(status="failed", error="the server went away during the 2 req/s point")
    died["points"][0]["itl_ms"] = None  # every answer a burst
    nothing = {**_load_doc(), "status": "failed", "error": "every request failed", "points": []}
    files = []
    for name, doc in (("died", died), ("nothing", nothing)):
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(doc))
        files.append(str(path))
    run = _report_json(files, tmp_path)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["result"]["load_curves"] == 2
    page = (tmp_path / "rep" / "load-curves.html").read_text()
    assert "died: failed — the server went away during the 2 req/s point" in page
    assert "nothing: failed — every request failed (no point finished a request" in page
    # the first point: TTFT p50 and p99, no ITL p99, E2E p99
    assert "<td>0.200</td><td>0.200</td><td>-</td><td>1.00</td><td>ok</td>" in page


def _bench_at(url: str) -> Any:
    from servegate.bench import cases, fixtures
    from servegate.bench.driver import Bench
    from servegate.engine import adapters
    from servegate.engine.openai import Endpoint

    spec = cases.Spec(Endpoint(url, "k3y", adapters.by_name("openai")), "m",
                      cases.parse_cases(["regular"], ["1k"], [1]), max_tokens=8,
                      warmup=False, timeout=5.0)  # fmt: skip
    bench = Bench(spec, None)
    bench.prompts = {"regular-1k": fixtures.load("regular").head(2000)}
    return bench


def test_a_server_that_refuses_or_errs_fails_every_request_it_got() -> None:
    """Real sockets: a port nobody listens on, and a server answering 503 (whose body
    must not be taken for a stream). Every request is failed with its reason; none is
    counted as completed or good."""
    import socket
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    seen: list[str] = []

    class Busy(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_POST(self) -> None:
            seen.append(self.headers.get("Authorization", ""))
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            body = b'{"error": {"message": "overloaded"}}'
            self.send_response(503)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Busy)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    spec = loadspec.LoadSpec(
        "rate", (10.0,), duration_s=1.0, slo=loadspec.parse_goodput("e2el:10s")
    )
    try:
        for url, why in ((f"http://127.0.0.1:{server.server_address[1]}", "HTTP 503"),
                         (f"http://127.0.0.1:{closed}", "cannot connect")):  # fmt: skip
            p = load.Load(_bench_at(url), spec, None).point(10.0)
            assert p["requests"] > 0
            assert p["completed"] == 0
            assert p["failed"] == p["requests"]
            assert p["good_requests"] == 0
            assert any(why in e for e in p["errors"]), p["errors"]
            assert "request(s) failed" in loadreport.saturation(p, None, None, spec)
    finally:
        server.shutdown()
        server.server_close()
    assert seen
    assert set(seen) == {"Bearer k3y"}  # the API key travels with every request


def test_report_says_which_load_file_is_damaged_and_draws_odd_names(tmp_path: Path) -> None:
    import subprocess
    import sys

    def report(*files: Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "servegate", "report", *map(str, files), "--out",
             str(tmp_path / "rep")],  # no config here: the files alone
            capture_output=True, text=True, timeout=120, check=False, cwd=tmp_path,
        )  # fmt: skip

    doc = _load_doc()
    doc["knee"] = loadreport.knee(doc["points"])
    odd = tmp_path / "h_math$\\foo$.json"  # matplotlib would read $...$ as math
    odd.write_text(json.dumps(doc))
    drawn = report(odd)
    assert drawn.returncode == 0, drawn.stderr
    for damage in ({"run": "oops"}, {"knee": "x"}, {"points": ["x"]}, {"points": "x"},
                   {"points": None}):  # fmt: skip
        bad = tmp_path / "bad.json"
        bad.write_text(json.dumps({**doc, **damage}))
        run = report(bad)
        assert run.returncode == 14, run.stderr
        assert "is damaged" in run.stderr, run.stderr
    future = tmp_path / "future.json"
    future.write_text(json.dumps({**doc, "schema": 99}))
    run = report(future)
    assert run.returncode == 14, run.stderr
    assert "result schema 99; this servegate reads 1" in run.stderr


def _point_without(key: str) -> dict[str, Any]:
    doc = _load_doc()
    del doc["points"][0][key]
    return doc


@pytest.mark.parametrize(
    ("damage", "said"),
    [
        ({"points": "x"}, "points is not a list"),
        ({"points": None}, "points is not a list"),
        ({"schema": 99}, "result schema 99; this servegate reads 1"),
        ({"schema": None}, "result schema None"),
        ("no-value", "point 0: value None is not a number"),
        ("ttft-fast", "point 0: ttft_s.p50 'fast' is not a number"),
        ("ttft-list", "point 0: ttft_s is not an object"),
        ("goodput-text", "point 0: goodput_rps 'lots' is not a number"),
        ("no-ttft", "point 0: ttft_s is missing"),
        ("ttft-nan", "point 0: ttft_s.p99 nan is not a number"),
        ({"points": [], "status": "failed", "error": "the warm-up request failed"},
         "has no load point: the sweep measured nothing (status 'failed': the warm-up"),
    ],
)  # fmt: skip
def test_export_refuses_a_damaged_or_unknown_file_and_writes_nothing(
    tmp_path: Path, damage: Any, said: str
) -> None:
    """A file the export cannot read whole is refused with exit 14 and the field that is
    wrong; nothing is written (a CSV missing a column without a word is worse than none)."""
    import subprocess
    import sys

    doc = _load_doc()
    if damage == "no-value":
        doc = _point_without("value")
    elif damage == "ttft-fast":
        doc["points"][0]["ttft_s"]["p50"] = "fast"
    elif damage == "ttft-list":
        doc["points"][0]["ttft_s"] = [0.2]
    elif damage == "goodput-text":
        doc["points"][0]["goodput_rps"] = "lots"
    elif damage == "no-ttft":
        doc = _point_without("ttft_s")
    elif damage == "ttft-nan":
        doc["points"][0]["ttft_s"]["p99"] = float("nan")
    else:
        doc.update(damage)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    for fmt in ("csv", "pytorch"):
        run = subprocess.run(
            [sys.executable, "-m", "servegate", "bench", "export", str(bad), "--format", fmt],
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert run.returncode == 14, run.stderr
        assert said in run.stderr, run.stderr
        assert "what to do:" in run.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.json"]


def test_export_into_a_folder_writes_the_files_name_there(tmp_path: Path) -> None:
    import subprocess
    import sys

    src = tmp_path / "sweep.json"
    src.write_text(json.dumps(_load_doc()))
    (tmp_path / "have").mkdir()
    for out, where in (("have", "have/sweep.csv"), ("new/", "new/sweep.csv"),
                       ("named.csv", "named.csv")):  # fmt: skip
        run = subprocess.run(
            [sys.executable, "-m", "servegate", "bench", "export", str(src), "--format", "csv",
             "--out", out],
            capture_output=True, text=True, timeout=120, check=False, cwd=tmp_path,
        )  # fmt: skip
        assert run.returncode == 0, run.stderr
        assert (tmp_path / where).read_text().startswith("mode,load,")


def test_shared_prefix_prompts_of_every_profile_and_tier_start_with_one_text() -> None:
    """Each prompt takes its share of one common text (the longest prompt's head), so
    the head of a shorter prompt is a prefix of a longer one's, across profiles too."""
    from servegate.bench import cases, fixtures
    from servegate.bench.driver import Bench
    from servegate.engine import adapters
    from servegate.engine.openai import Endpoint

    spec = cases.Spec(Endpoint("http://127.0.0.1:9", "", adapters.VLLM), "m",
                      cases.parse_cases(["regular", "coding"], ["1k", "2k"], [1]),
                      max_tokens=8, warmup=False)  # fmt: skip
    bench = Bench(spec, None)
    bench.prompts = {
        "regular-1k": fixtures.load("regular").head(4000),
        "regular-2k": fixtures.load("regular").head(8000),
        "coding-1k": fixtures.load("coding").head(4000),
        "coding-2k": fixtures.load("coding").head(8000),
    }
    sweep = load.Load(bench, loadspec.LoadSpec("rate", (1.0,), duration_s=10.0,
                                           workload="shared-prefix", prefix_share=0.8), None)  # fmt: skip
    heads = {}
    for key, text in bench.prompts.items():
        body = sweep._body(key, "t")
        user = body["messages"][-1]["content"]
        heads[key] = user[: int(len(text) * 0.8)]
        assert user.startswith(heads[key])
    longest = heads["coding-2k"] if len(bench.prompts["coding-2k"]) >= len(
        bench.prompts["regular-2k"]) else heads["regular-2k"]  # fmt: skip
    for head in heads.values():
        assert longest.startswith(head)


def test_the_ideal_hit_rate_is_what_a_cache_that_forgot_nothing_served_in_order() -> None:
    rows = [{"prompt_tokens": n} for n in (1000, 2000, 1000, 2000)]
    # heads of 800, 1600, 800, 1600 tokens: hits 0, 800, 800, 1600 of 6000 prompted
    assert loadreport.ideal_hit_rate(rows, 0.8) == pytest.approx(3200 / 6000, abs=1e-4)
    assert loadreport.ideal_hit_rate([{"prompt_tokens": 1000}] * 100, 0.8) == pytest.approx(0.792)
    assert loadreport.ideal_hit_rate([], 0.8) is None


def test_bench_history_shows_the_gpu_telemetry_beside_every_group(tmp_path: Path) -> None:
    """A bench result file's groups each carry the GPU tool's readings: the history page
    lists them per group (min to max, and the mean over the GPUs), and names the tool."""
    from servegate.bench import charts

    reading = {"sm_clock_mhz": {"min": 1410.0, "mean": 1700.0, "max": 1980.0},
               "temperature_c": {"min": 60.0, "mean": 70.0, "max": 83.0}}  # fmt: skip
    doc = {
        "kind": "servegate.bench",
        "telemetry": {"source": "rocm-smi", "gpus": [{"gpu": "0", "name": "V620"},
                                                     {"gpu": "1", "name": "V620"}]},
        "cases": [{"id": "regular-16k", "groups": [
            {"group": 1, "telemetry": {"gpus": {"0": reading, "1": reading}}},
            {"group": 2, "telemetry": None},
        ]}],
    }  # fmt: skip
    groups = charts.gpu_groups(doc, "r1")
    assert [g.group for g in groups] == [1, 2]
    assert groups[0].gpu == {"sm_clock_mhz": (1410.0, 1700.0, 1980.0),
                             "temperature_c": (60.0, 70.0, 83.0)}  # fmt: skip
    assert groups[1].gpu is None
    points = [charts.Point("r1", "", "", "result file", "regular-16k", 1000.0, 50.0)]
    _, page = charts.render(points, tmp_path, "t", groups, {"r1": charts.gpu_source(doc)})
    text = page.read_text()
    assert "r1: rocm-smi (V620)" in text
    assert "<td>1410 to 1980 (1700)</td>" in text
    assert "<td>60 to 83 (70)</td>" in text


def test_bench_gate_on_a_load_sweep_says_where_sweeps_are_judged(tmp_path: Path) -> None:
    from servegate.bench import results
    from servegate.errors import ResultFileError

    path = tmp_path / "sweep.json"
    path.write_text(json.dumps(_load_doc()))
    with pytest.raises(ResultFileError) as err:
        results.load(path)
    assert "is a load sweep (servegate bench load), not a bench result" in str(err.value)
    assert "load gate check" in (err.value.hint or "")
