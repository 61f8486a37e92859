"""Trust in local files: a damaged or crafted state file, a planted lock link, a socket
path another user could take — each refused with a clear error, nothing deleted."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path

import pytest

from servegate.cli import release_main
from servegate.engine.health import wait_healthy
from servegate.engine.managers import supervisor
from servegate.errors import LockHeld, PreflightFailed
from servegate.judging import noise
from servegate.pipeline.lock import HostLock
from servegate.pipeline.redact import host_salt
from servegate.release import record
from tests.conftest import Host, Stack, hold_lock


def test_a_truncated_state_file_is_named_not_a_traceback(
    host: Host, capsys: pytest.CaptureFixture[str]
) -> None:
    state = host.cfg.host_root / "state.json"
    state.parent.mkdir(parents=True, exist_ok=True)
    state.write_text('{"schema": 1, "current": {"sha": "ab')
    for command in ("status", "history", "rollback"):
        assert release_main([command, "--config", str(host.path), "--json"]) == 20
        error = json.loads(capsys.readouterr().out)["error"]
        assert str(state) in error["message"]
        assert "not readable JSON" in error["message"]
        assert "release recover --rebuild-state" in error["hint"]


SHA_A = "0123456789abcdef0123456789abcdef01234567"


def entry(**fields: object) -> dict[str, object]:
    return {"sha": SHA_A, "release_dir": "", "verdict": "released", "at": "", **fields}


@pytest.mark.parametrize(
    ("doc", "said"),
    [
        ({"current": entry(sha=1)}, "current.sha is int"),
        ({"current": entry(release_dir=5)}, "current.release_dir is int"),
        ({"current": entry(release_dir="/x\u0000y")}, "NUL"),
        ({"current": entry(artifacts=["x"])}, "current.artifacts is not an object"),
        ({"current": entry(artifacts={"a": 1})}, "current.artifacts.a is int"),
        ({"current": entry(trusted=True)}, "current.trusted is not a field"),
        ({"pending": {"kind": "promote"}}, "pending.sha is missing"),
        ({"history": [entry(startup_seconds="x")]}, "history[0].startup_seconds is str"),
        ({"history": [entry(at=None)]}, "history[0].at is NoneType"),
        ({"history": None}, "history is not a list"),
        ({"pending": {"sha": SHA_A, "kind": ["x"], "at": {}}}, "pending.kind is list"),
        ({"pending": "x"}, "pending is not an object"),
    ],
)
def test_state_fields_of_the_wrong_type_are_named_never_a_traceback(
    host: Host, capsys: pytest.CaptureFixture[str], doc: dict[str, object], said: str
) -> None:
    state = host.cfg.host_root / "state.json"
    state.parent.mkdir(parents=True, exist_ok=True)
    state.write_text(json.dumps({"schema": 1, **doc}))
    for command in ("status", "history"):
        assert release_main([command, "--config", str(host.path), "--json"]) == 20
        error = json.loads(capsys.readouterr().out)["error"]
        assert str(state) in error["message"]
        assert said in error["message"]
        assert "release recover --rebuild-state" in error["hint"]


def test_a_state_nested_too_deep_is_named_never_a_traceback(
    host: Host, capsys: pytest.CaptureFixture[str]
) -> None:
    state = host.cfg.host_root / "state.json"
    state.parent.mkdir(parents=True, exist_ok=True)
    state.write_text('{"schema": 1, "history": ' + "[" * 100000 + "]" * 100000 + "}")
    assert release_main(["status", "--config", str(host.path), "--json"]) == 20
    assert "not readable JSON" in json.loads(capsys.readouterr().out)["error"]["message"]


@pytest.mark.parametrize(
    "holder",
    ["{}", json.dumps({"pid": 999999, "host": "h", "command": "c", "since": 1e300}),
     json.dumps({"pid": "1", "host": 2, "command": None, "since": "x"}), "[" * 100000],
)  # fmt: skip
def test_a_crafted_lock_holder_is_an_unknown_holder_never_a_crash(
    tmp_path: Path, holder: str
) -> None:
    lock = tmp_path / "root" / "servegate.lock"
    lock.parent.mkdir(mode=0o700)
    lock.write_text(holder)
    with HostLock(lock, "promote") as taken:  # nobody holds the flock: taken over
        assert taken.took_over is None
    lock.write_text(holder)
    with hold_lock(lock):  # a live holder whose record is garbage
        lock.write_text(holder)
        with pytest.raises(LockHeld, match="left no readable record"), HostLock(lock, "other"):
            pass


def test_a_noise_file_with_wrong_types_is_ignored_with_the_reason(tmp_path: Path) -> None:
    path = tmp_path / noise.FILE
    v = noise.SCHEMA
    row = {"cv": 0.1, "offset": 0, "starts": 3, "samples": 9}
    for doc in ({"schema": v, "fingerprint": "x"},
                {"schema": v, "fingerprint": {"digest": "d"}, "rows": {"a": {"cv": "x"}}},
                {"schema": v, "fingerprint": {"digest": "d"}, "rows": ["a"]},
                {"schema": v, "fingerprint": {"digest": "d"},
                 "rows": {"a": {**row, "offset_estimate": "0"}}},
                {"schema": v, "fingerprint": {"digest": "d"}, "sha": 5, "rows": {"a": row}}):  # fmt: skip
        path.write_text(json.dumps(doc))
        rows, why = noise.load(tmp_path, "d")
        assert why, doc
        assert rows == {} or set(rows) == {"a"}


def test_the_state_is_rebuilt_from_the_notes_and_release_directories(
    host: Host, stack: Stack, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two releases, then the state file is lost to a crash mid-write: `release recover
    --rebuild-state` makes it again; verify, status and a rollback work from it."""
    first = stack.commit()
    assert release_main(["promote", first, "--config", str(host.path)]) == 0
    second = stack.commit()
    assert release_main(["promote", second, "--config", str(host.path)]) == 0
    state = host.cfg.host_root / "state.json"
    before = json.loads(state.read_text())
    damaged = state.read_text()[:40]
    state.write_text(damaged)
    assert release_main(["status", "--config", str(host.path)]) == 20
    capsys.readouterr()

    assert release_main(["recover", "--rebuild-state", "--config", str(host.path), "--json"]) == 0
    rebuilt = json.loads(capsys.readouterr().out)["result"]["rebuilt"]
    assert (rebuilt["current"], rebuilt["previous"]) == (second, first)
    assert (
        Path(rebuilt["kept"]).read_text() == json.dumps(before)[:40]
        or Path(rebuilt["kept"]).exists()
    )
    after = json.loads(state.read_text())
    assert [(e["sha"], e["verdict"], e["tag"]) for e in after["history"]] == [
        (e["sha"], e["verdict"], e["tag"]) for e in before["history"]
    ]
    assert after["current"]["artifacts"] == before["current"]["artifacts"]
    assert after["current"]["release_dir"] == before["current"]["release_dir"]
    assert release_main(["verify", "--config", str(host.path)]) == 0
    assert release_main(["rollback", "--config", str(host.path)]) == 0
    assert json.loads(state.read_text())["current"]["sha"] == first


def test_two_releases_of_one_second_are_rebuilt_in_the_order_they_were_made(
    host: Host, stack: Stack, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Records of one instant (older servegates wrote seconds only), and the later
    release's SHA listed first by the notes: the live release is still current and the
    earlier one its previous, never lost to the notes' order."""
    from servegate.release import record

    frozen = record.now()
    monkeypatch.setattr(record, "now", lambda: frozen)
    first = stack.commit()
    assert release_main(["promote", first, "--config", str(host.path)]) == 0
    second = stack.commit()
    while second > first:  # the notes list by SHA: the later release first
        second = stack.commit()
    assert release_main(["promote", second, "--config", str(host.path)]) == 0
    (host.cfg.host_root / "state.json").write_text("{")
    capsys.readouterr()
    assert release_main(["recover", "--rebuild-state", "--config", str(host.path), "--json"]) == 0
    rebuilt = json.loads(capsys.readouterr().out)["result"]["rebuilt"]
    assert (rebuilt["current"], rebuilt["previous"]) == (second, first)


def test_a_note_line_of_wrong_types_is_skipped_with_a_warning_by_rebuild(
    host: Host, stack: Stack, capsys: pytest.CaptureFixture[str]
) -> None:
    first = stack.commit()
    assert release_main(["promote", first, "--config", str(host.path), "--json"]) == 0
    mine = json.loads(capsys.readouterr().out)["result"]["record"]["host_id"]
    planted = {"host_id": mine, "sha": first, "verdict": "released", "at": "2099",
               "previous_sha": None, "host": "h", "branch": "main", "remote": "origin",
               "strategy": "worktree", "startup_seconds": "fast", "artifacts": ["x"]}  # fmt: skip
    # sealed with the host's own key (a record only this host could have written)
    sealed = {**planted, "seal": record.seal(planted, host_salt(host.cfg.host_root))}
    repo = host.cfg.host_root / "repo.git"
    for line in (planted, sealed):
        subprocess.run(["git", "-C", str(repo), "-c", "user.name=x", "-c", "user.email=x@x",
                        "notes", "--ref", "refs/notes/servegate", "append", "-m",
                        json.dumps(line), first], check=True)  # fmt: skip
    assert release_main(["recover", "--rebuild-state", "--config", str(host.path)]) == 0
    io = capsys.readouterr()
    assert "1 record(s) of " in io.err  # the unsealed one
    assert "carry no seal of its key" in io.err
    assert "warning: a record of " in io.err  # the sealed one, of the wrong types
    assert "startup_seconds is str 'fast', not a number" in io.err
    state = json.loads((host.cfg.host_root / "state.json").read_text())
    assert state["current"]["sha"] == first
    assert [e["at"] for e in state["history"]] != ["2099"]
    assert release_main(["verify", "--config", str(host.path)]) == 0


def test_a_crafted_sha_never_becomes_a_path_servegate_deletes(
    host: Host, stack: Stack, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    victim = tmp_path / "victim"
    (victim / ".git").mkdir(parents=True)
    (victim / "keep.txt").write_text("mine")
    root = host.cfg.host_root
    root.mkdir(parents=True, exist_ok=True)
    crafted = {"sha": "../../victim", "release_dir": str(victim), "verdict": "released",
               "at": "2026-12-01T00:00:00+00:00"}  # fmt: skip
    (root / "state.json").write_text(json.dumps(
        {"schema": 1, "current": None, "previous": None, "history": [crafted], "pending": None}
    ))  # fmt: skip
    assert release_main(["rollback", "--to", "../../victim", "--config", str(host.path)]) == 20
    assert "is not a 40-hex commit SHA" in capsys.readouterr().err
    assert (victim / "keep.txt").read_text() == "mine"
    # a well-formed SHA with a release directory outside the host root: refused too
    crafted["sha"] = "a" * 40
    (root / "state.json").write_text(json.dumps(
        {"schema": 1, "current": crafted, "previous": None, "history": [], "pending": None}
    ))  # fmt: skip
    assert release_main(["rollback", "--config", str(host.path)]) == 20
    assert "lies outside" in capsys.readouterr().err
    assert (victim / "keep.txt").exists()


def test_a_planted_lock_link_is_refused_and_its_target_untouched(tmp_path: Path) -> None:
    precious = tmp_path / "precious.conf"
    precious.write_text("do not truncate\n")
    lock = tmp_path / "root" / "servegate.lock"
    lock.parent.mkdir()
    lock.symlink_to(precious)
    with pytest.raises(LockHeld, match="is a symbolic link"), HostLock(lock, "promote"):
        pass
    assert precious.read_text() == "do not truncate\n"


def test_a_long_root_puts_the_socket_in_a_private_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # what gettempdir() answers
    deep = tmp_path / ("d" * 120)
    sock = supervisor.socket_path(deep)
    assert sock.parent == tmp_path / f"servegate-{os.getuid()}"
    assert (sock.parent.stat().st_mode & 0o777) == 0o700
    # another user's (or anyone's) directory there: refused, never used
    sock.parent.chmod(0o777)
    with pytest.raises(PreflightFailed, match="not a private directory"):
        supervisor.socket_path(deep)


def test_a_host_root_others_can_write_is_refused(
    host: Host, stack: Stack, capsys: pytest.CaptureFixture[str]
) -> None:
    root = host.cfg.host_root
    root.mkdir(parents=True, exist_ok=True)
    root.chmod(0o777)
    sha = stack.commit()
    assert release_main(["promote", sha, "--config", str(host.path)]) == 6
    err = capsys.readouterr().err
    assert "writable by others" in err
    assert f"chmod go-w {root}" in err
    assert not (root / "releases").exists()  # nothing fetched, nothing deployed
    root.chmod(0o755)
    assert release_main(["promote", sha, "--config", str(host.path)]) == 0


def test_read_only_commands_on_a_host_never_set_up_leave_it_bare(
    host: Host, capsys: pytest.CaptureFixture[str]
) -> None:
    root = host.cfg.host_root
    assert release_main(["verify", "--config", str(host.path)]) == 12
    assert release_main(["rollback", "--config", str(host.path)]) == 12
    assert release_main(["history", "--config", str(host.path)]) == 0
    assert not (root / "repo.git").exists()
    assert "no release is recorded" in capsys.readouterr().err


def _rebuilt_library(host: Host, sha: str) -> str:
    """A library rebuilt in the release and its hash written into state.json, the
    service started on it: what someone who can write the host root can do."""
    import hashlib

    lib = host.cfg.host_root / "releases" / sha / "build" / "libtiny.so"
    src = host.cfg.host_root / "other.c"
    src.write_text("int tiny_version(void) { return 7; } int evil(void) { return 666; }\n")
    subprocess.run(["cc", "-shared", "-fPIC", "-o", f"{lib}.new", str(src)], check=True)
    os.replace(f"{lib}.new", lib)
    new = hashlib.sha256(lib.read_bytes()).hexdigest()
    path = host.cfg.host_root / "state.json"
    state = json.loads(path.read_text())
    state["current"]["artifacts"]["build/libtiny.so"] = new
    path.write_text(json.dumps(state))
    ctx = host.context()
    ctx.manager.stop()
    ctx.manager.start()
    # up and mapping the rebuilt library, so only the record differs
    wait_healthy(ctx.manager, ctx.endpoint, 30, ctx.reporter)
    return new


def test_verify_believes_the_release_record_not_a_rewritten_state(
    host: Host, stack: Stack, capsys: pytest.CaptureFixture[str]
) -> None:
    from servegate.release.promote import promote

    sha = stack.commit()
    assert promote(host.context(), sha).verdict == "released"
    _rebuilt_library(host, sha)
    capsys.readouterr()
    assert release_main(["verify", "--config", str(host.path)]) == 8
    err = capsys.readouterr().err
    assert "differ from its release record's (build/libtiny.so)" in err
    assert "--rebuild-state" in err


@pytest.mark.parametrize("with_artifacts", [True, False])
def test_a_record_appended_by_the_same_writer_does_not_outvote_the_release_record(
    host: Host, stack: Stack, capsys: pytest.CaptureFixture[str], with_artifacts: bool
) -> None:
    from servegate.release.promote import promote

    sha = stack.commit()
    assert promote(host.context(), sha).verdict == "released"
    new = _rebuilt_library(host, sha)
    repo = host.cfg.host_root / "repo.git"
    notes = ["git", "-c", "user.name=x", "-c", "user.email=x@x.invalid", "-C", str(repo),
             "notes", "--ref", "refs/notes/servegate"]  # fmt: skip
    shown = subprocess.run([*notes, "show", sha], capture_output=True, text=True, check=True)
    last = json.loads([ln for ln in shown.stdout.splitlines() if ln.startswith("{")][-1])
    forged = dict(last, at=last["at"] + "Z")
    if with_artifacts:
        forged["artifacts"] = dict(last["artifacts"], **{"build/libtiny.so": new})
    else:
        forged.pop("artifacts")
    subprocess.run([*notes, "append", "-m", json.dumps(forged), sha], check=True)
    capsys.readouterr()
    assert release_main(["verify", "--config", str(host.path)]) == 8
    assert "differ from its release record's" in capsys.readouterr().err


def test_a_state_rebuilt_after_a_rollback_verifies_and_promotes(
    host: Host, stack: Stack, capsys: pytest.CaptureFixture[str]
) -> None:
    """A rollback record carries no build hashes: the rebuilt state takes the SHA's
    from its released record, so verify and the next promote hold."""
    first = stack.commit()
    assert release_main(["promote", first, "--config", str(host.path)]) == 0
    assert release_main(["promote", stack.commit(), "--config", str(host.path)]) == 0
    assert release_main(["rollback", "--config", str(host.path)]) == 0
    state = host.cfg.host_root / "state.json"
    state.write_text(state.read_text()[:40])  # lost to a crash
    assert release_main(["recover", "--rebuild-state", "--config", str(host.path)]) == 0
    current = json.loads(state.read_text())["current"]
    assert current["sha"] == first
    assert current["verdict"] == "rollback"
    assert "build/libtiny.so" in current["artifacts"]
    capsys.readouterr()
    assert release_main(["verify", "--config", str(host.path)]) == 0
    assert release_main(["promote", stack.commit(), "--config", str(host.path)]) == 0


def test_a_record_pushed_to_origin_in_this_hosts_name_is_not_this_hosts(
    host: Host, stack: Stack, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Anyone who may push to origin can append to the notes ref every box fetches and
    merges, and every record there shows this host's id. A copy of the live release's
    record with a later time, other build hashes and tiny bench samples (a seal made up,
    or none) must not become the gate's baseline, make `verify` refuse the state, or
    enter a rebuilt state."""
    from servegate.release import bringup

    live = stack.commit()
    assert release_main(["promote", live, "--config", str(host.path), "--json"]) == 0
    genuine = json.loads(capsys.readouterr().out)["result"]["record"]
    genuine.pop("publish")  # what reached origin: shown, not written
    assert genuine["seal"] == record.seal(genuine, host_salt(host.cfg.host_root))

    attacker = tmp_path / "attacker"
    subprocess.run(["git", "clone", "-q", str(stack.origin), str(attacker)], check=True)

    def git(*args: str) -> None:
        subprocess.run(["git", "-C", str(attacker), "-c", "user.name=x", "-c", "user.email=x@x",
                        *args], check=True, capture_output=True)  # fmt: skip

    git("fetch", "-q", "origin", "+refs/notes/servegate:refs/notes/servegate")
    samples = {"cases": {"prose-16k": {"metrics": {"prefill_tps": [1.0, 1.1, 0.9, 1.0]}}}}
    forged = dict(genuine, at="2099-01-01T00:00:00.000+00:00",
                  artifacts={"build/lib.so": "0" * 64},
                  gate={"verdict": "PASS", "checks": [{"name": "bench", "verdict": "PASS",
                                                       "evidence": {"samples": samples}}]})  # fmt: skip
    for seal in (None, "f" * 64, genuine["seal"]):
        line = {k: v for k, v in forged.items() if k != "seal"}
        if seal:
            line["seal"] = seal
        git("notes", "--ref", "refs/notes/servegate", "append", "-m", json.dumps(line), live)
    git("push", "-q", "origin", "refs/notes/servegate")

    ctx = host.context()
    ctx.deployer.repo.fetch()  # what every release command does first
    baseline = bringup.live_record(ctx)
    assert baseline is not None
    assert baseline.at == genuine["at"]
    assert [r.at for r in bringup.host_released(ctx, live)] == [genuine["at"]]
    assert release_main(["verify", "--config", str(host.path)]) == 0
    (host.cfg.host_root / "state.json").write_text("{")
    assert release_main(["recover", "--rebuild-state", "--config", str(host.path)]) == 0
    assert "3 record(s) of " in capsys.readouterr().err
    state = json.loads((host.cfg.host_root / "state.json").read_text())
    assert state["current"]["artifacts"] == genuine.get("artifacts", {})
    assert release_main(["verify", "--config", str(host.path)]) == 0


def test_a_note_origin_removed_or_poisoned_does_not_take_this_hosts_records(
    host: Host, stack: Stack, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A push to origin can rewrite the notes ref: remove the live release's note (the
    host's fetch takes it as a fast-forward), or add a line whose seal is no hex at all.
    The host still has its own sealed copy of what it recorded: verify checks against
    it, a rebuilt state finds the live release, and nothing crashes."""
    from servegate.release import bringup

    live = stack.commit()
    assert release_main(["promote", live, "--config", str(host.path), "--json"]) == 0
    genuine = json.loads(capsys.readouterr().out)["result"]["record"]
    attacker = tmp_path / "attacker"
    subprocess.run(["git", "clone", "-q", str(stack.origin), str(attacker)], check=True)

    def git(*args: str) -> None:
        subprocess.run(["git", "-C", str(attacker), "-c", "user.name=x", "-c", "user.email=x@x",
                        *args], check=True, capture_output=True)  # fmt: skip

    git("fetch", "-q", "origin", "+refs/notes/servegate:refs/notes/servegate")
    git("notes", "--ref", "refs/notes/servegate", "remove", live)
    git("push", "-q", "origin", "refs/notes/servegate")  # no force needed: a new commit
    ctx = host.context()
    ctx.deployer.repo.fetch()
    assert ctx.deployer.repo.notes(live).strip() == ""  # gone from the note
    assert [r.at for r in bringup.host_released(ctx, live)] == [genuine["at"]]
    assert release_main(["verify", "--config", str(host.path)]) == 0
    assert "no release record of this host" not in capsys.readouterr().out

    poisoned = dict(genuine, seal="\u00e9", at="2099-01-01T00:00:00.000+00:00")
    poisoned.pop("publish", None)
    git("fetch", "-q", "origin", "+refs/notes/servegate:refs/notes/servegate")
    git("notes", "--ref", "refs/notes/servegate", "add", "-f", "-m", json.dumps(poisoned), live)
    git("push", "-q", "origin", "refs/notes/servegate")
    ctx.deployer.repo.fetch()
    assert "\u00e9" in ctx.deployer.repo.notes(live) or "\\u00e9" in ctx.deployer.repo.notes(live)
    assert [r.at for r in bringup.host_released(ctx, live)] == [genuine["at"]]
    assert release_main(["verify", "--config", str(host.path)]) == 0
    (host.cfg.host_root / "state.json").write_text("{")
    assert release_main(["recover", "--rebuild-state", "--config", str(host.path)]) == 0
    state = json.loads((host.cfg.host_root / "state.json").read_text())
    assert state["current"]["sha"] == live
    assert release_main(["verify", "--config", str(host.path)]) == 0


def test_a_torn_line_in_the_hosts_record_copy_costs_no_later_record(
    host: Host, stack: Stack
) -> None:
    """A crash or a full disk mid-append leaves a line without its end: the next record
    starts a line of its own instead of being glued onto it (and lost)."""
    first = stack.commit()
    assert release_main(["promote", first, "--config", str(host.path)]) == 0
    copy = host.cfg.host_root / "records.jsonl"
    with copy.open("a") as f:
        f.write('{"verdict": "released", "sha": "')  # torn
    second = stack.commit()
    assert release_main(["promote", second, "--config", str(host.path)]) == 0
    assert [r["sha"] for r in record.logged(host.cfg)] == [first, second]


def test_a_salt_others_could_read_is_refused_not_used(
    host: Host, stack: Stack, capsys: pytest.CaptureFixture[str]
) -> None:
    """The salt seals this host's records: one others can read (a copy made without
    -p, one shared by a fleet's image) could seal records in its name."""
    live = stack.commit()
    assert release_main(["promote", live, "--config", str(host.path)]) == 0
    salt = host.cfg.host_root / "salt"
    salt.chmod(0o644)
    capsys.readouterr()
    assert release_main(["verify", "--config", str(host.path)]) != 0
    err = capsys.readouterr().err
    assert "is not a private file of this user's" in err
    assert "chmod 600" in err
    salt.chmod(0o600)
    assert release_main(["verify", "--config", str(host.path)]) == 0
