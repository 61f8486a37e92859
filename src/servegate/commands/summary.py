"""``servegate summary FILE``: a promote's JSON as Markdown, for a CI job summary."""

from __future__ import annotations

import argparse
import html
import json
from pathlib import Path
from typing import Any

from servegate.errors import ConfigError
from servegate.output import Output

ICON = {"released": "✅", "rolled_back": "↩️", "failed": "❌"}


def _esc(text: Any) -> str:
    """Text from outside servegate (a log line, a reason) as inert Markdown: the job
    summary renders HTML, so a crafted log line must not become markup there."""
    return html.escape(str(text), quote=False).replace("|", "\\|").replace("\n", " ")


def _table(head: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return lines + ["| " + " | ".join(_esc(c) for c in r) + " |" for r in rows]


def _num(value: Any, digits: int = 1) -> str:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return "-" if value is None else str(value)
    return f"{value:,.{digits}f}"


def _iv(value: Any) -> str:
    if isinstance(value, list | tuple) and len(value) == 2:
        return f"[{_num(value[0], 3)}, {_num(value[1], 3)}]"
    return "-"


def _obj(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _dicts(value: Any) -> list[dict[str, Any]]:
    """The entries of a list that are objects (a hand-edited file may hold anything)."""
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def markdown(doc: dict[str, Any]) -> str:
    result = _obj(doc.get("result"))
    error = _obj(doc.get("error"))
    verdict = str(result.get("verdict") or ("failed" if error else "unknown"))
    sha = str(result.get("sha", ""))
    lines = [
        f"## {ICON.get(verdict, '❔')} release {sha[:12]}: {verdict} (exit {doc.get('exit_code')})",
        "",
    ]
    if result.get("tag"):
        lines += [f"Tagged `{result['tag']}`.", ""]
    if result.get("reason") or error:
        lines += [f"**Why:** {_esc(result.get('reason') or error.get('message', ''))}", ""]
    record = _obj(result.get("record"))
    gate = _obj(record.get("gate"))
    checks = _dicts(gate.get("checks"))
    if checks:
        lines += [
            "### Gate",
            "",
            *_table(
                ["check", "verdict", "reason", "seconds"],
                [
                    [
                        str(c.get("name", "?")),
                        str(c.get("verdict", "?")),
                        str(c.get("reason", "")),
                        _num(c.get("seconds"), 2),
                    ]
                    for c in checks
                ],
            ),
            "",
        ]
    for check in checks:
        ev = _obj(check.get("evidence"))
        rows = _dicts(ev.get("rows"))
        if check.get("name") != "bench" or not rows:
            continue
        lines += [
            f"### Bench gate: {check.get('verdict')}",
            "",
            f"Baseline: {ev.get('baseline')}; {ev.get('method', '')}.",
            "",
            *_table(
                ["case", "metric", "baseline", "candidate", "ratio", "interval", "threshold",
                 "floor", "verdict"],
                [
                    [str(r.get("case", "?")), str(r.get("metric", "?")),
                     _num(r.get("baseline_median")), _num(r.get("candidate_median")),
                     _num(r.get("ratio"), 3), _iv(r.get("interval")),
                     _num(r.get("threshold"), 3), _num(r.get("floor")),
                     str(r.get("verdict", "?"))]
                    for r in rows
                ],
            ),
            "",
        ]  # fmt: skip
    stages = _dicts(result.get("stages"))
    if stages:
        lines += [
            "### Stages",
            "",
            *_table(
                ["stage", "status", "seconds", "detail"],
                [
                    [
                        str(s.get("name", "?")),
                        str(s.get("status", "?")),
                        _num(s.get("seconds"), 2),
                        str(s.get("detail", "")),
                    ]
                    for s in stages
                ],
            ),
            "",
        ]
    rollback = _obj(result.get("rollback"))
    if rollback:
        state = (
            "serving again, verified"
            if rollback.get("ok")
            else f"FAILED: {_esc(rollback.get('reason'))}"
        )
        lines += [f"**Rollback** to `{str(rollback.get('sha'))[:12]}`: {state}", ""]
    return "\n".join(lines)


def run(out: Output, path: Path) -> int:
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(
            f"cannot read {path}: {exc}", hint="pass the output of `release promote --json`"
        ) from None
    if not isinstance(doc, dict) or not ({"result", "error"} & set(doc)):
        shown = type(doc).__name__ if not isinstance(doc, dict) else "an object without result"
        raise ConfigError(
            f"{path} is not the output of `release promote --json` ({shown})",
            hint="pass the file `release promote SHA --json > promote.json` wrote",
        )
    command = doc.get("command")
    verdict = _obj(doc.get("result")).get("verdict")
    if (isinstance(command, str) and not command.startswith("release ")) or (
        "error" not in doc and verdict not in ICON
    ):
        what = f"`{command} --json`" if isinstance(command, str) else "no release's outcome"
        raise ConfigError(
            f"{path} is not the output of `release promote --json`: it is {what}"
            + (f" (verdict {verdict!r})" if verdict is not None else ""),
            hint="pass the file `release promote SHA --json > promote.json` wrote",
        )
    out.line(markdown(doc))
    return 0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", type=Path, help="output of `release promote --json`")
    p.add_argument("-v", "--verbose", action="store_true", help=argparse.SUPPRESS)


def main(args: argparse.Namespace, out: Output) -> int:
    return run(out, args.file)
