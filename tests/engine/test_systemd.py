"""The systemd user unit: rendered from the launch spec, checked by systemd-analyze."""

from __future__ import annotations

import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from servegate import config
from servegate.engine.launch import launch_spec
from servegate.engine.managers.systemd import render_unit, unit_dir

CONFIG = """
[stack]
remote = "/srv/stack.git"
[host]
root = "/srv/servegate"
[service]
manager = "systemd-user"
unit = "v620-tp4-git"
port = 8080
memory_max = "236223201280"
memory_swap_max = "0"
command = ["/opt/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server",
           "--port", "{port}", "--served-model-name", "active", "qwen3.8-flash-next",
           "--compilation-config", '{"mode":0,"cudagraph_mode":"FULL_DECODE_ONLY","cudagraph_capture_sizes":[3,6,12]}',
           "--api-key", "50% off $HOME"]
[service.env]
PYTHONPATH = "{release}"
VLLM_TUNED_CONFIG_FOLDER = "{release}/tuned-moe"
VLLM_TEST_NOTE = "costs $5 at 100%"
"""


def unit_text(tmp_path: Path) -> str:
    cfg = config.parse(CONFIG, environ={})
    spec = launch_spec(cfg, Path("/srv/servegate/releases/532ed3f930f4"), "532ed3f930f4" + "0" * 28)
    return render_unit(spec)


def test_unit_has_the_seed_settings(tmp_path: Path) -> None:
    text = unit_text(tmp_path)
    for line in (
        "WorkingDirectory=/srv/servegate/releases/532ed3f930f4",
        'Environment="PYTHONPATH=/srv/servegate/releases/532ed3f930f4"',
        "Restart=on-failure",
        "StartLimitBurst=3",
        "StartLimitIntervalSec=600",
        "KillMode=control-group",
        "MemoryMax=236223201280",
        "MemorySwapMax=0",
        "TimeoutStopSec=120",
    ):
        assert line in text.splitlines()
    assert "Restart=always" not in text
    # the whole SHA: `systemctl status` then names the exact release serving
    (desc,) = [x for x in text.splitlines() if x.startswith("Description=")]
    assert "532ed3f930f4" + "0" * 28 in desc


def test_execstart_round_trips_json_percent_and_dollar(tmp_path: Path) -> None:
    text = unit_text(tmp_path)
    exec_line = next(line for line in text.splitlines() if line.startswith("ExecStart="))
    words = shlex.split(exec_line.removeprefix("ExecStart=").replace("%%", "%").replace("$$", "$"))
    assert words[words.index("--compilation-config") + 1] == (
        '{"mode":0,"cudagraph_mode":"FULL_DECODE_ONLY","cudagraph_capture_sizes":[3,6,12]}'
    )
    assert words[words.index("--port") + 1] == "8080"
    assert words[-1] == "50% off $HOME"


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")
def test_systemd_analyze_verify_reports_nothing(tmp_path: Path) -> None:
    unit = tmp_path / "v620-tp4-git.service"
    # the executable must exist for verify; point it at a real interpreter
    unit.write_text(
        unit_text(tmp_path).replace(
            "/opt/venv/bin/python", shutil.which("python3") or "/usr/bin/python3"
        )
    )
    result = subprocess.run(
        ["systemd-analyze", "verify", str(unit)], capture_output=True, text=True
    )
    # systemd-analyze exits 0 even when it complains: any output is a finding
    noise = [
        line
        for line in (result.stdout + result.stderr).splitlines()
        if str(unit) in line or "Unknown" in line or "Failed" in line
    ]
    assert result.returncode == 0, result.stderr
    assert noise == []


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")
def test_systemd_analyze_catches_a_bad_unit(tmp_path: Path) -> None:
    unit = tmp_path / "bad.service"
    unit.write_text(unit_text(tmp_path).replace("Restart=on-failure", "Restart=sometimes"))
    result = subprocess.run(
        ["systemd-analyze", "verify", str(unit)], capture_output=True, text=True
    )
    assert "Failed to parse service restart specifier" in result.stdout + result.stderr


def test_units_go_under_xdg_config_home(no_writes_to_home: Path) -> None:
    assert unit_dir() == no_writes_to_home / ".config" / "systemd" / "user"


def test_environment_keeps_a_dollar_as_written(tmp_path: Path) -> None:
    """systemd gives ``$`` no meaning in Environment= (only ExecStart expands it), so it
    is written once; ``%`` is a specifier there too and is doubled."""
    lines = unit_text(tmp_path).splitlines()
    assert 'Environment="VLLM_TEST_NOTE=costs $5 at 100%%"' in lines
    exec_line = next(line for line in lines if line.startswith("ExecStart="))
    assert '"50%% off $$HOME"' in exec_line


def test_no_user_bus_says_what_to_set_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without this user's systemd (no user bus: a login without linger, a container)
    `systemctl --user` answers "Failed to connect to bus": said with what to enable
    (exit 6), never a raw command failure. The real systemctl is asked."""
    if shutil.which("systemctl") is None:
        pytest.skip("systemctl is not installed")
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "no-runtime-dir"))
    monkeypatch.delenv("DBUS_SESSION_BUS_ADDRESS", raising=False)
    probe = subprocess.run(["systemctl", "--user", "show", "x"], capture_output=True,
                           text=True, check=False)  # fmt: skip
    if "Failed to connect to bus" not in probe.stdout + probe.stderr:
        pytest.skip("this box has a user bus even without XDG_RUNTIME_DIR")
    from servegate.engine.managers.systemd import SystemdUser
    from servegate.errors import PreflightFailed

    manager = SystemdUser(config.parse(CONFIG, environ={}))
    with pytest.raises(PreflightFailed, match="cannot reach this user's systemd") as caught:
        manager.state()
    assert "enable-linger" in (caught.value.hint or "")
    assert caught.value.exit_code == 6
