"""The box's noise: its estimate, the gate's plan from it, and what config check says."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest

from servegate import config
from servegate.bench import noise, results
from servegate.cli import main
from servegate.errors import ConfigError
from servegate.release import bench_gate
from tests.bench.test_results_fixtures import lcb_doc


def test_the_estimate_separates_within_start_noise_from_the_restart_offset() -> None:
    rng = random.Random(7)
    starts = []
    for _ in range(40):
        shift = rng.gauss(0, 0.03)
        starts.append([100 * math.exp(shift + rng.gauss(0, 0.01)) for _ in range(8)])
    est = noise.estimate(starts)
    assert est is not None
    assert est.cv == pytest.approx(0.01, rel=0.15)
    assert est.offset == pytest.approx(0.03, rel=0.25)
    assert est.starts == 40
    quiet = noise.estimate([[100.0, 100.0], [100.0, 100.0]])
    assert quiet is not None
    assert (quiet.cv, quiet.offset) == (0.0, 0.0)
    assert noise.estimate([[100.0]]) is None  # one sample a start: no within-start spread


CFG = """
[stack]
remote = "x"
[host]
root = "{root}"
[service]
command = ["x"]
port = 5
model = "m"
[bench]
profiles = ["regular"]
tiers = ["16k"]
repetitions = 3
max_repetitions = 6
[gate]
checks = ["smoke", "bench"]
"""


def _cfg(root: Path, extra: str = "") -> Path:
    path = root / "servegate.toml"
    path.write_text(CFG.format(root=root) + extra)
    return path


def _noise_file(root: Path, cfg: config.Config, cv: float, offset: float) -> None:
    from servegate.bench.cases import spec_from_config
    from servegate.bench.document import fingerprint
    from servegate.engine.openai import Endpoint

    fp = fingerprint(spec_from_config(cfg.bench, Endpoint(""), "m"))
    found = {f"regular-16k:{m}": noise.Noise(cv, offset, 3, 15)
             for m in ("prefill_tps", "generation_tps")}  # fmt: skip
    noise.save(root, found, fp, "a" * 40, "box", [])


def test_the_gate_plans_from_the_box_noise_and_says_what_it_cannot_resolve(
    tmp_path: Path,
) -> None:
    cfg = config.load(_cfg(tmp_path), {})
    _noise_file(tmp_path, cfg, cv=0.005, offset=0.0)
    found, about = noise.load(tmp_path, _digest(cfg))
    assert "noise measured" in about
    rows = bench_gate.plan(cfg, found)
    assert {r["metric"] for r in rows} == {"prefill_tps", "generation_tps"}
    assert all(r["repetitions"] is not None and 3 <= r["repetitions"] <= 6 for r in rows)
    assert bench_gate.unresolved(rows, 6) == []
    _noise_file(tmp_path, cfg, cv=0.01, offset=0.03)  # a restart offset of 3 %
    rows = bench_gate.plan(cfg, noise.load(tmp_path, _digest(cfg))[0])
    (line, _) = bench_gate.unresolved(rows, 6)
    assert "this box resolves" in line
    assert "not 5% within bench.max_repetitions = 6" in line
    # measured with other bench settings: not used, and it says so
    assert noise.load(tmp_path, "other")[0] == {}
    assert "other bench settings" in noise.load(tmp_path, "other")[1]


def _digest(cfg: config.Config) -> str:
    from servegate.bench.cases import spec_from_config
    from servegate.bench.document import fingerprint
    from servegate.engine.openai import Endpoint

    return str(fingerprint(spec_from_config(cfg.bench, Endpoint(""), "m"))["digest"])


def test_config_check_warns_about_the_box_and_refuses_an_empty_gate(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _cfg(tmp_path)
    assert main(["config", "check", "--config", str(path)]) == 0
    assert "the gate cannot plan its repetitions: no noise measurement" in capsys.readouterr().err
    _noise_file(tmp_path, config.load(path, {}), cv=0.01, offset=0.03)
    assert main(["config", "check", "--config", str(path)]) == 0
    assert "this box resolves" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="a gate without checks would pass every release"):
        config.parse(CFG.format(root=tmp_path).replace('["smoke", "bench"]', "[]"), environ={})


def test_an_llm_context_bench_baseline_is_accepted_before_measuring(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    lcb = tmp_path / "lcb.json"
    lcb.write_text(json.dumps(lcb_doc(8)))
    args = ["bench", "--url", "http://127.0.0.1:9", "--model", "demo", "--profiles", "regular",
            "--no-lease", "--json", "--baseline", str(lcb)]  # fmt: skip
    # a case in common: accepted, so the run goes on to the (absent) server
    assert main([*args, "--tiers", "16k"]) == 13
    assert "does not answer /v1/models" in json.loads(capsys.readouterr().out)["error"]["message"]
    # no case in common: refused before anything is measured
    assert main([*args, "--tiers", "8k"]) == 14
    assert "no case in common" in json.loads(capsys.readouterr().out)["error"]["message"]
    assert results.load(lcb).cases["regular-16k"].valid
