"""The release gate: named checks run against the restarted service, and one verdict.

A check is anything with a ``name`` and a ``run(ctx) -> CheckResult``. Checks are
registered by name (``register``) and chosen in the config (``[gate] checks``). The
built-in ``smoke`` check asks for one chat completion; the long-context bench plugs in
through the same interface.
"""

from __future__ import annotations

import contextlib
import enum
import json
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from servegate.bench import probes, results
from servegate.config import DEFAULT_CORRECTNESS, Config
from servegate.engine import openai
from servegate.errors import ConfigError
from servegate.gpu import health
from servegate.pipeline import atomic
from servegate.pipeline.stages import QuietReporter, Reporter
from servegate.release import bench_gate, load_gate
from servegate.release.record import CheckRecord, GateRecord, ReleaseRecord


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
    previous_record: ReleaseRecord | None
    #: the service log since the restart (for checks that scan it)
    service_log: Callable[[int], str]
    #: the file the service logs to, if it is a file (the bench scans measured windows)
    log_file: Path | None = None
    reporter: Reporter = field(default_factory=QuietReporter)
    environ: Mapping[str, str] = field(default_factory=dict)
    #: the launch command (secrets redacted), recorded in bench results
    command: str = ""
    #: log rules for a measured window: the text → reasons a trial is invalid
    window_check: Callable[[str], list[str]] | None = None
    #: the host has no released record of the stack at all (gate.no_baseline)
    first_release: bool = False
    #: restarts the candidate service and proves it again (healthy, log rules,
    #: provenance), returning what it saw; None where the check may not restart it
    restart: Callable[[], dict[str, Any]] | None = None
    #: the fresh baseline: the live release measured before the switch (gate.baseline)
    live: bench_gate.LiveBench | None = None
    #: judges the candidate's bench samples against this host's release history
    trend: Callable[[results.Samples], dict[str, Any]] | None = None


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


def _probe_result(result: probes.ProbeResult) -> CheckResult:
    verdict = Verdict.PASS if result.ok else Verdict.FAIL
    return CheckResult(result.name, verdict, result.reason, result.seconds, result.evidence)


class CorrectnessCheck:
    name = "correctness"

    def run(self, ctx: GateContext) -> CheckResult:
        p = ctx.cfg.probes
        cases = p.correctness or DEFAULT_CORRECTNESS
        return _probe_result(probes.correctness(ctx.endpoint, ctx.model, cases, p.timeout))


class PrefixReuseCheck:
    name = "prefix_reuse"

    def run(self, ctx: GateContext) -> CheckResult:
        p = ctx.cfg.probes
        return _probe_result(
            probes.prefix_reuse(
                ctx.endpoint, ctx.model, p.prefix_tier, p.prefix_min_cached,
                p.prefix_max_ttft_ratio, p.timeout,
            )
        )  # fmt: skip


class VisionCheck:
    name = "vision"

    def run(self, ctx: GateContext) -> CheckResult:
        p = ctx.cfg.probes
        return _probe_result(
            probes.vision(
                ctx.endpoint, ctx.model, p.vision_size, p.vision_followup_tier,
                p.prefix_min_cached, p.prefix_max_ttft_ratio, p.timeout,
            )
        )  # fmt: skip


class SpecDecodeCheck:
    name = "spec_decode"

    def run(self, ctx: GateContext) -> CheckResult:
        p = ctx.cfg.probes
        return _probe_result(
            probes.spec_decode(ctx.endpoint, ctx.model, p.timeout, p.spec_min_acceptance)
        )


class BenchCheck:
    """The long-context bench against the live release's samples (see bench_gate)."""

    name = bench_gate.CHECK

    def run(self, ctx: GateContext) -> CheckResult:
        start = time.monotonic()
        before = _gpus(ctx)
        try:
            evidence = bench_gate.run(
                ctx.cfg, ctx.endpoint, ctx.model, ctx.sha, ctx.previous_record, ctx.log_file,
                ctx.reporter, ctx.environ, command=ctx.command, window_check=ctx.window_check,
                first_release=ctx.first_release, restart=ctx.restart, live=ctx.live,
                trend=ctx.trend,
            )  # fmt: skip
        except Exception as exc:  # a bench that broke on sick GPUs judges nothing either
            evidence = {"verdict": str(Verdict.FAIL), "why": f"the check crashed: {exc!r}"}
            judged = on_healthy_gpus(evidence, before, _gpus(ctx))
            if judged["verdict"] == str(Verdict.FAIL):
                raise
            return _measured(self.name, start, judged)
        return _measured(self.name, start, on_healthy_gpus(evidence, before, _gpus(ctx)))


class LoadCheck:
    """A load sweep of the candidate against the live release's sweep (see load_gate);
    its rows are reported only unless ``[[load.rules]]`` makes them required."""

    name = load_gate.CHECK

    def __init__(self, cfg: Config) -> None:
        load_gate.check_config(cfg)  # refused before anything is deployed

    def run(self, ctx: GateContext) -> CheckResult:
        start = time.monotonic()
        before = _gpus(ctx)
        evidence = load_gate.run(
            ctx.cfg, ctx.endpoint, ctx.model, ctx.sha, ctx.previous_record, ctx.reporter,
            ctx.environ, command=ctx.command, first_release=ctx.first_release,
        )  # fmt: skip
        return _measured(self.name, start, on_healthy_gpus(evidence, before, _gpus(ctx)))


def _gpus(ctx: GateContext) -> health.Snapshot | None:
    """The GPU health around a measurement; a check that breaks is an unhealthy
    snapshot, never a crash of the gate."""
    try:
        return health.for_release(ctx.cfg, ctx.environ or os.environ)
    except Exception as exc:
        snap = health.Snapshot(at=health.now())
        snap.findings.append(
            health.Finding(
                "tool",
                "fail",
                f"the GPU health check itself failed: {exc!r:.300}",
                "run `servegate gpu health` and report what it says",
            )
        )
        return snap


def on_healthy_gpus(
    evidence: dict[str, Any], before: health.Snapshot | None, after: health.Snapshot | None
) -> dict[str, Any]:
    """A measuring check's evidence with the GPU health before and after it (also in its
    result file); measured on GPUs that were not healthy, it judges nothing: INCONCLUSIVE
    with the reason, never a PASS or a FAIL of the release."""
    if before is None and after is None:
        return evidence
    evidence["gpu_health"] = {"before": health.brief(before), "after": health.brief(after)}
    result_file = evidence.get("result_file")
    if result_file and Path(result_file).is_file():
        with contextlib.suppress(OSError, ValueError):
            doc = json.loads(Path(result_file).read_text())
            doc["gpu_health"] = evidence["gpu_health"]
            atomic.write_json(Path(result_file), doc)
    sick = [
        (when, s)
        for when, s in (("before", before), ("after", after))
        if s is not None and not s.healthy
    ]
    if sick:
        when, snap = sick[-1]
        evidence["why"] = (
            f"the GPUs were not healthy {when} the measurement, so its numbers judge "
            f"neither a pass nor a fail of the release: {snap.summary()} (the measurement "
            f"alone: {evidence['verdict']}, {str(evidence.get('why', ''))[:300]})"
        )
        evidence["verdict"] = str(Verdict.INCONCLUSIVE)
    return evidence


def _measured(name: str, start: float, evidence: dict[str, Any]) -> CheckResult:
    """A measuring check's result: its evidence carries the verdict and why."""
    return CheckResult(
        name, Verdict(evidence["verdict"]), evidence["why"], time.monotonic() - start, evidence
    )


_REGISTRY: dict[str, Callable[[Config], GateCheck]] = {
    "load": LoadCheck,
    "smoke": lambda cfg: SmokeCheck(),
    "bench": lambda cfg: BenchCheck(),
    "correctness": lambda cfg: CorrectnessCheck(),
    "prefix_reuse": lambda cfg: PrefixReuseCheck(),
    "vision": lambda cfg: VisionCheck(),
    "spec_decode": lambda cfg: SpecDecodeCheck(),
}


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

    def record(self) -> GateRecord:
        """The decision as the release record keeps it."""
        return GateRecord(
            str(self.verdict),
            [CheckRecord(r.name, str(r.verdict), r.reason, round(r.seconds, 3), r.evidence)
             for r in self.results],
        )  # fmt: skip


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
