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
