"""The shipped workflows: linted by actionlint and zizmor, and their gates evaluated."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
import yaml

from servegate.cli import release_main
from servegate.release.state import HostState
from tests.conftest import Host, Stack

ROOT = Path(__file__).resolve().parents[2]
TEMPLATES = resources.files("servegate.runners") / "workflows"
FILES = [
    ROOT / ".github/workflows/ci.yml",
    *(Path(str(TEMPLATES)) / n for n in ("pull-request.yml", "release.yml", "release-fleet.yml")),
]


def tool(name: str) -> str:
    found = shutil.which(name, path=str(Path(sys.executable).parent)) or shutil.which(name)
    if found is None:
        pytest.skip(f"{name} is not installed (pip install '.[dev]')")
    return found


def load(name: str) -> dict[Any, Any]:
    data: dict[Any, Any] = yaml.safe_load((Path(str(TEMPLATES)) / name).read_text())
    return data


def test_actionlint_reports_nothing() -> None:
    run = subprocess.run(
        [tool("actionlint"), *map(str, FILES)], cwd=ROOT, capture_output=True, text=True
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout == ""


def test_zizmor_reports_nothing() -> None:
    run = subprocess.run(
        [tool("zizmor"), "--offline", *map(str, FILES)], cwd=ROOT, capture_output=True, text=True
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "No findings to report" in run.stdout + run.stderr


def evaluate(expr: str, ctx: dict[str, Any]) -> bool:
    """A stand-in for GitHub's expression evaluator (there is no maintained Python one;
    actionlint checks syntax and types, not values), covering exactly what the shipped
    gates use and refusing anything else rather than guessing:

    - property paths into ``ctx`` (``github.event.pull_request.head.repo.full_name``);
    - single-quoted string literals; ``==`` between two terms (GitHub compares strings
      case-insensitively: the gates' literals are lower case, as the contexts here);
    - ``contains(list.*.field, 'x')`` (object filter + membership);
    - ``&&`` binding tighter than ``||``, as in GitHub; no parentheses, ``!``, ``!=``,
      ``<``/``>``, numbers or other functions (a ValueError says so).
    """
    bare = re.sub(r"contains\([^()]*\)", "", expr)
    if re.search(r"[()!<>]|\b\d", bare) or re.search(r"\b(?!contains)\w+\(", expr):
        raise ValueError(f"outside the evaluator's subset: {expr!r}")

    def value(term: str) -> Any:
        term = term.strip()
        if term.startswith("'"):
            return term.strip("'")
        call = re.fullmatch(r"contains\((.+?),\s*'(.+)'\)", term)
        if call:
            path, wanted = call.groups()
            base, _, field = path.partition(".*.")
            return wanted in [item[field] for item in value(base)]
        node: Any = ctx
        for part in term.split("."):  # a property that is not there is null, as in GitHub
            node = node.get(part) if isinstance(node, dict) else None
        return node

    def clause(text: str) -> bool:
        if "==" in text:
            left, right = text.split("==")
            return bool(value(left) == value(right))
        return bool(value(text))

    return any(all(clause(c) for c in alt.split("&&")) for alt in expr.split("||"))


def event(
    head_repo: str, labels: list[str], action: str = "opened", label: str = ""
) -> dict[str, Any]:
    """A pull_request event: ``action`` (opened, synchronize, labeled …), the label it
    applied (labeled only) and the labels the pull request has."""
    body: dict[str, Any] = {
        "action": action,
        "pull_request": {
            "head": {"repo": {"full_name": head_repo}},
            "labels": [{"name": n} for n in labels],
        },
    }
    if label:
        body["label"] = {"name": label}
    return {"github": {"repository": "team/stack", "event": body}}


def test_the_stand_in_refuses_what_it_does_not_cover() -> None:
    for expr in ("!github.x", "(a || b) && c", "github.n > 1", "startsWith(a, 'b')", "a != 'b'"):
        with pytest.raises(ValueError, match="outside the evaluator's subset"):
            evaluate(expr, {})


def test_gpu_job_runs_only_for_own_branches_or_the_commits_a_maintainer_labelled() -> None:
    gate = load("pull-request.yml")["jobs"]["gpu"]["if"]
    assert evaluate(gate, event("team/stack", []))
    assert evaluate(gate, event("team/stack", [], "synchronize"))
    assert not evaluate(gate, event("stranger/stack", []))
    assert not evaluate(gate, event("stranger/stack", ["needs-review"], "labeled", "needs-review"))
    # the maintainer read the change and applied the label: this push's commits run
    assert evaluate(gate, event("stranger/stack", ["safe-to-test"], "labeled", "safe-to-test"))
    # the fork pushes again: the label is still on the pull request, but nobody read the
    # new commits, so nothing runs on the GPU until the label is applied again
    assert not evaluate(gate, event("stranger/stack", ["safe-to-test"], "synchronize"))
    assert not evaluate(gate, event("stranger/stack", ["safe-to-test"], "reopened"))
    # another label applied while safe-to-test is on: not a review of new commits
    assert not evaluate(gate, event("stranger/stack", ["safe-to-test", "x"], "labeled", "x"))


def test_pull_request_workflow_is_least_privilege() -> None:
    wf = load("pull-request.yml")
    on = wf[True] if True in wf else wf["on"]  # YAML 1.1 reads the key `on` as True
    assert "pull_request_target" not in on
    assert wf["permissions"] == {}
    assert wf["concurrency"]["group"] == "pr-${{ github.event.pull_request.number }}"
    gpu = wf["jobs"]["gpu"]
    # a runner of its own: never the release runner (label serving), whose user owns the
    # live service, the host root and the deploy key
    assert gpu["runs-on"] == ["self-hosted", "linux", "gfx1030", "pr-tests"]
    for name in ("release.yml", "release-fleet.yml"):
        for job in load(name)["jobs"].values():
            if "runs-on" in job and "self-hosted" in job["runs-on"]:
                assert "serving" in job["runs-on"], (name, job["runs-on"])
    assert gpu["permissions"] == {"contents": "read"}
    assert "servegate lease" in gpu["steps"][-1]["run"]
    assert gpu["steps"][-1]["run"].endswith(" --require-gpu")  # skipped is not green
    for job in wf["jobs"].values():
        checkout = next(s for s in job["steps"] if "actions/checkout@" in s.get("uses", ""))
        assert checkout["with"]["persist-credentials"] is False
        assert re.search(r"@[0-9a-f]{40} ", checkout["uses"] + " ")


def test_release_workflow_is_manual_and_protected() -> None:
    wf = load("release.yml")
    on = wf[True] if True in wf else wf["on"]
    assert list(on) == ["workflow_dispatch"]
    assert on["workflow_dispatch"]["inputs"]["sha"]["required"] is True
    job = wf["jobs"]["promote"]
    assert job["environment"] == "production"
    assert "serving" in job["runs-on"]
    script = job["steps"][0]["run"]
    assert "${{" not in script  # inputs reach the shell through env, never by templating
    assert 'servegate summary "$result" >> "$GITHUB_STEP_SUMMARY"' in script


@pytest.mark.parametrize("configured", ["", "/etc/servegate/box.toml"])
def test_release_step_runs_promote_with_the_boxs_config(tmp_path: Path, configured: str) -> None:
    """The release step's own script, run by bash as the runner would: the box's config
    (the runner user's ~/servegate.toml, or the SERVEGATE_CONFIG variable) is passed."""
    script = load("release.yml")["jobs"]["promote"]["steps"][0]["run"]
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("release", "servegate"):  # the runner's servegate, recording its arguments
        (bin_dir / tool).write_text(f'#!/bin/sh\necho "{tool} $*" >> "$CALLS"\n')
        (bin_dir / tool).chmod(0o755)
    sha = "a" * 40
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path / "home"), "SHA": sha,
           "RUNNER_TEMP": str(tmp_path), "GITHUB_STEP_SUMMARY": str(tmp_path / "summary"),
           "CALLS": str(tmp_path / "calls"), "SERVEGATE_CONFIG": configured}  # fmt: skip
    subprocess.run(["bash", "-e", "-c", script], env=env, check=True)
    calls = (tmp_path / "calls").read_text().splitlines()
    config = configured or f"{tmp_path}/home/servegate.toml"
    assert calls[0] == f"release promote {sha} --config {config} --json"
    assert calls[1] == f"servegate summary {tmp_path}/promote.json"
    env["SHA"] = "main"
    bad = subprocess.run(["bash", "-e", "-c", script], env=env, capture_output=True, text=True)
    assert bad.returncode == 2
    assert "full 40-character" in bad.stdout


# -- the fleet workflow: its job graph under GitHub's rules --------------------------------

_TOKEN = re.compile(r"\s*(\(|\)|&&|\|\||!=|==|!|'[^']*'|[A-Za-z_][\w.\-]*\(\)|[A-Za-z_][\w.\-]*)")


def job_if(expr: str, needs: dict[str, str], ancestors: list[str], results: dict[str, str]) -> bool:
    """A job's ``if`` as GitHub evaluates it (the subset the shipped workflows use):
    ``always()``, ``success()`` (every ancestor job succeeded), ``failure()`` (one
    failed), ``cancelled()``; ``needs.<job>.result``; string literals; ``==``, ``!=``,
    ``!``, ``&&``, ``||``, parentheses. Without a status function GitHub puts
    ``success() &&`` in front; anything else is refused."""
    expr = expr.strip().removeprefix("${{").removesuffix("}}").strip()
    if not re.search(r"\b(always|success|failure|cancelled)\(\)", expr):
        expr = f"success() && ({expr})"
    tokens, pos = [], 0
    while pos < len(expr):
        m = _TOKEN.match(expr, pos)
        if not m:
            raise ValueError(f"outside the evaluator's subset: {expr[pos:]!r}")
        tokens.append(m.group(1))
        pos = m.end()
    funcs = {
        "always()": True,
        "success()": all(results[a] == "success" for a in ancestors),
        "failure()": any(results[a] == "failure" for a in ancestors),
        "cancelled()": False,
    }

    def atom(i: int) -> tuple[Any, int]:
        t = tokens[i]
        if t == "(":
            v, i = alt(i + 1)
            assert tokens[i] == ")"
            return v, i + 1
        if t == "!":
            v, i = cmp(i + 1)
            return not v, i
        if t.startswith("'"):
            return t.strip("'"), i + 1
        if t in funcs:
            return funcs[t], i + 1
        parts = t.split(".")
        if len(parts) == 3 and parts[0] == "needs" and parts[2] == "result":
            return needs[parts[1]], i + 1
        raise ValueError(f"outside the evaluator's subset: {t!r}")

    def cmp(i: int) -> tuple[Any, int]:
        v, i = atom(i)
        if i < len(tokens) and tokens[i] in ("==", "!="):
            w, j = atom(i + 1)
            return (v == w) if tokens[i] == "==" else (v != w), j
        return v, i

    def conj(i: int) -> tuple[Any, int]:
        v, i = cmp(i)
        while i < len(tokens) and tokens[i] == "&&":
            w, i = cmp(i + 1)
            v = bool(v) and bool(w)
        return v, i

    def alt(i: int) -> tuple[Any, int]:
        v, i = conj(i)
        while i < len(tokens) and tokens[i] == "||":
            w, i = conj(i + 1)
            v = bool(v) or bool(w)
        return v, i

    value, end = alt(0)
    assert end == len(tokens), expr
    return bool(value)


def run_graph(
    wf: dict[str, Any], failing: set[str], cancelled: frozenset[str] = frozenset()
) -> dict[str, str]:
    """Every job's result when the jobs in ``failing`` fail (a matrix job fails when one
    of its runs does) and those in ``cancelled`` are cancelled while they run:
    ``success``, ``failure``, ``cancelled`` or ``skipped``."""
    jobs = wf["jobs"]
    results: dict[str, str] = {}
    while len(results) < len(jobs):
        for name, job in jobs.items():
            needs = job.get("needs", [])
            needs = [needs] if isinstance(needs, str) else list(needs)
            if name in results or any(n not in results for n in needs):
                continue
            ancestors, todo = [], list(needs)
            while todo:
                a = todo.pop()
                if a not in ancestors:
                    ancestors.append(a)
                    up = jobs[a].get("needs", [])
                    todo += [up] if isinstance(up, str) else list(up)
            runs = job_if(str(job.get("if", "success()")), {n: results[n] for n in needs},
                          ancestors, results)  # fmt: skip
            ran = "cancelled" if name in cancelled else "failure" if name in failing else "success"
            results[name] = ran if runs else "skipped"
    return results


def test_the_evaluator_refuses_what_it_does_not_cover() -> None:
    for expr in ("contains(a, 'b')", "github.ref == 'x'", "needs.a.outputs.x == '1'"):
        with pytest.raises(ValueError, match="outside the evaluator's subset"):
            job_if(expr, {"a": "success"}, ["a"], {"a": "success"})


def test_fleet_release_canary_then_waves_then_rollback_on_any_failure() -> None:
    wf = load("release-fleet.yml")
    ran = run_graph(wf, set())
    assert ran == {"canary": "success", "waves": "success", "rollback": "skipped"}
    canary_failed = run_graph(wf, {"canary"})
    assert canary_failed == {"canary": "failure", "waves": "skipped", "rollback": "success"}
    wave_failed = run_graph(wf, {"waves"})
    assert wave_failed == {"canary": "success", "waves": "failure", "rollback": "success"}
    both = run_graph(wf, {"waves", "rollback"})  # a rollback that fails is a failed run
    assert both["rollback"] == "failure"
    # someone cancels the run while the canary promotes: its box may be half-switched
    cut = run_graph(wf, set(), frozenset({"canary"}))
    assert cut == {"canary": "cancelled", "waves": "skipped", "rollback": "success"}
    cut_wave = run_graph(wf, set(), frozenset({"waves"}))
    assert cut_wave["rollback"] == "success"


def test_fleet_release_jobs_run_on_each_boxs_own_runner_in_waves() -> None:
    wf = load("release-fleet.yml")
    on = wf[True] if True in wf else wf["on"]
    assert list(on) == ["workflow_dispatch"]
    assert wf["permissions"] == {}
    jobs = wf["jobs"]
    assert jobs["canary"]["environment"] == "production"  # one approval, before anything
    assert jobs["canary"]["runs-on"][-1] == "${{ vars.SERVEGATE_CANARY }}"
    waves = jobs["waves"]
    assert waves["needs"] == "canary"
    assert waves["runs-on"][-1] == "${{ matrix.host }}"
    assert waves["strategy"]["fail-fast"] is True  # the first failure stops the rest
    assert waves["strategy"]["max-parallel"] == "${{ fromJSON(vars.SERVEGATE_WAVE) }}"
    back = jobs["rollback"]
    assert back["strategy"]["fail-fast"] is False  # every box is rolled back
    assert back["strategy"]["matrix"]["include"] == [{"host": "${{ vars.SERVEGATE_CANARY }}"}]
    for job in jobs.values():
        assert job["permissions"] == {}
        assert "${{" not in job["steps"][0]["run"]  # inputs reach the shell through env
    assert jobs["canary"]["steps"][0]["run"] == waves["steps"][0]["run"]


NEW, OLD = "a" * 40, "b" * 40


def rollback_step(
    tmp_path: Path, answers: list[tuple[int, dict[str, Any]]], touched: bool = True
) -> tuple[list[str], str]:
    """The rollback step's own script, run by bash against a stand-in ``release`` that
    answers ``status`` from ``answers`` in turn (exit code, JSON result)."""
    script = load("release-fleet.yml")["jobs"]["rollback"]["steps"][0]["run"]
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for i, (code, result) in enumerate(answers):
        (bin_dir / f"status{i}.json").write_text(json.dumps({"result": result}))
        (bin_dir / f"status{i}.code").write_text(str(code))
    (bin_dir / "release").write_text(
        '#!/bin/bash\necho "release $*" >> "$CALLS"\n'
        'if [ "$1" = status ]; then\n'
        f"  n=$(cat {bin_dir}/n 2>/dev/null || echo 0); echo $((n+1)) > {bin_dir}/n\n"
        f"  [ -f {bin_dir}/status$n.json ] || n=$((n-1))\n"
        f"  cat {bin_dir}/status$n.json; exit $(cat {bin_dir}/status$n.code)\n"
        "fi\nexit 0\n"
    )
    (bin_dir / "servegate").write_text('#!/bin/sh\necho "servegate $*" >> "$CALLS"\n')
    for f in (bin_dir / "release", bin_dir / "servegate"):
        f.chmod(0o755)
    marks = tmp_path / "state" / "servegate" / "runs"
    if touched:
        marks.mkdir(parents=True)
        (marks / "4242").write_text(NEW)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path), "SHA": NEW,
           "RUNNER_TEMP": str(tmp_path), "GITHUB_STEP_SUMMARY": str(tmp_path / "summary"),
           "CALLS": str(tmp_path / "calls"), "SERVEGATE_CONFIG": "", "GITHUB_RUN_ID": "4242",
           "XDG_STATE_HOME": str(tmp_path / "state")}  # fmt: skip
    subprocess.run(["bash", "-e", "-c", script], env=env, check=True)
    assert not (marks / "4242").exists()  # the mark is spent
    calls = (tmp_path / "calls").read_text().splitlines() if (tmp_path / "calls").exists() else []
    return calls, (tmp_path / "summary").read_text()


@pytest.mark.parametrize(("live", "rolled"), [(NEW, True), (OLD, False), ("", False)])
def test_fleet_rollback_step_rolls_back_only_a_box_serving_the_new_sha(
    tmp_path: Path, live: str, rolled: bool
) -> None:
    calls, summary = rollback_step(
        tmp_path, [(0, {"current": {"sha": live} if live else None, "pending": None})]
    )
    config = f"{tmp_path}/servegate.toml"
    assert calls[0] == f"release status --config {config} --json"
    assert (f"release rollback --config {config} --json" in calls) is rolled
    assert "release recover" not in " ".join(calls)
    if not rolled:
        assert "nothing to roll back" in summary


def test_fleet_rollback_step_leaves_a_box_this_run_never_touched(tmp_path: Path) -> None:
    """A box that already served the SHA before this run (its job never started) is not
    this run's to roll back."""
    calls, summary = rollback_step(
        tmp_path, [(0, {"current": {"sha": NEW}, "pending": None})], touched=False
    )
    assert calls == []
    assert "this run did not touch this box" in summary


def test_fleet_rollback_step_recovers_a_promote_cut_off_after_its_switch(
    tmp_path: Path,
) -> None:
    """A cancelled job interrupted the promote after its switch: status exits 7 with the
    old release as current and the new one pending. The step recovers first (the last
    proven release back), and then has nothing left to roll back."""
    cut = {"current": {"sha": OLD}, "pending": {"sha": NEW, "kind": "promote"}}
    calls, summary = rollback_step(tmp_path, [(7, cut), (0, {"current": {"sha": OLD}})])
    config = f"{tmp_path}/servegate.toml"
    assert calls == [
        f"release status --config {config} --json",
        f"release recover --wait 120 --config {config} --json",
        f"servegate summary {tmp_path}/recover.json",
        f"release status --config {config} --json",
    ]
    assert "nothing to roll back" in summary


def test_fleet_run_leaves_a_box_that_served_the_sha_before_it(
    tmp_path: Path, stack: Stack, host: Host
) -> None:
    """The box served the SHA before this run; its wave job promotes it again (a promote
    of the live SHA re-gates it), another box fails, and the rollback job runs here: the
    box keeps the SHA, not the older release it served before that. Both steps are the
    workflow's own scripts, run by bash with the real servegate."""
    older = stack.commit("ok", "older")
    assert release_main(["promote", older, "--config", str(host.path)]) == 0
    sha = stack.commit("ok", "served before the run")
    assert release_main(["promote", sha, "--config", str(host.path)]) == 0
    jobs = load("release-fleet.yml")["jobs"]
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "SHA": sha,
           "GITHUB_RUN_ID": "4242", "RUNNER_TEMP": str(tmp_path),
           "GITHUB_STEP_SUMMARY": str(tmp_path / "summary"), "SERVEGATE_CONFIG": str(host.path),
           "XDG_STATE_HOME": str(tmp_path / "state")}  # fmt: skip
    for job in ("waves", "rollback"):
        script = jobs[job]["steps"][0]["run"]
        done = subprocess.run(["bash", "-e", "-c", script], env=env, capture_output=True, text=True)
        assert done.returncode == 0, f"{job}: {done.stdout[-2000:]}{done.stderr[-2000:]}"
    current = HostState.load(host.cfg.host_root / "state.json").current
    assert current is not None
    assert current.sha == sha
    assert sha in host.live_root()
    assert f"this box served {sha} before this run" in (tmp_path / "summary").read_text()


def _pending(host: Host) -> bool:
    path = host.cfg.host_root / "state.json"
    try:
        return bool(json.loads(path.read_text()).get("pending"))
    except (OSError, ValueError):
        return False


@pytest.mark.parametrize("kill_after", [10.0, 0.5], ids=["as-the-runner", "tree-killed-at-once"])
def test_a_cancelled_release_run_leaves_the_previous_release_serving(
    tmp_path: Path, stack: Stack, host: Host, kill_after: float
) -> None:
    """The release workflow cancelled after the switch, as GitHub's runner cancels a step:
    SIGINT to the step's shell alone, SIGTERM 7.5 s later, the process tree killed 2.5 s
    after that; then the job's ``if: cancelled()`` step. The shell hands servegate the
    cancel (an in-process rollback); whatever the kill cut short, the recover step
    finishes: the previous release serves, verified. Both steps are the workflow's own
    scripts, run by bash with the real servegate."""
    good = stack.commit("ok", "good")
    assert release_main(["promote", good, "--config", str(host.path)]) == 0
    slow = stack.commit("slow-start", "slow to start")
    steps = load("release.yml")["jobs"]["promote"]["steps"]
    assert steps[1]["if"] == "cancelled()"
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "SHA": slow,
           "RUNNER_TEMP": str(tmp_path), "GITHUB_STEP_SUMMARY": str(tmp_path / "summary"),
           "SERVEGATE_CONFIG": str(host.path)}  # fmt: skip
    shell = subprocess.Popen(["bash", "-e", "-c", steps[0]["run"]], env=env,
                             start_new_session=True, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)  # fmt: skip
    deadline = time.monotonic() + 120
    while not _pending(host) and shell.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _pending(host), "the promote never reached its switch"
    time.sleep(0.5)
    shell.send_signal(signal.SIGINT)  # the shell alone, not its process group
    ended_by_itself = False
    for sig, wait in ((signal.SIGTERM, min(7.5, kill_after)), (signal.SIGKILL, 2.5)):
        try:
            shell.wait(wait)
            ended_by_itself = True
            break
        except subprocess.TimeoutExpired:
            if sig == signal.SIGKILL or kill_after < 7.5:
                os.killpg(shell.pid, signal.SIGKILL)  # the runner kills the process tree
                shell.wait(10)
                break
            shell.send_signal(sig)
    if ended_by_itself:  # servegate got the cancel and put the good release back itself
        assert shell.returncode == 130
        result = json.loads((tmp_path / "promote.json").read_text())["result"]
        assert (result["verdict"], result["reason"]) == ("rolled_back", "interrupted")
    recover = subprocess.run(["bash", "-e", "-c", steps[1]["run"]], env=env,
                             capture_output=True, text=True, timeout=300)  # fmt: skip
    assert recover.returncode == 0, recover.stdout[-2000:] + recover.stderr[-2000:]
    assert release_main(["verify", "--config", str(host.path)]) == 0
    state = HostState.load(host.cfg.host_root / "state.json")
    assert state.current is not None
    assert state.current.sha == good
    assert state.pending is None
    assert state.history[-1].sha == slow
    assert state.history[-1].verdict == "rolled_back"
