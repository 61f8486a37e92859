"""What ``config check`` can see on this box before any promote: what a first promote
would otherwise stop on, each with the exit code promote gives for the same cause.

- the port: taken by a process that is not the service → 6, as promote's preflight;
- the remote: ``git ls-remote`` answers and holds ``stack.branch`` → 11 (the fetch
  failed) or 3 (no such branch), as promote's fetch; skipped with ``--offline``;
- the build command's program: on this box's PATH, or a path in the repository → 5;
- each ``[[build.targets]]``: its compiler builds ``build.archs`` → 2 (as ``servegate
  build`` says), its tools are on the build's PATH → 5;
- the launch's program, the engine it runs and a local model: the program exists and
  is executable, the interpreter imports the engine the launch names (``vllm serve``,
  ``python -m vllm…``, ``transformers serve``), the model directory exists → 7, the
  service could not start (after a switch, a promote rolls back for it).

What lies in the release (``{release}/…``, a relative path) cannot exist before the
first checkout; those are named, not checked. Each check that runs or is skipped says
so in the result.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

from servegate import hostpaths
from servegate.config import Config
from servegate.engine import managers, ports
from servegate.engine.launch import LaunchSpec
from servegate.errors import (
    BuildFailed,
    CommandFailed,
    GitRefusal,
    PreflightFailed,
    ServegateError,
    ServiceFailed,
)
from servegate.pipeline import gitenv, proc, redact
from servegate.provenance import check as provenance

#: per engine, the module its interpreter must import, and the launches that run it
ENGINES = {"vllm": "vllm", "transformers": "transformers"}
#: seconds the engine's import may take (vLLM's pulls in torch)
IMPORT_TIMEOUT = 300.0
#: seconds ``git ls-remote`` may take
REMOTE_TIMEOUT = 60.0


def check(
    cfg: Config, spec: LaunchSpec, offline: bool, failed: list[ServegateError] | None = None
) -> list[str]:
    """Run every check; return what was checked and what was not, a line each. A check
    that fails is added to ``failed`` (in the order a promote would meet them) and the
    rest still run; without ``failed`` the first failure is raised."""
    if cfg.remote_hosts:
        hosts = ", ".join(h.address for h in cfg.remote_hosts)
        return [f"box: not checked here; the config promotes on {hosts}: run it there"]
    done: list[str] = []
    steps: list[Callable[[], list[str]]] = [
        lambda: [_port(cfg)],
        lambda: ["remote: not checked (--offline)" if offline else _remote(cfg)],
        lambda: [_build(cfg)],
        lambda: _targets(cfg),
        lambda: _launch(cfg, spec),
    ]
    for step in steps:
        try:
            done += step()
        except ServegateError as exc:
            if failed is None:
                raise
            failed.append(exc)
    return done


def _port(cfg: Config) -> str:
    port = cfg.service.port
    owners, hidden = ports.owners(port)
    try:
        pid = managers.make_manager(cfg).main_pid()
    except (ServegateError, OSError):  # no service manager up yet: nothing is ours
        pid = None
    foreign = owners - (set(provenance.descendants(pid)) if pid else set())
    if foreign or hidden:
        who = "; ".join(
            [f"pid {p}: {' '.join(redact.argv(ports.argv(p), ''))[:160]}" for p in sorted(foreign)]
            + [f"{hidden} socket(s) of a process this user cannot see"] * bool(hidden)
        )  # fmt: skip
        raise PreflightFailed(
            f"port {port} is already taken by a process that is not the service: {who}; a "
            "promote would stop at its preflight (exit 6)",
            hint="stop that process, or set service.port to a free port",
        )
    return f"port {port}: free" if not owners else f"port {port}: the service's own"


def _remote(cfg: Config) -> str:
    remote, branch = cfg.stack.remote, cfg.stack.branch
    done = gitenv.run(
        ["ls-remote", "--heads", "--", remote, f"refs/heads/{branch}"],
        timeout=REMOTE_TIMEOUT,
        env={"GIT_TERMINAL_PROMPT": "0"},
    )
    if not done.ok:
        raise CommandFailed(
            f"git ls-remote {remote} failed: {_cause(done.stderr + done.stdout)}; a promote's "
            "fetch "
            "would fail the same way (exit 11)",
            hint="check stack.remote, the network and the credentials git uses here "
            "(`--offline` skips this check)",
        )
    if f"refs/heads/{branch}" not in done.stdout:
        raise GitRefusal(
            f"{remote} has no branch {branch!r}: a promote would find nothing to release (exit 3)",
            hint="push the branch, or set stack.branch",
        )
    return f"remote: {remote} has {branch}"


def _cause(output: str) -> str:
    """git's own reason (its ``fatal:``/``error:`` lines and ssh's), not the advice it
    prints after them; the last lines where it printed none."""
    lines = [x.strip() for x in output.splitlines() if x.strip()]
    said = [x for x in lines if x.startswith(("fatal:", "error:", "ssh:", "remote:"))]
    return "; ".join((said or lines[-3:])[:6]) or "(no output)"


def _inside_release(cfg: Config, path: str) -> bool:
    current = str(hostpaths.of(cfg).current)
    return not os.path.isabs(path) or path == current or path.startswith(current + os.sep)


def _found(program: str, env_path: str) -> str | None:
    """``program`` as the service or build would run it: a path as it is, a bare name
    looked up in ``env_path`` (the launch's PATH, else servegate's)."""
    if os.sep in program:
        return program if os.path.isfile(program) and os.access(program, os.X_OK) else None
    return shutil.which(program, path=env_path or os.environ.get("PATH", ""))


def _build(cfg: Config) -> str:
    command = cfg.build.command
    if not command:
        return "build: none configured"
    program = command[0]
    if os.sep in program and not os.path.isabs(program):
        return f"build: {program} lies in the repository (checked by the first build)"
    if _found(program, cfg.build.env.get("PATH", "")) is None:
        raise BuildFailed(
            f"the build command's program {program!r} is not on this box: a promote's build "
            "would fail (exit 5)",
            hint="install it, give its full path in build.command, or set PATH in build.env",
        )
    return f"build: {program} found"


def _targets(cfg: Config) -> list[str]:
    """Each ``[[build.targets]]``: its compiler can build ``build.archs`` (else 2, as
    ``servegate build`` says) and its tools are on the build's PATH (else 5)."""
    from servegate.kernels import recipes

    env = {**os.environ, **cfg.build.env}
    out = []
    for target in cfg.build.targets:
        tools = recipes.tools(target, cfg.build.archs)
        for tool in tools:
            recipes.require_tool(tool, env)
        archs = ", ".join(cfg.build.archs) or "its default arch"
        out.append(f"build target {target.name}: {'/'.join(tools)} found, for {archs}")
    return out


def _launch(cfg: Config, spec: LaunchSpec) -> list[str]:
    out = []
    program = spec.argv[0]
    if _inside_release(cfg, program) and os.sep in program:
        return [f"launch: {program} lies in the release (checked by the first promote)"]
    found = _found(program, spec.env.get("PATH", ""))
    if found is None:
        raise ServiceFailed(
            f"the launch's program {program!r} is not on this box (or not executable): the "
            "service could not start, and a promote would roll back (exit 7)",
            hint="give the interpreter's full path (the service's venv: /opt/venvs/NAME/bin/"
            "python), or set PATH in service.env",
        )
    out.append(f"launch: {found}")
    module = ENGINES.get(spec.engine)
    python = _interpreter(found)
    if module and python and _runs_engine(spec, module):
        done = proc.run([python, "-c", f"import {module}"], timeout=IMPORT_TIMEOUT,
                        check=False, env={**os.environ, **spec.env})  # fmt: skip
        if not done.ok:
            raise ServiceFailed(
                f"{python} cannot import {module}: {proc.tail(done.output, 3)}; the service "
                "could not start, and a promote would roll back (exit 7)",
                hint=f"install {module} in that interpreter's environment, or point the "
                "launch at the environment that has it",
            )
        out.append(f"engine: {python} imports {module}")
    model = spec.args.get("model")
    if isinstance(model, str) and model.startswith(("/", "~", "./", "../")):
        where = os.path.expanduser(model)
        if _inside_release(cfg, where):
            out.append(f"model: {model} lies in the release (checked by the first promote)")
        elif not Path(where).is_dir():
            raise ServiceFailed(
                f"the model {model} is not a directory on this box: the service could not "
                "load it, and a promote would roll back (exit 7)",
                hint="download it there first (huggingface-cli download … --local-dir), or "
                "fix the --model path",
            )
        else:
            out.append(f"model: {model} found")
    return out


def _interpreter(program: str) -> str | None:
    """The Python that runs ``program``: itself, or the interpreter its ``#!`` names."""
    if os.path.basename(program).startswith("python"):
        return program
    try:
        with open(program, "rb") as handle:
            first = handle.readline(512).decode(errors="replace").strip()
    except OSError:
        return None
    if first.startswith("#!") and "python" in first:
        words = first[2:].split()
        return words[-1] if words[0].endswith("/env") and len(words) > 1 else words[0]
    return None


def _runs_engine(spec: LaunchSpec, module: str) -> bool:
    """The launch runs the engine's own entry point: ``-m MODULE…`` or its console script."""
    argv = list(spec.argv)
    if "-m" in argv[:-1] and argv[argv.index("-m") + 1].split(".")[0] == module:
        return True
    return os.path.basename(argv[0]) == module
