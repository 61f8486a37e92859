"""promote against a real supervisord and a small real server, with real git."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import git
import pytest

from servegate import config as config_mod
from servegate.cli import release_main
from servegate.engine.managers.supervisor import Supervisor
from servegate.errors import GitRefusal, LockHeld
from servegate.release.promote import promote
from servegate.release.rollback import rollback
from servegate.release.state import HostState
from tests.conftest import Host, Stack, config_text, free_port, hold_lock


def released(host: Host, stack: Stack, mode: str = "ok") -> str:
    sha = stack.commit(mode)
    outcome = promote(host.context(), sha)
    assert outcome.verdict == "released", outcome.reason
    return sha


def assert_serving(host: Host, sha: str) -> None:
    """The live server runs ``sha``'s checkout, and its provenance holds."""
    assert host.live_root() == host.release_dir(sha)
    assert release_main(["verify", "--config", str(host.path)]) == 0


def test_promote_deploys_records_and_proves(host: Host, stack: Stack) -> None:
    sha = stack.commit()
    outcome = promote(host.context(), sha)
    assert outcome.verdict == "released", outcome.reason
    assert outcome.exit_code == 0
    assert_serving(host, sha)
    # current symlink, state file, tag and note pushed to the remote
    assert (host.cfg.host_root / "current").resolve() == host.cfg.host_root / "releases" / sha
    state = HostState.load(host.cfg.host_root / "state.json")
    assert state.current is not None
    assert state.current.sha == sha
    origin = git.Repo(stack.origin)
    assert [t.name for t in origin.tags] == [outcome.tag]
    assert origin.tags[0].commit.hexsha == sha
    note = json.loads(origin.git.notes("--ref", "refs/notes/servegate", "show", sha))
    assert note["verdict"] == "released"
    assert note["sha"] == sha
    assert note["artifacts"] == {"build/libtiny.so": state.current.artifacts["build/libtiny.so"]}
    assert note["launch"]["env"]["TINY_SECRET_TOKEN"].startswith("<redacted sha256:")
    assert "hunter2" not in json.dumps(note)
    assert "hunter2" not in json.dumps(note)
    mapped = note["provenance"]["extensions"]
    assert mapped
    assert all(m["sha256"] == m["expected_sha256"] for m in mapped)
    assert {s["name"] for s in note["stages"]} >= {
        "preflight",
        "fetch",
        "build",
        "switch",
        "healthy",
        "provenance",
        "gate",
    }


def test_second_promote_then_rollback_on_demand(host: Host, stack: Stack) -> None:
    first = released(host, stack)
    second = released(host, stack)
    assert_serving(host, second)
    result = rollback(host.context(), None)
    assert result["ok"]
    assert result["sha"] == first
    assert_serving(host, first)
    state = HostState.load(host.cfg.host_root / "state.json")
    assert state.current is not None
    assert state.current.sha == first
    assert state.previous is not None
    assert state.previous.sha == second
    assert release_main(["rollback", "--to", second[:10], "--config", str(host.path)]) == 0
    assert_serving(host, second)


@pytest.mark.parametrize(
    ("mode", "code", "words"),
    [
        ("exit", 7, "fatal: refusing to start"),
        ("never-healthy", 7, "not healthy within"),
        ("crash-loop", 7, "tiny: crashed after start"),
        ("env-elsewhere", 8, "environment PYTHONPATH"),
        ("foreign-so", 8, "mapped from outside the release"),
        ("empty-answer", 9, "smoke"),
        ("graph-downgrade", 16, "Overriding to NONE"),
        ("log-gone", 16, "could not be read"),  # unread evidence is not a clean log
    ],
)
def test_failure_after_switch_rolls_back(
    host: Host, stack: Stack, mode: str, code: int, words: str, capsys: pytest.CaptureFixture[str]
) -> None:
    good = released(host, stack)
    bad = stack.commit(mode)
    assert release_main(["promote", bad, "--config", str(host.path), "--json"]) == code
    doc = json.loads(capsys.readouterr().out)
    result = doc["result"]
    assert doc["exit_code"] == code
    assert result["verdict"] == "rolled_back"
    assert words in result["reason"] + result["record"]["reason"]
    assert result["rollback"]["ok"]
    assert result["rollback"]["sha"] == good
    assert_serving(host, good)
    note = git.Repo(stack.origin).git.notes("--ref", "refs/notes/servegate", "show", bad)
    assert json.loads(note)["verdict"] == "rolled_back"
    assert all(t.commit.hexsha != bad for t in git.Repo(stack.origin).tags)
    state = HostState.load(host.cfg.host_root / "state.json")
    assert state.current is not None
    assert state.current.sha == good
    assert state.history[-1].verdict == "rolled_back"


def test_failing_build_leaves_live_service_untouched(host: Host, stack: Stack) -> None:
    good = released(host, stack)
    pid = host.context().manager.main_pid()
    bad = stack.commit("build-fail")
    assert release_main(["promote", bad, "--config", str(host.path)]) == 5
    assert host.context().manager.main_pid() == pid
    assert_serving(host, good)


def test_a_tracked_link_out_of_the_release_is_refused_before_the_switch(
    host: Host, stack: Stack, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A commit that tracks ``hook.py -> /elsewhere/x.py``: git hashes the link's text,
    never the code behind it, which can change after the release. Refused before the
    build (exit 8), the live release untouched; a link that stays inside is fine."""
    good = released(host, stack)
    pid = host.context().manager.main_pid()
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "x.py").write_text("import builtins  # monkeypatches at import\n")
    (stack.work / "hook.py").symlink_to(outside / "x.py")
    (stack.work / "inside.txt").symlink_to("mode")
    bad = stack.commit("ok", "a link out of the release")
    assert release_main(["promote", bad, "--config", str(host.path), "--json"]) == 8
    doc = json.loads(capsys.readouterr().out)
    assert f"hook.py -> {outside / 'x.py'}" in doc["error"]["message"], doc
    assert "inside.txt" not in doc["error"]["message"]
    assert host.context().manager.main_pid() == pid
    assert_serving(host, good)
    (stack.work / "hook.py").unlink()
    fine = stack.commit("ok", "the link inside stays")
    assert release_main(["promote", fine, "--config", str(host.path)]) == 0
    assert_serving(host, fine)


def test_a_huge_note_pushed_to_origin_is_not_merged(host: Host, stack: Stack) -> None:
    """Anyone who may push to origin writes its notes ref: a 2 MB note there (a record is a
    few kB) is not merged into the box's notes, which every command that reads records
    reads. The promote goes on and says so; origin's notes are left as they are."""
    first = released(host, stack)
    work = git.Repo(stack.work)
    work.git.fetch("origin", "+refs/notes/servegate:refs/notes/servegate")
    blob = stack.work.parent / "big.txt"
    blob.write_text(("x" * 1023 + "\n") * 2048)
    who = {"GIT_AUTHOR_NAME": "o", "GIT_AUTHOR_EMAIL": "o@o", "GIT_COMMITTER_NAME": "o",
           "GIT_COMMITTER_EMAIL": "o@o"}  # fmt: skip
    with work.git.custom_environment(**who):
        work.git.notes("--ref", "refs/notes/servegate", "append", "-F", str(blob), first)
    work.git.push("origin", "refs/notes/servegate:refs/notes/servegate")
    sha = stack.commit("ok", "after the big note")
    outcome = promote(host.context(), sha)
    assert outcome.verdict == "released", outcome.reason
    warned = " ".join(outcome.record.get("warnings") or [])
    assert "origin's release notes were not merged" in warned
    assert f"the note on {first[:12]} holds 2,1" in warned  # the record and the 2 MiB
    mine = git.Repo(host.cfg.host_root / "repo.git")
    assert len(mine.git.notes("--ref", "refs/notes/servegate", "show", first)) < 100_000


def test_lint_failure_stops_before_the_live_service_is_touched(
    host: Host, stack: Stack, capsys: pytest.CaptureFixture[str]
) -> None:
    good = released(host, stack)
    pid = host.context().manager.main_pid()
    text = host.path.read_text().replace(
        'TINY_SECRET_TOKEN = "hunter2"',
        'TINY_SECRET_TOKEN = "hunter2"\nPYTORCH_TUNABLEOP_ENABLED = "1"\nVLLM_RDNA_AR_MAXKB = "64"',
    )
    host.path.write_text(text)
    candidate = stack.commit("ok", "next")
    assert release_main(["promote", candidate, "--config", str(host.path), "--json"]) == 15
    doc = json.loads(capsys.readouterr().out)
    assert doc["error"]["class"] == "LintFailed"
    assert "tunableop.tuning-on" in doc["error"]["message"]
    assert host.context().manager.main_pid() == pid
    assert_serving(host, good)


def test_unknown_sha_is_refused(
    host: Host, stack: Stack, capsys: pytest.CaptureFixture[str]
) -> None:
    good = released(host, stack)
    assert release_main(["promote", "0123456789abcdef0123", "--config", str(host.path)]) == 3
    assert "does not exist" in capsys.readouterr().err
    assert release_main(["promote", "not-a-sha", "--config", str(host.path)]) == 3
    assert_serving(host, good)


def test_sha_not_on_branch_is_refused(
    host: Host, stack: Stack, capsys: pytest.CaptureFixture[str]
) -> None:
    good = released(host, stack)
    work = git.Repo(stack.work)
    work.git.switch("-c", "feature")
    other = stack.commit("ok", branch="feature")
    assert release_main(["promote", other, "--config", str(host.path)]) == 3
    assert "is not on branch 'main'" in capsys.readouterr().err
    assert_serving(host, good)


def test_non_fast_forward_needs_permission(host: Host, stack: Stack) -> None:
    first = released(host, stack)
    second = released(host, stack)
    with pytest.raises(GitRefusal, match="not a fast-forward"):
        promote(host.context(), first)
    assert_serving(host, second)
    outcome = promote(host.context(), first, allow_non_ff=True)
    assert outcome.verdict == "released"
    assert_serving(host, first)


def test_port_taken_by_another_process(
    host: Host, stack: Stack, capsys: pytest.CaptureFixture[str]
) -> None:
    good = released(host, stack)
    host.context().manager.stop()
    intruder = subprocess.Popen(
        ["python3", "-m", "http.server", "--bind", "127.0.0.1", str(host.cfg.service.port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        for _ in range(50):
            if host.context() and _listening(host.cfg.service.port):
                break
            subprocess.run(["sleep", "0.1"], check=True)
        assert release_main(["promote", stack.commit(), "--config", str(host.path)]) == 6
        assert f"pid {intruder.pid}" in capsys.readouterr().err
    finally:
        intruder.terminate()
        intruder.wait()
    assert HostState.load(host.cfg.host_root / "state.json").current.sha == good  # type: ignore[union-attr]


#: a stranger on the service's port that hides its descriptors: non-dumpable, so a
#: servegate that is not root cannot read its /proc/PID/fd (nor another user's)
STRANGER = r"""
import ctypes, http.server, socket, sys
ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)
class V6(http.server.HTTPServer):
    address_family = socket.AF_INET6
s = V6(("::1", int(sys.argv[1])), http.server.BaseHTTPRequestHandler)
print("listening", flush=True)
s.serve_forever()
"""


def _owners_as_another_user(port: int) -> tuple[list[int], int]:
    """``ports.owners`` as a servegate that is not root sees the port: in a forked child
    that, when the tests run as root, drops to nobody first."""
    from servegate.engine import ports

    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: nothing but the /proc reads, then out
        code = 1
        try:
            os.close(read)
            if os.getuid() == 0:
                os.setgroups([])
                os.setgid(65534)
                os.setuid(65534)
            pids, hidden = ports.owners(port)
            os.write(write, json.dumps([sorted(pids), hidden]).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write)
    with os.fdopen(read) as got:
        out = got.read()
    assert os.waitpid(pid, 0)[1] == 0
    pids, hidden = json.loads(out)
    return pids, hidden


def _stranger(port: int) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", STRANGER, str(port)],
                            stdout=subprocess.PIPE, text=True)  # fmt: skip
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "listening"
    return proc


def _stop(proc: subprocess.Popen[str]) -> None:
    proc.kill()
    proc.wait()
    assert proc.stdout is not None
    proc.stdout.close()


def test_a_listener_whose_descriptors_cannot_be_read_is_still_a_listener() -> None:
    from servegate.engine import ports

    port = free_port()
    stranger = _stranger(port)
    try:
        # no owner it can read, one listening socket all the same
        assert _owners_as_another_user(port) == ([], 1)
        if os.getuid() == 0:  # root reads every process's descriptors
            assert ports.owners(port) == ({stranger.pid}, 0)
    finally:
        _stop(stranger)


def test_a_hidden_listener_fails_verify_and_the_next_promote(
    host: Host, stack: Stack, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """What a servegate that is not root sees: the stranger's socket without its pid
    (the test above shows the real table read that way)."""
    from servegate.engine import ports

    good = released(host, stack)
    port = host.cfg.service.port
    stranger = _stranger(port)
    real = ports.owners

    def unreadable(p: int) -> tuple[set[int], int]:
        pids, hidden = real(p)
        return pids - {stranger.pid}, hidden + (stranger.pid in pids)

    monkeypatch.setattr(ports, "owners", unreadable)
    try:
        capsys.readouterr()
        assert release_main(["verify", "--config", str(host.path)]) == 8
        err = capsys.readouterr().err
        assert f"port {port} listener" in err
        assert "cannot read" in err
        assert release_main(["promote", stack.commit(), "--config", str(host.path)]) == 6
        assert "cannot read" in capsys.readouterr().err
    finally:
        _stop(stranger)
    assert HostState.load(host.cfg.host_root / "state.json").current.sha == good  # type: ignore[union-attr]


def test_a_service_restarted_after_its_proof_is_not_recorded_as_proven(
    host: Host, stack: Stack, capsys: pytest.CaptureFixture[str]
) -> None:
    """The release answers the smoke probe and dies; the service manager starts it again
    before the record: the process serving then was never proven, so no released
    record may carry the proof of the one before it."""
    good = released(host, stack)
    sha = stack.commit("crash-after-answer")
    capsys.readouterr()
    assert release_main(["promote", sha, "--config", str(host.path)]) == 7
    err = capsys.readouterr().err
    assert "changed after it was proven" in err
    assert_serving(host, good)
    assert HostState.load(host.cfg.host_root / "state.json").current.sha == good  # type: ignore[union-attr]


def test_a_rollback_to_a_release_that_dies_after_its_proof_is_not_recorded(
    host: Host, stack: Stack, capsys: pytest.CaptureFixture[str]
) -> None:
    """The same on the way back: the release rolled back to answers the smoke probe
    and dies, the service manager starts it again; no rollback record may say the
    process serving then was proven."""
    import hashlib
    import tempfile

    a = stack.commit("crash-after-answer")
    key = hashlib.sha256(str(Path(host.release_dir(a)).resolve()).encode()).hexdigest()[:16]
    marker = Path(tempfile.gettempdir()) / f"tiny-started-{key}"
    marker.touch()  # its promote does not crash
    try:
        assert promote(host.context(), a).verdict == "released"
        b = stack.commit()
        assert promote(host.context(), b).verdict == "released"
        marker.unlink()  # the next start of a dies after its first answer (the rb smoke)
        capsys.readouterr()
        assert release_main(["rollback", "--config", str(host.path)]) != 0
        assert "changed after it was proven" in capsys.readouterr().err
        state = HostState.load(host.cfg.host_root / "state.json")
        assert state.current is None or state.current.sha != a or state.pending
    finally:
        marker.unlink(missing_ok=True)


def _listening(port: int) -> bool:
    from servegate.engine.ports import port_in_use

    return port_in_use(port)


def test_concurrent_promote_fails_at_once(
    host: Host, stack: Stack, capsys: pytest.CaptureFixture[str]
) -> None:
    good = released(host, stack)
    sha = stack.commit()
    with hold_lock(host.cfg.host_root / "servegate.lock") as holder:
        with pytest.raises(LockHeld, match=f"pid {holder.pid}"):
            promote(host.context(), sha)
        assert release_main(["promote", sha, "--config", str(host.path)]) == 4
        err = capsys.readouterr().err
        assert "host busy" in err
        assert "release promote other" in err
    assert_serving(host, good)


def test_in_place_follows_the_seed_steps(inplace_host: Host, stack: Stack) -> None:
    host = inplace_host
    first = released(host, stack)
    assert_serving(host, first)
    second = released(host, stack)
    assert_serving(host, second)
    checkout = host.cfg.host_root / "checkout"
    assert git.Repo(checkout).head.commit.hexsha == second
    assert git.Repo(checkout).active_branch.name == "main"


def test_in_place_refuses_a_dirty_checkout(
    inplace_host: Host, stack: Stack, capsys: pytest.CaptureFixture[str]
) -> None:
    host = inplace_host
    good = released(host, stack)
    (host.cfg.host_root / "checkout" / "tiny.c").write_text("/* edited on the box */\n")
    assert release_main(["promote", stack.commit(), "--config", str(host.path)]) == 3
    err = capsys.readouterr().err
    assert "uncommitted changes" in err
    assert "tiny.c" in err
    assert host.live_root() == host.release_dir(good)  # still serving the last good release
    # and verify names the edit made on the box
    assert release_main(["verify", "--config", str(host.path)]) == 8
    assert "tracked tree clean" in capsys.readouterr().err


def test_in_place_rollback_after_failure(inplace_host: Host, stack: Stack) -> None:
    host = inplace_host
    good = released(host, stack)
    outcome = promote(host.context(), stack.commit("exit"))
    assert outcome.verdict == "rolled_back"
    assert outcome.exit_code == 7
    assert_serving(host, good)


def test_old_release_worktrees_are_pruned(host: Host, stack: Stack) -> None:
    shas = [released(host, stack) for _ in range(4)]
    kept = sorted(p.name for p in (host.cfg.host_root / "releases").iterdir())
    assert kept == sorted(shas[1:])  # keep_releases = 3
    worktrees = git.Repo(host.cfg.host_root / "repo.git").git.worktree("list")
    assert shas[0] not in worktrees
    assert_serving(host, shas[-1])


def test_build_that_changes_tracked_files_is_refused(
    host: Host, stack: Stack, capsys: pytest.CaptureFixture[str]
) -> None:
    good = released(host, stack)
    assert release_main(["promote", stack.commit("build-dirty"), "--config", str(host.path)]) == 5
    assert "the build changed tracked files: M tiny.c" in capsys.readouterr().err
    assert_serving(host, good)


def test_verify_notices_an_edit_on_the_box(
    host: Host, stack: Stack, capsys: pytest.CaptureFixture[str]
) -> None:
    sha = released(host, stack)
    (host.cfg.host_root / "releases" / sha / "tiny.c").write_text("/* hot fix */\n")
    assert release_main(["verify", "--config", str(host.path)]) == 8
    assert "tracked tree clean" in capsys.readouterr().err


def test_compile_caches_are_keyed_per_release_seeded_from_the_live_one_and_pruned(
    host: Host, stack: Stack, tmp_path: Path
) -> None:
    """Each release compiles into caches of its own key. With ``compile_cache_seed``
    they start as a copy of the live release's (the engine's own keys decide what is
    reused): the copy is the candidate's, so what it compiles never reaches the live
    release's cache, and a link in the live cache is not followed into it. Without it
    (the default) a new release's caches start empty."""
    service = dataclasses.replace(host.cfg.service, compile_cache_seed=True)
    seeding = Host(dataclasses.replace(host.cfg, service=service), host.path)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "planted.so").write_bytes(b"code from outside the caches")
    keys: list[str] = []
    caches: list[Path] = []
    shas: list[str] = []
    for i in range(5):
        sha = stack.commit("ok", f"release {i}")
        outcome = promote((seeding if i >= 2 else host).context(), sha)
        assert outcome.verdict == "released", outcome.reason
        launch = outcome.record["launch"]
        key = launch["compile_cache_key"]
        cache = Path(launch["env"]["TORCHINDUCTOR_CACHE_DIR"])
        assert cache == host.cfg.host_root / "compile-cache" / key / "inductor"
        if i >= 2:
            assert launch["compile_cache_seeded_from"] == shas[-1]
            copied = sorted(p.name for p in cache.iterdir())
            assert copied == [f"graph-{j}.bin" for j in range(1, i)]
        else:  # nothing live to seed from; then seeding off
            assert "compile_cache_seeded_from" not in launch
            assert not cache.exists()
        cache.mkdir(parents=True, exist_ok=True)  # what the engine would write there
        (cache / f"graph-{i}.bin").write_bytes(b"compiled")
        (cache / "linked").symlink_to(outside, target_is_directory=True)
        keys.append(key)
        caches.append(cache)
        shas.append(sha)
    assert len(set(keys)) == 5  # a new release never writes into another's caches
    # the live release's cache holds what it compiled, none of its successor's graphs
    assert not (caches[-2] / "graph-4.bin").exists()
    kept = {p.name for p in (host.cfg.host_root / "compile-cache").iterdir()}
    releases = {p.name for p in (host.cfg.host_root / "releases").iterdir()}
    assert len(releases) == 3  # keep_releases
    assert kept == set(keys[-3:])  # the kept releases' warm caches stay, the rest go
    assert (outside / "planted.so").exists()


def test_pruning_compile_caches_never_deletes_outside_the_host_roots_cache(
    tmp_path: Path, stack: Stack
) -> None:
    shared = tmp_path / "shared-triton"  # another host's or user's keyed caches
    victim = shared / "0123456789abcdef"
    victim.mkdir(parents=True)
    (victim / "kernel.bin").write_text("someone else's compiled kernel")
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "keep.txt").write_text("not servegate's")
    path = tmp_path / "servegate.toml"
    path.write_text(
        config_text(stack, tmp_path / "host", free_port()).replace(
            'TINY_SECRET_TOKEN = "hunter2"',
            f'TINY_SECRET_TOKEN = "hunter2"\nTRITON_CACHE_DIR = "{shared}"',
        )
    )
    host = Host(config_mod.load(path, {}), path)
    planted = host.cfg.host_root / "compile-cache" / "fedcba9876543210"
    try:
        released(host, stack)
        planted.parent.mkdir(exist_ok=True)
        planted.symlink_to(outside, target_is_directory=True)  # a link out of the root
        released(host, stack)
        assert (victim / "kernel.bin").exists()
        assert (outside / "keep.txt").exists()
    finally:
        Supervisor(host.cfg).shutdown_daemon()


def test_an_old_release_that_cannot_be_pruned_is_a_warning_never_a_failed_release(
    host: Host, stack: Stack, capsys: pytest.CaptureFixture[str]
) -> None:
    released(host, stack)
    stray = host.cfg.host_root / "releases" / "old-manual-copy"  # no worktree of servegate's
    stray.mkdir()
    b = stack.commit("ok", "b")
    assert release_main(["promote", b, "--config", str(host.path), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)["result"]
    assert result["verdict"] == "released"
    assert "could not remove old release directories" in result["record"]["warnings"][0]
    note = git.Repo(stack.origin).git.notes("--ref", "refs/notes/servegate", "show", b)
    assert json.loads(note)["warnings"] == result["record"]["warnings"]
    state = HostState.load(host.cfg.host_root / "state.json")
    assert state.current is not None
    assert state.current.sha == b
    assert state.pending is None
    assert_serving(host, b)


def test_records_that_could_not_be_pushed_are_kept_and_pushed_later(
    host: Host, stack: Stack, capsys: pytest.CaptureFixture[str]
) -> None:
    """Origin refuses the records for a while: nothing is lost, status says what waits,
    and the first run after origin accepts again pushes all of it."""
    a = released(host, stack)
    hook = stack.origin / "hooks" / "pre-receive"
    hook.write_text(
        "#!/bin/sh\nwhile read old new ref; do case $ref in refs/heads/*) ;; *)\n"
        "echo 'records are frozen today' >&2; exit 1;; esac; done\n"
    )
    hook.chmod(0o755)
    b = released(host, stack)  # released and verified; its record could not be pushed
    c = released(host, stack)  # the fetch before it merges origin's notes, never overwrites
    assert release_main(["status", "--config", str(host.path), "--json"]) == 0
    waiting = json.loads(capsys.readouterr().out)["result"]["unpushed"]
    assert "refs/notes/servegate:refs/notes/servegate" in waiting
    assert sum(r.startswith("refs/tags/") for r in waiting) == 2  # b's and c's tags
    hook.unlink()
    d = released(host, stack)
    origin = git.Repo(stack.origin)
    for sha in (a, b, c, d):
        note = origin.git.notes("--ref", "refs/notes/servegate", "show", sha)
        assert json.loads(note.strip().splitlines()[-1])["verdict"] == "released"
    assert {t.commit.hexsha for t in origin.tags} == {a, b, c, d}
    origin.close()
    assert release_main(["status", "--config", str(host.path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["result"]["unpushed"] == []


def test_unpushed_entries_are_checked_and_one_rejected_ref_holds_back_no_other(
    host: Host, stack: Stack, capsys: pytest.CaptureFixture[str]
) -> None:
    a = released(host, stack)
    repo = host.cfg.host_root / "repo.git"
    subprocess.run(["git", "-C", str(repo), "tag", "clash", a], check=True)
    other = stack.commit("ok", "other")
    subprocess.run(["git", "-C", str(stack.origin), "tag", "clash", other], check=True)
    (host.cfg.host_root / "unpushed.json").write_text(json.dumps([
        "refs/tags/clash:refs/tags/clash",  # origin rejects it: its clash points elsewhere
        "refs/tags/gone:refs/tags/gone",  # no longer here
        "--mirror", 7, "refs/heads/main:refs/heads/evil",  # never written by servegate
    ]))  # fmt: skip
    b = stack.commit("ok", "b")
    assert release_main(["promote", b, "--config", str(host.path), "--json"]) == 0
    publish = json.loads(capsys.readouterr().out)["result"]["record"]["publish"]
    assert publish["pushed"] is False
    assert "refs/tags/clash" in publish["error"]
    # the entries the run before the build found wrong: said in the record
    origin = git.Repo(stack.origin)
    note = origin.git.notes("--ref", "refs/notes/servegate", "show", b)  # pushed all the same
    warned = " ".join(json.loads(note.strip().splitlines()[-1])["warnings"])
    assert "refs/tags/gone no longer exists here" in warned
    assert "'--mirror' is not a refspec" in warned
    assert "'refs/heads/main:refs/heads/evil' is not a refspec" in warned
    assert b in {t.commit.hexsha for t in origin.tags}
    origin.close()
    kept = json.loads((host.cfg.host_root / "unpushed.json").read_text())
    assert kept == ["refs/tags/clash:refs/tags/clash"]


def test_a_rollback_that_cannot_start_never_stops_the_live_release(
    host: Host, stack: Stack, capsys: pytest.CaptureFixture[str]
) -> None:
    a = released(host, stack)
    b = released(host, stack)
    lib = Path(host.release_dir(a)) / "build" / "libtiny.so"
    built = lib.read_bytes()
    lib.write_bytes(b"not what was built")
    assert release_main(["rollback", "--config", str(host.path)]) == 6
    assert "build/libtiny.so of " in capsys.readouterr().err
    assert_serving(host, b)  # untouched
    lib.unlink()
    assert release_main(["rollback", "--config", str(host.path)]) == 6  # missing: the same
    assert_serving(host, b)
    # the artifacts are right but the checkout does not start: b is put back, verified
    lib.write_bytes(built)
    (Path(host.release_dir(a)) / "tinystack" / "server.py").write_text("raise SystemExit(3)\n")
    assert release_main(["rollback", "--config", str(host.path)]) == 7
    err = capsys.readouterr().err
    assert f"{b[:12]}, which was serving, is back and verified" in err
    assert_serving(host, b)
    state = json.loads((host.cfg.host_root / "state.json").read_text())
    assert state["current"]["sha"] == b
    assert state["pending"] is None


def test_a_failed_rollback_is_recorded_as_failed_never_as_rolled_back(
    host: Host, stack: Stack, capsys: pytest.CaptureFixture[str]
) -> None:
    a = released(host, stack, "exit-on-restart")  # it cannot start a second time
    bad = stack.commit("exit")
    assert release_main(["promote", bad, "--config", str(host.path), "--json"]) == 10
    result = json.loads(capsys.readouterr().out)["result"]
    assert result["verdict"] == "failed"
    assert result["record"]["verdict"] == "failed"
    note = git.Repo(stack.origin).git.notes("--ref", "refs/notes/servegate", "show", bad)
    assert json.loads(note)["verdict"] == "failed"
    state = HostState.load(host.cfg.host_root / "state.json")
    assert state.history[-1].verdict == "failed"
    assert "no verified release is serving" in state.history[-1].reason
    assert release_main(["status", "--config", str(host.path)]) == 10  # status is a check
    assert "NO VERIFIED RELEASE SERVING" in capsys.readouterr().out
    # what status tells users to do: fix the cause, start the recorded release again
    marker = "import tinystack.server as s; s.started_marker().unlink()"
    subprocess.run([sys.executable, "-c", marker], cwd=host.release_dir(a), check=True)
    assert release_main(["rollback", "--to", a, "--config", str(host.path)]) == 0
    assert_serving(host, a)
    assert release_main(["status", "--config", str(host.path)]) == 0
    # with a verified release serving, the same request has nothing to do
    assert release_main(["rollback", "--to", a, "--config", str(host.path)]) == 12


def test_a_recover_whose_restore_failed_is_recorded_as_failed(
    host: Host, stack: Stack, capsys: pytest.CaptureFixture[str]
) -> None:
    released(host, stack, "exit-on-restart")  # it cannot start a second time
    interrupted = stack.commit()  # a promote of it died after its switch
    path = host.cfg.host_root / "state.json"
    state = json.loads(path.read_text())
    state["pending"] = {"kind": "promote", "sha": interrupted, "pid": 1,
                        "release_dir": host.release_dir(interrupted),
                        "at": "2026-01-01T00:00:00+00:00"}  # fmt: skip
    path.write_text(json.dumps(state))
    assert release_main(["recover", "--config", str(host.path)]) == 10
    entry = HostState.load(path).history[-1]
    assert (entry.sha, entry.verdict) == (interrupted, "failed")
    note = git.Repo(stack.origin).git.notes("--ref", "refs/notes/servegate", "show", interrupted)
    assert json.loads(note.splitlines()[-1])["verdict"] == "failed"
    capsys.readouterr()
    assert release_main(["status", "--config", str(host.path)]) == 10
    assert "NO VERIFIED RELEASE SERVING" in capsys.readouterr().out


def test_status_is_a_check_that_fails_when_the_live_release_is_down(
    host: Host, stack: Stack, capsys: pytest.CaptureFixture[str]
) -> None:
    released(host, stack)
    assert release_main(["status", "--config", str(host.path)]) == 0
    host.context().manager.stop()
    capsys.readouterr()
    assert release_main(["status", "--config", str(host.path), "--json"]) == 7
    error = json.loads(capsys.readouterr().out)["error"]
    assert error["class"] == "ServiceFailed"
    assert "is not healthy" in error["message"]


@pytest.mark.parametrize(
    ("mode", "said"),
    [
        ("build-clobbers-others", "build/libtiny.so of "),
        ("build-edits-others", "tracked M tinystack/server.py"),
    ],
)
def test_a_build_that_damages_the_live_release_stops_before_the_switch(
    host: Host, stack: Stack, capsys: pytest.CaptureFixture[str], mode: str, said: str
) -> None:
    """The automatic rollback starts the live release again from its files: a build
    that deletes or edits them is stopped before the live service is touched."""
    a = released(host, stack)
    capsys.readouterr()
    bad = stack.commit(mode)
    assert release_main(["promote", bad, "--config", str(host.path)]) == 5
    err = capsys.readouterr().err
    assert f"changed the files of the live release {a[:12]}" in err
    assert said in err
    assert host.live_root() == host.release_dir(a)  # never switched
    state = json.loads((host.cfg.host_root / "state.json").read_text())
    assert state["current"]["sha"] == a
    # the live process still runs what it loaded; verify says its files changed under it
    assert release_main(["verify", "--config", str(host.path)]) == 8
    assert ("deleted on disk" if "clobbers" in mode else "M tinystack/server.py") in (
        capsys.readouterr().err
    )


def test_an_edit_the_build_hides_from_git_status_is_still_a_change(
    host: Host, stack: Stack, capsys: pytest.CaptureFixture[str]
) -> None:
    """``git update-index --skip-worktree`` makes ``git status`` blind to an edit: the
    tracked files are hashed from disk against the commit's tree, in the new release
    and in the live one."""
    a = released(host, stack)
    capsys.readouterr()
    own = stack.commit("build-skip-worktree")
    assert release_main(["promote", own, "--config", str(host.path)]) == 5
    assert "the build changed tracked files: M tinystack/__init__.py" in capsys.readouterr().err
    assert_serving(host, a)
    other = stack.commit("build-hides-in-others")
    assert release_main(["promote", other, "--config", str(host.path)]) == 5
    err = capsys.readouterr().err
    assert f"changed the files of the live release {a[:12]}" in err
    assert "tracked M tinystack/__init__.py" in err
    # verify says the same of the live release whose file was edited under it
    assert release_main(["verify", "--config", str(host.path)]) == 8
    assert "M tinystack/__init__.py" in capsys.readouterr().err


def test_a_nested_repository_the_build_leaves_is_untracked_code(
    host: Host, stack: Stack, capsys: pytest.CaptureFixture[str]
) -> None:
    a = released(host, stack)
    capsys.readouterr()
    nested = stack.commit("build-nested-repo")
    assert release_main(["promote", nested, "--config", str(host.path)]) == 8
    assert "untracked code planted/" in capsys.readouterr().err
    assert_serving(host, a)


def test_code_loaded_after_the_proof_during_the_gate_is_not_recorded_as_proven(
    host: Host, stack: Stack, capsys: pytest.CaptureFixture[str]
) -> None:
    """The release is clean while provenance reads it, and its first answer to the gate
    loads a library from outside the release into the very process that was proven
    (same pid, same start): the process the record would call proven runs foreign code
    by then, so it is not released."""
    good = released(host, stack)
    sha = stack.commit("foreign-after-answer")
    capsys.readouterr()
    assert release_main(["promote", sha, "--config", str(host.path)]) == 8
    assert "mapped from outside the release" in capsys.readouterr().err
    assert_serving(host, good)
    assert HostState.load(host.cfg.host_root / "state.json").current.sha == good  # type: ignore[union-attr]
