"""The Ansible collection (ansible/servegate/release): built with ansible-galaxy, installed,
and its rolling playbook run by ansible-core against real sshd hosts in network
namespaces (tests/sshlab.py), each running servegate itself: a good release across four
hosts in batches, a failing canary, a failing second batch rolled back, an unreachable
host. ansible-lint, ansible-doc and the offline ansible-test sanity tests check the collection."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from servegate import config as config_mod
from servegate.cli import release_main
from servegate.engine.managers.supervisor import Supervisor
from servegate.release.state import HostState
from tests import sshlab
from tests.conftest import Host, Stack, make_stack
from tests.release.test_ssh import host_config

ROOT = Path(__file__).resolve().parents[2]
COLLECTION = ROOT / "ansible" / "ansible_collections" / "servegate" / "release"
BIN = Path(sys.executable).parent
WHY = sshlab.unavailable()


def tool(name: str) -> str:
    found = shutil.which(name, path=str(BIN))
    if found is None:
        pytest.skip(f"{name} is not installed (pip install '.[dev]')")
    return found


@pytest.fixture(scope="module")
def collections(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The collection built into a tarball and installed from it, as a user would."""
    work = tmp_path_factory.mktemp("galaxy")
    galaxy = tool("ansible-galaxy")
    subprocess.run([galaxy, "collection", "build", str(COLLECTION), "--output-path", str(work)],
                   check=True, capture_output=True, text=True)  # fmt: skip
    (tarball,) = work.glob("servegate-release-*.tar.gz")
    target = work / "collections"
    subprocess.run([galaxy, "collection", "install", "--offline", str(tarball), "-p",
                    str(target)], check=True, capture_output=True, text=True)  # fmt: skip
    assert (target / "ansible_collections/servegate/release/plugins/modules/release.py").exists()
    return target


def _ansible_env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "HOME": str(tmp_path), "ANSIBLE_LOCAL_TEMP": str(tmp_path / "tmp"),
            "ANSIBLE_COLLECTIONS_PATH": str(ROOT / "ansible"),
            "PATH": f"{BIN}:{os.environ.get('PATH', '')}"}  # fmt: skip


def test_ansible_lint_reports_nothing(tmp_path: Path) -> None:
    """ansible-lint exits 0 while it prints ``[ERROR]`` (a module whose documentation
    does not parse): what it prints counts too."""
    run = subprocess.run(
        [tool("ansible-lint"), "--offline", "--nocolor", "-q", str(COLLECTION)],
        cwd=COLLECTION, capture_output=True, text=True, timeout=600, env=_ansible_env(tmp_path),
    )  # fmt: skip
    said = run.stdout + run.stderr
    assert run.returncode == 0, said[-6000:]
    assert "[ERROR]" not in said, said[-6000:]


def test_ansible_doc_reads_the_module_documentation(tmp_path: Path) -> None:
    """``ansible-doc`` parses DOCUMENTATION, EXAMPLES and RETURN as YAML (a ``: `` in a
    description made it invalid) and shows every option."""
    run = subprocess.run(
        [tool("ansible-doc"), "--json", "servegate.release.release"],
        capture_output=True, text=True, timeout=300, env=_ansible_env(tmp_path),
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    doc = json.loads(run.stdout)["servegate.release.release"]
    assert set(doc["doc"]["options"]) == {"action", "sha", "to", "config", "servegate",
                                          "timeout", "interrupt_grace"}  # fmt: skip
    assert doc["examples"]
    assert "servegate" in doc["return"]


#: ansible-test's sanity tests that install their own requirements from the network into a
#: venv of their own: left out (the rest run offline, in the interpreter at hand)
NEEDS_NETWORK = ("ansible-doc", "validate-modules", "yamllint", "pep8", "pylint", "import",
                  "runtime-metadata", "pslint", "shellcheck")  # fmt: skip


def test_ansible_test_sanity_passes_offline(tmp_path: Path) -> None:
    """``ansible-test sanity`` on a copy of the collection (it writes tests/output),
    every test that needs no download: compile, shebang, line endings, argspec types…"""
    copy = tmp_path / "ansible_collections" / "servegate" / "release"
    shutil.copytree(COLLECTION, copy, ignore=shutil.ignore_patterns("output", "__pycache__"))
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    skips = [a for t in NEEDS_NETWORK for a in ("--skip-test", t)]
    run = subprocess.run(
        [tool("ansible-test"), "sanity", "--local", "--python", version, *skips],
        cwd=copy, capture_output=True, text=True, timeout=600, env=_ansible_env(tmp_path),
    )  # fmt: skip
    said = run.stdout + run.stderr
    assert run.returncode == 0, said[-6000:]
    assert 'Running sanity test "compile"' in said, said[-3000:]


@dataclass
class Rollout:
    """The module's lab: four hosts of one stack, and the good release's first rollout."""

    lab: sshlab.Lab
    stack: Stack
    good: str
    first: subprocess.CompletedProcess[str]


@pytest.fixture(scope="module")
def rolled_out(collections: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rollout]:
    """One lab for the module's rollouts, a good release rolled out across it once. Each
    test goes on from what the hosts serve then (every commit descends from the ones
    before, so a new release needs no reset) and puts back what it changed of the lab
    (:func:`lab`)."""
    if WHY:
        pytest.skip(f"no SSH lab here: {WHY}")
    tmp = tmp_path_factory.mktemp("ansible-lab")
    stack = make_stack(tmp)
    with sshlab.lab(tmp / "lab", 4) as the_lab:
        for h in the_lab.hosts:
            host_config(stack, h, tmp)
        try:
            good = stack.commit("ok", "good")
            yield Rollout(the_lab, stack, good, playbook(collections, the_lab, tmp, good))
        finally:
            for h in the_lab.hosts:
                Supervisor(config_mod.load(h.config, {})).shutdown_daemon()


@pytest.fixture
def lab(rolled_out: Rollout) -> Iterator[sshlab.Lab]:
    """The module's lab, as the last test left it, its hosts' configs and sshd put back
    after this one."""
    first = rolled_out.first
    if first.returncode != 0:
        pytest.fail(
            f"the good release's rollout failed: {first.stdout[-4000:]}{first.stderr[-2000:]}"
        )
    the_lab = rolled_out.lab
    configs = {h.index: h.config.read_text() for h in the_lab.hosts}
    try:
        yield the_lab
    finally:
        for h in the_lab.hosts:
            h.config.write_text(configs[h.index])
            if h.sshd is None:
                the_lab.start(h)


def inventory(
    lab: sshlab.Lab,
    tmp: Path,
    bins: dict[int, str] | None = None,
    hostvars: dict[int, str] | None = None,
) -> Path:
    lines = ["[serving]"]
    for h in lab.hosts:
        lines.append(
            f"box{h.index} ansible_host={h.address} ansible_user=root "
            f"servegate_config={h.config} "
            f"servegate_bin={(bins or {}).get(h.index, sshlab.SERVEGATE)} "
            f"{(hostvars or {}).get(h.index, '')}".rstrip()
        )
    ssh_args = (f"-o UserKnownHostsFile={lab.known_hosts} -o StrictHostKeyChecking=yes "
                "-o ConnectTimeout=3")  # fmt: skip
    lines += [
        "[serving:vars]",
        f"ansible_ssh_private_key_file={lab.client_key}",
        f"ansible_ssh_common_args='{ssh_args}'",
        f"ansible_python_interpreter={shutil.which('python3', path='/usr/bin:/bin')}",
    ]
    path = tmp / "inventory.ini"
    path.write_text("\n".join(lines) + "\n")
    return path


def playbook(
    collections: Path,
    lab: sshlab.Lab,
    tmp: Path,
    sha: str,
    bins: dict[int, str] | None = None,
    hostvars: dict[int, str] | None = None,
    extra: tuple[str, ...] = (),
) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "ANSIBLE_COLLECTIONS_PATH": str(collections),
        "ANSIBLE_SHOW_CUSTOM_STATS": "true",
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_LOCAL_TEMP": str(tmp / "ansible-local"),
        "ANSIBLE_HOME": str(tmp / "ansible-home"),
        "ANSIBLE_RETRY_FILES_ENABLED": "false",
        # the lab's sshd has no sftp subsystem: modules travel through the session's pipe
        "ANSIBLE_SSH_TRANSFER_METHOD": "piped",
    }
    run = subprocess.run(
        [tool("ansible-playbook"), "servegate.release.rolling", "-i",
         str(inventory(lab, tmp, bins, hostvars)),
         "-e", f"servegate_sha={sha}", "-e", "servegate_batch=2", *extra],
        env=env, capture_output=True, text=True, timeout=1800,
    )  # fmt: skip
    with (tmp / "ansible.log").open("a") as log:  # every run's output, for a failing test
        log.write(f"== {sha}\n{run.stdout}\n{run.stderr}\n")
    return run


def live(h: sshlab.LabHost) -> str | None:
    current = HostState.load(h.root / "state.json").current
    return current.sha if current else None


def recap(out: str) -> dict[str, dict[str, int]]:
    rows = {}
    for m in re.finditer(r"^(box\d)\s*:\s*(.*)$", out, re.MULTILINE):
        rows[m.group(1)] = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", m.group(2))}
    return rows


def stats(out: str) -> dict[str, str]:
    m = re.search(r"CUSTOM STATS: \*+\s*\n\s*RUN: (\{.*\})", out)
    assert m, out[-3000:]
    found: dict[str, str] = json.loads(m.group(1))["servegate"]
    return found


def test_a_good_release_goes_canary_first_then_in_batches(rolled_out: Rollout) -> None:
    run, good = rolled_out.first, rolled_out.good
    assert run.returncode == 0, run.stdout[-5000:] + run.stderr[-2000:]
    assert [live(h) for h in rolled_out.lab.hosts] == [good] * 4
    # the canary alone, then two batches of two: three plays' worth of batches
    assert run.stdout.count("PLAY [Canary first, then batches]") == 3
    rows = recap(run.stdout)
    assert all(rows[f"box{i}"]["changed"] == 1 for i in range(1, 5)), rows
    assert stats(run.stdout) == {f"box{i}": "released, gate PASS" for i in range(1, 5)}


def test_a_failing_canary_stops_before_any_other_host(
    collections: Path, lab: sshlab.Lab, rolled_out: Rollout, tmp_path: Path
) -> None:
    stack = rolled_out.stack
    before = [live(h) for h in lab.hosts]
    bad = stack.commit("exit", "does not start")
    run = playbook(collections, lab, tmp_path, bad)
    assert run.returncode != 0
    assert [live(h) for h in lab.hosts] == before  # the canary rolled itself back
    assert "servegate release promote exited 7" in run.stdout
    assert run.stdout.count("PLAY [Canary first, then batches]") == 1
    assert stats(run.stdout) == {"box1": "rolled_back (exit 7)"}

    # attestations required, of boxes that sign none: the canary takes the release, its
    # attestation does not verify, its batch goes back and no other box is asked
    nxt = stack.commit("ok", "next, unsigned")
    run = playbook(
        collections, lab, tmp_path, nxt, extra=("-e", "servegate_require_attestation=true")
    )
    assert run.returncode != 0
    assert [live(h) for h in lab.hosts] == before
    assert "servegate release verify exited 22" in run.stdout
    assert run.stdout.count("PLAY [Canary first, then batches]") == 1
    assert stats(run.stdout) == {"box1": "attestation not verified (exit 22)"}


def test_a_failing_second_batch_is_rolled_back_and_the_rest_untouched(
    collections: Path, lab: sshlab.Lab, rolled_out: Rollout, tmp_path: Path
) -> None:
    before = [live(h) for h in lab.hosts]
    third = lab.hosts[2]
    third.config.write_text(  # its launch now fails lint: refused before its switch
        third.config.read_text().replace(
            'TINY_SECRET_TOKEN = "hunter2"',
            'TINY_SECRET_TOKEN = "hunter2"\nPYTORCH_TUNABLEOP_ENABLED = "1"',
        )
    )
    nxt = rolled_out.stack.commit("ok", "next")
    run = playbook(collections, lab, tmp_path, nxt)
    assert run.returncode != 0
    # canary keeps the new release; box2 took it and went back with its batch; box3
    # refused it; box4 (the next batch) was never asked
    assert [live(h) for h in lab.hosts] == [nxt, *before[1:]]
    assert "servegate release promote exited 15" in run.stdout
    assert "rolled back in this batch: ['box2']" in run.stdout
    assert stats(run.stdout) == {
        "box1": "released, gate PASS",
        "box2": "released, then rolled back with its batch",
        "box3": "failed (exit 15)",
    }


def test_an_unreachable_host_stops_the_rollout_before_anything_changes(
    collections: Path, lab: sshlab.Lab, rolled_out: Rollout, tmp_path: Path
) -> None:
    before = [live(h) for h in lab.hosts]
    lab.stop(lab.hosts[3])
    nxt = rolled_out.stack.commit("ok", "next")
    run = playbook(collections, lab, tmp_path, nxt)
    assert run.returncode != 0
    assert "UNREACHABLE" in run.stdout
    assert [live(h) for h in lab.hosts] == before  # the survey stopped it
    assert "Promote the release on this host" not in run.stdout


def test_a_connection_lost_mid_promote_still_rolls_the_batch_back(
    collections: Path, lab: sshlab.Lab, rolled_out: Rollout, tmp_path: Path
) -> None:
    """box3's SSH session dies right after its promote switched and released (its sshd
    session process is killed, as a network drop would): Ansible sees it unreachable,
    which a rescue would not catch; the role still fails it into the rescue, and the
    rescue rolls back both hosts of the batch that serve the release, box3 included
    over a new connection."""
    before = [live(h) for h in lab.hosts]
    drop = tmp_path / "drop-after-promote.sh"
    drop.write_text(
        "#!/bin/bash\n"
        f'"{sshlab.SERVEGATE}" "$@"; code=$?\n'
        f'if [ "$2" = promote ] && [ ! -e {tmp_path}/dropped ]; then\n'
        f"  touch {tmp_path}/dropped; pid=$$\n"
        '  while [ "$pid" -gt 1 ]; do\n'
        "    pid=$(awk '{print $4}' /proc/$pid/stat)\n"
        '    case "$(cat /proc/$pid/comm)" in sshd*) kill -9 "$pid"; break;; esac\n'
        "  done\n"
        "fi\nexit $code\n"
    )
    drop.chmod(0o755)
    nxt = rolled_out.stack.commit("ok", "next")
    run = playbook(collections, lab, tmp_path, nxt, bins={3: str(drop)})
    assert (tmp_path / "dropped").exists()
    assert run.returncode != 0
    assert "was lost during its promote" in run.stdout
    assert [live(h) for h in lab.hosts] == [nxt, *before[1:]]
    found = stats(run.stdout)
    assert found["box3"] == "connection lost during its promote"
    assert found["box2"] == "released, then rolled back with its batch"
    assert "box4" not in found


def test_a_promote_past_its_timeout_is_recovered_by_the_rescue(
    collections: Path, lab: sshlab.Lab, rolled_out: Rollout, tmp_path: Path
) -> None:
    """The canary's promote runs past `servegate_timeout` after its switch (a long
    start-up) and servegate is killed at once (`servegate_interrupt_grace: 0`): the host
    is left half switched, the task fails as changed, and the rescue recovers it (the
    last proven release back, the attempt recorded), so no ungated release serves."""
    before = [live(h) for h in lab.hosts]
    canary = lab.hosts[0]
    canary.config.write_text(
        canary.config.read_text().replace("startup_timeout = 8", "startup_timeout = 90")
    )
    slow = rolled_out.stack.commit("slow-start", "a start-up longer than the timeout")
    run = playbook(
        collections, lab, tmp_path, slow,
        hostvars={1: "servegate_timeout=12 servegate_interrupt_grace=0"},
    )  # fmt: skip
    assert run.returncode != 0
    assert "ran past 12 s and was killed" in run.stdout
    assert run.stdout.count("PLAY [Canary first, then batches]") == 1
    assert stats(run.stdout) == {"box1": "timed out (exit 124)"}
    state = HostState.load(canary.root / "state.json")
    assert state.pending is None
    assert state.history[-1].sha == slow
    assert state.history[-1].verdict == "rolled_back"
    assert "interrupted after the switch" in state.history[-1].reason
    assert [live(h) for h in lab.hosts] == before


def test_the_module_interrupts_a_promote_past_its_timeout(stack: Stack, host: Host) -> None:
    """Past `timeout`, servegate is interrupted as Ctrl-C would: it puts the previous
    release back by itself, verified, within `interrupt_grace`; the task fails as
    changed (the role's rescue acts on a changed host). The module runs as Ansible runs
    it: its file, with its arguments in a JSON file."""
    good = stack.commit("ok", "good")
    assert release_main(["promote", good, "--config", str(host.path)]) == 0
    host.path.write_text(
        host.path.read_text().replace("startup_timeout = 8", "startup_timeout = 90")
    )
    slow = stack.commit("slow-start", "a start-up longer than the timeout")
    args = host.path.parent / "args.json"
    args.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": {
        "action": "promote", "sha": slow, "config": str(host.path),
        "servegate": str(BIN / "servegate"), "timeout": 12, "interrupt_grace": 120,
    }}))  # fmt: skip
    module = COLLECTION / "plugins" / "modules" / "release.py"
    done = subprocess.run([sys.executable, str(module), str(args)], capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    answer = json.loads(done.stdout)
    assert answer["failed"] is True
    assert answer["changed"] is True
    assert answer["exit_code"] == 124
    assert answer["verdict"] == "timed out"
    assert (
        "ran past 12 s and was interrupted (interrupted; the previous release was put back)"
        in answer["msg"]
    )
    state = HostState.load(host.cfg.host_root / "state.json")
    assert state.pending is None
    assert state.current is not None
    assert state.current.sha == good
    assert state.history[-1].verdict == "rolled_back"
    assert state.history[-1].reason == "interrupted"
    assert host.live_root() == host.release_dir(good)
