"""GPU telemetry from the vendor's real tool (nvidia-smi or rocm-smi) on a GPU host."""

from __future__ import annotations

import time

import pytest

from servegate.bench import telemetry

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def source() -> telemetry.Source:
    found = telemetry.find()
    if found is None:
        pytest.skip("no GPU: neither nvidia-smi nor rocm-smi is on PATH")
    return found


def test_the_vendor_tool_names_every_gpu(source: telemetry.Source) -> None:
    said = telemetry.describe(source)
    assert said["source"] == source.tool
    assert "why" not in said, said
    assert said["gpus"], said
    assert all(g["name"] for g in said["gpus"])


def test_a_sampler_records_clocks_power_and_temperature_while_it_runs(
    source: telemetry.Source,
) -> None:
    sampler = telemetry.Sampler(source, interval=0.2).start()
    time.sleep(1.0)
    got = sampler.stop()
    assert got is not None
    assert got["error"] == ""
    assert got["readings"] >= 3
    for fields in got["gpus"].values():
        for key in ("sm_clock_mhz", "power_w", "temperature_c"):
            stats = fields[key]
            assert 0 < stats["min"] <= stats["mean"] <= stats["max"], (key, stats)
        assert fields["utilization_pct"]["max"] <= 100
