"""Ctrl-C during a promote: 130 before the switch with nothing changed; after the switch
the previous release is put back, the attempt recorded with reason "interrupted"."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

from servegate.cli import release_main
from servegate.release.promote import promote
from tests.conftest import Host, Stack

RELEASE = str(Path(sys.executable).with_name("release"))


def _interrupt_when(host: Host, sha: str, marker: str) -> tuple[int, str]:
    child = subprocess.Popen(
        [RELEASE, "promote", sha, "--config", str(host.path)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    assert child.stdout is not None
    seen = ""
    deadline = time.monotonic() + 120
    while marker not in seen and time.monotonic() < deadline:
        line = child.stdout.readline()
        if not line:
            break
        seen += line
    time.sleep(0.5)
    child.send_signal(signal.SIGINT)
    rest, _ = child.communicate(timeout=180)
    return child.returncode, seen + rest


def test_ctrl_c_after_the_switch_rolls_back_as_interrupted(host: Host, stack: Stack) -> None:
    good = stack.commit()
    assert promote(host.context(), good).verdict == "released"
    slow = stack.commit("slow-start")
    code, output = _interrupt_when(host, slow, "switch")
    assert code == 130, output[-3000:]
    assert "interrupted" in output
    assert release_main(["verify", "--config", str(host.path)]) == 0  # the good one serves
    state = json.loads((host.cfg.host_root / "state.json").read_text())
    assert state["current"]["sha"] == good
    assert state["history"][-1]["verdict"] == "rolled_back"
    assert state["history"][-1]["reason"] == "interrupted"


def test_ctrl_c_before_the_switch_changes_nothing(host: Host, stack: Stack) -> None:
    good = stack.commit()
    assert promote(host.context(), good).verdict == "released"
    nxt = stack.commit("slow-start")
    code, output = _interrupt_when(host, nxt, "preflight")
    assert code == 130, output[-3000:]
    assert "Traceback" not in output
    state = json.loads((host.cfg.host_root / "state.json").read_text())
    assert state["current"]["sha"] == good
    assert release_main(["verify", "--config", str(host.path)]) == 0
