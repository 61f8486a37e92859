"""The ``bench`` gate check: measure the restarted release and judge it against a baseline.

Baseline (``gate.baseline``):

- ``fresh`` (the default): the live release measured again during the promote, on the
  same cases, after the build and before the switch (:class:`LiveBench`), so both sides
  see the box in the same state. Where the plan spreads the repetitions over several
  service starts, the design is **ABAB**: live, candidate, live, candidate, the service
  switched back and forth and proven at every start, so that the restart offset and the
  box's drift fall on both sides alike; it costs the same starts as measuring one side
  after the other. Where the live release cannot be measured (it is not serving, does not
  prove, or fails its bench) the recorded samples are used and the evidence says why.
- ``recorded``: the samples the live release's own gate recorded (same host, same bench
  fingerprint): hours or weeks old, another start, another state of the box.
- a path: a result file.

While a required row is INCONCLUSIVE the check measures the candidate again, up to
``bench.max_repetitions``; then ``gate.inconclusive`` decides. Where ``[trend]`` is
enabled, the candidate is also judged against the best of the last released records
(:mod:`servegate.judging.trend`): a trend FAIL fails the check.
"""

from __future__ import annotations

import datetime as dt
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from servegate import documents, hostpaths
from servegate.bench import results
from servegate.bench.cases import Spec, parse_cases, spec_from_config
from servegate.bench.document import fingerprint
from servegate.bench.driver import Bench, LogWindow
from servegate.bench.results import spread as spread  # where the gate spreads its starts
from servegate.config import Config
from servegate.engine.openai import Endpoint
from servegate.errors import BenchFailed, ResultFileError, ServegateError
from servegate.judging import noise, stats, verdict
from servegate.pipeline.stages import Reporter
from servegate.release.record import ReleaseRecord, host_id
from servegate.release.state import HostState

CHECK = "bench"


def rules(cfg: Config) -> list[verdict.Rule]:
    configured = [
        verdict.Rule(r.metric, r.direction, r.tolerance, r.floor, r.cases) for r in cfg.gate.rules
    ]
    chosen = configured or list(verdict.DEFAULT_RULES)
    if cfg.gate.floors:
        chosen += verdict.floors(cfg.gate.floors)
    return chosen


def settings(
    cfg: Config,
    first_release: bool = False,
    looks: int = 1,
    first: int = 0,
    found: Mapping[str, noise.Noise] | None = None,
) -> verdict.Settings:
    """The verdict's settings from the config: ``looks`` planned looks from ``first``
    candidate samples, the box's noise record ``found`` (``bench noise``)."""
    return verdict.Settings.of(
        cfg.gate, looks=looks, first=first, first_release=first_release, noise=dict(found or {})
    )


def plan(cfg: Config, found: Mapping[str, noise.Noise]) -> list[dict[str, Any]]:
    """Per deciding row with a noise estimate: the repetitions and service starts that
    resolve its tolerance (None: not within bench.max_repetitions and bench.max_starts)
    and the loss the box resolves at the cap."""
    b, g = cfg.bench, cfg.gate
    cases = [
        c for c in parse_cases(b.profiles, b.tiers, b.concurrency, b.report_only) if c.required
    ]
    chosen = [r for r in rules(cfg) if r.tolerance < 1]
    deciding = sum(1 for c in cases for r in chosen if verdict.covers(r, c.id))
    rows = []
    for case in cases:
        for rule in chosen:
            est = found.get(f"{case.id}:{rule.metric}")
            if est is None or not verdict.covers(rule, case.id):
                continue
            prior = est.samples - est.starts
            split = stats.plan_starts(est.cv, est.offset, rule.tolerance, g.false_alarm,
                                      g.miss, deciding, b.repetitions, b.max_repetitions,
                                      b.max_starts, prior)  # fmt: skip
            levels = stats.Levels.split(g.false_alarm / 2, g.miss, deciding, 1)
            rows.append({
                "case": case.id, "metric": rule.metric, "tolerance": rule.tolerance,
                "cv": est.cv, "offset": est.offset,
                "repetitions": split[0] if split else None,
                "starts": split[1] if split else None,
                "resolves": stats.resolvable(est.cv, est.offset, levels, b.max_repetitions,
                                             b.max_starts, prior),
            })  # fmt: skip
    return rows


def design(planned: list[dict[str, Any]], reps: int, cap: int, max_starts: int) -> tuple[int, int]:
    """(repetitions measured before the first look, service starts they are spread
    over): what the plan's most demanding row needs, within the caps. A row the box
    cannot resolve asks for the caps (said before measuring; its row will not PASS)."""
    first = max([reps] + [r["repetitions"] or cap for r in planned])
    first = min(first, cap)
    starts = max([1] + [r["starts"] or max_starts for r in planned])
    return first, min(starts, max_starts, first)


def unresolved(rows: list[dict[str, Any]], cap: int, max_starts: int = 1) -> list[str]:
    """ "this box resolves 12 %, not 5 %" for each row the box cannot resolve at the cap."""
    starts = f" over {max_starts} service starts" if max_starts > 1 else ""
    return [
        f"{r['case']} {r['metric']}: this box resolves {r['resolves']:.0%}, not "
        f"{r['tolerance']:.0%} within bench.max_repetitions = {cap}{starts} (CV "
        f"{r['cv']:.1%}, restart offset {r['offset']:.1%})"
        for r in rows
        if r["repetitions"] is None
    ]


def noise_check(cfg: Config) -> tuple[list[str], str]:
    """What ``config check`` says about the box's measured noise and the gate's rules:
    (warnings, the plan and its cost on this box, "" without a noise record)."""
    spec = spec_from_config(cfg.bench, Endpoint(""), cfg.service.model)
    found, about = noise.load(cfg.host_root, str(fingerprint(spec)["digest"]))
    if not found:
        return [f"the gate cannot plan its repetitions: {about}"], ""
    b = cfg.bench
    planned = plan(cfg, found)
    return unresolved(planned, b.max_repetitions, b.max_starts), _plan_line(cfg, planned)


def _plan_line(cfg: Config, planned: list[dict[str, Any]]) -> str:
    """What the gate's plan costs on this box: repetitions, service starts a side and,
    where the live release's start-up time is known, the minutes of start-ups the ABAB
    design spends (a fresh baseline alternates live and candidate: ``2k - 1`` starts)."""
    b = cfg.bench
    first, starts = design(planned, b.repetitions, b.max_repetitions, b.max_starts)
    line = f"the gate's plan: {first} repetitions a side"
    if starts <= 1:
        return line + " in one service start (the restart offset does not need more)"
    line += f" over {starts} service starts (the restart offset needs them; bench.max_starts"
    line += f" caps it): {2 * starts - 1} starts with the fresh baseline's ABAB design"
    state_file = hostpaths.of(cfg).state
    if state_file.exists():
        try:
            current = HostState.load(state_file).current
        except ServegateError:
            current = None
        if current is not None and current.startup_seconds > 0:
            minutes = (2 * starts - 1) * current.startup_seconds / 60
            line += (f", about {minutes:.0f} min of start-ups at the live release's "
                     f"{current.startup_seconds:.0f} s")  # fmt: skip
    return line


def results_dir(cfg: Config) -> Path:
    if cfg.bench.results_dir:
        return Path(cfg.bench.results_dir)
    return hostpaths.of(cfg).bench if cfg.host.root else Path("bench-results")


def recorded_samples(record: ReleaseRecord | None) -> dict[str, Any] | None:
    """The bench samples a release record's gate kept, if any."""
    check = record.gate.check(CHECK) if record and record.gate else None
    samples = check.evidence.get("samples") if check else None
    return samples if isinstance(samples, dict) else None


def baseline(
    cfg: Config, previous_record: ReleaseRecord | None, fingerprint: Mapping[str, Any]
) -> tuple[results.Samples | None, str]:
    """(samples, what they are). A configured result file must match; the live release's
    samples that don't match are no baseline (and the note says why)."""
    if cfg.gate.baseline not in ("fresh", "recorded"):
        base = results.load(Path(cfg.gate.baseline))
        lenient = not base.harness.startswith("servegate")
        planned = {str(c): results.CaseSamples(str(c)) for c in fingerprint.get("cases") or []}
        ours = results.Samples("this bench", "servegate-bench", dict(fingerprint), planned)
        problems = results.check_comparable(base, ours, lenient)
        if problems:
            raise ResultFileError(
                f"baseline {cfg.gate.baseline} cannot be compared: {'; '.join(problems)}",
                hint="re-measure the baseline with the same [bench] settings, or fix gate.baseline",
            )
        differs = results.lenient_differences(base, ours) if lenient else []
        said = f" (compared leniently although {'; '.join(differs)})" if differs else ""
        return base, f"result file {cfg.gate.baseline}{said}"
    if previous_record is None:
        return None, "no live release recorded"
    sha = previous_record.sha[:12]
    doc = recorded_samples(previous_record)
    if doc is None:
        return None, f"the live release {sha} has no recorded bench samples"
    mine = host_id(cfg)
    theirs = previous_record.host_id or f"hostname:{previous_record.host}"
    if theirs != mine:
        return None, f"the live release {sha} was measured on another host ({theirs}, not {mine})"
    try:
        base = results.from_record(doc, f"live release {sha}")
    except documents.DocumentError as exc:
        return None, f"the live release {sha}'s recorded bench samples are damaged: {exc}"
    if base.fingerprint.get("digest") != fingerprint.get("digest"):
        diffs = [
            k for k in sorted(set(base.fingerprint) | set(fingerprint))
            if k != "digest" and base.fingerprint.get(k) != fingerprint.get(k)
        ]  # fmt: skip
        return None, f"the live release {sha} was measured differently ({', '.join(diffs)})"
    return base, f"live release {sha}"


@dataclass
class Layout:
    """How the check measures: the noise record, the plan from it, the repetitions before
    the first look and the service starts they are spread over."""

    found: dict[str, noise.Noise]
    about: str
    planned: list[dict[str, Any]]
    first: int
    starts: int


def layout(cfg: Config, spec: Spec) -> Layout:
    found, about = noise.load(cfg.host_root, str(fingerprint(spec)["digest"]))
    planned = plan(cfg, found)
    first, starts = design(planned, spec.repetitions, cfg.bench.max_repetitions,
                           cfg.bench.max_starts)  # fmt: skip
    return Layout(dict(found), about, planned, first, starts)


class LiveBench:
    """The live release measured again during the promote (``gate.baseline = "fresh"``).

    :meth:`begin` measures its first block while it still serves, before the switch; the
    bench check then measures the candidate, and where the plan spreads the repetitions
    over service starts and ``to_live`` can put the live release back, alternates:
    ``to_live()`` (switch to the live release and prove it), a live block, the candidate
    switched back and proven, a candidate block. Without ``to_live`` the live release
    is measured in its running start only, and the evidence says so."""

    def __init__(
        self,
        cfg: Config,
        endpoint: Endpoint,
        model: str,
        sha: str,
        reporter: Reporter,
        environ: Mapping[str, str],
        *,
        log_file: Path | None = None,
        window_check: Callable[[str], list[str]] | None = None,
        to_live: Callable[[], dict[str, Any]] | None = None,
        cannot_alternate: str = "",
    ) -> None:
        self.sha = sha
        self.reporter = reporter
        stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S")
        output = results_dir(cfg) / f"{stamp}-{sha[:12]}-baseline.json"
        spec = spec_from_config(cfg.bench, endpoint, model, "", socket.gethostname())
        self.bench = Bench(spec, output, reporter, LogWindow(log_file) if log_file else None,
                           environ)  # fmt: skip
        self.bench.window_check = window_check
        self.layout = layout(cfg, spec)
        self.blocks = spread(self.layout.first, self.layout.starts)
        if self.layout.starts > 1 and to_live is None:
            self.design = "fresh"
            self.why = (
                f"the plan spreads the candidate over {self.layout.starts} service starts, "
                f"but {cannot_alternate or 'the live release cannot be switched back to'}: "
                "the live release is measured in its running start only"
            )
            self.blocks = [self.layout.first]
        elif self.layout.starts > 1:
            self.design = "abab"
            self.why = (
                f"the box's restart offset needs {self.layout.starts} service starts a side: "
                "live and candidate alternate, so the offset and the box's drift fall on "
                "both alike (the same starts as one side after the other)"
            )
        else:
            self.design = "fresh"
            self.why = (
                "one service start a side resolves the tolerance: the live release in its "
                "running start, then the candidate"
            )
        self.to_live = to_live if self.design == "abab" else None
        #: what each switch back to the live release saw (provenance, start-up)
        self.switches: list[dict[str, Any]] = []
        #: why the fresh baseline could not be measured ("" while it can)
        self.failed = ""
        #: the reason is one the candidate could have caused (its build changed the live
        #: service): no fallback to recorded samples, the check is INCONCLUSIVE
        self.forced = False

    def begin(self) -> None:
        """Prepare, warm up and measure the first block of the live release as it serves."""
        try:
            self.bench.prepare()
            self.bench.warm_up()
            for case in self.bench.spec.cases:
                self.bench.measure(case, self.blocks[0])
        except BenchFailed as exc:
            self.failed = f"the live release's bench failed: {exc}"
            self.bench.fail("failed", str(exc))

    def block(self, count: int) -> None:
        """Switch back to the live release, prove it, measure ``count`` more of each case."""
        assert self.to_live is not None
        self.reporter.note(
            f"bench gate: switching back to the live release {self.sha[:12]} (ABAB design: "
            f"{len(self.switches) + 2} of {len(self.blocks)} starts a side)"
        )
        self.switches.append(self.to_live())
        self.bench.restarted()
        self.bench.warm_up()
        for case in self.bench.spec.cases:
            self.bench.measure(case, count)

    def samples(self) -> results.Samples:
        return results.from_result(self.bench.result, f"live release {self.sha[:12]}")

    def finish(self) -> None:
        if not self.failed:
            self.bench.finish()

    def describe(self) -> dict[str, Any]:
        counts = [len(c["groups"]) for c in self.bench.result["cases"]]
        return {
            "name": self.design,
            "why": self.why,
            "first": self.layout.first,
            "starts": self.layout.starts,
            "live_repetitions": max(counts, default=0),
            "live_starts": 1 + len(self.switches),
            "switches": self.switches,
            "baseline_result_file": str(self.bench.output),
        }


def run(
    cfg: Config,
    endpoint: Endpoint,
    model: str,
    sha: str,
    previous_record: ReleaseRecord | None,
    log_file: Path | None,
    reporter: Reporter,
    environ: Mapping[str, str],
    *,
    command: str = "",
    window_check: Callable[[str], list[str]] | None = None,
    first_release: bool = False,
    restart: Callable[[], dict[str, Any]] | None = None,
    live: LiveBench | None = None,
    trend: Callable[[results.Samples], dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Measure, decide, and return the evidence (``verdict`` is PASS, FAIL or INCONCLUSIVE).

    ``restart``: restarts the candidate service and proves it again (healthy, provenance);
    called between service starts when the box's restart offset needs the repetitions
    spread (:func:`plan`); in the ABAB design it switches the service back to the
    candidate. Without it every repetition runs in one start. ``live``: the fresh
    baseline, its first block measured before the switch. ``trend``: judges the
    candidate's samples against the release history
    (:func:`servegate.release.trend.judge_candidate`)."""
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S")
    output = results_dir(cfg) / f"{stamp}-{sha[:12]}.json"
    spec = spec_from_config(cfg.bench, endpoint, model, command, socket.gethostname())
    bench = Bench(spec, output, reporter, LogWindow(log_file) if log_file else None, environ)
    bench.window_check = window_check
    evidence: dict[str, Any] = {
        "result_file": str(output),
        "fingerprint": bench.result["fingerprint"],
        "weaker_evidence": [],
    }
    if log_file is None:  # e.g. systemd-user: the journal, not a file
        evidence["weaker_evidence"].append(
            "compile/JIT lines inside measured windows were not checked: the service's log "
            "is not a file servegate can read by offset"
        )
    if not cfg.bench.reference:
        evidence["weaker_evidence"].append(
            "bench.reference = false: a change of the box cannot be told from a change of "
            "the release"
        )
    fresh = live is not None and not live.failed
    if live is not None and live.forced:
        why = (
            f"no fair baseline: {live.failed} (the candidate's build ran beside it; where the "
            "live release itself is at fault, gate.baseline = 'recorded' compares with its "
            "recorded samples instead)"
        )
        reporter.note(f"bench gate INCONCLUSIVE — {why}")
        return {**evidence, "verdict": verdict.INCONCLUSIVE, "why": why, "rows": []}
    if live is not None and live.failed:
        evidence["weaker_evidence"].append(
            f"no fresh baseline ({live.failed}): compared with the live release's recorded "
            "samples instead"
        )
    if live is not None and fresh and live.design == "fresh" and live.layout.starts > 1:
        evidence["weaker_evidence"].append(live.why)
    for line in evidence["weaker_evidence"]:
        reporter.note(f"bench gate, weaker evidence: {line}")
    base: results.Samples | None = None
    if not fresh:
        try:
            base, about = baseline(cfg, previous_record, bench.result["fingerprint"])
        except ResultFileError as exc:
            return {**evidence, "verdict": verdict.FAIL, "why": str(exc), "rows": []}
        evidence["baseline"] = about
    shape = live.layout if live is not None and fresh else layout(cfg, spec)
    evidence["noise"] = {"about": shape.about, "plan": shape.planned}
    for line in unresolved(shape.planned, cfg.bench.max_repetitions, cfg.bench.max_starts):
        reporter.note(f"bench gate: {line}")
    first, starts = shape.first, shape.starts
    if starts > 1 and restart is None:
        evidence["weaker_evidence"].append(
            f"the box's restart offset needs the repetitions spread over {starts} service "
            "starts, and this run cannot restart the service: one start measured"
        )
        starts = 1
    evidence["starts"] = starts
    alternate = live if fresh and live is not None and live.to_live is not None else None
    try:
        bench.prepare()
        _check_counts(bench, evidence, reporter)
        bench.warm_up()
        for chunk, count in enumerate(spread(first, starts)):
            if chunk:
                assert restart is not None
                try:
                    if alternate is not None:
                        alternate.block(count)
                    else:
                        reporter.note(
                            f"bench gate: restarting the service ({chunk + 1} of {starts} "
                            "starts: the box's restart offset needs the repetitions spread)"
                        )
                    seen = restart()
                except ServegateError as exc:  # a start that is not proven
                    bench.fail("failed", f"the restart between service starts failed: {exc}")
                    raise
                evidence.setdefault("restarts", []).append(seen)
                bench.restarted()
                bench.warm_up()
            for case in spec.cases:
                bench.measure(case, count)
        if fresh and live is not None:
            live.finish()
            base = live.samples()
            evidence["baseline"] = (
                f"fresh: live release {live.sha[:12]} measured during this promote ({live.design})"
            )
            evidence["design"] = live.describe()
            evidence["baseline_samples"] = base.as_dict()
        looks = max(1, cfg.bench.max_repetitions - first + 1)
        st = settings(cfg, first_release, looks, first, shape.found)
        chosen = rules(cfg)
        decision = verdict.evaluate(
            base, results.from_result(bench.result), chosen, st, final=False
        )
        while decision["verdict"] == verdict.INCONCLUSIVE:
            open_cases = {
                r["case"] for r in decision["rows"] if r["verdict"] == verdict.INCONCLUSIVE
            }
            todo = [
                c for c in spec.cases
                if c.id in open_cases and _reps(bench, c.id) < cfg.bench.max_repetitions
            ]  # fmt: skip
            if not todo:
                break
            reporter.note(f"bench gate INCONCLUSIVE — {decision['why']}: measuring again")
            for case in todo:
                bench.measure(case, 1)
            decision = verdict.evaluate(
                base, results.from_result(bench.result), chosen, st, final=False
            )
        decision = verdict.evaluate(base, results.from_result(bench.result), chosen, st, final=True)
    except BenchFailed as exc:
        bench.fail("failed", str(exc))
        return {**evidence, "verdict": verdict.FAIL, "why": f"the bench could not measure: {exc}",
                "rows": [], "samples": results.from_result(bench.result).as_dict()}  # fmt: skip
    finally:
        bench.release()  # whatever stopped it: no tokenizer helper left behind
        if live is not None:
            live.bench.release()
    bench.result["gate"] = decision
    bench.finish()
    decided_at = {c["id"]: len(c["groups"]) for c in bench.result["cases"]}
    candidate = results.from_result(bench.result, str(output))
    outcome, why = decision["verdict"], decision["why"]
    judged = trend(candidate) if trend is not None else None
    if judged is not None and judged.get("verdict") == verdict.FAIL:
        outcome = verdict.FAIL
        why = f"creeping loss against {judged['against']}: {judged['why']}"
        if decision["verdict"] != verdict.PASS:
            why = f"{decision['why']}; and {why}"
    elif judged is not None and judged.get("verdict") == verdict.INCONCLUSIVE:
        reporter.note(f"bench gate: the trend is open (reported, not deciding): {judged['why']}")
    return {
        **evidence,
        "verdict": outcome,
        "why": why,
        "method": decision["method"],
        "rows": decision["rows"],
        "repetitions": decided_at,
        "table": bench.result["performance_table"],
        "samples": candidate.as_dict(),
        **({"trend": judged} if judged is not None else {}),
    }


def _check_counts(bench: Bench, evidence: dict[str, Any], reporter: Reporter) -> None:
    """What checks the candidate's token counts, which the candidate itself reports.

    A vLLM candidate whose ``/tokenize`` does not answer (vLLM always serves it) could
    not have its prompts sized nor its answers counted again: the check fails (a release
    that hides its tokenizer must not pass on its own ``usage``). Counted by the
    candidate's own ``/tokenize``, the check is weaker evidence, and says so: the model's
    tokenizer files (``bench.tokenizer``) count with nothing the release serves."""
    source = bench.result["engine"]["tokenizer_source"]
    adapter = bench.spec.endpoint.adapter
    if source == "estimate" and adapter.tokenize_path:
        raise BenchFailed(
            f"the candidate's {adapter.tokenize_path} does not answer ({adapter.name} serves "
            "it): its prompts could not be sized nor its answers' token counts checked",
            hint="set bench.tokenizer to the model directory (and bench.tokenizer_python to "
            "a Python with transformers) to size and count with the model's own files",
        )
    if source == "server /tokenize":
        line = (
            "the answers' token counts were checked by the candidate's own /tokenize: "
            "bench.tokenizer (the model directory) counts with files the release does not serve"
        )
        evidence["weaker_evidence"].append(line)
        reporter.note(f"bench gate, weaker evidence: {line}")


def _reps(bench: Bench, case_id: str) -> int:
    for doc in bench.result["cases"]:
        if doc["id"] == case_id:
            return len(doc["groups"])
    return 0
