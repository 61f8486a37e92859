"""``release promote <sha>``: the whole flow, with automatic rollback after the switch."""

from __future__ import annotations

import copy
import dataclasses
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from git import GitCommandError

from servegate import hostpaths
from servegate.engine.launch import placeholders, stale_caches
from servegate.errors import (
    BuildFailed,
    GitRefusal,
    GpuUnhealthy,
    Interrupted,
    ProvenanceMismatch,
    RollbackFailed,
    ServegateError,
    ServiceFailed,
)
from servegate.gpu import health
from servegate.kernels.build import BuildResult, run_build
from servegate.pipeline import interrupts, redact
from servegate.pipeline.git import dirty_files, escaping_links, worktree_head
from servegate.pipeline.lease import gpu_lease
from servegate.pipeline.lock import HostLock
from servegate.provenance import codeorigin
from servegate.release import attest, bench_gate, bringup
from servegate.release import record as rec
from servegate.release.context import Context
from servegate.release.deploy import remove_inside
from servegate.release.rollback import (
    mark_pending,
    recover,
    restore_after_failure,
    restore_problem,
    warn_unpushed,
)
from servegate.release.state import Entry


@dataclass
class Outcome:
    sha: str
    verdict: str  # released | rolled_back | failed
    exit_code: int
    reason: str = ""
    tag: str = ""
    record: dict[str, Any] = field(default_factory=dict)
    stages: list[dict[str, Any]] = field(default_factory=list)
    rollback: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    #: why it was not released (the --json envelope's ``error``); None when released
    error: ServegateError | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "sha": self.sha,
            "verdict": self.verdict,
            "exit_code": self.exit_code,
            "reason": self.reason,
            "tag": self.tag,
            "seconds": round(self.seconds, 3),
            "stages": self.stages,
            "rollback": self.rollback,
            "record": self.record,
        }


def preflight(ctx: Context, requested: str, allow_non_ff: bool) -> str:
    bringup.check_host_root(ctx)
    # a signing key that cannot sign is found now, before anything changes (exit 2)
    attest.signer_of(ctx.cfg, rec.host_id(ctx.cfg))
    ctx.deployer.preflight()
    repo = ctx.deployer.repo
    repo.fetch()
    if repo.notes_warning:
        ctx.reporter.note(f"warning: {repo.notes_warning}")
        ctx.warnings.append(repo.notes_warning)
    if ctx.cfg.release.push and rec.unpushed(ctx.cfg):  # an earlier run's records first
        left = rec.push_pending(ctx.cfg, repo)
        for line in left["warnings"]:
            ctx.reporter.note(f"warning: {line}")
            ctx.warnings.append(line)
        if not left["pushed"]:
            ctx.reporter.note(f"records still not pushed ({left['error'][:200]}); kept")
    gpus = health.for_release(ctx.cfg, ctx.environ)
    if gpus is not None and not gpus.healthy:  # measured on a sick GPU, a gate judges nothing
        raise GpuUnhealthy(
            "the GPUs are not healthy, so nothing is built, switched or measured: "
            + "; ".join(f.line() for f in gpus.failures[:6]),
            hint="fix what each finding says (`servegate gpu health` checks again), then promote",
        )
    sha = repo.resolve(requested)
    repo.require_on_branch(sha)
    live = ctx.state.current
    if live is not None and ctx.cfg.attest.require_live:
        found = attest.check_release(
            ctx.cfg, repo, live.sha, rec.host_id(ctx.cfg), Path(live.release_dir)
        )
        if not found.ok:
            raise attest.failure(found)
        ctx.reporter.note(f"the live release's attestation verifies (signed by {found.signer})")
    if live is not None and not allow_non_ff and not repo.is_ancestor(live.sha, sha):
        raise GitRefusal(
            f"{sha[:12]} is not a fast-forward of the live release {live.sha[:12]}",
            hint="promote a descendant of the live release, or pass --allow-non-ff to "
            "deploy it anyway (`release rollback` returns to an earlier release)",
        )
    bringup.check_port_free(ctx)
    return sha


def require_clean_after_build(release_dir: Path, sha: str) -> None:
    """The build may add untracked files (build/), never change tracked ones."""
    dirty = dirty_files(release_dir, sha)
    if dirty:
        raise BuildFailed(
            "the build changed tracked files: " + "; ".join(d.strip() for d in dirty[:10]),
            hint="make the build write only untracked (ignored) outputs; "
            "the live service was not touched",
        )


def require_links_inside(release_dir: Path, sha: str) -> None:
    """Every symbolic link the release tracks stays inside it: code behind a link that
    leaves it is in no commit and no hash, and can change after the release."""
    leaving = escaping_links(release_dir, sha)
    if leaving:
        raise ProvenanceMismatch(
            f"{sha[:12]} tracks {len(leaving)} symbolic link(s) that leave the release: "
            + "; ".join(leaving[:10])
            + " (what they point at is in no commit and no hash, and can change after the "
            "release)",
            hint="commit the file itself instead of a link to it, or point the link inside "
            "the repository; the live service was not touched",
        )


def require_live_intact(ctx: Context, sha: str) -> None:
    """The build of a new release must leave the live one as it was built: the
    automatic rollback after the switch starts it again from its files."""
    live = ctx.state.current
    if live is None or live.sha == sha or ctx.deployer.rebuilds_on_restore:
        return
    where = Path(live.release_dir)
    why = restore_problem(ctx, live)
    if not why and worktree_head(where) != live.sha:
        why = f"its checkout is no longer at {live.sha[:12]}"
    if not why:
        dirty = dirty_files(where, live.sha)
        planted = codeorigin.untracked_code(where, live.artifacts) or []
        if not dirty and not planted:
            return
        why = "; ".join(
            [
                *(f"tracked {d.strip()}" for d in dirty[:5]),
                *(f"untracked code {p}" for p in planted[:5]),
            ]
        )
    raise BuildFailed(
        f"the build of {sha[:12]} changed the files of the live release {live.sha[:12]} "
        f"({why}): a rollback to it could no longer start",
        hint="make the build write only inside its own release directory. The live "
        "service was not touched and keeps serving what it loaded; promote a fixed commit to "
        "replace it (until then an automatic rollback to it could not start)",
    )


def promote(ctx: Context, requested: str, allow_non_ff: bool = False) -> Outcome:
    start = time.monotonic()
    bringup.check_host_root(ctx)  # before its lock file is made in it
    with HostLock(ctx.lock_path, f"release promote {requested}"):
        recover(ctx)
        interrupts.stop_if_received()  # a stop during the recover: switch nothing more
        return _promote(ctx, requested, allow_non_ff, start)


def _promote(ctx: Context, requested: str, allow_non_ff: bool, start: float) -> Outcome:
    runner = ctx.runner
    with runner.stage("preflight") as st:
        sha = preflight(ctx, requested, allow_non_ff)
        st.detail = f"{sha[:12]} {ctx.deployer.repo.subject(sha)[:60]}"
        before = bringup.serving(ctx)  # before the candidate's build can touch it
    with runner.stage("fetch") as st:
        release_dir = ctx.deployer.prepare(sha)
        require_links_inside(release_dir, sha)
        st.detail = str(release_dir)
    with runner.stage("build") as st:
        built = run_build(
            ctx.cfg,
            release_dir,
            placeholders(ctx.cfg, release_dir, sha),
            ctx.log_path(sha, "build"),
            ctx.build_cache,
        )
        require_clean_after_build(release_dir, sha)
        require_live_intact(ctx, sha)
        if built.leftovers:
            line = (
                f"the build left {len(built.leftovers)} process(es) running, stopped before "
                "anything was measured: " + "; ".join(built.leftovers[:5])
            )
            ctx.reporter.note(f"warning: {ctx.scrub(line)}")
            ctx.warnings.append(ctx.scrub(line))
        archs = f", code for {', '.join(ctx.cfg.build.archs)}" if ctx.cfg.build.archs else ""
        cached = [t["name"] for t in built.targets if t["cached"]]
        reuse = f", cache hit: {', '.join(cached)}" if cached else ""
        st.detail = f"{len(built.artifacts)} artifact(s) hashed{archs}{reuse}"
    evidence = bringup.Evidence()
    with runner.stage("lint") as st:
        findings = bringup.lint(ctx, sha, release_dir, evidence)
        warned = f", {len(findings)} warning(s)" if findings else ""
        st.detail = f"{len(ctx.rules.of('lint'))} rules{warned}"
    with ExitStack() as lease:
        with runner.stage("lease") as st:
            what = f"release promote {sha[:12]}"
            lease.enter_context(gpu_lease(ctx.lease_path, what, ctx.cfg.host.lease_timeout))
            st.detail = str(ctx.lease_path)
        return _switch_and_prove(ctx, sha, release_dir, built, evidence, start, before)


def _switch_and_prove(
    ctx: Context,
    sha: str,
    release_dir: Path,
    built: BuildResult,
    evidence: bringup.Evidence,
    start: float,
    before: bringup.Serving | None = None,
) -> Outcome:
    """From stopping the old release to the record, holding the GPU lease. ``before``:
    the live service as the promote found it (the fresh baseline checks it is unchanged)."""
    runner = ctx.runner
    previous = ctx.state.current
    mark_pending(ctx, "promote", sha, release_dir)
    try:
        live = None
        if bringup.wants_fresh_baseline(ctx, sha):
            with runner.stage("baseline") as st:
                live = bringup.measure_live(ctx, sha, before)
                st.detail = _baseline_detail(live)
        with runner.stage("switch") as st:
            bringup.switch(ctx, sha, release_dir, evidence)
            st.detail = f"{ctx.manager.name} restarted {ctx.cfg.service.unit}"
        with runner.stage("healthy") as st:
            bringup.healthy(ctx, sha, release_dir, evidence)
            facts = evidence.startup_log.get("facts", {})
            shown = ", ".join(f"{k} {v}" for k, v in list(facts.items())[:3])
            st.detail = f"start-up {evidence.startup_seconds:.1f}s" + (
                f"; {shown}" if shown else ""
            )
        with runner.stage("provenance") as st:
            report = bringup.prove(ctx, sha, release_dir, built.artifacts, evidence)
            observed = sum(p.get("evidence") == "observed" for p in report.processes)
            st.detail = (
                f"{len(report.processes)} process(es), {observed} observed, "
                f"{len(report.extensions)} mapping(s)"
            )
            warned = [h for h in report.hooks if h["verdict"] == "warn"]
            if warned:
                ctx.reporter.note(
                    f"provenance: {len(warned)} start-up hook(s) run code in the service's "
                    "interpreter (listed in the record: provenance.startup_hooks)"
                )
            for line in report.weaker:
                ctx.reporter.note(f"provenance, weaker evidence: {line}")
        with runner.stage("gate") as st:
            decision = bringup.gate(
                ctx, sha, release_dir, evidence, artifacts=built.artifacts, live=live
            )
            # what the record will say was proven: that process, as it runs now
            bringup.proven_after_gate(ctx, sha, release_dir, built.artifacts, evidence)
            st.detail = ", ".join(f"{r.name} {r.verdict}" for r in decision.results)
    except ServegateError as exc:
        return _roll_back(ctx, sha, release_dir, built, evidence, exc, start)
    except Exception as exc:  # the old release is stopped: whatever broke, put it back
        failure = ServiceFailed(f"unexpected error after the switch: {exc!r}")
        return _roll_back(ctx, sha, release_dir, built, evidence, failure, start)
    except KeyboardInterrupt:  # the same: the old release is stopped
        interrupted = Interrupted("interrupted", hint="the previous release was put back")
        return _roll_back(ctx, sha, release_dir, built, evidence, interrupted, start)
    try:
        with runner.stage("record") as st:
            outcome = _record_release(ctx, sha, release_dir, built, evidence, previous, start)
            st.detail = outcome.tag
    except Interrupted:
        raise  # released, verified and serving; the record is kept to push (it says so)
    except (ServegateError, OSError) as exc:  # a full disk, a broken repository: unrecorded
        if ctx.state.current is not None and ctx.state.current.sha == sha:
            raise  # the state already names it released: `release status` says so
        failure = ServiceFailed(
            f"the release record of {sha[:12]} could not be written ({exc}): a release "
            "nobody can verify is not released",
            hint="free space under the host root (or fix the repository), then promote again",
        )
        return _roll_back(ctx, sha, release_dir, built, evidence, failure, start)
    outcome.stages = runner.as_list()
    outcome.seconds = time.monotonic() - start
    return outcome


def _baseline_detail(live: bench_gate.LiveBench | None) -> str:
    if live is None:
        return "nothing to measure afresh"
    if live.forced:
        return f"no fair baseline: {live.failed[:120]}"
    if live.failed:
        return f"recorded samples instead: {live.failed[:120]}"
    return f"live {live.sha[:12]} measured ({live.design}: {live.why[:80]})"


def _record_release(
    ctx: Context,
    sha: str,
    release_dir: Path,
    built: BuildResult,
    evidence: bringup.Evidence,
    previous: Entry | None,
    start: float,
) -> Outcome:
    when = rec.now()
    tag = rec.tag_name(ctx.cfg.release.tag, sha, when, ctx.state.release_count() + 1)
    typed = _record(
        ctx, sha, previous.sha if previous else None, "released", built, evidence, start
    )
    typed.tag = tag
    entry = Entry(
        sha=sha,
        release_dir=str(release_dir),
        verdict="released",
        at=when.isoformat(timespec="milliseconds"),
        tag=tag,
        reason="",
        startup_seconds=evidence.startup_seconds,
        artifacts=dict(built.artifacts),
    )
    state = ctx.state
    after = dataclasses.replace(
        state,
        previous=previous if previous is None or previous.sha != sha else state.previous,
        current=entry,
        history=[*state.history, entry],
    )
    # old releases go before the record is written, so a failure to remove one is in it;
    # a failure is a warning, never a failure of the release it follows
    warnings = prune_old(ctx, after.protected(ctx.cfg.host.keep_releases), after.history)
    typed.warnings = [*ctx.warnings, *warnings] or None
    try:
        record = rec.publish(ctx.cfg, ctx.deployer.repo, typed, tag, ctx.scrubber)
    except KeyboardInterrupt:
        # the release is proven and serving; the push was cut off (its refs are kept)
        record = None
    state.pending = None
    state.previous, state.current, state.history = after.previous, entry, after.history
    state.save()
    if record is None:
        raise Interrupted(
            f"interrupted while the record was pushed: {sha[:12]} is released, verified and "
            "serving, and its record is kept on this host",
            hint="the next release command pushes what is left (`release status` lists it)",
        )
    warn_unpushed(ctx, record)
    return Outcome(sha, "released", 0, tag=tag, record=record)


def prune_old(ctx: Context, protected: set[str], history: list[Entry]) -> list[str]:
    """Remove the releases and compile caches no longer kept; what could not be removed,
    as warnings (also printed)."""
    warnings: list[str] = []
    for what, prune in (
        ("old release directories", lambda: ctx.deployer.prune(protected)),
        ("old compile caches", lambda: prune_compile_caches(ctx, protected, history)),
    ):
        try:
            prune()
        except (ServegateError, OSError, GitCommandError) as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else repr(exc)
            warnings.append(
                f"could not remove {what} ({first[:300]}); the release is live and recorded. "
                f"Remove what is left under {ctx.cfg.host_root} by hand"
            )
    for line in warnings:
        ctx.reporter.note(f"warning: {line}")
    return warnings


def prune_compile_caches(
    ctx: Context, protected: set[str], history: list[Entry] | None = None
) -> list[Path]:
    """Compile caches whose key no kept release launches with (a release since pruned, or
    a launch since changed) are removed; the kept releases' warm caches stay. Only the
    host root's own compile-cache directory is pruned: a cache directory the profile or
    ``[service.env]`` points elsewhere may be shared with other hosts or users, and
    servegate never deletes there."""
    history = ctx.state.history if history is None else history
    entries = [e for e in history if e.sha in protected and e.release_dir]
    keep = {ctx.spec(Path(e.release_dir), e.sha).cache_key for e in entries} - {""}
    if not keep or not ctx.cfg.service.compile_cache:
        return []
    root = hostpaths.of(ctx.cfg).compile_cache
    stale = stale_caches([root], keep)
    for path in stale:
        remove_inside(path, root)  # a planted link out of the root is refused
    return stale


def _record(
    ctx: Context,
    sha: str,
    previous: str | None,
    verdict: str,
    built: BuildResult,
    evidence: bringup.Evidence,
    start: float,
) -> rec.ReleaseRecord:
    record = rec.ReleaseRecord.new(ctx.cfg, sha, previous, verdict)
    record.run = ctx.run_id
    record.stages = ctx.runner.as_list()
    record.total_seconds = round(time.monotonic() - start, 3)
    record.startup_seconds = round(evidence.startup_seconds, 3)
    record.artifacts = dict(built.artifacts)
    record.code_objects = dict(built.code_objects)
    record.build_targets = list(built.targets)
    record.build_log = str(built.log)
    record.launch = evidence.launch
    record.lint = evidence.lint
    record.startup_log = evidence.startup_log
    record.service_manager = ctx.manager.name
    record.service_pid = evidence.service_pid
    record.provenance = evidence.provenance
    record.gate = evidence.gate
    return record


def _scrubbed(exc: ServegateError, scrub: redact.Scrubber) -> ServegateError:
    """The failure as --json shows it: its text may quote the service's log, so the
    launch's secret values are replaced as in the record."""
    shown = copy.copy(exc)
    shown.args = (scrub.text(str(exc)),)
    shown.hint = scrub.text(exc.hint)
    return shown


@interrupts.putting_back()
def _roll_back(
    ctx: Context,
    sha: str,
    release_dir: Path,
    built: BuildResult,
    evidence: bringup.Evidence,
    exc: ServegateError,
    start: float,
) -> Outcome:
    """Put the previous release back after the switch and record the attempt; a stop
    signal (a cancel after a failed gate, the first signal too) does not cut it short."""
    scrub = ctx.scrubber  # a failure's text may quote the service's log
    reason = scrub.text(str(exc).splitlines()[0])
    ctx.reporter.note(f"{scrub.text(exc.render())}\nrolling back …")
    previous = ctx.state.current
    typed = _record(
        ctx, sha, previous.sha if previous else None, "rolled_back", built, evidence, start
    )
    typed.reason = scrub.text(str(exc))
    typed.warnings = list(ctx.warnings) or None
    rollback = restore_after_failure(ctx, failed_sha=sha)
    verdict = "rolled_back" if rollback["ok"] else "failed"  # never "rolled back" untrue
    typed.verdict = verdict
    if not rollback["ok"]:
        reason = f"{reason}; the rollback failed too: no verified release is serving"
    typed.rollback = rollback
    typed.stages = ctx.runner.as_list()
    try:
        record = rec.publish(ctx.cfg, ctx.deployer.repo, typed, None, ctx.scrubber)
        warn_unpushed(ctx, record)
        when = rec.stamp()
        ctx.state.pending = None
        ctx.state.history.append(
            Entry(
                sha=sha,
                release_dir=str(release_dir),
                verdict=verdict,
                at=when,
                tag="",
                reason=reason,
                startup_seconds=evidence.startup_seconds,
                artifacts=dict(built.artifacts),
            )
        )
        ctx.state.save()
    except OSError as full:  # a full disk: what serves is settled, its record is not
        unwritten = (
            f"the record of this attempt and the host state could not be written "
            f"({full.strerror}); the state still says a promote of {sha[:12]} is pending: "
            "free space on the host root, then `release recover` records it"
        )
        ctx.reporter.note(f"warning: {unwritten}")
        reason = f"{reason}; {unwritten}"
        record = typed.as_dict()
        ctx.scrubber.inplace(record)  # what --json shows: the secrets replaced, as a record
    outcome = Outcome(
        sha,
        verdict,
        exc.exit_code,
        reason=reason,
        record=record,
        rollback=rollback,
        stages=record["stages"],
        seconds=time.monotonic() - start,
        error=_scrubbed(exc, scrub),
    )
    if not rollback["ok"]:
        outcome.exit_code = RollbackFailed.exit_code
        outcome.error = RollbackFailed(
            scrub.text(f"{reason}: {rollback.get('reason', '')}"),
            hint=f"see `release status`; logs are under {ctx.cfg.host_root}/logs",
        )
    return outcome
