"""``servegate summary FILE``: a promote's JSON as Markdown, for a CI job summary."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from servegate.errors import ConfigError
from servegate.output import Output

ICON = {"released": "✅", "rolled_back": "↩️", "failed": "❌"}


def _table(head: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return lines + [
        "| " + " | ".join(c.replace("|", "\\|").replace("\n", " ") for c in r) + " |" for r in rows
    ]


def _num(value: Any, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _iv(value: Any) -> str:
    return f"[{value[0]:.3f}, {value[1]:.3f}]" if value else "-"


def markdown(doc: dict[str, Any]) -> str:
    result = doc.get("result") or {}
    error = doc.get("error") or {}
    verdict = str(result.get("verdict") or ("failed" if error else "unknown"))
    sha = str(result.get("sha", ""))
    lines = [
        f"## {ICON.get(verdict, '❔')} release {sha[:12]}: {verdict} (exit {doc.get('exit_code')})",
        "",
    ]
    if result.get("tag"):
        lines += [f"Tagged `{result['tag']}`.", ""]
    if result.get("reason") or error:
        lines += [f"**Why:** {result.get('reason') or error.get('message', '')}", ""]
    checks = (result.get("record") or {}).get("gate", {}).get("checks", [])
    if checks:
        lines += [
            "### Gate",
            "",
            *_table(
                ["check", "verdict", "reason", "seconds"],
                [[c["name"], c["verdict"], c["reason"], f"{c['seconds']:.2f}"] for c in checks],
            ),
            "",
        ]
    for check in checks:
        ev = check.get("evidence") or {}
        rows = ev.get("rows") or []
        if check.get("name") != "bench" or not rows:
            continue
        lines += [
            f"### Bench gate: {check['verdict']}",
            "",
            f"Baseline: {ev.get('baseline')}; {ev.get('method', '')}.",
            "",
            *_table(
                ["case", "metric", "baseline", "candidate", "ratio", "interval", "threshold",
                 "floor", "verdict"],
                [
                    [r["case"], r["metric"], _num(r["baseline_median"]),
                     _num(r["candidate_median"]), _num(r["ratio"], 3),
                     _iv(r["interval"]), _num(r["threshold"], 3),
                     _num(r["floor"]), r["verdict"]]
                    for r in rows
                ],
            ),
            "",
        ]  # fmt: skip
    stages = result.get("stages") or []
    if stages:
        lines += [
            "### Stages",
            "",
            *_table(
                ["stage", "status", "seconds", "detail"],
                [[s["name"], s["status"], f"{s['seconds']:.2f}", s["detail"]] for s in stages],
            ),
            "",
        ]
    rollback = result.get("rollback") or {}
    if rollback:
        state = (
            "serving again, verified" if rollback.get("ok") else f"FAILED: {rollback.get('reason')}"
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
    out.line(markdown(doc))
    return 0
