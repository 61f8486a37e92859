"""The command line: documented exit codes, JSON envelopes, reference docs in sync."""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import shutil
import subprocess
import sys
import tomllib
import typing
from pathlib import Path
from typing import Any

import pytest

from servegate import cli, config, errors, flags
from servegate.cli import main, release_main
from servegate.commands import bench as bench_cmd
from tests.conftest import Host, Stack

DOCS = Path(__file__).resolve().parent.parent / "docs"


def test_exit_code_table_matches_errors() -> None:
    table = (DOCS / "exit-codes.md").read_text()
    rows = dict(re.findall(r"^\| (\d+) \| `(\w+)` \|", table, re.MULTILINE))
    assert rows == {str(e.exit_code): e.__name__ for e in errors.ALL_ERRORS}
    codes = [e.exit_code for e in errors.ALL_ERRORS]
    assert len(codes) == len(set(codes)), "one exit code per failure class"
    assert f"| {errors.INTERNAL_ERROR} |" in table
    assert f"| {errors.INTERRUPTED} |" in table


def test_every_config_key_is_documented() -> None:
    text = (DOCS / "config.md").read_text()
    hints = typing.get_type_hints(config.Config)
    for section in dataclasses.fields(config.Config):
        if section.name == "path":
            continue
        for key in dataclasses.fields(hints[section.name]):
            assert f"`{section.name}.{key.name}`" in text, f"{section.name}.{key.name} undocumented"


def _declared_default(f: dataclasses.Field[Any]) -> Any:
    if f.default is not dataclasses.MISSING:
        value = f.default
    elif f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
    else:
        return REQUIRED
    if isinstance(value, tuple):
        return list(value)
    return dict(value) if isinstance(value, typing.Mapping) else value


REQUIRED = object()


def test_config_md_states_each_key_s_declared_default() -> None:
    """docs/config.md's default column is the config's own declaration: a row whose
    default is a TOML value reads back as the field's default, a key without a default
    says "required", and every key has a row of its own (keys a row lists together share
    its defaults in order). A default changed in code without its doc line fails here."""
    rows: dict[str, str] = {}
    for line in (DOCS / "config.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 3 or not cells[0].startswith("`"):
            continue
        keys = re.findall(r"`([a-z_]+\.[a-z_]+)`", cells[0])
        defaults = [d.strip() for d in cells[1].split(", ")] if len(keys) > 1 else [cells[1]]
        for i, key in enumerate(keys):
            rows[key] = defaults[i] if len(defaults) == len(keys) else cells[1]
    hints = typing.get_type_hints(config.Config)
    checked = 0
    for section in dataclasses.fields(config.Config):
        if section.name == "path":
            continue
        for f in dataclasses.fields(hints[section.name]):
            key = f"{section.name}.{f.name}"
            assert key in rows, f"{key} has no row in docs/config.md"
            cell, want = rows[key], _declared_default(f)
            if want is REQUIRED:
                assert cell.startswith("required"), f"{key} is required: the doc says {cell!r}"
            elif re.fullmatch(r"`[^`]*`", cell) and not re.fullmatch(r"`[a-z_]+\.[a-z_]+`", cell):
                got = tomllib.loads(f"v = {cell[1:-1]}")["v"]
                assert got == want, f"{key}: docs/config.md says {got!r}, the code {want!r}"
                checked += 1
    assert checked > 100  # prose defaults ("built-in", "none") are the exception


def test_json_error_envelope(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "servegate.toml"
    path.write_text("[stack]\nremote = 'x'\n")
    assert release_main(["status", "--config", str(path), "--json"]) == 2
    doc = json.loads(capsys.readouterr().out)
    assert doc["schema"] == 1
    assert doc["ok"] is False
    assert doc["exit_code"] == 2
    assert doc["error"]["class"] == "ConfigError"
    assert "[host]" in doc["error"]["message"]


def test_console_scripts_are_installed() -> None:
    for script in ("servegate", "release"):
        exe = Path(sys.executable).with_name(script)
        out = subprocess.run([str(exe), "--help"], capture_output=True, text=True, check=True)
        assert "usage:" in out.stdout


def test_status_history_and_verify_report(
    host: Host, stack: Stack, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = ["--config", str(host.path), "--json"]
    assert release_main(["verify", *cfg]) == 12  # nothing released yet
    capsys.readouterr()
    sha = stack.commit()
    assert release_main(["promote", sha, *cfg]) == 0
    capsys.readouterr()
    assert release_main(["status", *cfg]) == 0
    status = json.loads(capsys.readouterr().out)["result"]
    assert status["current"]["sha"] == sha
    assert status["service"]["healthy"] is True
    assert release_main(["history", *cfg]) == 0
    history = json.loads(capsys.readouterr().out)["result"]
    assert [h["verdict"] for h in history["releases"]] == ["released"]
    assert history["trend"] == {"why": "no released record with bench samples on this host"}
    assert main(["release", "verify", *cfg]) == 0
    proof = json.loads(capsys.readouterr().out)["result"]
    assert proof["ok"] is True
    assert proof["modules"]["tinystack"].startswith(host.release_dir(sha))


def test_summary_renders_gate_and_verdict(
    host: Host, stack: Stack, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert release_main(["promote", stack.commit(), "--config", str(host.path), "--json"]) == 0
    result = tmp_path / "promote.json"
    result.write_text(capsys.readouterr().out)
    assert main(["summary", str(result)]) == 0
    text = capsys.readouterr().out
    assert "released (exit 0)" in text
    assert "| smoke | PASS |" in text
    assert "| provenance | ok |" in text
    bad = tmp_path / "bad.json"
    bad.write_text("not json")
    assert main(["summary", str(bad)]) == 2
    # another command's --json (a bench result) is refused, never "release : unknown"
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps({"schema": 1, "command": "bench", "ok": True, "exit_code": 0,
                                 "result": {"cases": []}}))  # fmt: skip
    assert main(["summary", str(bench)]) == 2
    assert "it is `bench --json`" in capsys.readouterr().err
    # a reason quoting a crafted log line stays text in the job summary, never markup
    doc = json.loads(result.read_text())
    doc["result"]["verdict"] = "rolled_back"
    doc["result"]["reason"] = 'log: <img src="https://x.invalid/p.png"> | cell'
    crafted = tmp_path / "crafted.json"
    crafted.write_text(json.dumps(doc))
    assert main(["summary", str(crafted)]) == 0
    text = capsys.readouterr().out
    assert "<img" not in text
    assert "&lt;img" in text


def test_summary_shows_the_bench_gate_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    row = {"case": "regular-16k", "metric": "generation_tps", "required": True,
           "baseline_median": 63.0, "candidate_median": 30.1, "ratio": 0.478,
           "interval": [0.41, 0.52], "threshold": 0.95, "floor": None, "verdict": "FAIL", "why": "x"}  # fmt: skip
    doc = {"exit_code": 9, "result": {"verdict": "rolled_back", "sha": "a" * 40, "reason": "gate verdict FAIL",
           "record": {"gate": {"checks": [{"name": "bench", "verdict": "FAIL", "reason": "r", "seconds": 1.0,
                                           "evidence": {"rows": [row], "baseline": "live release abc",
                                                        "method": "bootstrap"}}]}}}}  # fmt: skip
    path = tmp_path / "p.json"
    path.write_text(json.dumps(doc))
    assert main(["summary", str(path)]) == 0
    text = capsys.readouterr().out
    assert "### Bench gate: FAIL" in text
    assert (
        "| regular-16k | generation_tps | 63.0 | 30.1 | 0.478 | [0.410, 0.520] | 0.950 | - | FAIL |"
        in text
    )


def test_version_names_the_commit_it_was_installed_from(tmp_path: Path) -> None:
    """The install the docs give (a Git URL at a commit) records the commit, and
    ``--version`` shows it; the editable checkout shows its HEAD."""
    repo = Path(__file__).resolve().parents[1]
    head = subprocess.run(
        ["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--disable-pip-version-check",
         "--target", str(target), f"git+file://{repo}@{head}"],
        check=True, timeout=600,
    )  # fmt: skip
    # this checkout's code (not the committed one), reading the metadata the install recorded
    code_dir = tmp_path / "code"
    shutil.copytree(repo / "src" / "servegate", code_dir / "servegate")
    code = (
        f"import sys; sys.path[0:0] = [{str(code_dir)!r}, {str(target)!r}]; "
        "from servegate.about import version_line; print(version_line())"
    )
    shown = subprocess.run(
        [sys.executable, "-I", "-c", code],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert f"(commit {head[:12]}, git URL file://{repo})" in shown
    # the console script answers --version without the command line's modules
    line = subprocess.run(
        [sys.executable, "-X", "importtime", "-c",
         "import sys; sys.argv = ['servegate', '--version']; "
         "from servegate.entry import main; main()"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert line.stdout.startswith("servegate ")
    assert "servegate.cli" not in line.stderr
    assert "rich" not in line.stderr


def test_report_without_its_extra_says_how_to_install_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from servegate.bench import charts

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if the extra were not installed
    with pytest.raises(errors.ConfigError, match="optional extra 'report'") as caught:
        charts.render([], tmp_path, "t")
    # never a bare `pip install 'servegate[report]'`: a public index could answer it
    assert "pip install 'servegate[report]'" not in caught.value.hint
    assert "from the checkout servegate was installed from" in caught.value.hint
    assert not (tmp_path / "bench-charts.png").exists()


def test_lease_with_a_config_that_does_not_exist_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A typo in --config must not take the lease in the default directory while the
    team's jobs wait on the one the real config names."""
    assert main(["lease", "--config", str(tmp_path / "typo.toml"), "--", "true"]) == 2
    assert "not found" in capsys.readouterr().err


def test_report_with_a_config_that_does_not_exist_is_refused_and_no_records_say_why(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A typo in --config is a config error (2), not "nothing to do"; a stack that has
    bench in its gate but no release yet is told to promote, not to add bench."""
    assert main(["report", "--config", str(tmp_path / "typo.toml")]) == 2
    assert "typo.toml not found" in capsys.readouterr().err
    monkeypatch.chdir(tmp_path)
    assert main(["report"]) == 12
    assert "no servegate.toml here" in capsys.readouterr().err


def test_bench_load_refuses_the_single_stream_benchs_group_options(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """--concurrency (streams started together) is one letter from --concurrencies
    (closed-loop clients): a load sweep refuses it, and --repetitions, with what to use."""
    code = main(["bench", "load", "--url", "http://127.0.0.1:9", "--rates", "1",
                 "--concurrency", "4", "--repetitions", "9", "--no-lease", "--json"])  # fmt: skip
    doc = json.loads(capsys.readouterr().out)
    assert code == 2
    assert doc["error"]["message"].startswith("bench load takes no --repetitions or --concurrency")
    assert "--concurrencies 1,2,4" in doc["error"]["hint"]


def test_a_command_line_argparse_refuses_is_still_one_json_document_with_json(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as ended:
        main(["release", "promote", "--json", "--no-such-flag"])
    assert ended.value.code == 2
    captured = capsys.readouterr()
    doc = json.loads(captured.out)  # stdout holds the JSON document and nothing else
    assert doc["ok"] is False
    assert doc["exit_code"] == 2
    assert doc["error"]["class"] == "ConfigError"
    assert "error:" in doc["error"]["message"]
    assert "usage:" in captured.err  # people still get argparse's usage
    with pytest.raises(SystemExit):
        main(["release", "promote", "--no-such-flag"])
    assert capsys.readouterr().out == ""  # without --json, nothing on stdout


def test_the_gate_s_statistics_settings_default_as_the_config_declares() -> None:
    """verdict.Settings carries config.Gate's statistics settings into the rule: a
    default that differs between the two (no_baseline once did) fails here."""
    from servegate.judging import verdict

    declared = {f.name: _declared_default(f) for f in dataclasses.fields(config.Gate)}
    shared = [f for f in dataclasses.fields(verdict.Settings) if f.name in declared]
    assert len(shared) >= 6
    for f in shared:
        assert _declared_default(f) == declared[f.name], f"gate.{f.name}"
    # and a config's values reach the rule, every one of them
    gate = config.parse(
        '[stack]\nremote = "x"\n[gate]\nfalse_alarm = 0.02\nmiss = 0.05\ndrift = 0.03\n'
        'inconclusive = "fail"\nno_baseline = "first-release"\nrestart_offset = 0.04\n',
        environ={}, build_only=True,
    ).gate  # fmt: skip
    st = verdict.Settings.of(gate, first_release=True)
    for f in shared:
        assert getattr(st, f.name) == getattr(gate, f.name) != _declared_default(f), f.name
    assert st.first_release


def _flagged() -> list[tuple[str, type[Any], dataclasses.Field[Any], flags.Flag]]:
    hints = typing.get_type_hints(config.Config)
    return [
        (s.name, hints[s.name], f, flag)
        for s in dataclasses.fields(config.Config)
        if s.name != "path"
        for f, flag in flags.declared(hints[s.name])
    ]


def test_each_flag_is_declared_once_with_its_setting_and_named_in_its_doc_row() -> None:
    """A setting's flag lives in the config field's declaration (servegate.flags): its
    row in docs/config.md names the flag, and the command's help shows the field's own
    default, so neither can drift from the code."""
    text = (DOCS / "config.md").read_text()
    found = _flagged()
    assert {f"{s}.{f.name}" for s, _c, f, _ in found} >= {
        "bench.tiers", "bench.repetitions", "bench.max_tokens", "load.duration", "load.workload"
    }  # fmt: skip
    for section, _cls, f, flag in found:
        row = next(
            line for line in text.splitlines() if line.startswith(f"| `{section}.{f.name}` |")
        )
        assert f"`{flag.name}`" in row, f"{section}.{f.name}: its row does not name {flag.name}"
    helps = {a.dest: a.help or "" for a in _bench_parser("bench")._actions}
    assert helps["bench__repetitions"].endswith(
        f"(default: bench.repetitions, {config.Bench().repetitions})"
    )


def _bench_parser(*words: str) -> argparse.ArgumentParser:
    parser = cli.servegate_parser(["bench", *words[1:]])
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    bench: argparse.ArgumentParser = sub.choices["bench"]
    if len(words) == 1:
        return bench
    bsub = next(a for a in bench._actions if isinstance(a, argparse._SubParsersAction))
    chosen: argparse.ArgumentParser = bsub.choices[words[1]]
    return chosen


@pytest.mark.parametrize(
    ("argv", "want"),
    [
        (["--tiers", "16K,128k", "--concurrency", "1,4"],
         {"tiers": ("16k", "128k"), "concurrency": (1, 4)}),
        (["--no-warmup", "--ignore-eos", "--seed", "-1", "--tolerance", "12"],
         {"warmup": False, "ignore_eos": True, "seed": -1, "tolerance_pct": 12.0}),
        (["--repetitions", "14"], {"repetitions": 14, "max_repetitions": 14}),
        ([], {}),
    ],
)  # fmt: skip
def test_a_typed_flag_overrides_its_setting_and_the_rest_stand(
    argv: list[str], want: dict[str, Any]
) -> None:
    cfg = config.parse(
        '[stack]\nremote = "x"\n[bench]\ntiers = ["8k"]\nseed = 7\nmax_tokens = 64\n',
        environ={},
        build_only=True,
    )
    args = cli.servegate_parser(["bench"]).parse_args(["bench", *argv])
    got = bench_cmd.bench_settings(
        cfg, bench_cmd.Options(bench=flags.overrides(config.Bench, args))
    )
    expected = dataclasses.replace(cfg.bench, **want)
    assert got == expected
    assert got.max_tokens == 64  # the config's value, where no flag was typed


def test_a_bad_flag_value_is_argparse_s_error_naming_the_flag(
    capsys: pytest.CaptureFixture[str],
) -> None:
    for argv, says in (
        (["bench", "--concurrency", "1,x"], "argument --concurrency: '1,x': give whole numbers"),
        (["bench", "--repetitions", "three"], "argument --repetitions: 'three' is not a whole"),
        (["bench", "load", "--rates", "1", "--workload", "hot"],
         "argument --workload: 'hot' is not one of cold, shared-prefix"),
    ):  # fmt: skip
        with pytest.raises(SystemExit) as ended:
            main(argv)
        assert ended.value.code == 2
        assert says in capsys.readouterr().err


def test_bench_load_takes_the_load_settings_flags_over_the_declared_defaults() -> None:
    args = cli.servegate_parser(["bench", "load"]).parse_args(
        ["bench", "load", "--rates", "0.5,1", "--duration", "12", "--workload", "shared-prefix",
         "--prefix-share", "0.5", "--load-seed", "3", "--seed", "-1"]
    )  # fmt: skip
    spec = bench_cmd._load_spec(args)
    assert (spec.duration_s, spec.workload, spec.prefix_share, spec.seed) == (
        12.0, "shared-prefix", 0.5, 3
    )  # fmt: skip
    assert spec.burstiness == config.Load().burstiness
    # --seed is the bench's per-request seed, --load-seed the sweep's: two settings
    assert flags.overrides(config.Bench, args) == {"seed": -1}
