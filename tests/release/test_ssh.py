"""Promote over SSH and across a fleet, against real sshd hosts in network namespaces
(tests/sshlab.py): the same promote as a local one, canary and waves, and the faults — an
unreachable host, a wrong or unknown host key, a connection lost before and after the
switch."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import git
import pytest

from servegate import config as config_mod
from servegate.cli import release_main
from servegate.engine.managers.supervisor import Supervisor
from servegate.release.state import HostState
from tests import sshlab
from tests.conftest import Stack, config_text

WHY = sshlab.unavailable()
pytestmark = pytest.mark.skipif(bool(WHY), reason=f"no SSH lab here: {WHY}")


def host_config(stack: Stack, lab_host: sshlab.LabHost, tmp: Path, extra: str = "") -> Path:
    root = tmp / f"host{lab_host.index}"
    text = config_text(stack, root, 8000).replace(
        "keep_releases = 3", f'keep_releases = 3\nstate_dir = "{tmp}/state{lab_host.index}"'
    )
    path = tmp / f"host{lab_host.index}.toml"
    path.write_text(text + extra)
    lab_host.root, lab_host.config = root, path
    return path


def workstation(lab: sshlab.Lab, stack: Stack, tmp: Path, fleet: bool, extra: str = "") -> Path:
    ssh = f"""
[ssh]
servegate = "{sshlab.SERVEGATE}"
known_hosts = "{lab.known_hosts}"
identity = "{lab.client_key}"
connect_timeout = 3
command_timeout = 300
"""
    if fleet:
        hosts = "".join(
            f'\n[[fleet.hosts]]\naddress = "{h.ssh}"\nconfig = "{h.config}"\n' for h in lab.hosts
        )
        text = f'[stack]\nremote = "{stack.origin}"\n{ssh}\n[fleet]\ncanary = 1\nwave_size = 2\n{hosts}'
    else:
        h = lab.hosts[0]
        text = f'[stack]\nremote = "{stack.origin}"\n[host]\nssh = "{h.ssh}"\n{ssh}config = "{h.config}"\n'
    path = tmp / "workstation.toml"
    path.write_text(text + extra)
    return path


@pytest.fixture
def lab(tmp_path: Path, stack: Stack, request: pytest.FixtureRequest) -> Iterator[sshlab.Lab]:
    count = getattr(request, "param", 1)
    with sshlab.lab(tmp_path / "lab", count) as the_lab:
        for h in the_lab.hosts:
            host_config(stack, h, tmp_path)
        try:
            yield the_lab
        finally:
            for h in the_lab.hosts:
                Supervisor(config_mod.load(h.config, {})).shutdown_daemon()


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, Any]]:
    code = release_main([*argv, "--json"])
    out = capsys.readouterr()
    assert out.out, f"exit {code}, no JSON; stderr:\n{out.err}"
    return code, json.loads(out.out)


def released(
    lab: sshlab.Lab,
    stack: Stack,
    tmp: Path,
    capsys: pytest.CaptureFixture[str],
    fleet: bool,
) -> tuple[Path, str]:
    """The workstation's config, and a first good commit promoted through it."""
    ws = workstation(lab, stack, tmp, fleet=fleet)
    good = stack.commit("ok", "good")
    code, doc = run(["promote", good, "--config", str(ws)], capsys)
    assert code == 0, doc
    return ws, good


def state(h: sshlab.LabHost) -> HostState:
    return HostState.load(h.root / "state.json")


def live(h: sshlab.LabHost) -> str | None:
    current = state(h).current
    return current.sha if current else None


def service_pid(h: sshlab.LabHost) -> int | None:
    return Supervisor(config_mod.load(h.config, {})).main_pid()


def test_promote_over_ssh_is_the_same_promote(
    lab: sshlab.Lab, stack: Stack, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ws = workstation(lab, stack, tmp_path, fleet=False)
    sha = stack.commit("ok", "first")
    code, doc = run(["promote", sha, "--config", str(ws)], capsys)
    assert code == 0, doc
    [row] = doc["result"]["hosts"]
    assert row["verdict"] == "released"
    assert row["live"] == sha
    h = lab.hosts[0]
    assert live(h) == sha  # the host's own state file
    record = json.loads(
        git.Repo(stack.origin).git.notes("--ref", "refs/notes/servegate", "show", sha)
    )
    assert record["verdict"] == "released"
    assert record["provenance"]["ok"] is True  # read from /proc on the host
    assert record["launch"]["cwd"] == str(h.root / "releases" / sha)
    code, doc = run(["status", "--config", str(ws)], capsys)
    assert code == 0
    assert doc["result"]["hosts"][0]["live"] == sha
    assert doc["result"]["hosts"][0]["healthy"] is True
    code, doc = run(["verify", "--config", str(ws)], capsys)
    assert code == 0, doc


@pytest.mark.parametrize("lab", [3], indirect=True)
def test_fleet_goes_canary_first_then_waves_and_rolls_back_the_failing_wave(
    lab: sshlab.Lab, stack: Stack, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ws = workstation(lab, stack, tmp_path, fleet=True)
    good = stack.commit("ok", "good")
    code, doc = run(["promote", good, "--config", str(ws)], capsys)
    assert code == 0, doc
    assert doc["result"]["waves"] == [[lab.hosts[0].ssh], [lab.hosts[1].ssh, lab.hosts[2].ssh]]
    assert [live(h) for h in lab.hosts] == [good] * 3
    code, doc = run(["status", "--config", str(ws)], capsys)
    assert code == 0
    assert all(r["matches"] for r in doc["result"]["hosts"])

    # the third host's launch fails lint: the canary keeps the new release, the wave's
    # first host goes back, the third was never touched
    third = lab.hosts[2]
    third.config.write_text(
        third.config.read_text().replace(
            'TINY_SECRET_TOKEN = "hunter2"',
            'TINY_SECRET_TOKEN = "hunter2"\nPYTORCH_TUNABLEOP_ENABLED = "1"',
        )
    )
    pid_third = service_pid(third)
    nxt = stack.commit("ok", "next")
    code, doc = run(["promote", nxt, "--config", str(ws)], capsys)
    result = doc["result"]
    assert code == 15, json.dumps(result, indent=1)
    assert result["failed_host"] == third.ssh
    rows = {r["host"]: r for r in result["hosts"]}
    assert rows[lab.hosts[1].ssh]["rollback"] == "ok"
    assert [live(h) for h in lab.hosts] == [nxt, good, good]
    assert service_pid(third) == pid_third
    code, doc = run(["status", "--config", str(ws)], capsys)
    assert code == 1  # the canary no longer matches the rest
    matches = {r["host"]: r["matches"] for r in doc["result"]["hosts"]}
    assert matches == {lab.hosts[0].ssh: False, lab.hosts[1].ssh: True, third.ssh: True}


@pytest.mark.parametrize("lab", [2], indirect=True)
def test_a_failing_canary_stops_the_fleet(
    lab: sshlab.Lab, stack: Stack, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ws, good = released(lab, stack, tmp_path, capsys, fleet=True)
    bad = stack.commit("exit", "does not start")
    code, doc = run(["promote", bad, "--config", str(ws)], capsys)
    assert code == 7
    rows = doc["result"]["hosts"]
    assert rows[0]["verdict"] == "rolled_back"  # the canary rolled itself back
    assert rows[0]["live"] == good
    assert len(rows) == 1  # the second host was never asked
    assert [live(h) for h in lab.hosts] == [good, good]

    # a fleet that requires attestations, of boxes that sign none: the canary releases,
    # its attestation does not verify, it is rolled back and no other host is asked
    ws.write_text(
        ws.read_text().replace("wave_size = 2\n", "wave_size = 2\nrequire_attestation = true\n")
    )
    nxt = stack.commit("ok", "next, unsigned")
    code, doc = run(["promote", nxt, "--config", str(ws)], capsys)
    assert code == 22, json.dumps(doc["result"], indent=1)
    (row,) = doc["result"]["hosts"]
    assert row["verdict"] == "attestation not verified"
    assert "unsigned: trusted by nobody" in row["reason"] or "no allowed signers" in row["reason"]
    assert row["rollback"] == "ok"
    assert [live(h) for h in lab.hosts] == [good, good]


@pytest.mark.parametrize("lab", [2], indirect=True)
def test_unreachable_host_or_a_wrong_key_changes_nothing(
    lab: sshlab.Lab, stack: Stack, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ws, good = released(lab, stack, tmp_path, capsys, fleet=True)
    nxt = stack.commit("ok", "next")
    lab.stop(lab.hosts[1])
    code, doc = run(["promote", nxt, "--config", str(ws)], capsys)
    assert code == 17
    assert f"cannot reach {lab.hosts[1].ssh}" in doc["error"]["message"]
    assert [live(h) for h in lab.hosts] == [good, good]
    lab.start(lab.hosts[1])

    keys = lab.known_hosts.read_text().splitlines()
    first_addr, second_key = keys[0].split()[0], keys[1].split(maxsplit=1)[1]
    lab.known_hosts.write_text(f"{first_addr} {second_key}\n{keys[1]}\n")  # a changed key
    code, doc = run(["promote", nxt, "--config", str(ws)], capsys)
    assert code == 18
    assert "does not match" in doc["error"]["message"]
    lab.known_hosts.write_text(f"{keys[1]}\n")  # an unknown host
    code, doc = run(["promote", nxt, "--config", str(ws)], capsys)
    assert code == 18
    assert "is not in" in doc["error"]["message"]
    assert [live(h) for h in lab.hosts] == [good, good]


def _promote_in_background(ws: Path, sha: str, out: dict[str, int]) -> threading.Thread:
    def target() -> None:
        out["code"] = release_main(["promote", sha, "--config", str(ws), "--json"])

    thread = threading.Thread(target=target)
    thread.start()
    return thread


def _wait_for(check: Any, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def test_connection_lost_before_the_switch_leaves_the_host_as_it_was(
    lab: sshlab.Lab, stack: Stack, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two releases first, so that going back one (a rollback to ``previous``) would show:
    the host must keep the release it served when the link went, not an older one."""
    ws, older = released(lab, stack, tmp_path, capsys, fleet=False)
    good = stack.commit("ok", "good")
    assert run(["promote", good, "--config", str(ws)], capsys)[0] == 0
    h = lab.hosts[0]
    pid = service_pid(h)
    slow = stack.commit("slow-build", "builds slowly")
    out: dict[str, int] = {}
    thread = _promote_in_background(ws, slow, out)
    _wait_for(lambda: (h.root / "releases" / slow / "mode").exists(), "the new worktree")
    time.sleep(2.0)  # inside build.sh's 20 s
    assert h.drop_connections() >= 1
    thread.join(timeout=120)
    doc = json.loads(capsys.readouterr().out)
    assert out["code"] == 17
    [row] = doc["result"]["hosts"]
    assert row["verdict"] == "connection lost"
    assert row["recovery"].startswith("nothing to undo"), row
    assert row["live"] == good
    left = state(h)
    assert left.pending is None
    assert left.previous is not None
    assert left.previous.sha == older
    assert service_pid(h) == pid
    assert live(h) == good
    code, doc = run(["verify", "--config", str(ws)], capsys)
    assert code == 0, doc
    after = stack.commit("ok", "after")
    assert run(["promote", after, "--config", str(ws)], capsys)[0] == 0
    assert live(h) == after


def _remote_promote_pid(h: sshlab.LabHost, sha: str) -> int:
    """The host's own ``release promote`` of ``sha`` (run by its sshd session)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"promote" in argv and sha.encode() in argv and str(h.config).encode() in argv:
            return int(entry.name)
    raise AssertionError(f"no promote of {sha[:12]} runs on {h.ssh}")


def _switched(
    lab: sshlab.Lab, stack: Stack, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> tuple[Path, str, sshlab.LabHost, str, threading.Thread, dict[str, int]]:
    """A released host, then a slow-starting release promoted to it over SSH in the
    background, just past its switch: (workstation config, the good SHA, the host, the
    slow SHA, the promote's thread, where its exit code goes)."""
    ws, good = released(lab, stack, tmp_path, capsys, fleet=False)
    h = lab.hosts[0]
    slow = stack.commit("slow-start", "starts slowly")
    out: dict[str, int] = {}
    thread = _promote_in_background(ws, slow, out)
    _wait_for(lambda: state(h).pending is not None, "the switch")
    time.sleep(1.0)
    return ws, good, h, slow, thread, out


def test_connection_lost_after_the_switch_the_host_puts_itself_back(
    lab: sshlab.Lab, stack: Stack, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The link goes and stays down after the switch: the host's promote hangs up
    (SIGHUP), puts the release it served back itself, verified, and records the attempt
    as interrupted; the next run finds nothing half done."""
    ws, good, h, slow, thread, out = _switched(lab, stack, tmp_path, capsys)
    lab.stop(h)  # the link goes and stays down
    thread.join(timeout=120)
    capsys.readouterr()
    assert out["code"] == 17
    _wait_for(lambda: state(h).pending is None, "the host's own putting back", timeout=120)
    done = state(h)
    assert done.current is not None
    assert done.current.sha == good
    assert (done.history[-1].sha, done.history[-1].verdict) == (slow, "rolled_back")
    assert done.history[-1].reason == "interrupted"
    assert live(h) == good
    lab.start(h)
    code, doc = run(["status", "--config", str(ws)], capsys)
    assert doc["result"]["hosts"][0]["pending"] is None
    code, doc = run(["verify", "--config", str(ws)], capsys)
    assert code == 0, doc


def test_connection_dropped_after_the_switch_the_fleet_waits_for_the_hosts_put_back(
    lab: sshlab.Lab, stack: Stack, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The link drops after the switch and comes back at once: the fleet reconnects and
    runs ``release recover --wait`` while the host's hung-up promote still puts the
    previous release back; recover waits for it (not "host busy"), and the run ends
    with the previous release serving, verified."""
    ws, good, h, slow, thread, out = _switched(lab, stack, tmp_path, capsys)
    assert h.drop_connections() >= 1
    thread.join(timeout=300)
    doc = json.loads(capsys.readouterr().out)
    assert out["code"] == 17
    [row] = doc["result"]["hosts"]
    assert row["verdict"] == "connection lost"
    assert not row["recovery"].startswith(("FAILED", "not reachable")), row
    assert row["live"] == good
    done = state(h)
    assert done.pending is None
    assert (done.history[-1].sha, done.history[-1].verdict) == (slow, "rolled_back")
    code, doc = run(["verify", "--config", str(ws)], capsys)
    assert code == 0, doc
    assert live(h) == good


def test_a_promote_killed_after_the_switch_is_finished_by_the_next_run(
    lab: sshlab.Lab, stack: Stack, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The host's promote dies after its switch with no chance to clean up (frozen, then
    SIGKILL: an OOM kill, a power cut) and the link goes with it: the host's state file
    knows what was left, and the next run over SSH puts the last proven release back."""
    ws, good, h, slow, thread, out = _switched(lab, stack, tmp_path, capsys)
    pid = _remote_promote_pid(h, slow)
    os.kill(pid, signal.SIGSTOP)  # the hang-up stays pending: no handler runs
    lab.stop(h)
    os.kill(pid, signal.SIGKILL)
    thread.join(timeout=120)
    capsys.readouterr()
    assert out["code"] == 17
    left = state(h)
    assert left.pending is not None
    assert left.pending.sha == slow  # the host's state file knows what was left
    assert live(h) == good  # still the last recorded release …
    lab.start(h)
    code, doc = run(["status", "--config", str(ws)], capsys)
    assert doc["result"]["hosts"][0]["pending"]["sha"] == slow
    code, doc = run(["rollback", "--config", str(ws)], capsys)
    assert code == 0, doc
    assert doc["result"][0]["result"]["recovered"] == slow
    done = state(h)
    assert done.pending is None
    assert done.history[-1].verdict == "rolled_back"
    assert "interrupted after the switch" in done.history[-1].reason
    code, doc = run(["verify", "--config", str(ws)], capsys)
    assert code == 0, doc
    assert live(h) == good


@pytest.mark.parametrize("lab", [2], indirect=True)
def test_a_host_lost_after_it_released_goes_back_with_its_wave(
    lab: sshlab.Lab, stack: Stack, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The second host releases, then its link goes before its answer arrives (its sshd
    session is killed, as a network drop would): recover finds nothing half done there,
    but the host serves the release of a failed wave, so it is rolled back with it."""
    ws, good = released(lab, stack, tmp_path, capsys, fleet=True)
    second = lab.hosts[1]
    drop = tmp_path / "drop-after-promote.sh"
    drop.write_text(
        "#!/bin/bash\n"
        f'if [ "$2" != promote ] || [[ "$*" != *"{second.config}"* ]] || [ -e {tmp_path}/dropped ]; then\n'
        f'  exec "{sshlab.SERVEGATE}" "$@"\n'
        "fi\n"
        f'"{sshlab.SERVEGATE}" "$@" >/dev/null 2>&1; touch {tmp_path}/dropped; pid=$$\n'
        'while [ "$pid" -gt 1 ]; do\n'
        "  pid=$(awk '{print $4}' /proc/$pid/stat)\n"
        '  case "$(cat /proc/$pid/comm)" in sshd*) kill -9 "$pid"; break;; esac\n'
        "done\n"
    )
    drop.chmod(0o755)
    ws.write_text(
        ws.read_text().replace(f'servegate = "{sshlab.SERVEGATE}"', f'servegate = "{drop}"')
    )
    nxt = stack.commit("ok", "next")
    code, doc = run(["promote", nxt, "--config", str(ws)], capsys)
    assert (tmp_path / "dropped").exists()
    assert code == 17, doc
    result = doc["result"]
    assert result["failed_host"] == second.ssh
    row = result["hosts"][1]
    assert row["verdict"] == "connection lost"
    assert row["recovery"].startswith("nothing to undo"), row
    assert row["rollback"] == "ok"
    assert row["live"] == good
    assert [live(h) for h in lab.hosts] == [nxt, good]


def test_bench_runs_on_the_host_with_the_hosts_config(
    lab: sshlab.Lab, stack: Stack, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`servegate bench` with a remote config measures from the host: the service's port
    lives in the host's network namespace, unreachable from here."""
    from servegate.cli import main

    ws, _ = released(lab, stack, tmp_path, capsys, fleet=False)
    code = main(["bench", "--config", str(ws), "--tiers", "1k", "--profiles", "regular",
                 "--repetitions", "1", "--max-tokens", "16", "--no-warmup", "--no-lease"])  # fmt: skip
    out = capsys.readouterr().out
    assert f"── {lab.hosts[0].ssh} ──" in out
    # the host's bench measured the tiny server (it streams; as a vLLM without /metrics its
    # trials are invalid, which a bench reports) and the exit code is the host's
    assert "regular-1k #1: INVALID" in out, out
    assert code == 0, out


def test_history_over_ssh_shows_the_hosts_own_table(
    lab: sshlab.Lab, stack: Stack, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ws, good = released(lab, stack, tmp_path, capsys, fleet=False)
    assert release_main(["history", "--config", str(ws)]) == 0
    out = capsys.readouterr().out
    assert f"── {lab.hosts[0].ssh} ──" in out
    assert good[:12] in out
    assert "released" in out


def test_rebuild_state_over_ssh_rebuilds_the_hosts_state(
    lab: sshlab.Lab, stack: Stack, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`release recover --rebuild-state` from the workstation rebuilds the host's state
    there (before, the flag was dropped on the way and the host only looked for an
    interrupted promote, leaving the damaged state as it was)."""
    ws, first = released(lab, stack, tmp_path, capsys, fleet=False)
    second = stack.commit("ok", "second")
    code, doc = run(["promote", second, "--config", str(ws)], capsys)
    assert code == 0, doc
    h = lab.hosts[0]
    path = config_mod.load(h.config, {}).host_root / "state.json"
    path.write_text(path.read_text()[:40])  # torn by a crash mid-write
    for command in ("status", "verify"):  # the host's own exit code, through SSH
        code, doc = run([command, "--config", str(ws)], capsys)
        assert code == 20, doc

    code, doc = run(["recover", "--rebuild-state", "--config", str(ws)], capsys)
    assert code == 0, doc
    [answer] = doc["result"]
    assert answer["exit_code"] == 0, answer
    rebuilt = answer["result"]["rebuilt"]
    assert (rebuilt["current"], rebuilt["previous"]) == (second, first)
    assert live(h) == second
    code, doc = run(["verify", "--config", str(ws)], capsys)
    assert code == 0, doc
