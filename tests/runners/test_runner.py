"""The self-hosted runner: unit rendering, registration (GitHub's config.sh is the one
fake, at the edge: it cannot reach GitHub here), and the job hooks on real processes."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from servegate.cli import main
from servegate.errors import CommandFailed
from servegate.pipeline import proc
from servegate.runners.install import RunnerSpec, render_unit

TOKEN = "AABBCCDDEEFF0011223344556677"
CONFIG_SH = """#!/bin/sh
# stands in for the runner's config.sh, answering the way it does
echo "args: $*" > "$(dirname "$0")/config-args.txt"
# the runner takes --token from ACTIONS_RUNNER_INPUT_TOKEN when it is not an argument
[ -n "$ACTIONS_RUNNER_INPUT_TOKEN" ] || { echo "Enter runner registration token:"; exit 1; }
echo "$ACTIONS_RUNNER_INPUT_TOKEN" > "$(dirname "$0")/config-token.txt"
if [ "$FAKE_GITHUB" = expired ]; then
  echo "Http response code: NotFound from 'POST https://api.github.com/actions/runner-registration'"
  exit 1
fi
echo "Runner successfully added"
"""


@pytest.fixture
def runner_dir(tmp_path: Path) -> Path:
    d = tmp_path / "actions-runner"
    d.mkdir()
    (d / "config.sh").write_text(CONFIG_SH)
    (d / "config.sh").chmod(0o755)
    (d / "run.sh").write_text("#!/bin/sh\nexit 0\n")
    (d / "run.sh").chmod(0o755)
    return d


def install(
    runner_dir: Path, monkeypatch: pytest.MonkeyPatch, token: str | None, github: str = "ok"
) -> int:
    if token is None:
        monkeypatch.delenv("RUNNER_TOKEN", raising=False)
    else:
        monkeypatch.setenv("RUNNER_TOKEN", token)
    monkeypatch.setenv("FAKE_GITHUB", github)
    return main(
        [
            "runner",
            "install",
            "--url",
            "https://github.com/team/stack",
            "--name",
            "box1",
            "--labels",
            "self-hosted,linux,gfx1030",
            "--dir",
            str(runner_dir),
            "--no-start",
        ]
    )


def test_unit_passes_systemd_analyze(tmp_path: Path) -> None:
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze not installed")
    spec = RunnerSpec("https://github.com/team/stack", "box1", ("self-hosted",), tmp_path)
    (tmp_path / "run.sh").write_text("#!/bin/sh\n")
    (tmp_path / "run.sh").chmod(0o755)
    unit = tmp_path / spec.unit
    unit.write_text(render_unit(spec))
    out = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True)
    assert [line for line in (out.stdout + out.stderr).splitlines() if str(unit) in line] == []
    assert 'Environment="SERVEGATE_RUNNER=box1"' in unit.read_text()


def test_install_registers_ephemeral_and_writes_unit_and_hooks(
    runner_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    no_writes_to_home: Path,
) -> None:
    assert install(runner_dir, monkeypatch, TOKEN) == 0
    args = (runner_dir / "config-args.txt").read_text()
    assert "--ephemeral" in args
    assert "--labels self-hosted,linux,gfx1030" in args
    unit = no_writes_to_home / ".config/systemd/user/servegate-runner-box1.service"
    text = unit.read_text()
    assert f'ExecStart="{runner_dir}/run.sh"' in text
    assert "ACTIONS_RUNNER_HOOK_JOB_STARTED" in text
    assert (runner_dir / "servegate-job-started.sh").stat().st_mode & 0o100
    # the token reached config.sh in its environment, not on its command line (which
    # every user of the box can read); no file servegate wrote holds it
    assert TOKEN not in args
    assert (runner_dir / "config-token.txt").read_text().strip() == TOKEN
    (runner_dir / "config-args.txt").unlink()
    (runner_dir / "config-token.txt").unlink()
    for path in [*runner_dir.rglob("*"), *no_writes_to_home.rglob("*")]:
        if path.is_file():
            assert TOKEN not in path.read_text(errors="replace"), path


def test_a_dry_run_registers_writes_and_starts_nothing(
    runner_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    no_writes_to_home: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.delenv("RUNNER_TOKEN", raising=False)  # not needed to look
    before = sorted(p.name for p in runner_dir.iterdir())
    code = main(["runner", "install", "--url", "https://github.com/team/stack", "--name", "box1",
                 "--labels", "self-hosted,linux", "--dir", str(runner_dir), "--dry-run"])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0
    assert "dry run: nothing is registered, written or started" in out
    assert (f"would register: ACTIONS_RUNNER_INPUT_TOKEN=<token from the environment> "
            f"{runner_dir}/config.sh --unattended --ephemeral") in out  # fmt: skip
    assert "--token" not in out
    assert "would start: systemctl --user enable --now servegate-runner-box1.service" in out
    assert sorted(p.name for p in runner_dir.iterdir()) == before  # config.sh never ran
    assert not (no_writes_to_home / ".config/systemd/user").exists()


def test_missing_token(
    runner_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert install(runner_dir, monkeypatch, None) == 2
    assert "RUNNER_TOKEN is not set" in capsys.readouterr().err


def test_expired_token_is_named_and_never_printed(
    runner_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert install(runner_dir, monkeypatch, TOKEN, github="expired") == 6
    err = capsys.readouterr().err
    assert "wrong or expired" in err
    assert TOKEN not in err


def test_proc_redacts_secrets_in_errors() -> None:
    with pytest.raises(CommandFailed) as err:
        proc.run(["sh", "-c", f"echo using {TOKEN}; exit 1"], redact=(TOKEN,))
    assert TOKEN not in str(err.value)


@pytest.fixture
def processes() -> Iterator[dict[str, subprocess.Popen[bytes]]]:
    sleep = [sys.executable, "-c", "import time; time.sleep(120)"]
    base = {k: v for k, v in os.environ.items() if k != "SERVEGATE_RUNNER"}
    procs = {
        "stale": subprocess.Popen(
            sleep, env={**base, "SERVEGATE_RUNNER": "box1"}, start_new_session=True
        ),
        "other_runner": subprocess.Popen(
            sleep, env={**base, "SERVEGATE_RUNNER": "box2"}, start_new_session=True
        ),
        "unmarked": subprocess.Popen(sleep, env=base, start_new_session=True),
    }
    yield procs
    for p in procs.values():
        if p.poll() is None:
            p.kill()
        p.wait()


def hook(event: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k != "SERVEGATE_RUNNER"}
    return subprocess.run(
        [sys.executable, "-m", "servegate", "runner", "hook", event],
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_job_started_ends_only_this_runners_leftovers(
    processes: dict[str, subprocess.Popen[bytes]],
) -> None:
    done = hook("started", SERVEGATE_RUNNER="box1")
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"{processes['stale'].pid}" in done.stdout
    processes["stale"].wait(timeout=10)
    assert processes["other_runner"].poll() is None
    assert processes["unmarked"].poll() is None
    if shutil.which("nvidia-smi") is None and shutil.which("rocm-smi") is None:
        assert "GPU idle check skipped" in done.stdout


CGROUP_ROOTS = {"v1": Path("/sys/fs/cgroup/systemd"), "v2": Path("/sys/fs/cgroup/unified")}


def _cgroup_root(version: str) -> Path:
    """A scratch folder in a real cgroup hierarchy (v1: systemd's named one), or skip."""
    for candidate in (CGROUP_ROOTS[version], Path("/sys/fs/cgroup")):
        procs = candidate / "cgroup.procs"
        v2 = (candidate / "cgroup.controllers").exists()
        if procs.exists() and v2 == (version == "v2") and os.access(candidate, os.W_OK):
            if version == "v1" and "name=systemd" not in Path("/proc/self/cgroup").read_text():
                continue
            return candidate
    pytest.skip(f"no writable cgroup {version} hierarchy here (making a cgroup needs root)")


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_a_leftover_that_cleared_its_environment_is_ended_by_the_units_cgroup(
    version: str, processes: dict[str, subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    """A job's process that sheds the marker (``env -i``) and forks away (``setsid``,
    backgrounded) still lives in the runner unit's cgroup: the job-completed hook ends
    it. Processes outside the unit (another runner's, unmarked ones) are left alone."""
    root = _cgroup_root(version)
    scratch = root / f"servegate-test-{os.getpid()}-{version}"
    unit = scratch / "servegate-runner-box1.service"
    unit.mkdir(parents=True)
    leak = tmp_path / "leak.pid"
    runner = (
        f"echo $$ > {unit / 'cgroup.procs'}\n"
        f"env -i setsid sleep 300 > /dev/null 2>&1 & echo $! > {leak}\n"
        f"exec {sys.executable} -m servegate runner hook completed\n"
    )
    try:
        base = {k: v for k, v in os.environ.items() if k != "SERVEGATE_RUNNER"}
        done = subprocess.run(["bash", "-c", runner], env={**base, "SERVEGATE_RUNNER": "box1"},
                              capture_output=True, text=True, timeout=60)  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
        pid = int(leak.read_text())
        deadline = time.monotonic() + 10
        while proc.pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not proc.pid_alive(pid), f"the leftover {pid} is still running"
        assert "ending 2 process(es) the job left running" in done.stdout  # and 'stale'
        assert processes["other_runner"].poll() is None
        assert processes["unmarked"].poll() is None
    finally:
        for cg in (unit, scratch):
            with contextlib.suppress(OSError):
                for pid_text in (cg / "cgroup.procs").read_text().split():
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(int(pid_text), signal.SIGKILL)
            for _ in range(50):
                try:
                    cg.rmdir()
                    break
                except OSError:
                    time.sleep(0.1)


def test_job_completed_cleans_the_workspace(
    processes: dict[str, subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    workspace = tmp_path / "_work" / "stack" / "stack"
    (workspace / "build").mkdir(parents=True)
    (workspace / "build" / "lib.so").write_text("x")
    (workspace / "README.md").write_text("x")
    done = hook("completed", SERVEGATE_RUNNER="box1", GITHUB_WORKSPACE=str(workspace))
    assert done.returncode == 0, done.stdout + done.stderr
    assert workspace.is_dir()
    assert list(workspace.iterdir()) == []
    processes["stale"].wait(timeout=10)


def test_hook_outside_a_runner_is_refused() -> None:
    assert hook("started").returncode == 2


MAIN = "refs/heads/main"
RELEASE_JOB = {"GITHUB_EVENT_NAME": "workflow_dispatch", "GITHUB_REF": MAIN,
               "GITHUB_REPOSITORY": "team/stack",
               "GITHUB_WORKFLOW_REF": f"team/stack/.github/workflows/release.yml@{MAIN}"}  # fmt: skip
RELEASE_RUNNER = {"SERVEGATE_RUNNER": "box1", "SERVEGATE_RUNNER_RELEASE_REF": MAIN,
                  "SERVEGATE_RUNNER_RELEASE_REPO": "team/stack"}  # fmt: skip


@pytest.mark.parametrize(
    ("job", "why"),
    [
        # a pull request's GPU job that asked for labels the release runner also has
        ({"GITHUB_EVENT_NAME": "pull_request", "GITHUB_REF": "refs/pull/7/merge",
          "GITHUB_WORKFLOW_REF": "team/stack/.github/workflows/pull-request.yml@refs/pull/7/merge"},
         "refuses a pull_request event"),
        # runs the base branch's workflow, on the base ref: still a pull request's
        ({**RELEASE_JOB, "GITHUB_EVENT_NAME": "pull_request_target"},
         "refuses a pull_request_target event"),
        # a writer's edited release.yml dispatched from their branch
        ({**RELEASE_JOB, "GITHUB_REF": "refs/heads/mine",
          "GITHUB_WORKFLOW_REF": "team/stack/.github/workflows/release.yml@refs/heads/mine"},
         "refuses a job on refs/heads/mine"),
        # main's commit, but the workflow file from another branch
        ({**RELEASE_JOB,
          "GITHUB_WORKFLOW_REF": "team/stack/.github/workflows/release.yml@refs/heads/mine"},
         "refuses a workflow file from refs/heads/mine"),
        ({}, "refuses a job of no known event"),
        # an organisation's runner: another repository's main, with its own workflow
        ({**RELEASE_JOB, "GITHUB_REPOSITORY": "team/scratch",
          "GITHUB_WORKFLOW_REF": f"team/scratch/.github/workflows/gpu.yml@{MAIN}"},
         "refuses a job of team/scratch's workflow"),
        # this repository's job running another repository's workflow file
        ({**RELEASE_JOB, "GITHUB_WORKFLOW_REF": f"team/scratch/.github/workflows/x.yml@{MAIN}"},
         "refuses a job of team/stack's workflow team/scratch/"),
    ],
)  # fmt: skip
def test_a_release_runner_refuses_every_job_but_its_refs(job: dict[str, str], why: str) -> None:
    """The runner whose user owns the live service takes only the release ref's jobs:
    its job-start hook fails any other job before its first step runs."""
    done = hook("started", **RELEASE_RUNNER, **job)
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"runner box1 releases from team/stack {MAIN} only: it {why}" in done.stdout
    assert "GPU idle check" not in done.stdout  # refused before anything else


def test_a_release_runner_takes_its_refs_jobs_and_other_runners_take_any(tmp_path: Path) -> None:
    done = hook("started", **RELEASE_RUNNER, **RELEASE_JOB)
    assert done.returncode == 0, done.stdout + done.stderr
    # a release runner told no repository takes nothing
    unset = {**RELEASE_RUNNER, "SERVEGATE_RUNNER_RELEASE_REPO": ""}
    assert hook("started", **unset, **RELEASE_JOB).returncode == 1
    pr = {"GITHUB_EVENT_NAME": "pull_request", "GITHUB_REF": "refs/pull/7/merge"}
    assert hook("started", SERVEGATE_RUNNER="box1", **pr).returncode == 0
    spec = RunnerSpec("https://github.com/team/stack", "box1", ("serving",), tmp_path, MAIN,
                      "team/stack")  # fmt: skip
    assert f'Environment="SERVEGATE_RUNNER_RELEASE_REF={MAIN}"' in render_unit(spec)
    assert 'Environment="SERVEGATE_RUNNER_RELEASE_REPO=team/stack"' in render_unit(spec)
    install = ["runner", "install", "--release-ref", MAIN, "--dry-run", "--dir", str(tmp_path)]
    assert main([*install, "--url", "https://github.com/team/stack"]) == 0
    assert main([*install, "--url", "https://github.com/team/stack", "--release-ref", "main"]) == 2
    # an organisation's runner must be told which repository it releases
    assert main([*install, "--url", "https://github.com/team"]) == 2
    assert main([*install, "--url", "https://github.com/team", "--release-repo", "team/stack"]) == 0


def test_a_serving_runner_without_release_ref_is_warned_about(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    install = ["runner", "install", "--url", "https://github.com/team/stack", "--dry-run",
               "--dir", str(tmp_path)]  # fmt: skip
    assert main([*install, "--labels", "self-hosted,linux,gfx1030,serving"]) == 0
    assert "warning: this runner has the label `serving` but no --release-ref" in (
        capsys.readouterr().err
    )
    assert main([*install, "--labels", "self-hosted,linux,gfx1030,pr-tests"]) == 0
    assert "warning" not in capsys.readouterr().err
    assert main([*install, "--release-repo", "team/stack"]) == 2  # nothing without a ref
