"""The release gate: named checks run against the restarted service, and one verdict.

A check is anything with a ``name`` and a ``run(ctx) -> CheckResult``. Checks are
registered by name (``register``) and chosen in the config (``[gate] checks``). The
built-in ``smoke`` check asks for one chat completion; the long-context bench plugs in
through the same interface.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from servegate.bench import probes
from servegate.config import Config
from servegate.engine import openai
from servegate.errors import ConfigError


class Verdict(enum.StrEnum):
    PASS = "PASS"
    FAIL = "FAIL"
    INCONCLUSIVE = "INCONCLUSIVE"


@dataclass(frozen=True)
class GateContext:
    cfg: Config
    endpoint: openai.Endpoint
    model: str
    sha: str
    release_dir: Path
    #: the record of the release that served before this one, if any
    previous_record: dict[str, Any] | None
    #: the service log since the restart (for checks that scan it)
    service_log: Callable[[int], str]


@dataclass(frozen=True)
class CheckResult:
    name: str
    verdict: Verdict
    reason: str
    seconds: float
    evidence: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "verdict": str(self.verdict),
            "reason": self.reason,
            "seconds": round(self.seconds, 3),
            "evidence": self.evidence,
        }


class GateCheck(Protocol):
    name: str

    def run(self, ctx: GateContext) -> CheckResult: ...


class SmokeCheck:
    name = "smoke"

    def run(self, ctx: GateContext) -> CheckResult:
        p = ctx.cfg.probes
        result = probes.smoke(
            ctx.endpoint, ctx.model, p.smoke_prompt, p.smoke_max_tokens, p.timeout
        )
        verdict = Verdict.PASS if result.ok else Verdict.FAIL
        return CheckResult("smoke", verdict, result.reason, result.seconds, result.evidence)


_REGISTRY: dict[str, Callable[[Config], GateCheck]] = {"smoke": lambda cfg: SmokeCheck()}


def register(name: str, factory: Callable[[Config], GateCheck]) -> None:
    _REGISTRY[name] = factory


def known_checks() -> list[str]:
    return sorted(_REGISTRY)


def build_checks(cfg: Config) -> list[GateCheck]:
    unknown = [c for c in cfg.gate.checks if c not in _REGISTRY]
    if unknown:
        raise ConfigError(
            f"gate.checks names unknown check(s): {', '.join(unknown)}",
            hint=f"known checks: {', '.join(known_checks())}",
        )
    return [_REGISTRY[name](cfg) for name in cfg.gate.checks]


@dataclass(frozen=True)
class Decision:
    verdict: Verdict
    results: tuple[CheckResult, ...]

    @property
    def failures(self) -> list[CheckResult]:
        return [r for r in self.results if r.verdict is not Verdict.PASS]

    def as_dict(self) -> dict[str, Any]:
        return {"verdict": str(self.verdict), "checks": [r.as_dict() for r in self.results]}


def decide(results: list[CheckResult]) -> Verdict:
    verdicts = {r.verdict for r in results}
    if Verdict.FAIL in verdicts:
        return Verdict.FAIL
    if Verdict.INCONCLUSIVE in verdicts:
        return Verdict.INCONCLUSIVE
    return Verdict.PASS


def run_gate(checks: list[GateCheck], ctx: GateContext) -> Decision:
    results: list[CheckResult] = []
    for check in checks:
        start = time.monotonic()
        try:
            results.append(check.run(ctx))
        except Exception as exc:  # a broken check is a failed gate, never a pass
            results.append(
                CheckResult(
                    check.name,
                    Verdict.FAIL,
                    f"the check crashed: {exc!r}",
                    time.monotonic() - start,
                )
            )
    return Decision(decide(results), tuple(results))
