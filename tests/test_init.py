"""``servegate init``: from a stack checkout and its shell launch script to a config that
``config check`` passes and a first ``release promote`` that releases."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import httpx
import pytest

from servegate import config as config_mod
from servegate.cli import main, release_main
from servegate.engine import profiles, shellimport
from servegate.engine.managers.supervisor import Supervisor
from servegate.pipeline.git import commit_all, push_branch
from tests.conftest import DEV, Stack, free_port
from tests.engine.test_profiles import BUILTINS, REPO, SEED_BLOCK, seed_command


def test_the_seeds_launch_script_converts_to_the_same_command_as_bash_runs(
    tmp_path: Path,
) -> None:
    """Every argument and every exported variable, against what bash itself execs."""
    conv = shellimport.convert(SEED_BLOCK.read_text(), Path(REPO))
    assert conv.unresolved == []
    assert conv.port == 8080
    assert set(conv.params) == {"runtime", "model"}  # the checkout is {release}
    path = tmp_path / "launch.toml"
    path.write_text(shellimport.profile_toml(conv, "seed.sh"))
    resolved = profiles.resolve(profiles.load(str(path)), {}, BUILTINS)
    argv, env = seed_command()
    assert list(resolved.argv) == argv
    assert dict(resolved.env) == env
    assert list(resolved.env) == re.findall(r"^export (\w+)=", SEED_BLOCK.read_text(), re.M)
    assert resolved.env["V620_PORT"] == "8080"  # {port}: the config's port decides
    # the pre-flight commands are listed, not dropped silently
    assert any("git fetch" in s and "SHA itself" in s for s in conv.skipped)
    assert any("check_v620_tuning.py" in s and "before the server" in s for s in conv.skipped)


LAUNCH = """#!/usr/bin/env bash
# how we start the tiny server by hand
set -euo pipefail
repo={work}
py={python}
cd "$repo"
./build.sh
export PYTHONPATH="$repo"
export TINY_PORT={port}
args=(
  -m tinystack.server
  --port {port}   # the one port
)
exec "$py" "${{args[@]}}"
"""


def _launch_script(stack: Stack, port: int) -> Path:
    script = stack.work / "launch.sh"
    script.write_text(LAUNCH.format(work=stack.work, python=sys.executable, port=port))
    commit_all(stack.work, "our launch script", DEV)
    push_branch(stack.work, "main")
    return script


def test_init_then_config_check_then_a_first_promote_releases(
    stack: Stack, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    port = free_port()
    script = _launch_script(stack, port)
    host_root = tmp_path / "host"
    code = main(["init", "--dir", str(stack.work), "--from-command", str(script),
                 "--host-root", str(host_root), "--gate", "smoke", "--build", "bash build.sh",
                 "--json"])  # fmt: skip
    doc = json.loads(capsys.readouterr().out)
    assert code == 0, doc
    written = {Path(p).name for p in doc["result"]["written"]}
    assert written == {"servegate.toml", "launch.toml", ".gitignore", "noxfile.py"}
    assert any("./build.sh" in n and "run it in the build" in n for n in doc["result"]["notes"])
    profile = (stack.work / "launch.toml").read_text()
    assert 'interpreter = "{py}"' in profile
    assert 'TINY_PORT = "{port}"' in profile
    assert 'PYTHONPATH = "{release}"' in profile
    cfg_path = stack.work / "servegate.toml"
    cfg = config_mod.load(cfg_path, {})
    assert cfg.service.port == port
    assert cfg.provenance.modules == ("tinystack",)
    assert "/build/" in (stack.work / ".gitignore").read_text()
    assert main(["config", "check", "--config", str(cfg_path)]) == 0
    capsys.readouterr()

    # the next commands as printed: commit what init wrote, push, promote
    sha = commit_all(stack.work, "servegate config", DEV)
    push_branch(stack.work, "main")
    try:
        code = release_main(["promote", sha, "--config", str(cfg_path), "--json"])
        result = json.loads(capsys.readouterr().out)["result"]
        assert code == 0, result.get("reason")
        assert result["verdict"] == "released"
        live = httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=5).json()
        assert live["data"][0]["root"] == str(host_root / "releases" / sha)
        assert result["record"]["provenance"]["ok"] is True
    finally:
        Supervisor(cfg).shutdown_daemon()


def test_init_writes_over_nothing_and_says_what_is_missing(
    stack: Stack, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = _launch_script(stack, free_port())
    args = ["init", "--dir", str(stack.work), "--host-root", str(tmp_path / "h")]
    assert main(args) == 2  # neither a script nor a model
    assert "--from-command SCRIPT" in capsys.readouterr().err
    assert main([*args, "--from-command", str(script)]) == 0
    capsys.readouterr()
    before = (stack.work / "servegate.toml").read_text()
    assert main([*args, "--from-command", str(script)]) == 2
    assert "does not write over it" in capsys.readouterr().err
    assert (stack.work / "servegate.toml").read_text() == before
    (stack.work / "launch.toml").unlink()  # a config of their own, no profile: untouched
    assert main([*args, "--from-command", str(script)]) == 2
    assert "servegate.toml exists" in capsys.readouterr().err
    assert not (stack.work / "launch.toml").exists()  # nothing written: all or nothing

    sloppy = tmp_path / "sloppy.sh"
    sloppy.write_text('export HF_HOME="$SCRATCH/hf"\nexec python -m x --model "$MODEL"\n')
    assert main([*args, "--force", "--from-command", str(sloppy)]) == 2
    err = capsys.readouterr().err
    assert "line 1: $SCRATCH is never set in the script" in err
    shim = tmp_path / "python3"  # what pyenv puts first on PATH
    shim.write_text('#!/usr/bin/env bash\nexec "$(pyenv which python3)" "$@"\n')
    shimmed = tmp_path / "shimmed.sh"
    shimmed.write_text(f"exec {shim} -m tinystack.server --port 8000\n")
    assert main([*args, "--force", "--from-command", str(shimmed)]) == 2
    assert "not an interpreter" in capsys.readouterr().err
    nothing = tmp_path / "nothing.sh"
    nothing.write_text("set -e\ncd /srv\ngit pull --ff-only\n")
    assert main([*args, "--force", "--from-command", str(nothing)]) == 2
    assert "starts no server" in capsys.readouterr().err


def test_init_outside_a_clone_with_an_origin_says_how(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["init", "--dir", str(tmp_path), "--model", "/m"]) == 6
    assert "not a Git checkout" in capsys.readouterr().err


def test_init_writes_what_the_lint_needs_or_says_what_to_add(
    stack: Stack, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A local model must never send the service to the Hub (lint
    model.local-without-offline, exit 15 at a promote): `init --model /path` writes
    HF_HUB_OFFLINE itself; a script that starts with a local model and no HF_HUB_OFFLINE
    is not rewritten behind the team's back — init names the rule and its fix."""
    args = ["init", "--dir", str(stack.work), "--host-root", str(tmp_path / "host"), "--json"]
    assert main([*args, "--model", "/models/qwen3", "--python", sys.executable]) == 0
    capsys.readouterr()
    cfg = config_mod.load(stack.work / "servegate.toml", {})
    assert cfg.service.env.get("HF_HUB_OFFLINE") == "1"
    script = tmp_path / "launch.sh"
    script.write_text(f"exec {sys.executable} -m vllm.entrypoints.openai.api_server "
                      "--model /models/qwen3 --port 8000\n")  # fmt: skip
    assert main([*args, "--force", "--from-command", str(script)]) == 0
    notes = json.loads(capsys.readouterr().out)["result"]["notes"]
    assert any("model.local-without-offline would stop the first promote (exit 15)" in n
               for n in notes), notes  # fmt: skip
    # without --python the service's Python is a bare name: init says which it found
    assert main([*args, "--force", "--model", "/models/qwen3"]) == 0
    notes = json.loads(capsys.readouterr().out)["result"]["notes"]
    assert any("the service's Python is 'python3'" in n and "--python" in n for n in notes)


def test_a_refused_script_is_a_documented_config_error_in_json(
    stack: Stack, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`conda activate` is refused by the script import's own error class; --json names
    the class docs/exit-codes.md documents for exit 2, ConfigError."""
    script = tmp_path / "conda.sh"
    script.write_text("conda activate vllm\nexec python -m vllm.entrypoints.openai.api_server\n")
    args = ["init", "--dir", str(stack.work), "--host-root", str(tmp_path / "h")]
    assert main([*args, "--from-command", str(script), "--json"]) == 2
    doc = json.loads(capsys.readouterr().out)
    assert doc["error"]["class"] == "ConfigError"
    assert "conda run -n vllm which python" in doc["error"]["hint"]


def test_a_checkout_whose_name_is_no_unit_name_still_gets_a_config_that_loads(
    stack: Stack, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The unit is named after the checkout: "_my stack" must not give a unit name
    systemd or supervisord would refuse (the config would not load)."""
    odd = tmp_path / "_my stack"
    stack.work.rename(odd)
    args = ["init", "--dir", str(odd), "--host-root", str(tmp_path / "h"), "--json"]
    assert main([*args, "--model", "/models/q", "--python", sys.executable]) == 0
    capsys.readouterr()
    assert config_mod.load(odd / "servegate.toml", {}).service.unit == "my-stack"
