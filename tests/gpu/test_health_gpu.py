"""``servegate gpu health`` against the real nvidia-smi of a GPU machine: idle and
healthy; a process holding GPU memory (healthy while processes may hold it, refused
where the GPUs must be idle, the pid named); a config that expects more GPUs than there
are, or another arch. With ``SERVEGATE_CAPTURE_DIR`` set, the tool's raw outputs are
written there (the fixtures of test_health_tools.py come from such a run)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

HOLD = """
import time, torch
x = torch.empty(2 * 1024**3, dtype=torch.uint8, device="cuda")
x.fill_(1)
torch.cuda.synchronize()
print("holding", flush=True)
time.sleep(120)
"""


@pytest.fixture(scope="module")
def nvidia() -> str:
    if not shutil.which("nvidia-smi"):
        pytest.skip("no GPU: nvidia-smi is not on PATH")
    listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=False)
    if listed.returncode or "GPU" not in listed.stdout:
        pytest.skip(f"nvidia-smi lists no GPU: {listed.stderr.strip()[:200]}")
    return listed.stdout


def health(tmp_path: Path, *extra: str, config: str = "") -> tuple[int, dict]:  # type: ignore[type-arg]
    if config:
        (tmp_path / "servegate.toml").write_text(config)
    done = subprocess.run(
        [sys.executable, "-m", "servegate", "gpu", "health", "--json", *extra],
        capture_output=True, text=True, timeout=300, check=False, cwd=tmp_path,
        env={**os.environ, "XDG_STATE_HOME": str(tmp_path / "state")},
    )  # fmt: skip
    return done.returncode, json.loads(done.stdout)


def capture(name: str, argv: list[str]) -> None:
    where = os.environ.get("SERVEGATE_CAPTURE_DIR")
    if where:
        Path(where).mkdir(parents=True, exist_ok=True)
        out = subprocess.run(argv, capture_output=True, text=True, check=False).stdout
        (Path(where) / name).write_text(out)


@pytest.fixture
def holder() -> Iterator[int]:
    """A real CUDA process holding 2 GiB of GPU memory."""
    pytest.importorskip("torch")
    proc = subprocess.Popen([sys.executable, "-c", HOLD], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    try:
        assert proc.stdout.readline().strip() == "holding"
        time.sleep(1.0)
        yield proc.pid
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()


def test_an_idle_gpu_machine_is_healthy(nvidia: str, tmp_path: Path) -> None:
    capture("nvidia-smi-q-x-idle.xml", ["nvidia-smi", "-q", "-x"])
    code, doc = health(tmp_path, "--idle")
    result = doc["result"]
    failures = [f for f in result["findings"] if f["severity"] == "fail"]
    assert code == 0, failures
    assert result["tool"] == "nvidia-smi"
    assert len(result["gpus"]) == nvidia.count("GPU ")
    assert all(g["arch"].startswith("sm_") for g in result["gpus"]), result["gpus"]
    assert all(g["memory_total_mib"] and g["temperature_c"] is not None for g in result["gpus"])


def test_a_process_holding_memory_is_seen_and_named(
    nvidia: str, tmp_path: Path, holder: int
) -> None:
    capture("nvidia-smi-q-x-busy.xml", ["nvidia-smi", "-q", "-x"])
    code, doc = health(tmp_path)
    assert code == 0, doc["result"]["findings"]  # processes may hold GPUs (a live service)
    held = [p for g in doc["result"]["gpus"] for p in g["processes"] if p["pid"] == holder]
    if not held:  # a container's pid namespace hides the pid: the memory is still seen
        assert any(g["processes"] for g in doc["result"]["gpus"]), doc["result"]["gpus"]
    else:
        assert held[0]["memory_mib"] >= 2048
    code, doc = health(tmp_path, "--idle")
    assert code == 23
    (memory,) = [f for f in doc["result"]["findings"] if f["check"] == "memory"]
    assert "processes hold the GPU" in memory["what"]


def test_a_config_that_expects_other_gpus_is_refused(nvidia: str, tmp_path: Path) -> None:
    count = nvidia.count("GPU ") + 3
    code, doc = health(tmp_path, config=(
        f'[stack]\nremote = "x"\n[host]\nroot = "{tmp_path / "host"}"\n'
        '[service]\nport = 8000\ncommand = ["true"]\n'
        f'[build]\narchs = ["gfx1030"]\n[gpu]\ncount = {count}\n'
    ))  # fmt: skip
    assert code == 23
    checks = {f["check"] for f in doc["result"]["findings"] if f["severity"] == "fail"}
    assert {"count", "arch"} <= checks, doc["result"]["findings"]
