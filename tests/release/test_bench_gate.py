"""Which baseline the bench gate compares with, and why not when it does not."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import pytest

from servegate import config
from servegate.bench import results
from servegate.release import bench_gate
from servegate.release.record import host_id
from tests.conftest import release_record

CFG = """
[stack]
remote = "x"
[host]
root = "/tmp/sg"
[service]
command = ["x"]
port = 5
"""


def cfg(extra: str = "") -> config.Config:
    return config.parse(CFG + extra, environ={})


FP = {"digest": "abc", "harness": "servegate-bench/1", "max_tokens": 1024, "cases": ["regular-16k"]}


def record(fp: dict[str, object], host: str | None = None) -> Any:
    samples = results.Samples("x", "servegate-bench/1", fp, {
        "regular-16k": results.CaseSamples("regular-16k", True, True, 3, {"generation_tps": [63.0, 64.0, 65.0]}),
    })  # fmt: skip
    return release_record(
        sha="a" * 40,
        host=socket.gethostname(),
        host_id=host or host_id(cfg()),
        verdict="released",
        gate={
            "checks": [
                {"name": "bench", "verdict": "PASS", "evidence": {"samples": samples.as_dict()}}
            ]
        },
    )


def test_the_live_release_samples_are_the_baseline() -> None:
    base, about = bench_gate.baseline(cfg(), record(FP), FP)
    assert base is not None
    assert about == "live release aaaaaaaaaaaa"
    assert base.cases["regular-16k"].metrics["generation_tps"] == [63.0, 64.0, 65.0]


@pytest.mark.parametrize(
    ("rec", "why"),
    [
        (None, "no live release recorded"),
        (
            release_record(sha="b" * 40, gate={"checks": [{"name": "smoke", "verdict": "PASS"}]}),
            "has no recorded bench samples",
        ),
        (record(FP, host="machine:other"), "was measured on another host (machine:other"),
        (record({**FP, "digest": "zzz", "max_tokens": 512}), "measured differently (max_tokens)"),
    ],
)
def test_no_comparable_baseline_says_why(rec: Any, why: str) -> None:
    base, about = bench_gate.baseline(cfg(), rec, FP)
    assert base is None
    assert why in about


@pytest.mark.parametrize(
    ("damage", "named"),
    [
        ({"valid": "no"}, "samples.cases.regular-16k.valid"),  # once read as true
        ({"trials": "12"}, "samples.cases.regular-16k.trials"),
        ({"metrics": {"generation_tps": [63.0, "64"]}}, "generation_tps[1]"),
        ({"starts": True}, "samples.cases.regular-16k.starts"),
        ({"id": "coding-16k"}, "samples.cases.regular-16k.id"),
        ({"surprise": 1}, "samples.cases.regular-16k.surprise"),
        # counts no bench records, each of which would narrow the gate's interval
        ({"starts": 10**9}, "has 1000000000 service start(s) for 3 trial(s)"),
        ({"metrics": {"generation_tps": [63.0, 64.0, 65.0] * 50}}, "150 samples of generation_tps"),
        ({"starts": 2, "blocks": {"generation_tps": [0, 1, 2]}}, "in more starts than its 2"),
        ({"reference": [0.0, 0.0, 0.0]}, "not a positive rate"),  # crashed the drift check
        ({"reference": [float("inf")] * 3}, "not a positive rate"),
    ],
)
def test_damaged_recorded_samples_are_no_baseline(damage: dict[str, Any], named: str) -> None:
    """The live release's samples come from its record, which a hand-edited note could
    make anything: a field of the wrong type is no baseline (the row then follows
    gate.no_baseline), and the reason names the field, never a value coerced."""
    rec = record(FP)
    assert rec.gate is not None
    samples = rec.gate.checks[0].evidence["samples"]
    samples["cases"]["regular-16k"].update(damage)
    base, about = bench_gate.baseline(cfg(), rec, FP)
    assert base is None
    assert "recorded bench samples are damaged" in about
    assert named in about


def test_the_host_identity_survives_a_new_hostname() -> None:
    """Containers get a new hostname at each start: host.id (or the machine id) decides."""
    unnamed = cfg()
    rec = record(FP, host="box-7")
    rec.host = "container-1234"
    named = config.parse(
        CFG.replace('root = "/tmp/sg"', 'root = "/tmp/sg"\nid = "box-7"'), environ={}
    )
    base, about = bench_gate.baseline(named, rec, FP)
    assert base is not None, about
    base, about = bench_gate.baseline(unnamed, rec, FP)
    assert base is None
    assert "another host (box-7" in about


def test_a_configured_baseline_file_must_match(tmp_path: Path) -> None:
    path = tmp_path / "base.json"
    path.write_text(json.dumps({"schema": 1, "kind": "servegate.bench", "status": "complete",
                                "harness": {"name": "servegate-bench/1"},
                                "fingerprint": {**FP, "digest": "other", "max_tokens": 256},
                                "cases": []}))  # fmt: skip
    from servegate.errors import ResultFileError

    with pytest.raises(ResultFileError, match="fingerprints differ in: max_tokens"):
        bench_gate.baseline(cfg(f'[gate]\nbaseline = "{path}"\n'), None, FP)


def test_rules_default_and_floor_sets() -> None:
    assert [r.metric for r in bench_gate.rules(cfg())] == ["prefill_tps", "generation_tps"]
    with_floors = bench_gate.rules(cfg('[gate]\nfloors = "v620-tp4"\n'))
    assert any(r.floor == 1750.0 for r in with_floors)
    own = bench_gate.rules(
        cfg('[[gate.rules]]\nmetric = "ttft_s"\ndirection = "lower"\ntolerance = 0.1\n')
    )
    assert [(r.metric, r.direction, r.tolerance) for r in own] == [("ttft_s", "lower", 0.1)]
