from __future__ import annotations

import json
import socket
import sys
from pathlib import Path

import git
import pytest

from servegate import config
from servegate.cli import main
from servegate.errors import ConfigError

MINIMAL = """
[stack]
remote = "/srv/stack.git"
[host]
root = "/srv/servegate"
[service]
port = 8080
command = ["python", "-m", "vllm.entrypoints.openai.api_server", "--compilation-config", '{"mode":0}']
[service.env]
PYTHONPATH = "{release}"
"""


def parse(text: str, environ: dict[str, str] | None = None) -> config.Config:
    return config.parse(text, environ=environ or {})


def test_minimal_config_gets_defaults() -> None:
    cfg = parse(MINIMAL)
    assert cfg.stack.branch == "main"
    assert cfg.host.strategy == "worktree"
    assert cfg.service.manager == "supervisor"
    assert cfg.gate.checks == ("smoke",)
    assert cfg.service.command[0] == "python"
    with pytest.raises(AttributeError):
        cfg.service.port = 1  # type: ignore[misc]


def test_placeholders_keep_json_braces() -> None:
    cfg = parse(MINIMAL)
    assert config.fill(cfg.service.env["PYTHONPATH"], release="/r/abc") == "/r/abc"
    assert config.fill(cfg.service.command[-1], release="/r") == '{"mode":0}'


def test_unknown_key_suggests_the_right_one() -> None:
    with pytest.raises(
        ConfigError,
        match=r"unknown key 'startup_timout' in \[service\] — did you mean 'startup_timeout'\?",
    ):
        parse(MINIMAL.replace("port = 8080", "port = 8080\nstartup_timout = 5"))


def test_unknown_section_suggests() -> None:
    with pytest.raises(ConfigError, match="did you mean 'probes'"):
        parse(MINIMAL + "[probe]\nsmoke = true\n")


def test_missing_key_names_key_and_section() -> None:
    with pytest.raises(ConfigError, match=r"missing required key 'port' in section \[service\]"):
        parse(MINIMAL.replace("port = 8080\n", ""))


def test_missing_section_is_named() -> None:
    with pytest.raises(ConfigError, match=r"the required \[stack\] section is missing"):
        parse(MINIMAL.replace('[stack]\nremote = "/srv/stack.git"\n', ""))


def test_wrong_type_and_bad_choice() -> None:
    with pytest.raises(ConfigError, match="service.port must be of type int"):
        parse(MINIMAL.replace("port = 8080", 'port = "8080"'))
    with pytest.raises(ConfigError, match="did you mean 'in-place'"):
        parse(MINIMAL.replace('root = "/srv/servegate"', 'root = "/x"\nstrategy = "inplace"'))
    with pytest.raises(ConfigError, match="must be a list of strings"):
        parse(MINIMAL + '[build]\ncommand = "make"\n')


def test_environment_expansion_uses_the_given_mapping() -> None:
    cfg = parse(MINIMAL.replace('"/srv/servegate"', '"$BOX/servegate"'), {"BOX": "/data"})
    assert cfg.host.root == "/data/servegate"
    with pytest.raises(ConfigError, match=r"uses \$BOX, which is not set"):
        parse(MINIMAL.replace('"/srv/servegate"', '"$BOX/servegate"'))


def on_this_box(tmp_path: Path, text: str = MINIMAL) -> str:
    """``text`` made true of this box: a host root of its own, this Python as the
    launch's interpreter, a vllm it can import (a stand-in package on the launch's
    PYTHONPATH) and a remote that holds ``main``."""
    engine = tmp_path / "engine"
    (engine / "vllm").mkdir(parents=True, exist_ok=True)
    (engine / "vllm" / "__init__.py").write_text("")
    origin = tmp_path / "origin.git"
    if not origin.exists():
        work = tmp_path / "seed"
        repo = git.Repo.init(work, initial_branch="main")
        (work / "README").write_text("stack\n")
        repo.git.add("-A")
        repo.git.commit("-m", "seed", env={"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
                        "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"})  # fmt: skip
        git.Repo.clone_from(str(work), str(origin), bare=True)
    return (
        text.replace("/srv/servegate", str(tmp_path / "host"))
        .replace('remote = "/srv/stack.git"', f'remote = "{origin}"')
        .replace('command = ["python",', f'command = ["{sys.executable}",')
        .replace('PYTHONPATH = "{release}"', f'PYTHONPATH = "{{release}}:{engine}"')
    )


def test_config_check_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = tmp_path / "good.toml"
    good.write_text(on_this_box(tmp_path))
    assert main(["config", "check", "--config", str(good)]) == 0
    assert "OK" in capsys.readouterr().out
    bad = tmp_path / "bad.toml"
    bad.write_text(MINIMAL + "[gate]\nchecks = ['smoke', 'bnech']\n")
    assert main(["config", "check", "--config", str(bad)]) == 2
    assert "bnech" in capsys.readouterr().err
    assert main(["config", "check", "--config", str(tmp_path / "missing.toml")]) == 2
    assert "not found" in capsys.readouterr().err


def test_a_tier_that_does_not_exist_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"bench.tiers has '3k', which is no tier") as err:
        parse(MINIMAL + '[bench]\ntiers = ["3k"]\n')
    assert "tiers: 1k, 2k, 4k" in err.value.hint
    with pytest.raises(ConfigError, match=r"probes.prefix_tier has '16K'") as err:
        parse(MINIMAL + '[probes]\nprefix_tier = "16K"\n')
    assert "did you mean '16k'" in err.value.hint


@pytest.mark.parametrize(
    "tag",
    ["release {short}", "rel..{n}", "-{short}", "v{n}.lock", "rel/{short}/", "x@{{n}}",
     "a:{sha}", "rel/.hidden-{n}", "", "r~{n}", "tag{date}."],
)  # fmt: skip
def test_a_tag_pattern_that_makes_no_valid_tag_is_refused_at_load(tag: str) -> None:
    text = MINIMAL + f"[release]\ntag = {tag!r}\n"
    with pytest.raises(ConfigError, match="does not make a valid tag name") as err:
        parse(text)
    assert "{date}" in err.value.hint


@pytest.mark.parametrize("tag", ["release/{date}-{time}-{short}", "v{n}", "deploy/{sha}"])
def test_valid_tag_patterns_load(tag: str) -> None:
    assert parse(MINIMAL + f"[release]\ntag = {tag!r}\n").release.tag == tag
    for name in ("release/20260101-000000-0123456789ab", "v1", "a/b.c_d-e"):
        assert config.ref_name_problem(name) == ""


def test_the_no_evidence_escapes_are_refused_with_what_to_do() -> None:
    """ "No evidence of a loss" is no PASS: the settings that made it one are refused by
    name, with the fix, rather than silently ignored or read as unknown keys."""
    with pytest.raises(ConfigError, match="gate.max_resolution is no longer a setting") as err:
        parse(MINIMAL + "[gate]\nmax_resolution = 0.75\n")
    assert "excludes the" in err.value.hint
    with pytest.raises(ConfigError, match="gate.inconclusive = 'evidence' is gone") as err:
        parse(MINIMAL + '[gate]\ninconclusive = "evidence"\n')
    assert "'pass'" in err.value.hint
    cfg = parse(MINIMAL)
    assert cfg.gate.inconclusive == "inconclusive"
    assert cfg.gate.restart_offset == 0.02  # never 0: nothing measured is no quiet box
    for bad in ("0", "1", "-0.1"):
        with pytest.raises(ConfigError, match=r"gate.restart_offset must be in \(0, 1\)"):
            parse(MINIMAL + f"[gate]\nrestart_offset = {bad}\n")


def test_trend_window_and_anchor_are_checked_at_load() -> None:
    assert parse(MINIMAL).trend == config.Trend(enabled=True, window=5, anchor="")
    cfg = parse(MINIMAL + '[trend]\nwindow = 8\nanchor = "0123456789ab"\nenabled = false\n')
    assert cfg.trend == config.Trend(enabled=False, window=8, anchor="0123456789ab")
    with pytest.raises(ConfigError, match=r"trend.window = 1: give 2..100"):
        parse(MINIMAL + "[trend]\nwindow = 1\n")
    for bad in ("HEAD~3", "abc", "0123456789ABCDEF"):
        with pytest.raises(ConfigError, match="is not a commit SHA"):
            parse(MINIMAL + f'[trend]\nanchor = "{bad}"\n')
    with pytest.raises(ConfigError, match="did you mean 'window'"):
        parse(MINIMAL + "[trend]\nwindows = 3\n")


def test_config_check_runs_the_lint_rules_promote_runs_before_the_switch(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A config whose first promote would stop at lint (exit 15) is not OK to `config
    check` either: the same rules, the same exit code."""
    local = MINIMAL.replace(
        '"--compilation-config"', '"--model", "/models/qwen", "--compilation-config"'
    )
    path = tmp_path / "local.toml"
    path.write_text(on_this_box(tmp_path, local).replace("/models/qwen", str(tmp_path / "qwen")))
    (tmp_path / "qwen").mkdir()
    assert main(["config", "check", "--config", str(path)]) == 15
    assert "model.local-without-offline" in capsys.readouterr().err
    path.write_text(path.read_text() + 'HF_HUB_OFFLINE = "1"\n')
    assert main(["config", "check", "--config", str(path)]) == 0


def test_config_check_sees_on_this_box_what_a_first_promote_would_stop_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each cause a first promote would stop on that this box already shows, with
    promote's exit code for it: a stranger on the port (6), a remote that does not
    answer (11) or lacks the branch (3), a build program not installed (5), a launch
    program missing, an engine its interpreter cannot import or a model directory that
    is not there (7: the service could not start). ``--offline`` skips the remote."""
    text = on_this_box(tmp_path, MINIMAL.replace(
        '"--compilation-config"', '"--model", "/models/qwen", "--compilation-config"'
    ) + 'HF_HUB_OFFLINE = "1"\n')  # fmt: skip
    (tmp_path / "qwen").mkdir()
    text = text.replace("/models/qwen", str(tmp_path / "qwen"))
    path = tmp_path / "box.toml"

    def check(body: str, *extra: str) -> int:
        path.write_text(body)
        capsys.readouterr()
        return main(["config", "check", "--config", str(path), *extra])

    assert check(text, "--json") == 0
    box = json.loads(capsys.readouterr().out)["result"]["box"]
    assert any(line.startswith("engine: ") and "imports vllm" in line for line in box), box
    assert any(line.startswith("remote: ") and "has main" in line for line in box), box
    with socket.socket() as stranger:
        stranger.bind(("127.0.0.1", 0))
        stranger.listen()
        port = stranger.getsockname()[1]
        assert check(text.replace("port = 8080", f"port = {port}")) == 6
        assert f"port {port} is already taken" in capsys.readouterr().err
    assert check(text.replace(str(tmp_path / "origin.git"), str(tmp_path / "nowhere.git"))) == 11
    assert "does not appear to be a git repository" in capsys.readouterr().err  # git's reason
    assert check(text.replace(str(tmp_path / "origin.git"), str(tmp_path / "nowhere.git")),
                 "--offline") == 0  # fmt: skip
    assert check(text.replace("[stack]\n", '[stack]\nbranch = "release"\n', 1)) == 3
    assert "has no branch 'release'" in capsys.readouterr().err
    assert check(text + '[build]\ncommand = ["no-such-builder", "all"]\n') == 5
    assert "no-such-builder" in capsys.readouterr().err
    assert check(text + '[build]\ncommand = ["bash", "build.sh"]\n') == 0
    target = '[[build.targets]]\nname = "k"\nkind = "hipcc"\nsources = ["k.hip"]\noutput = "k.so"\n'
    assert check(text + '[build]\narchs = ["sm_90"]\n' + target) == 2
    assert "hipcc cannot build them" in capsys.readouterr().err
    no_tools = '[build]\narchs = ["gfx1030"]\nenv = { PATH = "/nonexistent" }\n'
    assert check(text + no_tools + target) == 5
    assert "hipcc is not installed" in capsys.readouterr().err
    missing = text.replace(
        f'command = ["{sys.executable}",', 'command = ["/opt/venvs/nope/bin/python",'
    )
    assert check(missing) == 7
    assert "/opt/venvs/nope/bin/python" in capsys.readouterr().err
    assert check(text.replace(f":{tmp_path / 'engine'}", "")) == 7
    assert "cannot import vllm" in capsys.readouterr().err
    assert check(text.replace(str(tmp_path / "qwen"), str(tmp_path / "gone"))) == 7
    assert "is not a directory on this box" in capsys.readouterr().err
    # every problem the box shows, in one run: the code is the one a promote meets first
    several = text.replace(str(tmp_path / "qwen"), str(tmp_path / "gone"))
    assert check(several + '[build]\ncommand = ["no-such-builder", "all"]\n', "--offline") == 5
    err = capsys.readouterr().err
    assert "no-such-builder" in err
    assert "also (7):" in err
    assert "is not a directory on this box" in err


@pytest.mark.parametrize("unit", ["my stack", "my%stack", "a\nb", "-x", "x" * 201, "é"])
def test_a_unit_name_either_manager_would_misread_is_refused(unit: str) -> None:
    """`service.unit` goes into a systemd unit file name and a supervisord section
    header: a space, a % specifier or a newline there is refused at load."""
    text = MINIMAL.replace("[service]\n", f"[service]\nunit = {json.dumps(unit)}\n", 1)
    with pytest.raises(ConfigError, match="is not a service name"):
        config.parse(text, environ={})
