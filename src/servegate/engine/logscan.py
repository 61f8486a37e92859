"""The server's output checked against the log rules: start-up and measured windows."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from servegate.engine.rules import Finding, Rule, RuleSet

MAX_EVIDENCE = 300


@dataclass
class Scan:
    findings: list[Finding] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)
    lines: int = 0

    @property
    def failures(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "fail"]

    def as_dict(self) -> dict[str, Any]:
        return {
            "lines": self.lines,
            "findings": [f.as_dict() for f in self.findings],
            "facts": self.facts,
        }


def expected_lines(launch_facts: Mapping[str, Any]) -> list[Rule]:
    """The profile's ``expect.log_lines`` as ``require`` rules."""
    expect = launch_facts.get("expect", {})
    lines = expect.get("log_lines", ()) if isinstance(expect, Mapping) else ()
    return [
        Rule(
            id="expect.log-line",
            kind="log",
            severity="fail",
            message=f"start-up never logged {line!r}, which the profile expects",
            remedy="see why the feature is off in the start-up log",
            require=line,
            phases=("startup",),
        )
        for line in lines
    ]


def scan(text: str, rules: RuleSet, launch_facts: Mapping[str, Any], phase: str) -> Scan:
    """Apply every log rule of ``phase`` to ``text``; ``require`` rules only at start-up."""
    lines = text.splitlines()
    out = Scan(lines=len(lines))
    selected = [r for r in rules.of("log") if phase in r.phases and r.applies(launch_facts)]
    if phase == "startup":
        selected += expected_lines(launch_facts)
    for rule in selected:
        if rule.require:
            if not any(rule.require in line for line in lines):
                out.findings.append(Finding(rule.id, rule.severity, rule.message, rule.remedy))
            continue
        pattern = re.compile(rule.pattern)
        hits = [(line, m) for line in lines if (m := pattern.search(line))]
        if not hits:
            continue
        if rule.severity == "fact":
            out.facts[rule.fact] = _value(hits[-1][1])
            continue
        more = f" (+{len(hits) - 1} more line(s))" if len(hits) > 1 else ""
        out.findings.append(
            Finding(
                rule.id,
                rule.severity,
                rule.message + more,
                rule.remedy,
                hits[0][0].strip()[:MAX_EVIDENCE],
            )
        )
    return out


def _value(match: re.Match[str]) -> Any:
    raw = match.group(1) if match.groups() else match.group(0)
    number = raw.replace(",", "")
    try:
        return int(number)
    except ValueError:
        pass
    try:
        return float(number)
    except ValueError:
        return raw


def window_check(rules: RuleSet, launch_facts: Mapping[str, Any]) -> Callable[[str], list[str]]:
    """The log rules of severity fail for a measured window, as reasons a trial is invalid."""

    def check(text: str) -> list[str]:
        found = scan(text, rules, launch_facts, "window").failures
        return [f"{f.rule}: {f.evidence or f.message}" for f in found]

    return check
