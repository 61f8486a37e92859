"""A failure after the switch that is not the gate's — a full disk when the record is
written — rolls back like any other: an unrecorded candidate never keeps serving."""

from __future__ import annotations

import errno
from typing import Any

import pytest

from servegate.release import record as rec
from servegate.release.promote import promote
from tests.conftest import Host, Stack


def test_a_full_disk_at_the_record_rolls_back_to_the_live_release(
    host: Host, stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    good = stack.commit("ok")
    assert promote(host.context(), good).verdict == "released"
    publish = rec.publish

    def full(cfg: Any, repo: Any, typed: rec.ReleaseRecord, *args: Any) -> dict[str, Any]:
        if typed.verdict == "released":
            raise OSError(errno.ENOSPC, "No space left on device")
        return publish(cfg, repo, typed, *args)

    monkeypatch.setattr(rec, "publish", full)  # promote calls it as rec.publish
    nxt = stack.commit("ok", "the next release")
    outcome = promote(host.context(), nxt)
    assert outcome.verdict == "rolled_back", outcome.reason
    assert outcome.exit_code == 7
    assert "could not be written" in outcome.reason
    assert "No space left on device" in outcome.reason
    assert outcome.rollback["ok"] is True
    assert host.live_root() == host.release_dir(good)
    ctx = host.context()
    assert ctx.state.current is not None
    assert ctx.state.current.sha == good
    assert ctx.state.pending is None
    assert ctx.state.history[-1].verdict == "rolled_back"


def test_a_first_release_that_fails_is_not_an_emergency(
    host: Host, stack: Stack, capsys: pytest.CaptureFixture[str]
) -> None:
    from servegate.cli import release_main

    bad = stack.commit("exit")  # never starts
    code = release_main(["promote", bad, "--config", str(host.path)])
    assert code == 7  # the failure's own code, not "rollback failed" (10)
    out = capsys.readouterr().out
    assert "not an emergency" in out
    assert "nothing was lost" in out
    assert "ROLLBACK FAILED" not in out
    ctx = host.context()
    assert ctx.state.current is None
    assert ctx.state.history[-1].verdict == "rolled_back"
    # status agrees: nothing is wrong with the box, and says what to do
    assert release_main(["status", "--config", str(host.path)]) == 0
    out = capsys.readouterr().out
    assert "no release has been released on this host yet" in out
    assert release_main(["recover", "--config", str(host.path)]) == 0  # nothing to undo
    assert "nothing" in capsys.readouterr().out.lower()


def test_recover_after_an_interrupted_first_promote_says_nothing_serves(
    host: Host, stack: Stack, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    from servegate.cli import release_main

    first = stack.commit("ok")
    assert promote(host.context(), first).verdict == "released"
    path = host.cfg.host_root / "state.json"
    state = json.loads(path.read_text())  # as if the first promote died after its switch
    state.update(current=None, previous=None, history=[], pending={
        "kind": "promote", "sha": first, "pid": 1, "release_dir": host.release_dir(first),
        "at": "2026-01-01T00:00:00+00:00"})  # fmt: skip
    path.write_text(json.dumps(state))
    capsys.readouterr()
    assert release_main(["recover", "--config", str(host.path)]) == 0
    out = capsys.readouterr().out
    assert "is live again" not in out
    assert "the service is stopped; nothing was lost" in out
    assert host.context().manager.main_pid() is None
