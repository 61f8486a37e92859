"""``servegate init``: a working ``servegate.toml`` for the stack checkout it runs in.

It writes, in the checkout (never over an existing file without ``--force``):

- ``servegate.toml``: the stack (its ``origin`` and branch), a host root, the service
  (supervisord, the port, the launch), provenance of the stack's own packages, the
  build, and a gate that lets the first release in on validity
  (``gate.no_baseline = "first-release"``);
- with ``--from-command SCRIPT``: ``launch.toml``, a launch profile converted from the
  team's shell launch script (:mod:`servegate.engine.shellimport`);
- a ``.gitignore`` entry for the build output (so ``servegate focus`` does not select
  every test after a build);
- ``noxfile.py`` with the sessions the pull-request workflow runs, if there is none;

then checks the config as ``config check`` would and prints the next three commands.
"""

from __future__ import annotations

import argparse
import re
import shlex
import shutil
import tempfile
from pathlib import Path
from typing import Any

from servegate import config as config_mod
from servegate import hostpaths
from servegate.commands import args as common_args
from servegate.engine import lint as lint_mod
from servegate.engine import shellimport
from servegate.engine.launch import launch_spec
from servegate.engine.lint import ruleset
from servegate.errors import ConfigError, PreflightFailed
from servegate.output import Output
from servegate.pipeline import gitenv
from servegate.release.gate import build_checks

NOXFILE = '''"""The sessions servegate's pull-request workflow runs (servegate init wrote this).

    nox -s lint mypy tests             # CPU checks, on hosted runners
    nox -s build gpu_tests -- --base origin/main --require-gpu   # the serving box, its lease
"""

import nox

nox.options.default_venv_backend = "venv"
PACKAGES = {packages!r}


@nox.session
def lint(session: nox.Session) -> None:
    session.install("ruff")
    session.run("ruff", "check", *PACKAGES)


@nox.session
def mypy(session: nox.Session) -> None:
    session.install("mypy")
    session.run("mypy", "--ignore-missing-imports", *PACKAGES)


@nox.session
def tests(session: nox.Session) -> None:
    session.install("pytest")
    session.run("pytest", "-m", "not gpu", *session.posargs, success_codes=[0, 5])


@nox.session(python=False)
def build(session: nox.Session) -> None:
    session.run("servegate", "build", "--config", "servegate.toml", external=True)


@nox.session(python=False)
def gpu_tests(session: nox.Session) -> None:
    session.run(
        "servegate", "focus", "--run", "--config", "servegate.toml", *session.posargs,
        external=True,
    )
'''


def _git(checkout: Path, *args: str) -> str:
    done = gitenv.run(["-C", str(checkout), *args])
    return done.stdout.strip() if done.ok else ""


def _packages(checkout: Path) -> list[str]:
    """The stack's own top-level Python packages (tracked ``*/__init__.py``)."""
    tracked = _git(checkout, "ls-files", "*/__init__.py").splitlines()
    found = []
    for path in tracked:
        parts = Path(path).parts
        if len(parts) == 2 and not parts[0].startswith((".", "test")):
            found.append(parts[0])
        elif len(parts) == 3 and parts[0] == "src":
            found.append(parts[1])
    return sorted(set(found))


def _toml(value: Any) -> str:
    return shellimport.toml_value(value)


def _config_text(
    checkout: Path,
    remote: str,
    branch: str,
    host_root: Path,
    unit: str,
    port: int,
    launch: dict[str, Any],
    packages: list[str],
    build: list[str],
    artifacts: list[str],
    checks: list[str],
    tiers: list[str],
) -> str:
    lines = [
        "# servegate config of this stack (docs/config.md); written by `servegate init`.",
        "[stack]",
        f"remote = {_toml(remote)}",
        f"branch = {_toml(branch)}",
        "",
        "[host]",
        "# releases, logs, records and the lock live here (mode 0700, this user's)",
        f"root = {_toml(str(host_root))}",
        "",
        "[service]",
        'manager = "supervisor"  # or "systemd-user" (docs/box-setup.md)',
        f"unit = {_toml(unit)}",
        f"port = {port}",
        "startup_timeout = 900",
    ]
    if "profile" in launch:
        lines.append(f"profile = {_toml(launch['profile'])}  # `servegate render` shows it")
        if launch["params"]:
            lines += ["", "[service.params]"]
            key = shellimport.toml_key
            lines += [f"{key(k)} = {_toml(v)}" for k, v in launch["params"].items()]
    else:
        lines.append(f"command = {_toml(launch['command'])}")
        if launch.get("env"):
            lines += ["", "[service.env]"]
            lines += [f"{shellimport.toml_key(k)} = {_toml(v)}" for k, v in launch["env"].items()]
    lines += ["", "[provenance]"]
    lines.append(f"modules = {_toml(packages)}")
    if artifacts:
        lines.append(f"extensions = {_toml([a for a in artifacts if a.endswith('.so')])}")
    lines.append("")
    if build:
        lines += ["[build]", f"command = {_toml(build)}", f"artifacts = {_toml(artifacts)}",
                  "timeout = 3600", ""]  # fmt: skip
    else:
        lines += [
            "# [build]",
            '# command = ["bash", "build.sh"]  # builds the GPU extensions',
            '# artifacts = ["build/*.so"]  # hashed, and proven mapped live',
            "",
        ]
    lines += [
        "[bench]",
        f"tiers = {_toml(tiers)}",
        "",
        "[gate]",
        f"checks = {_toml(checks)}",
        "# the first release has nothing to compare with: it passes on validity alone",
        'no_baseline = "first-release"',
        "",
    ]
    return "\n".join(lines)


def _write(path: Path, text: str, force: bool, written: list[str], dry: bool = False) -> None:
    if path.exists() and not force:
        raise ConfigError(
            f"{path} exists: servegate init does not write over it",
            hint="move it away, or pass --force to replace it",
        )
    if dry:
        return
    path.write_text(text)
    written.append(str(path))


def _ignore_build_output(checkout: Path, artifacts: list[str], written: list[str]) -> str:
    tops = sorted({a.split("/", 1)[0] + "/" for a in artifacts if "/" in a}) or ["build/"]
    missing = [
        t
        for t in tops
        if not gitenv.run(["-C", str(checkout), "check-ignore", "-q", "--no-index", t + "probe"]).ok
    ]
    if not missing:
        return ""
    path = checkout / ".gitignore"
    old = path.read_text() if path.exists() else ""
    block = "".join(f"/{t}\n" for t in missing)
    path.write_text(old + ("" if not old or old.endswith("\n") else "\n")
                    + "# build output (servegate build): never part of a release's tracked files\n"
                    + block)  # fmt: skip
    written.append(str(path))
    return ", ".join(missing)


def _check_interpreter(template: str, params: dict[str, str]) -> None:
    """The service's interpreter must be an interpreter: a shim (pyenv, asdf) is a script
    that picks one at run time, and provenance could not tie the live process to it."""
    path = Path(config_mod.fill(template, **params)) if template else None
    if path is None or "{" in str(path) or not path.is_file():
        return
    with path.open("rb") as handle:
        head = handle.read(2)
    if head == b"#!":
        raise ConfigError(
            f"the launch script runs {path}, a script that picks a Python at run time "
            "(a pyenv or asdf shim), not an interpreter: provenance could not tie the "
            "live process to it",
            hint=f"use the interpreter itself in the script: {path} -c 'import sys; "
            "print(sys.executable)' prints it (best: the serving venv's bin/python)",
        )


def run(
    out: Output,
    checkout: Path,
    from_command: Path | None,
    model: str,
    python: str,
    port: int | None,
    host_root: Path | None,
    unit: str,
    build: str,
    artifacts: list[str],
    checks: list[str],
    tiers: list[str],
    force: bool,
) -> int:
    checkout = checkout.resolve()
    if not (checkout / ".git").exists():
        raise PreflightFailed(
            f"{checkout} is not a Git checkout",
            hint="run servegate init in a clone of your serving stack (or pass --dir)",
        )
    remote = _git(checkout, "remote", "get-url", "origin")
    if not remote:
        raise PreflightFailed(
            f"{checkout} has no remote 'origin': servegate deploys from it",
            hint="git remote add origin URL (the repository the box pulls from)",
        )
    if "://" not in remote and not re.match(r"^[\w.-]+@[\w.-]+:", remote):
        remote = str((checkout / remote).resolve())  # a local path: the box needs it whole
    branch = _git(checkout, "symbolic-ref", "--short", "HEAD") or "main"
    name = re.sub(r"[^A-Za-z0-9_.-]", "-", checkout.name).lstrip("_.-")[:200] or "stack"
    unit = unit or name
    host_root = (host_root or Path.home() / ".local" / "share" / "servegate" / name).expanduser()
    written: list[str] = []
    notes: list[str] = []
    targets = [checkout / "servegate.toml"] + ([checkout / "launch.toml"] if from_command else [])
    for path in targets:  # before anything is written: all or nothing
        _write(path, "", force, [], dry=True)
    launch: dict[str, Any]
    if from_command is not None:
        script = from_command if from_command.is_absolute() else Path.cwd() / from_command
        try:
            text = script.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"cannot read the launch script {script}: {exc}") from None
        conv = shellimport.convert(text, checkout)
        _check_interpreter(conv.interpreter, conv.params)
        port = port or conv.port
        _write(checkout / "launch.toml", shellimport.profile_toml(conv, script.name), force,
               written)  # fmt: skip
        notes += [f"launch.toml: {n}" for n in conv.skipped]
        launch = {"profile": "launch.toml", "params": conv.params}
    else:
        if not model:
            raise ConfigError(
                "init needs the launch: --from-command SCRIPT (your launch script) or --model",
                hint="servegate init --from-command launch.sh, or servegate init --model "
                "/path/to/model [--python /path/to/venv/bin/python]",
            )
        launch = {"command": [python, "-m", "vllm.entrypoints.openai.api_server", "--model",
                              model, "--served-model-name", name, "--port", "{port}"]}  # fmt: skip
        if "/" not in python:
            found = shutil.which(python)
            notes.append(
                f"the service's Python is {python!r} from the PATH a promote runs with"
                + (f" (here {found})" if found else " (not found here)")
                + ": give --python /path/to/venv/bin/python, the environment that has vLLM"
            )
        if model.startswith(("/", "~", "./", "../")):
            # a local model: a missing file must never send the service to the Hub
            # (the lint rule model.local-without-offline)
            launch["env"] = {"HF_HUB_OFFLINE": "1"}
    build_argv = shlex.split(build) if build else []
    if build_argv and not artifacts:
        artifacts = ["build/*.so"]
    text = _config_text(checkout, remote, branch, host_root, unit, port or 8000, launch,
                        _packages(checkout), build_argv, artifacts, checks, tiers)  # fmt: skip
    cfg_path = checkout / "servegate.toml"
    _write(cfg_path, text, force, written)
    # what config check checks: the file, the launch it resolves, the rules, the gate
    cfg = config_mod.load(cfg_path, {})
    spec = launch_spec(cfg, hostpaths.of(cfg).current, "0" * 40)
    rules = ruleset(cfg)
    build_checks(cfg)
    # the lint rules a promote runs before its switch: what they would stop on is asked
    # of the user now, with the rule's own remedy (the script is not rewritten behind them)
    with tempfile.TemporaryDirectory(prefix="servegate-init-") as spare:
        for f in lint_mod.lint(spec, rules, Path(spare)):
            if f.severity == "fail":
                notes.append(
                    f"lint {f.rule} would stop the first promote (exit 15): {f.message}"
                    + (f" — {f.remedy}" if f.remedy else "")
                )
    ignored = _ignore_build_output(checkout, artifacts, written)
    if not (checkout / "noxfile.py").exists():
        _write(checkout / "noxfile.py", NOXFILE.format(packages=_packages(checkout) or ["."]),
               force, written)  # fmt: skip
    steps = [
        "servegate config check --config servegate.toml",
        "git add "
        + " ".join(shlex.quote(Path(w).name) for w in written)
        + ' && git commit -m "servegate config" && git push origin '
        + shlex.quote(branch),
        f"servegate release promote $(git rev-parse {shlex.quote(branch)}) --config servegate.toml",
    ]
    doc = {"written": written, "ignored": ignored, "notes": notes, "next": steps,
           "config": str(cfg_path)}  # fmt: skip
    if out.json_mode:
        return out.emit(doc)
    for name in written:
        out.line(f"wrote {name}")
    for note in notes:
        out.line(f"  {note}")
    out.line("next:")
    for i, step in enumerate(steps, 1):
        out.line(f"  {i}. {step}")
    return 0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dir", type=Path, default=Path("."), help="the stack checkout (default: .)")
    p.add_argument(
        "--from-command",
        type=Path,
        metavar="SCRIPT",
        help="your shell launch script: its exports and arguments become launch.toml",
    )
    p.add_argument("--model", default="", help="without a script: the model vLLM serves")
    p.add_argument("--python", default="python3", help="without a script: the Python that has vLLM")
    p.add_argument("--port", type=int, help="the service port (default: the script's, or 8000)")
    p.add_argument(
        "--host-root",
        type=Path,
        help="where releases and records live (default: ~/.local/share/servegate/NAME)",
    )
    p.add_argument("--unit", default="", help="the service's name (default: the checkout's)")
    p.add_argument("--build", default="", help='the build command, e.g. "bash build.sh"')
    p.add_argument(
        "--artifacts",
        action="append",
        default=[],
        metavar="GLOB",
        help="what the build makes (repeatable; default with --build: build/*.so)",
    )
    p.add_argument(
        "--gate", default="smoke,bench", help="gate checks, comma-separated (default smoke,bench)"
    )
    tiers = ",".join(config_mod.Bench().tiers)  # the config's own default, declared once
    p.add_argument("--tiers", default=tiers, help=f"bench tiers, comma-separated (default {tiers})")
    p.add_argument("--force", action="store_true", help="replace files init would write")
    common_args.output(p)


def main(args: argparse.Namespace, out: Output) -> int:
    return run(
        out, args.dir, args.from_command, args.model, args.python, args.port,
        args.host_root, args.unit, args.build, args.artifacts,
        [c for c in args.gate.split(",") if c], [t for t in args.tiers.split(",") if t],
        args.force,
    )  # fmt: skip
