"""Values reach the service exactly or not at all: a newline in a config value, a
${NAME} filled from servegate's environment (a CI secret with a trailing newline) or a
quote never becomes a directive, a program or a changed value in the unit that
supervisord or systemd reads — and the refusal comes before the switch, with the live
service untouched."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from servegate import config, hostpaths
from servegate.engine import managers
from servegate.engine.launch import LaunchSpec, unsafe
from servegate.engine.managers import supervisor, systemd
from servegate.errors import ConfigError
from servegate.pipeline.stages import QuietReporter
from servegate.release import rollback
from servegate.release.context import Context
from servegate.release.promote import promote
from tests.conftest import Host, Stack, make_host

SPEC = LaunchSpec(
    unit="svc",
    argv=("/usr/bin/python3", "-c", "print('x')", 'a"b', "back\\slash", "50% off $HOME"),
    env={"PLAIN": "value", "QUOTED": 'he said "hi" twice', "APOS": "it's", "BACK": "C:\\dir\\",
         "PCT": "100%", "COMMA": "a,b=c d", "DOLLAR": "$HOME ${X}", "UTF": "größe"},
    cwd=Path("/srv/releases/abc"),
    sha="a" * 40,
)  # fmt: skip


def _supervisor(tmp_path: Path) -> supervisor.Supervisor:
    text = f"""
[stack]
remote = "x"
[host]
root = "{tmp_path}"
[service]
manager = "supervisor"
command = ["x"]
port = 5
"""
    return supervisor.Supervisor(config.parse(text, environ={}))


def test_supervisord_reads_back_exactly_what_was_meant(tmp_path: Path) -> None:
    sv = _supervisor(tmp_path)
    assert sv.render_problems(SPEC) == []  # supervisor's own parser, compared
    assert systemd.render_problems(SPEC, systemd.render_unit(SPEC)) == []


@pytest.mark.parametrize("bad", ["x\n[program:evil]\ncommand=touch /tmp/pwned", "tok\n",
                                 "a\rb", "nul\x00"])  # fmt: skip
def test_a_control_character_in_a_value_is_refused_without_quoting_it(
    tmp_path: Path, bad: str
) -> None:
    spec = dataclasses.replace(SPEC, env={**SPEC.env, "HF_TOKEN": bad})
    (problem,) = unsafe(spec)
    assert problem.startswith("the value of HF_TOKEN holds a control character (U+00")
    for manager in (_supervisor(tmp_path), systemd.SystemdUser(_supervisor(tmp_path).cfg)):
        with pytest.raises(ConfigError) as refused:
            managers.refuse(manager, spec)
        assert bad.strip() not in str(refused.value)  # a secret is never printed
    sv = _supervisor(tmp_path)
    with pytest.raises(ConfigError):
        sv.install(spec)
    assert not sv.program_conf.exists()  # nothing written, no daemon started
    assert not sv.socket.exists()


def test_a_filled_secret_with_a_trailing_newline_says_where_it_came_from() -> None:
    spec = dataclasses.replace(SPEC, env={"TOKEN": "${CI_TOKEN}"}).expanded(
        {"CI_TOKEN": "s3cret\n"}
    )
    (problem,) = unsafe(spec)
    assert "TOKEN (filled from ${...} in servegate's environment)" in problem
    assert "s3cret" not in problem


def test_names_and_arguments_are_checked_too() -> None:
    spec = dataclasses.replace(SPEC, argv=("/bin/x", "--flag\nExecStartPre=/bin/evil"),
                               env={"BAD NAME": "v", "1X": "v"})  # fmt: skip
    problems = unsafe(spec)
    assert "argument 1 of the command holds a control character (U+000A, a newline)" in problems
    assert sum("is not a valid name" in p for p in problems) == 2


def test_a_value_supervisord_cannot_carry_is_refused_by_name(tmp_path: Path) -> None:
    both = dataclasses.replace(SPEC, env={"MIXED": 'it\'s "both"'})
    (problem,) = _supervisor(tmp_path).render_problems(both)
    assert problem.startswith("the value of MIXED holds both quote characters")
    assert 'both"' not in problem
    edge = dataclasses.replace(SPEC, env={"EDGE": '"quoted"'})
    assert _supervisor(tmp_path).render_problems(edge)  # quotes stripped at both ends


def test_an_injected_directive_in_a_rendered_unit_is_seen() -> None:
    text = systemd.render_unit(SPEC) + "ExecStartPre=/bin/evil\n"
    assert systemd.render_problems(SPEC, text) == [
        "the unit would hold a directive 'ExecStartPre' servegate does not write"
    ]


def test_a_promote_with_a_newline_in_a_filled_value_stops_before_the_switch(
    tmp_path: Path, stack: Stack
) -> None:
    host = make_host(tmp_path, stack)
    try:
        cfg = _secret_from_environment(host)
        good = stack.commit("ok")
        fine = Context.create(cfg, QuietReporter(), {"CI_TOKEN": "hunter2"})
        assert promote(fine, good).verdict == "released"
        conf = Host(cfg, host.path)
        program = _supervisor_of(cfg).program_conf.read_text()

        nxt = stack.commit("ok", "the next release")
        injected = "hunter2\n[program:evil]\ncommand=touch " + str(tmp_path / "pwned")
        bad = Context.create(cfg, QuietReporter(), {"CI_TOKEN": injected})
        with pytest.raises(ConfigError, match="TINY_SECRET_TOKEN") as refused:
            promote(bad, nxt)
        assert "hunter2" not in str(refused.value)
        assert refused.value.exit_code == 2
        # the live release still serves, its program file as it was, nothing ran
        assert conf.live_root() == conf.release_dir(good)
        assert _supervisor_of(cfg).program_conf.read_text() == program
        assert not (tmp_path / "pwned").exists()
        assert Context.create(cfg, QuietReporter(), {}).state.pending is None
    finally:
        _supervisor_of(host.cfg).shutdown_daemon()


def test_a_rollback_installs_the_launch_its_release_ran(tmp_path: Path, stack: Stack) -> None:
    """A rollback puts back what the earlier release ran — its kept launch, sealed by
    this host — never what today's config and environment render: a secret rotated
    since, or one that now carries an injected program, does not reach it. A kept
    launch this host did not seal is not used, and today's render, refused, stops the
    rollback before the live release is touched."""
    host = make_host(tmp_path, stack)
    try:
        cfg = _secret_from_environment(host)
        conf = Host(cfg, host.path)
        good = stack.commit("ok")
        assert promote(Context.create(cfg, QuietReporter(), {"CI_TOKEN": "hunter2"}), good).verdict == "released"  # fmt: skip
        ran = _supervisor_of(cfg).program_conf.read_text()
        assert "hunter2" in ran
        nxt = stack.commit("ok", "the next release")
        assert promote(Context.create(cfg, QuietReporter(), {"CI_TOKEN": "rotated"}), nxt).verdict == "released"  # fmt: skip
        injected = "x\n[program:evil]\ncommand=touch " + str(tmp_path / "pwned")

        result = rollback.rollback(Context.create(cfg, QuietReporter(), {"CI_TOKEN": injected}), good)  # fmt: skip
        assert result["ok"], result
        assert result["launch"] == "kept"
        assert conf.live_root() == conf.release_dir(good)
        assert _supervisor_of(cfg).program_conf.read_text() == ran
        assert not (tmp_path / "pwned").exists()

        kept = hostpaths.of(cfg).launch(nxt)
        doc = json.loads(kept.read_text())
        doc["launch"]["env"]["TINY_SECRET_TOKEN"] = "forged"
        kept.write_text(json.dumps(doc))
        with pytest.raises(ConfigError, match="TINY_SECRET_TOKEN") as refused:
            rollback.rollback(Context.create(cfg, QuietReporter(), {"CI_TOKEN": injected}), nxt)
        assert refused.value.exit_code == 2
        assert conf.live_root() == conf.release_dir(good)
        assert _supervisor_of(cfg).program_conf.read_text() == ran
        assert Context.create(cfg, QuietReporter(), {}).state.pending is None
    finally:
        _supervisor_of(host.cfg).shutdown_daemon()


def _secret_from_environment(host: Host) -> config.Config:
    """The host's config with its secret filled from ``${CI_TOKEN}`` (a CI secret)."""
    host.path.write_text(host.path.read_text().replace(
        'TINY_SECRET_TOKEN = "hunter2"', 'TINY_SECRET_TOKEN = "${CI_TOKEN}"'
    ))  # fmt: skip
    return config.load(host.path, {})


def _supervisor_of(cfg: config.Config) -> supervisor.Supervisor:
    return supervisor.Supervisor(cfg)
