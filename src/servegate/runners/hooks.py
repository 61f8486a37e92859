"""Job hooks of the self-hosted runner (ACTIONS_RUNNER_HOOK_JOB_STARTED/COMPLETED).

Every process a job starts inherits ``SERVEGATE_RUNNER=<runner name>`` from the runner's
unit, and lives in that unit's cgroup. Whatever still carries this runner's marker, or
shares the runner unit's cgroup, and is not the running job's own chain was left behind
by an earlier job — a stray vLLM holding the GPUs, or a process that cleared its
environment (``env -i``) to shed the marker and double-forked away from the job: a
cgroup is kept across fork, setsid and exec — and is ended. Other runners' processes
and unmarked processes outside the unit are never touched (no name matching). The
cgroup is used only when this hook runs in a unit servegate wrote
(``servegate-runner[-manager]-<name>.service``), never elsewhere, where it would be the
session or the whole box.

Not caught: a process the job has the user's own systemd start (``systemd-run
--user``), or moves into another cgroup of the user's delegated subtree. It carries
neither mark; the GPU check before the next job still refuses to start while it holds a
GPU, and a pull request's runner user that owns nothing else (docs/box-setup.md) keeps
what it could do small.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import stat
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from servegate import config as config_mod
from servegate.errors import ConfigError
from servegate.gpu import health
from servegate.pipeline import proc
from servegate.pipeline.lease import state_dir

MARKER = "SERVEGATE_RUNNER"
#: set on a runner that releases (``runner install/serve --release-ref refs/heads/main``):
#: it takes only jobs of that ref whose workflow file comes from that ref
RELEASE_REF = "SERVEGATE_RUNNER_RELEASE_REF"
#: and of this repository (``owner/repo``): an organisation's runner serves all of them
RELEASE_REPO = "SERVEGATE_RUNNER_RELEASE_REPO"


def refused(environ: Mapping[str, str]) -> str:
    """Why a release runner refuses the job it was given ("": it takes it, or it is no
    release runner). The runner's user owns the live service, the host root, the deploy
    key and the runner's token: a pull request's code (its event, its merge ref) or a
    workflow file from another branch (a writer's edited ``release.yml`` dispatched from
    their branch, without the production approval) must not run there. GitHub sends a
    job to any runner with all the labels it asks for, so labels alone cannot keep them
    out; this check runs before the job's first step, and a job-start hook that fails
    fails the job."""
    ref = environ.get(RELEASE_REF, "")
    if not ref:
        return ""
    event = environ.get("GITHUB_EVENT_NAME", "")
    job_ref = environ.get("GITHUB_REF", "")
    workflow = environ.get("GITHUB_WORKFLOW_REF", "")
    repo = environ.get(RELEASE_REPO, "").lower()
    job_repo = environ.get("GITHUB_REPOSITORY", "")
    if not event or event.startswith("pull_request") or event == "merge_group":
        return f"a {event or 'job of no known'} event"
    if not repo or job_repo.lower() != repo or not workflow.lower().startswith(repo + "/"):
        return f"a job of {job_repo or 'no repository'}'s workflow {workflow or '?'}"
    if job_ref != ref:
        return f"a job on {job_ref or 'no ref'}"
    if not workflow.endswith("@" + ref):
        return f"a workflow file from {workflow.rpartition('@')[2] or 'no ref'}"
    return ""


SCRIPT = """#!/bin/sh
# servegate job hook ({event}), run by the Actions runner (ACTIONS_RUNNER_HOOK_JOB_*)
exec {python} -m servegate runner hook {event}
"""


def script_path(directory: Path, event: str) -> Path:
    return directory / f"servegate-job-{event}.sh"


def write_script(directory: Path, event: str) -> Path:
    """The runner's hook script for ``event`` (``servegate runner hook EVENT`` with this
    Python), written where the runner is unpacked."""
    path = script_path(directory, event)
    path.write_text(SCRIPT.format(event=event, python=sys.executable))
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP)
    return path


def _environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    return dict(p.decode(errors="replace").split("=", 1) for p in raw.split(b"\0") if b"=" in p)


def marked(name: str) -> list[int]:
    return sorted(
        int(p) for p in os.listdir("/proc") if p.isdigit() and _environ(int(p)).get(MARKER) == name
    )


def _cgroups(pid: int | str) -> dict[str, str]:
    """``/proc/PID/cgroup`` as hierarchy → path (``0`` is cgroup v2's, ``name=systemd``
    the v1 hierarchy systemd keeps its units in)."""
    try:
        text = Path(f"/proc/{pid}/cgroup").read_text()
    except OSError:
        return {}
    found = {}
    for line in text.splitlines():
        number, controllers, path = [*line.split(":", 2), "", ""][:3]
        found["0" if number == "0" else controllers] = path
    return found


def runner_unit_cgroup(name: str) -> tuple[str, str] | None:
    """(hierarchy, path) of this process's cgroup when it is the unit of runner
    ``name`` that servegate wrote; None anywhere else."""
    units = {f"servegate-runner-{name}.service", f"servegate-runner-manager-{name}.service"}
    mine = _cgroups("self")
    for hierarchy in ("0", "name=systemd"):
        path = mine.get(hierarchy, "")
        if units & set(path.split("/")):
            return hierarchy, path
    return None


def in_cgroup(hierarchy: str, path: str) -> list[int]:
    """Every process whose cgroup in ``hierarchy`` is ``path`` or under it."""
    return sorted(
        int(p)
        for p in os.listdir("/proc")
        if p.isdigit()
        and (
            (theirs := _cgroups(p).get(hierarchy)) == path
            or (theirs or "").startswith(path.rstrip("/") + "/")
        )
    )


def leftovers(name: str) -> list[int]:
    """This runner's processes that are not the current job's own chain: those that
    carry its marker, and those in its unit's cgroup."""
    own = proc.lineage(os.getpid())
    unit = runner_unit_cgroup(name)
    found = set(marked(name)) | set(in_cgroup(*unit) if unit else ())
    return sorted(pid for pid in found if pid not in own)


def end(pids: list[int], grace: float = 5.0) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        alive = [p for p in pids if proc.pid_alive(p)]
        for pid in alive:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + grace
        while any(proc.pid_alive(p) for p in alive) and time.monotonic() < deadline:
            time.sleep(0.1)


def gpu_users() -> tuple[str, list[str]]:
    """(tool used, processes on the GPUs); ("", []) when no GPU tool is installed."""
    if shutil.which("nvidia-smi"):
        out = proc.run(
            ["nvidia-smi", "--query-compute-apps=pid,process_name", "--format=csv,noheader"],
            check=False,
            timeout=60,
        )
        return "nvidia-smi", [line.strip() for line in out.output.splitlines() if line.strip()]
    if shutil.which("rocm-smi"):
        out = proc.run(["rocm-smi", "--showpids"], check=False, timeout=60)
        rows = [
            line.strip()
            for line in out.output.splitlines()
            if line.strip() and line.split()[0].isdigit()
        ]
        return "rocm-smi", rows
    return "", []


def _name(environ: Mapping[str, str]) -> str:
    name = environ.get(MARKER, "")
    if not name:
        raise ConfigError(
            f"{MARKER} is not set: this hook runs inside a servegate runner",
            hint="install the runner with `servegate runner install`",
        )
    return name


#: the environment variable naming the stack config whose [gpu] the checks read
CONFIG = "SERVEGATE_CONFIG"


def offline_path(environ: Mapping[str, str], name: str) -> Path:
    """The mark of a runner that took itself offline (its GPUs failed a check)."""
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}", name):
        raise ConfigError(
            f"runner name {name[:100]!r}: give letters, digits and . _ - only",
            hint="a runner's name is a file name in the state directory",
        )
    return state_dir(environ) / "runners" / f"{name}.offline.json"


def offline(environ: Mapping[str, str], name: str) -> dict[str, object] | None:
    """Why the runner is offline, or None; a mark that cannot be read still counts."""
    path = offline_path(environ, name)
    if not os.path.lexists(path):  # a dangling link is a mark too
        return None
    try:
        doc = json.loads(path.read_text())
        return dict(doc) if isinstance(doc, dict) else {"why": "an unreadable mark"}
    except (OSError, ValueError):
        return {"why": f"an unreadable mark ({path})"}


def take_offline(environ: Mapping[str, str], name: str, snap: health.Snapshot) -> Path:
    path = offline_path(environ, name)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    path.write_text(json.dumps({"at": snap.at, "why": snap.summary(), "health": snap.as_dict()}))
    return path


def gpu_check(environ: Mapping[str, str]) -> health.Snapshot:
    """The GPU health before or after a job: idle GPUs, and what the stack config named by
    ``SERVEGATE_CONFIG`` expects (its defaults without one)."""
    where = environ.get(CONFIG, "")
    cfg = config_mod.load(Path(where), environ) if where and Path(where).exists() else None
    last = health.last_check_file(environ)
    return health.check(health.expect_of(cfg, busy_ok=False), last=last)


def job_started(environ: Mapping[str, str], admission: bool = True) -> int:
    """The checks before a job: a runner that took itself offline takes none; a release
    runner takes only its ref's jobs (:func:`refused`; ``admission=False`` before a runner
    has a job to look at), what earlier jobs left is ended, and the GPUs must be healthy
    and idle."""
    name = _name(environ)
    down = offline(environ, name)
    if down is not None:
        print(
            f"servegate: runner {name} is offline since {down.get('at', '?')}: "
            f"{down.get('why', '?')}. Fix the GPUs, then `servegate runner online {name}` "
            "(it checks them again) brings it back",
            flush=True,
        )
        return 1
    why = refused(environ) if admission else ""
    if why:
        print(
            f"servegate: runner {name} releases from {environ.get(RELEASE_REPO, '?')} "
            f"{environ[RELEASE_REF]} only: it refuses "
            f"{why} (workflow {environ.get('GITHUB_WORKFLOW_REF', '?')}, event "
            f"{environ.get('GITHUB_EVENT_NAME', '?')}); pull requests' GPU jobs go to a "
            "runner of their own (docs/box-setup.md)",
            flush=True,
        )
        return 1
    stale = leftovers(name)
    if stale:
        print(
            f"servegate: ending {len(stale)} process(es) an earlier job of runner {name} "
            f"left: {', '.join(f'{p} ({proc_cmd(p)})' for p in stale)}",
            flush=True,
        )
        end(stale)
    if health.any_tool():
        snap = gpu_check(environ)
        if not snap.healthy:
            print(f"servegate: runner {name} refuses the job: the GPUs are not healthy", flush=True)
            for finding in snap.findings:
                print(f"servegate:   {finding.line()}", flush=True)
            return 1
        print(f"servegate: GPUs {snap.summary()}", flush=True)
        return 0
    tool, users = gpu_users()
    if not tool:
        print("servegate: no nvidia-smi or rocm-smi here: GPU idle check skipped", flush=True)
    elif users:
        print(f"servegate: the GPUs are not idle ({tool}): {'; '.join(users)}", flush=True)
        return 1
    return 0


def job_completed(environ: Mapping[str, str]) -> int:
    name = _name(environ)
    stale = leftovers(name)
    if stale:
        print(f"servegate: ending {len(stale)} process(es) the job left running", flush=True)
        end(stale)  # a lease holder among them frees the lease as it dies
    workspace = environ.get("GITHUB_WORKSPACE")
    if workspace and Path(workspace).is_dir():
        for entry in Path(workspace).iterdir():
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)
        print(f"servegate: cleaned {workspace}", flush=True)
    if health.any_tool():
        snap = gpu_check(environ)
        if not snap.healthy:
            mark = take_offline(environ, name, snap)
            print(
                f"servegate: runner {name} takes itself offline: the GPUs are not healthy "
                "after the job (its results may come from a sick GPU):",
                flush=True,
            )
            for finding in snap.findings:
                print(f"servegate:   {finding.line()}", flush=True)
            print(
                f"servegate: it refuses every job until `servegate runner online {name}` "
                f"finds the GPUs healthy again (mark: {mark})",
                flush=True,
            )
            return 1
    return 0


def proc_cmd(pid: int) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return "?"
    return " ".join(p.decode(errors="replace") for p in raw.split(b"\0") if p)[:80]
