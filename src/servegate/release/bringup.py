"""Bring a release up on the service and prove it: switch, healthy, provenance, gate."""

from __future__ import annotations

import dataclasses
import hmac
import json
import os
import shutil
import stat
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from servegate import hostpaths
from servegate.engine import lint as lint_mod
from servegate.engine import logscan, managers, openai, ports
from servegate.engine.health import wait_healthy
from servegate.engine.launch import COMPILE_CACHES, LaunchSpec
from servegate.engine.rules import Finding
from servegate.errors import (
    GateFailed,
    LogRuleFailed,
    PreflightFailed,
    ProvenanceMismatch,
    ServegateError,
    ServiceFailed,
)
from servegate.pipeline import atomic, redact, reserve
from servegate.pipeline.git import dirty_files, escaping_links, worktree_head, worktree_top
from servegate.provenance import check as provenance
from servegate.release import bench_gate
from servegate.release import trend as release_trend
from servegate.release.context import Context
from servegate.release.gate import (
    Decision,
    GateCheck,
    GateContext,
    SmokeCheck,
    Verdict,
    build_checks,
    run_gate,
)
from servegate.release.record import GateRecord, ReleaseRecord, host_records, seal


@dataclass
class Evidence:
    """What bringing a release up measured and saw; goes into the record."""

    startup_seconds: float = 0.0
    provenance: dict[str, Any] = field(default_factory=dict)
    gate: GateRecord | None = None
    launch: dict[str, Any] = field(default_factory=dict)
    service_pid: int | None = None
    #: lint findings (warnings; a fail stops before the switch)
    lint: list[dict[str, str]] = field(default_factory=list)
    #: the start-up log scan: findings and facts (KV cache tokens, graph capture, …)
    startup_log: dict[str, Any] = field(default_factory=dict)
    #: where the new release's output starts in the service log
    log_mark: str = ""
    #: the main process provenance last proved: (pid, start time); the record is written
    #: only while that very process serves
    proven: tuple[int, int | None] | None = None


def service_pids(ctx: Context) -> set[int]:
    pid = ctx.manager.main_pid()
    return set(provenance.descendants(pid)) if pid else set()


def check_host_root(ctx: Context) -> None:
    """Nothing servegate trusts may be writable by others: the host root must be this
    user's and closed to group and others' writes."""
    root = ctx.cfg.host_root
    if not root.exists():
        root.mkdir(parents=True, mode=0o700)
    info = os.lstat(root)
    if stat.S_ISLNK(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o022:
        raise PreflightFailed(
            f"the host root {root} is writable by others or not this user's (owner uid "
            f"{info.st_uid}, mode {oct(stat.S_IMODE(info.st_mode))}): anyone who can write "
            "there could change what servegate deploys, records and deletes",
            hint=f"chown $(id -u) {root} && chmod go-w {root}",
        )
    # the salt records hash secrets with: one that cannot be read stops the run here,
    # before anything changed (StateInvalid says how to fix it)
    _ = ctx.salt
    reserve.ensure(hostpaths.of(ctx.cfg).reserve)  # room for a rollback on a full disk


def check_port_free(ctx: Context) -> None:
    """The port is free or held by our own service — never by a stranger."""
    port = ctx.cfg.service.port
    owners, hidden = ports.owners(port)
    foreign = owners - service_pids(ctx)
    if foreign or hidden:
        who = "; ".join(
            [f"pid {p}: {' '.join(redact.argv(ports.argv(p), ctx.salt))[:160]}"
             for p in sorted(foreign)]
            + [f"{hidden} socket(s) of a process whose descriptors this user cannot read "
               f"(find it with: sudo ss -ltnp 'sport = :{port}')"] * bool(hidden)
        )  # fmt: skip
        raise PreflightFailed(
            f"port {port} is already taken by a process that is not the service: {who}",
            hint="stop that process, or set service.port to a free port; "
            "the live service was not touched",
        )


def lint(ctx: Context, sha: str, release_dir: Path, evidence: Evidence) -> list[Finding]:
    """The launch checked against the lint rules; a ``fail`` stops here, nothing touched.
    First, the unit or program file the switch will write must carry the launch exactly
    (no control character in a value, the rendering parsed back): ConfigError else."""
    spec = ctx.spec(release_dir, sha)
    managers.refuse(ctx.manager, spec)
    findings = lint_mod.lint(spec, ctx.rules, ctx.cache_dir)
    evidence.lint = [f.as_dict() for f in findings]
    if any(f.severity == "fail" for f in findings):
        what = f"profile {spec.profile}" if spec.profile else "service.command"
        raise lint_mod.failure(findings, what)
    return findings


def switch(ctx: Context, sha: str, release_dir: Path, evidence: Evidence) -> None:
    """Stop the old release and start ``release_dir`` in its place. A launch no unit can
    carry exactly is refused before anything stops; the launch installed is kept
    (:func:`keep_launch`) for a rollback to install again."""
    spec = ctx.spec(release_dir, sha)
    evidence.launch = spec.redacted(ctx.salt)
    managers.refuse(ctx.manager, spec)
    keep_launch(ctx, spec)
    if seeded := seed_compile_caches(ctx, spec):
        evidence.launch["compile_cache_seeded_from"] = seeded
    ctx.manager.stop()
    ctx.deployer.activate(release_dir)
    ctx.manager.install(spec)
    evidence.log_mark = ctx.manager.log_mark()
    ctx.manager.start()


def seed_compile_caches(ctx: Context, spec: LaunchSpec) -> str:
    """Start a release's empty compile caches as a copy of the live release's, and say
    from which release ("": not seeded). Only with ``service.compile_cache_seed``.

    Each release compiles into caches of its own key (:func:`keyed_caches`), so a new
    release started from empty caches compiles every graph again: about 20 of a 35 s
    start of the CPU demo, minutes for a large model on GPUs. Inductor's and Triton's
    caches are keyed by what they compile, and vLLM's by its config and the code it
    traced (file paths included), which is how vLLM shares one cache across runs by
    default: an entry the candidate's code no longer matches is never used, only
    compiled again beside it — unless a release changes what the engine's key leaves
    out (a fork's kernel-path switch: such a fork once reloaded a graph compiled for
    another kernel path), hence off by default. The copy is the candidate's own (its
    key's directory; provenance counts it as the launch's compile cache), so the live
    release's cache stays as it was for a rollback. Links are not copied. A cache the candidate
    already has, or a copy that fails (a full disk), is left alone: the release then
    compiles as before."""
    live = ctx.state.current
    if not ctx.cfg.service.compile_cache_seed or not spec.cache_key:
        return ""
    if live is None or live.sha == spec.sha:
        return ""
    live_dir = Path(live.release_dir)
    source, _ = kept_launch(ctx, live.sha, live_dir)
    if source is None or not source.cache_key or source.cache_key == spec.cache_key:
        return ""
    seeded = False
    for name in COMPILE_CACHES:
        src, dst = source.env.get(name), spec.env.get(name)
        if not src or not dst or src == dst:
            continue
        here, there = Path(src), Path(dst)
        if there.exists() or there.is_symlink() or here.is_symlink() or not here.is_dir():
            continue
        tmp = there.with_name(f".{there.name}.seed-{os.getpid()}")
        try:
            there.parent.mkdir(parents=True, exist_ok=True)
            shutil.copytree(here, tmp, ignore=_links, symlinks=True)
            os.replace(tmp, there)
            seeded = True
        except OSError as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            ctx.reporter.note(
                f"warning: the compile cache {there} was not seeded from {live.sha[:12]}'s "
                f"({exc.strerror or exc}): the release compiles from scratch"
            )
    return live.sha if seeded else ""


def _links(where: str, names: list[str]) -> set[str]:
    """What :func:`shutil.copytree` leaves out of a seeded cache: links."""
    return {n for n in names if os.path.islink(os.path.join(where, n))}


def keep_launch(ctx: Context, spec: LaunchSpec) -> None:
    """Keep the launch about to be installed, values in clear (0600, like the unit it
    becomes) and sealed with the host's key, so that a rollback to this release
    installs what it ran — not what today's config and environment would render (a
    rotated or newline-carrying secret, a flag the old release does not know)."""
    doc: dict[str, Any] = {"launch": spec.stored()}
    doc["seal"] = seal(doc, ctx.salt)
    try:
        atomic.write_json(hostpaths.of(ctx.cfg).launch(spec.sha), doc)
    except OSError as exc:  # a full disk must not stop a switch (or a rollback's)
        line = (
            f"the launch of {spec.sha[:12]} could not be kept ({exc.strerror}): a rollback to "
            "it will render it from the config of the day"
        )
        ctx.reporter.note(f"warning: {line}")
        ctx.warnings.append(line)


def kept_launch(ctx: Context, sha: str, release_dir: Path) -> tuple[LaunchSpec | None, str]:
    """The launch ``sha`` was last installed with (:func:`keep_launch`), or None and why
    it cannot be used: none kept (released before servegate kept them), unreadable, not
    sealed by this host, or for another directory."""
    path = hostpaths.of(ctx.cfg).launch(sha)
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        return None, "no launch was kept for it"
    except (OSError, ValueError) as exc:
        return None, f"its kept launch {path} cannot be read ({exc})"
    if not (
        isinstance(doc, dict)
        and isinstance(doc.get("seal"), str)
        and hmac.compare_digest(doc["seal"].encode(), seal(doc, ctx.salt).encode())
    ):
        return None, f"its kept launch {path} is not sealed by this host"
    try:
        spec = LaunchSpec.from_stored(doc["launch"])
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        return None, f"its kept launch {path} is not a launch ({exc})"
    if spec.sha != sha or spec.cwd != release_dir:
        return None, f"its kept launch ran in {spec.cwd}, not {release_dir}"
    return spec, ""


def healthy(ctx: Context, sha: str, release_dir: Path, evidence: Evidence) -> None:
    """Healthy within the start-up timeout, and a start-up log no fail rule matches."""
    evidence.startup_seconds = wait_healthy(
        ctx.manager, ctx.endpoint, ctx.cfg.service.startup_timeout, ctx.reporter
    )
    spec = ctx.spec(release_dir, sha)
    try:
        text = ctx.manager.log_since(evidence.log_mark)
    except OSError as exc:  # unread evidence is not a clean log
        raise LogRuleFailed(
            f"the start-up log of {sha[:12]} could not be read ({exc}): the log rules cannot "
            "be checked",
            hint="check the service manager's log (the supervisor log file, or journalctl "
            "--user) and its permissions",
        ) from None
    scan = logscan.scan(text, ctx.rules, lint_mod.facts(spec), "startup")
    evidence.startup_log = scan.as_dict()
    if scan.failures:
        lines = "\n".join(
            f"  - {f.rule}: {f.message}" + (f"\n      line: {f.evidence}" if f.evidence else "")
            for f in scan.failures
        )
        raise LogRuleFailed(
            f"the start-up log of {sha[:12]} matched {len(scan.failures)} fail rule(s):\n{lines}",
            hint=scan.failures[0].remedy or "read the service log",
        )


def prove(
    ctx: Context, sha: str, release_dir: Path, artifacts: Mapping[str, str], evidence: Evidence
) -> provenance.Report:
    exp = ctx.expectation(ctx.spec(release_dir, sha), artifacts)
    pid = ctx.manager.main_pid()
    evidence.service_pid = pid
    report = provenance.verify(pid, exp)
    check_checkout(release_dir, sha, report)
    evidence.provenance = report.as_dict()
    evidence.proven = None if pid is None else (pid, provenance.start_ticks(pid))
    if not report.ok:
        first = report.findings[0].check
        more = f" (+{len(report.findings) - 1} more)" if len(report.findings) > 1 else ""
        raise ProvenanceMismatch(
            f"{first}{more}: the live service does not run {release_dir}\n{report.explain()}",
            hint="the release's launcher or environment points elsewhere; fix it on the branch",
        )
    return report


def check_checkout(release_dir: Path, sha: str, report: provenance.Report) -> None:
    """The release directory still holds exactly ``sha`` with a clean tracked tree."""
    head = worktree_head(release_dir)
    if head != sha:
        report.findings.append(provenance.Finding("checkout HEAD", sha, head))
    top = worktree_top(release_dir)
    if os.path.realpath(top) != os.path.realpath(release_dir):
        report.findings.append(
            provenance.Finding(
                "checkout work tree",
                f"{release_dir} (git's status and hashes read it)",
                f"{top}: the checkout's git configuration points git at another directory",
            )
        )
    dirty = dirty_files(release_dir, sha)
    if dirty:
        shown = "; ".join(dirty[:5]) + (" …" if len(dirty) > 5 else "")
        report.findings.append(provenance.Finding("tracked tree clean", "no changes", shown))
    leaving = escaping_links(release_dir, sha)
    if leaving:
        shown = "; ".join(leaving[:5]) + (" …" if len(leaving) > 5 else "")
        report.findings.append(
            provenance.Finding("tracked links inside the release", "none leaves it", shown)
        )


def live_record(ctx: Context) -> ReleaseRecord | None:
    """The release record of the release serving before this promote (its note)."""
    current = ctx.state.current
    if current is None:
        return None
    released = host_released(ctx, current.sha)
    return released[-1] if released else None


def host_released(ctx: Context, sha: str) -> list[ReleaseRecord]:
    """This host's ``released`` records of ``sha``, oldest first. An unreadable note is
    an error, not "no record" (the gate must not skip its comparison because git
    failed): it propagates and fails the check."""
    text = ctx.deployer.repo.notes(sha)
    return [  # every host writes the same notes ref: only what this host sealed
        r for r in host_records(ctx.cfg, text, sha) if r.verdict == "released"
    ]


def still_proven(ctx: Context, evidence: Evidence) -> None:
    """The process serving now is the one provenance last proved: a service that died
    and was started again (a crash the service manager restarted, an operator's
    restart) after its proof is a process nobody proved, and no record may say it was."""
    pid = ctx.manager.main_pid()
    now = None if pid is None else (pid, provenance.start_ticks(pid))
    if evidence.proven is None or now != evidence.proven:
        was = evidence.proven[0] if evidence.proven else None
        raise ServiceFailed(
            f"the service's main process changed after it was proven (pid {was} → {pid}): "
            "it stopped or was started again during the gate, and the process serving now "
            "was never proven",
            hint=f"read the service log ({ctx.manager.log_file or 'journalctl -u the unit'}): "
            "a release that crashes under its gate is not released",
        )


def proven_after_gate(
    ctx: Context, sha: str, release_dir: Path, artifacts: Mapping[str, str], evidence: Evidence
) -> provenance.Report:
    """After the gate, before the record: the proven process still serves, and it is
    proven again. A proof read before the gate says what the process ran then; code it
    loaded or exec'd into since (on the gate's first request: same pid, same start) is
    what it runs now, and the record says what runs when it is written."""
    still_proven(ctx, evidence)
    report = prove(ctx, sha, release_dir, artifacts, evidence)
    still_proven(ctx, evidence)
    return report


def restarter(
    ctx: Context,
    sha: str,
    release_dir: Path,
    artifacts: Mapping[str, str],
    proven: Evidence | None = None,
    *,
    full: bool = False,
) -> Callable[[], dict[str, Any]]:
    """Restart ``sha`` in place and prove it again — healthy, a clean start-up log,
    provenance — for a gate that spreads its repetitions over service starts. A restart
    that fails any of these raises, and the promote rolls back. ``proven``: the promote's
    evidence, told which process is the proven one now. ``full``: switch the service to
    ``release_dir`` first (its unit installed again), as the ABAB design does after the
    other release served."""

    def restart() -> dict[str, Any]:
        again = Evidence()
        if full:
            switch(ctx, sha, release_dir, again)
        else:
            ctx.manager.stop()
            again.log_mark = ctx.manager.log_mark()
            ctx.manager.start()
        healthy(ctx, sha, release_dir, again)
        report = prove(ctx, sha, release_dir, artifacts, again)
        if proven is not None:
            proven.proven = again.proven
        return {
            "sha": sha,
            "service_pid": again.service_pid,
            "startup_seconds": round(again.startup_seconds, 3),
            "provenance": "ok" if report.ok else "mismatch",
            "evidence": report.as_dict().get("evidence"),
        }

    return restart


@dataclass(frozen=True)
class Serving:
    """The live service's main process as it was, and how it was scheduled: taken when
    a promote begins, before the candidate's build runs (which could slow it)."""

    pid: int
    start: int | None
    nice: int | None
    cpus: frozenset[int]


def serving(ctx: Context) -> Serving | None:
    pid = ctx.manager.main_pid()
    if pid is None:
        return None
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        nice: int | None = int(fields[16])
        cpus = frozenset(os.sched_getaffinity(pid))
    except (OSError, IndexError, ValueError):
        nice, cpus = None, frozenset()
    return Serving(pid, provenance.start_ticks(pid), nice, cpus)


def _changed(before: Serving, now: Serving | None) -> str:
    """How the live service changed since the promote began ("": it did not)."""
    if now is None or (now.pid, now.start) != (before.pid, before.start):
        return (
            f"the live service's process changed while the candidate was built (pid "
            f"{before.pid} → {now.pid if now else 'none'})"
        )
    if (now.nice, now.cpus) != (before.nice, before.cpus):
        return (
            "the live service's scheduling changed while the candidate was built (nice "
            f"{before.nice} → {now.nice}, CPUs {sorted(before.cpus)} → {sorted(now.cpus)})"
        )
    return ""


def wants_fresh_baseline(ctx: Context, sha: str) -> bool:
    """A bench check compares with a fresh baseline and a live release other than ``sha``
    serves (or should)."""
    live = ctx.state.current
    return (
        bench_gate.CHECK in ctx.cfg.gate.checks
        and ctx.cfg.gate.baseline == "fresh"
        and live is not None
        and live.sha != sha
    )


def measure_live(
    ctx: Context, sha: str, before: Serving | None = None
) -> bench_gate.LiveBench | None:
    """The fresh baseline (``gate.baseline = "fresh"``): the live release, proven as it
    serves, measured on the bench's cases after the build and before the switch of
    ``sha``. None where there is nothing to measure afresh (no bench check, another
    baseline, no live release, the same SHA again); a :class:`LiveBench` whose ``failed``
    says why where the live release cannot be measured. ``before``: the live service as
    the promote found it, before the candidate's build. Where it was not serving then,
    the recorded samples are used; where it changed since (another process, another
    nice value or CPU set: what a hostile build could do to slow it), no comparison is
    fair and the check is INCONCLUSIVE (``forced``)."""
    cfg, live = ctx.cfg, ctx.state.current
    if not wants_fresh_baseline(ctx, sha) or live is None:
        return None
    where = Path(live.release_dir)
    artifacts = dict(live.artifacts)
    in_place = ctx.deployer.rebuilds_on_restore
    measured = bench_gate.LiveBench(
        cfg, ctx.endpoint, cfg.service.model or "", live.sha, ctx.reporter, ctx.environ,
        log_file=ctx.manager.log_file,
        window_check=logscan.window_check(ctx.rules, lint_mod.facts(ctx.spec(where, live.sha))),
        to_live=None if in_place else restarter(ctx, live.sha, where, artifacts, full=True),
        cannot_alternate="an in-place deploy rebuilds the checkout at every switch",
    )  # fmt: skip
    if in_place:
        measured.failed = (
            "an in-place deploy changed the live checkout at fetch: the serving process "
            "can no longer be proven to run it"
        )
        return measured
    if before is None or ctx.manager.main_pid() is None:
        measured.failed = f"the live release {live.sha[:12]} was not serving"
        if before is not None:  # it was when the promote began: the build may have done it
            measured.failed += " after the candidate's build (it was when the promote began)"
            measured.forced = True
        return measured
    changed = _changed(before, serving(ctx))
    if changed:
        measured.failed, measured.forced = changed, True
        return measured
    try:
        if not cfg.service.model:
            measured.bench.spec = dataclasses.replace(
                measured.bench.spec, model=openai.first_model(ctx.endpoint)
            )
        prove(ctx, live.sha, where, artifacts, Evidence())
    except ServegateError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else repr(exc)
        measured.failed = f"the live service could not be proven as {live.sha[:12]}: {first}"
        measured.forced = True  # it served when the promote began: the build may have done it
        return measured
    measured.begin()
    measured.forced = bool(measured.failed)  # the same: no fallback the candidate can force
    return measured


def gate(
    ctx: Context,
    sha: str,
    release_dir: Path,
    evidence: Evidence,
    smoke_only: bool = False,
    artifacts: Mapping[str, str] | None = None,
    live: bench_gate.LiveBench | None = None,
) -> Decision:
    """The configured gate checks; after a rollback only the smoke probe. ``artifacts``:
    the release's hashed build output, which lets the bench restart and re-prove the
    service when the box's restart offset needs its repetitions spread. ``live``: the
    fresh baseline measured before the switch (:func:`measure_live`)."""
    abab = live is not None and live.to_live is not None and not live.failed
    model = ctx.cfg.service.model or openai.first_model(ctx.endpoint)
    gctx = GateContext(
        cfg=ctx.cfg,
        endpoint=ctx.endpoint,
        model=model,
        sha=sha,
        release_dir=release_dir,
        previous_record=None if smoke_only else live_record(ctx),
        service_log=ctx.manager.log_tail,
        log_file=ctx.manager.log_file,
        reporter=ctx.reporter,
        environ=ctx.environ,
        command=" ".join(ctx.spec(release_dir, sha).redacted(ctx.salt)["argv"]),
        window_check=logscan.window_check(ctx.rules, lint_mod.facts(ctx.spec(release_dir, sha))),
        first_release=ctx.state.current is None and ctx.state.release_count() == 0,
        restart=None
        if artifacts is None
        else restarter(ctx, sha, release_dir, artifacts, evidence, full=abab),
        live=None if smoke_only else live,
        trend=None
        if smoke_only or not ctx.cfg.trend.enabled
        else (lambda samples: release_trend.judge_candidate(ctx.cfg, samples, sha)),
    )
    selected: list[GateCheck] = [SmokeCheck()] if smoke_only else build_checks(ctx.cfg)
    decision = run_gate(selected, gctx)
    evidence.gate = decision.record()
    if decision.verdict is not Verdict.PASS:
        lines = "\n".join(f"  - {r.name}: {r.verdict} — {r.reason}" for r in decision.failures)
        raise GateFailed(
            f"gate verdict {decision.verdict}:\n{lines}",
            hint="the record holds each check's evidence; fix the release and promote again",
        )
    return decision
