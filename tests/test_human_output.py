"""Human-mode output is text, never markup: a "[section]" prints as written, and a
message holding "[/" cannot crash the error handler."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console

from servegate.cli import main
from servegate.errors import ConfigError
from servegate.output import Output
from servegate.pipeline.stages import ConsoleReporter, StageResult, Status


def test_a_config_error_names_its_section(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "servegate.toml"
    path.write_text('[stack]\nremote = "x"\n[host]\nroot = "/tmp/h"\n[service]\nprot = 8000\n')
    code = main(["config", "check", "--config", str(path)])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "[service]" in err
    assert "did you mean 'port'" in err


def test_an_error_with_closing_markup_prints_as_written(
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = Output(json_mode=False, command="x")
    code = out.error(ConfigError("bad value [/red] in [gate.rules]", hint="fix [/ it"))
    err = capsys.readouterr().err
    assert code == 2
    assert "bad value [/red] in [gate.rules]" in err
    assert "fix [/ it" in err


def test_stage_details_and_tables_are_text() -> None:
    buffer = io.StringIO()
    console = Console(file=buffer, width=200, highlight=False)
    ConsoleReporter(console).stage_ended(
        StageResult("lint", Status.OK, 0.5, "rule [/x] in [service.params]")
    )
    out = Output(json_mode=False, command="x", console=console, err=console)
    out.table("live [release]", ["pid", "command"], [["1", "python -m x [/bad] [a]"]])
    text = buffer.getvalue()
    assert "rule [/x] in [service.params]" in text
    assert "live [release]" in text
    assert "python -m x [/bad] [a]" in text


def test_a_table_in_a_log_cuts_nothing_that_names_a_case_a_verdict_or_an_error() -> None:
    """In CI (no terminal) a table wider than the log's 120 columns keeps every cell
    whole on its row: the tier of a case, a verdict, a history reason, an SSH error."""
    buffer = io.StringIO()
    out = Output(json_mode=False, command="x", console=Console(file=buffer, width=120))
    reason = ("regular-128k prefill_tps: ratio 0.941 (lower bound 0.902 < 0.950): at the cap the "
              "interval still holds a loss of 5% (these samples resolve 9%): not a pass")  # fmt: skip
    ssh = "ssh: connect to host gpu-box-07.example.internal port 22: Connection timed out"
    out.table("history", ["sha", "case", "verdict", "reason", "host"],
              [["0123456789ab", "regular-128k", "INCONCLUSIVE", reason, ssh]])  # fmt: skip
    lines = buffer.getvalue().splitlines()
    row = next(line for line in lines if "0123456789ab" in line)
    for cell in ("regular-128k", "INCONCLUSIVE", reason, ssh):
        assert cell in row, row
    assert "…" not in buffer.getvalue()


def test_a_failure_reported_as_a_result_still_carries_an_error_object(
    capsys: pytest.CaptureFixture[str],
) -> None:
    import json

    out = Output(json_mode=True, command="bench gate")
    assert out.emit({"verdict": "FAIL", "rows": []}, 9) == 9
    doc = json.loads(capsys.readouterr().out)
    assert doc["error"]["class"] == "GateFailed"
    assert doc["error"]["message"] == "FAIL"
    assert out.emit({"ok": True}, 0) == 0
    assert "error" not in json.loads(capsys.readouterr().out)


def test_summary_of_a_foreign_or_partial_file_is_an_error_or_markdown(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    listed = tmp_path / "list.json"
    listed.write_text("[1, 2]")
    assert main(["summary", str(listed)]) == 2
    assert "not the output of `release promote --json` (list)" in capsys.readouterr().err
    partial = tmp_path / "partial.json"
    partial.write_text(json.dumps({"exit_code": 9, "result": {
        "verdict": "rolled_back", "sha": "a" * 40, "stages": [{"name": "build"}, "junk"],
        "record": {"gate": {"checks": [{"name": "bench", "verdict": "FAIL",
                                        "evidence": {"rows": [{"ratio": "x"}]}}]}}}}))  # fmt: skip
    assert main(["summary", str(partial)]) == 0
    text = capsys.readouterr().out
    assert "| build | ? | - |  |" in text
    assert "### Bench gate: FAIL" in text
