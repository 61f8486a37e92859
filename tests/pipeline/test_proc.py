from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from servegate.errors import CommandFailed
from servegate.pipeline import proc


def test_output_and_exit_code() -> None:
    result = proc.run([sys.executable, "-c", "print('hi'); import sys; sys.stderr.write('err')"])
    assert result.ok
    assert "hi" in result.output
    assert "err" in result.output


def test_failure_shows_command_code_and_indented_output() -> None:
    with pytest.raises(CommandFailed) as err:
        proc.run([sys.executable, "-c", "print('boom'); raise SystemExit(3)"])
    text = str(err.value)
    assert "exited with 3" in text
    assert "raise SystemExit(3)" in text
    assert "    boom" in text


def test_timeout_kills_the_whole_group(tmp_path: Path) -> None:
    marker = tmp_path / "child.pid"
    script = (
        "import subprocess, sys, time\n"
        f"c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        f"open({str(marker)!r}, 'w').write(str(c.pid))\n"
        "time.sleep(60)\n"
    )
    start = time.monotonic()
    with pytest.raises(CommandFailed, match="timed out"):
        proc.run([sys.executable, "-c", script], timeout=2)
    assert time.monotonic() - start < 15
    child = int(marker.read_text())
    time.sleep(0.2)
    assert not proc.pid_alive(child)


def test_missing_program_says_what_to_install() -> None:
    with pytest.raises(CommandFailed, match="cannot run no-such-tool-xyz") as err:
        proc.run(["no-such-tool-xyz"])
    assert "install 'no-such-tool-xyz'" in err.value.hint


def test_log_path_gets_full_output(tmp_path: Path) -> None:
    log = tmp_path / "logs" / "build.log"
    proc.run([sys.executable, "-c", "for i in range(100): print(i)"], log_path=log)
    assert log.read_text().splitlines()[-1] == "99"


def test_what_a_command_leaves_running_is_stopped_and_named_an_ended_orphan_is_not() -> None:
    from servegate.pipeline import proc

    with proc.stopping_leftovers() as left:
        # one detached sleeper that keeps running, one orphan that ends at once
        proc.run(["bash", "-c", "setsid sleep 1000 </dev/null >/dev/null 2>&1 & "
                  "(true &) ; sleep 0.2"])  # fmt: skip
    assert len(left) == 1, left
    assert "sleep 1000" in left[0]
    pid = int(left[0].split()[1].rstrip(":"))
    assert not Path(f"/proc/{pid}").exists()  # killed and reaped
