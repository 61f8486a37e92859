"""Ctrl-C during a promote: 130 before the switch with nothing changed; after the switch
the previous release is put back, the attempt recorded with reason "interrupted"."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from servegate.cli import release_main
from servegate.errors import CommandFailed
from servegate.pipeline.git import StackRepo
from servegate.release.promote import promote
from tests.conftest import Host, Stack

RELEASE = str(Path(sys.executable).with_name("release"))


def ctrl_c_works() -> None:
    """A terminal's Ctrl-C reaches a process whose SIGINT is not ignored; a test run
    started in the background (nohup, `&` without job control) would hand it an ignored
    one."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def sigint_ignored() -> None:
    """What nohup, cron or a non-interactive shell's ``cmd &`` hand a child."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _read_until(child: subprocess.Popen[str], marker: str, seen: str = "") -> str:
    assert child.stdout is not None
    deadline = time.monotonic() + 120
    while marker not in seen and time.monotonic() < deadline:
        line = child.stdout.readline()
        if not line:
            break
        seen += line
    return seen


def _start(
    host: Host, *args: str, inherited: Callable[[], None] | None = None
) -> subprocess.Popen[str]:
    """``release ARGS --config …`` with its output (both streams) on a pipe."""
    return subprocess.Popen(
        [RELEASE, *args, "--config", str(host.path)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        preexec_fn=inherited,
    )  # fmt: skip


def _signal_at(
    child: subprocess.Popen[str],
    marker: str,
    sig: signal.Signals = signal.SIGINT,
    again: tuple[signal.Signals, ...] = (),
    settle: float = 0.5,
) -> tuple[int, str]:
    """Send ``sig`` ``settle`` s after ``marker`` is printed; with ``again``, send those
    too once the putting back has begun. The exit code and the whole output."""
    seen = _read_until(child, marker)
    time.sleep(settle)
    child.send_signal(sig)
    if again:
        seen = _read_until(child, "rolling back", seen)
        for other in again:
            child.send_signal(other)
    rest, _ = child.communicate(timeout=180)
    return child.returncode, seen + rest


def _interrupt_when(
    host: Host,
    sha: str,
    marker: str,
    sig: signal.Signals = signal.SIGINT,
    inherited: Callable[[], None] = ctrl_c_works,
    again: tuple[signal.Signals, ...] = (),
) -> tuple[int, str]:
    """Promote ``sha``, send ``sig`` once ``marker`` is printed (see :func:`_signal_at`)."""
    return _signal_at(_start(host, "promote", sha, inherited=inherited), marker, sig, again)


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


@pytest.mark.parametrize(
    ("sig", "inherited"),
    [
        (signal.SIGINT, sigint_ignored),  # Ctrl-C works whatever SIGINT was inherited
        (signal.SIGTERM, sigint_ignored),  # systemd stopping a unit, `timeout`, a CI cancel
        (signal.SIGHUP, ctrl_c_works),  # the SSH session that ran it is gone
    ],
    ids=["SIGINT-inherited-ignored", "SIGTERM", "SIGHUP"],
)
def test_a_stop_signal_after_the_switch_rolls_back_as_interrupted(
    host: Host, stack: Stack, sig: signal.Signals, inherited: Callable[[], None]
) -> None:
    good = stack.commit()
    assert promote(host.context(), good).verdict == "released"
    slow = stack.commit("slow-start")
    code, output = _interrupt_when(host, slow, "switch", sig, inherited)
    assert code == 130, output[-3000:]
    assert "rolling back" in output
    assert release_main(["verify", "--config", str(host.path)]) == 0  # the good one serves
    state = json.loads((host.cfg.host_root / "state.json").read_text())
    assert state["current"]["sha"] == good
    assert state.get("pending") is None
    assert state["history"][-1]["verdict"] == "rolled_back"
    assert state["history"][-1]["reason"] == "interrupted"


def test_more_stop_signals_do_not_cut_the_putting_back_short(host: Host, stack: Stack) -> None:
    """A CI runner's cancel sends SIGINT, then SIGTERM; a person presses Ctrl-C twice. The
    first starts the rollback; the later ones are said and the rollback finishes."""
    good = stack.commit()
    assert promote(host.context(), good).verdict == "released"
    slow = stack.commit("slow-start")
    code, output = _interrupt_when(
        host, slow, "switch", signal.SIGINT, again=(signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
    )
    assert code == 130, output[-3000:]
    assert "finishes what it started" in output
    assert release_main(["verify", "--config", str(host.path)]) == 0
    state = json.loads((host.cfg.host_root / "state.json").read_text())
    assert state["current"]["sha"] == good
    assert state.get("pending") is None
    assert state["history"][-1]["verdict"] == "rolled_back"


def test_recover_waits_for_a_promote_still_running_then_undoes_what_its_kill_left(
    host: Host, stack: Stack
) -> None:
    """A CI runner kills a cancelled promote's process tree; the recover step that
    follows may start while it still holds the host lock. ``release recover --wait``
    waits for it, then puts the last proven release back."""
    good = stack.commit()
    assert promote(host.context(), good).verdict == "released"
    slow = stack.commit("slow-start")
    child = _start(host, "promote", slow)
    seen = _read_until(child, "switch")
    time.sleep(0.5)
    recovering = _start(host, "recover", "--wait", "120")
    time.sleep(2)
    assert recovering.poll() is None, "recover did not wait for the promote's host lock"
    child.kill()  # the tree killed mid-switch: nothing put back, the pending mark stays
    child.communicate(timeout=60)
    out, _ = recovering.communicate(timeout=240)
    assert recovering.returncode == 0, seen + out
    assert "is live again and verified" in out
    assert release_main(["verify", "--config", str(host.path)]) == 0
    state = json.loads((host.cfg.host_root / "state.json").read_text())
    assert state["current"]["sha"] == good
    assert state.get("pending") is None
    # without --wait a held lock is refused at once (exit 4), as before
    holder = _start(host, "promote", slow)
    try:
        _read_until(holder, "preflight")
        refused = subprocess.run([RELEASE, "recover", "--config", str(host.path)],
                                 capture_output=True, text=True, timeout=60)  # fmt: skip
        assert refused.returncode == 4, refused.stderr
    finally:
        holder.kill()
        holder.communicate(timeout=60)


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


CRASH_AT_THE_LAST_SAVE = """
import datetime, os, signal, sys
from servegate.release import record, state
save = state.HostState.save
def save_or_die(self):
    if self.current is not None and self.current.sha == sys.argv[1]:
        os.kill(os.getpid(), signal.SIGKILL)  # recorded and tagged, the state not yet saved
    save(self)
    if self.pending is not None and len(sys.argv) > 3:  # the clock jumps back an hour
        now = record.now
        record.now = lambda: now() - datetime.timedelta(hours=1)
state.HostState.save = save_or_die
import pytest

from servegate.cli import release_main
release_main(["promote", sys.argv[1], "--config", sys.argv[2]])
"""


@pytest.mark.parametrize("note", ["readable", "unreadable", "clock jumped back"])
def test_a_promote_killed_after_its_tag_is_superseded_in_its_note_by_recover(
    host: Host, stack: Stack, note: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worst moment: the record and tag are pushed, then the process dies before the
    host state says "released". The next run rolls it back; the tag on origin must not
    stand alone: the release's note says it was rolled back and supersedes the tag. A
    note the recover cannot read does not drop that: the host's own copy of its records
    still shows the release, and the record says the note went unread."""
    good = stack.commit()
    assert promote(host.context(), good).verdict == "released"
    nxt = stack.commit()
    jump = ["jump"] if note == "clock jumped back" else []  # after its pending marker
    died = subprocess.run([sys.executable, "-c", CRASH_AT_THE_LAST_SAVE, nxt, str(host.path),
                           *jump], capture_output=True, text=True, timeout=300)  # fmt: skip
    assert died.returncode == -signal.SIGKILL, died.stderr[-2000:]
    tags = subprocess.run(["git", "-C", str(stack.origin), "tag", "--points-at", nxt],
                          capture_output=True, text=True, check=True).stdout.split()  # fmt: skip
    assert len(tags) == 1  # the tag reached origin before the crash

    if note == "unreadable":
        real = StackRepo.notes

        def unreadable(self: StackRepo, sha: str) -> str:
            if sha == nxt:
                raise CommandFailed("git notes show failed: fatal: bad object")
            return real(self, sha)

        monkeypatch.setattr(StackRepo, "notes", unreadable)
    assert release_main(["recover", "--config", str(host.path)]) == 0
    monkeypatch.undo()
    text = subprocess.run(
        ["git", "-C", str(stack.origin), "notes", "--ref", "refs/notes/servegate", "show", nxt],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    records = sorted((json.loads(x) for x in text.splitlines() if x.startswith("{")),
                     key=lambda r: r["at"])  # fmt: skip
    assert [r["verdict"] for r in records] == ["released", "rolled_back"]
    unread = any("could not be read" in w for w in records[-1].get("warnings") or [])
    assert unread == (note == "unreadable")
    assert records[-1]["supersedes"] == {"verdict": "released", "tag": tags[0],
                                         "at": records[0]["at"]}  # fmt: skip
    assert tags[0] in records[-1]["reason"]
    state = json.loads((host.cfg.host_root / "state.json").read_text())
    assert state["current"]["sha"] == good
    assert state["history"][-1]["verdict"] == "rolled_back"
    assert state["history"][-1]["tag"] == tags[0]
    assert release_main(["verify", "--config", str(host.path)]) == 0
    # a state made again from the records agrees: the superseded record is no release
    (host.cfg.host_root / "state.json").write_text("{")
    assert release_main(["recover", "--rebuild-state", "--config", str(host.path)]) == 0
    rebuilt = json.loads((host.cfg.host_root / "state.json").read_text())
    assert rebuilt["current"]["sha"] == good
    assert [e["verdict"] for e in rebuilt["history"] if e["sha"] == nxt] == ["rolled_back"]


def test_ctrl_c_while_the_record_is_pushed_keeps_the_proven_release(
    host: Host, stack: Stack, capsys: pytest.CaptureFixture[str]
) -> None:
    """The release is proven when the record's push (up to minutes on a slow origin) is
    interrupted: it stays the live release, the state says so, and the refs wait in
    unpushed.json for the next command — never a rollback of a verified release."""
    good = stack.commit()
    assert promote(host.context(), good).verdict == "released"
    nxt = stack.commit(message="next")
    hook = stack.origin / "hooks" / "pre-receive"
    hook.write_text("#!/bin/sh\nsleep 60\n")  # an origin that takes its time
    hook.chmod(0o755)
    try:
        code, output = _interrupt_when(host, nxt, "✓ gate")
    finally:
        hook.unlink()
    assert code == 130, output[-3000:]
    assert "is released, verified and serving" in output
    state = json.loads((host.cfg.host_root / "state.json").read_text())
    assert state["current"]["sha"] == nxt
    assert state.get("pending") is None
    kept = json.loads((host.cfg.host_root / "unpushed.json").read_text())
    assert any(r.startswith("refs/notes/servegate") for r in kept)
    assert release_main(["verify", "--config", str(host.path)]) == 0
    capsys.readouterr()
    assert release_main(["status", "--config", str(host.path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["result"]["unpushed"]
    # the next promote pushes what was left
    third = stack.commit(message="third")
    assert release_main(["promote", third, "--config", str(host.path)]) == 0
    assert not (host.cfg.host_root / "unpushed.json").exists()


def test_a_stop_signal_during_the_rollback_of_a_failed_start_does_not_cut_it_short(
    host: Host, stack: Stack
) -> None:
    """A cancel that comes while a failed release is being rolled back (the first signal,
    not a second one) must let the putting back finish: the old release is stopped."""
    good = stack.commit()
    assert promote(host.context(), good).verdict == "released"
    broken = stack.commit("exit")
    code, output = _interrupt_when(host, broken, "rolling back", signal.SIGTERM)
    assert "rolled back: " in output, output[-3000:]
    assert release_main(["verify", "--config", str(host.path)]) == 0  # the good one serves
    state = json.loads((host.cfg.host_root / "state.json").read_text())
    assert state["current"]["sha"] == good
    assert state.get("pending") is None
    assert state["history"][-1]["verdict"] == "rolled_back"
    assert code != 0


def test_sighup_with_stderr_gone_still_rolls_back_as_interrupted(
    host: Host, stack: Stack, tmp_path: Path
) -> None:
    """A lost SSH session: SIGHUP, and stderr leads nowhere. The handler's message must not
    take the place of the stop (a BrokenPipeError is no Ctrl-C)."""
    good = stack.commit()
    assert promote(host.context(), good).verdict == "released"
    slow = stack.commit("slow-start")
    result = tmp_path / "promote.json"
    with result.open("w") as out:
        child = subprocess.Popen(
            [RELEASE, "promote", slow, "--config", str(host.path), "--json"],
            stdout=out, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
    state_path = host.cfg.host_root / "state.json"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if state_path.exists() and json.loads(state_path.read_text() or "{}").get("pending"):
            break
        time.sleep(0.1)
    time.sleep(1.5)  # switched: the slow release is starting
    assert child.stderr is not None
    child.stderr.close()  # the reader is gone
    child.send_signal(signal.SIGHUP)
    child.wait(timeout=180)
    doc = json.loads(result.read_text())
    assert child.returncode == 130, doc
    state = json.loads(state_path.read_text())
    assert state["current"]["sha"] == good
    assert state.get("pending") is None
    assert state["history"][-1]["verdict"] == "rolled_back"
    assert state["history"][-1]["reason"] == "interrupted"
    assert release_main(["verify", "--config", str(host.path)]) == 0


def test_a_stop_signal_during_release_rollback_leaves_a_verified_release(
    host: Host, stack: Stack
) -> None:
    first = stack.commit()
    assert promote(host.context(), first).verdict == "released"
    second = stack.commit(message="second")
    assert promote(host.context(), second).verdict == "released"
    code, output = _signal_at(_start(host, "rollback"), "rb switch", signal.SIGTERM, settle=0)
    assert code == 130, output[-3000:]
    assert "which was serving, is back and verified" in output
    assert release_main(["verify", "--config", str(host.path)]) == 0, output[-3000:]
    state = json.loads((host.cfg.host_root / "state.json").read_text())
    assert state.get("pending") is None, output[-3000:]
    assert state["current"]["sha"] == second


def test_a_stop_signal_during_release_recover_does_not_cut_its_putting_back_short(
    host: Host, stack: Stack
) -> None:
    good = stack.commit()
    assert promote(host.context(), good).verdict == "released"
    slow = stack.commit("slow-start")
    killed = _start(host, "promote", slow)
    _read_until(killed, "switch")
    killed.kill()  # nothing put back: the pending mark stays
    killed.communicate(timeout=60)
    code, output = _signal_at(_start(host, "recover"), "rb switch", signal.SIGTERM, settle=0)
    assert code == 0, output[-3000:]
    assert release_main(["verify", "--config", str(host.path)]) == 0, output[-3000:]
    state = json.loads((host.cfg.host_root / "state.json").read_text())
    assert state.get("pending") is None
    assert state["current"]["sha"] == good
