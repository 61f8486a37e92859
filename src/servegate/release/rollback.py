"""Putting an earlier release back: after a failed promote, or on request."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, NoReturn

from servegate import documents, hostpaths
from servegate.engine import managers
from servegate.engine.launch import placeholders
from servegate.errors import (
    Interrupted,
    NothingToDo,
    PreflightFailed,
    RollbackFailed,
    ServegateError,
    ServiceFailed,
)
from servegate.kernels.build import run_build
from servegate.pipeline import interrupts, reserve
from servegate.pipeline.hashing import sha256_file
from servegate.pipeline.lease import gpu_lease
from servegate.pipeline.lock import HostLock
from servegate.release import bringup
from servegate.release import record as rec
from servegate.release.context import Context
from servegate.release.state import Entry, Pending

WHAT_TO_DO = (
    "the service is NOT serving a verified release. Read the service log under "
    "{root}/logs, then run `release rollback --to <good sha>` (see `release history`), "
    "or start the last good release by hand"
)


def restore(ctx: Context, target: Entry) -> dict[str, Any]:
    """Switch the service to ``target``, wait until healthy, verify provenance, smoke probe.

    Returns the evidence; ``ok`` is False (with ``reason``) when any step failed. A restore
    that failed for want of space gives up the host root's reserve
    (:mod:`servegate.pipeline.reserve`) and tries once more.
    """
    result = _restore(ctx, target)
    where = hostpaths.of(ctx.cfg).reserve
    if not result["ok"] and reserve.is_full(result["reason"]) and reserve.release(where):
        ctx.reporter.note(
            "the disk is full: the space held back for this gave way, and the rollback is "
            "tried again"
        )
        result = {**_restore(ctx, target), "reserve_used": True}
    return result


def _restore(ctx: Context, target: Entry) -> dict[str, Any]:
    start = time.monotonic()
    runner = ctx.runner
    evidence = bringup.Evidence()
    launch = "kept"
    try:
        with runner.stage("rb switch") as st:
            release_dir = ctx.deployer.restore(target.sha)
            kept, why = bringup.kept_launch(ctx, target.sha, release_dir)
            if kept is not None:
                ctx.use_launch(release_dir, kept)
            else:
                launch = f"rendered from the current config: {why}"
                ctx.reporter.note(f"rollback: {target.sha[:12]}'s launch is {launch}")
            artifacts = dict(target.artifacts)
            if ctx.deployer.rebuilds_on_restore:
                places = placeholders(ctx.cfg, release_dir, target.sha)
                artifacts = dict(
                    run_build(
                        ctx.cfg,
                        release_dir,
                        places,
                        ctx.log_path(target.sha, "build"),
                        ctx.build_cache,
                    ).artifacts
                )
            bringup.switch(ctx, target.sha, release_dir, evidence)
            st.detail = f"back to {target.sha[:12]}"
        with runner.stage("rb healthy") as st:
            bringup.healthy(ctx, target.sha, release_dir, evidence)
            st.detail = f"start-up {evidence.startup_seconds:.1f}s"
        with runner.stage("rb provenance"):
            bringup.prove(ctx, target.sha, release_dir, artifacts, evidence)
        with runner.stage("rb smoke"):
            bringup.gate(ctx, target.sha, release_dir, evidence, smoke_only=True)
            # the process the record will say was proven, as it runs now
            bringup.proven_after_gate(ctx, target.sha, release_dir, artifacts, evidence)
    except (ServegateError, OSError) as exc:  # a full disk too: said, never a crash
        return {
            "ok": False,
            "sha": target.sha,
            "reason": str(exc),
            "launch": launch,
            "seconds": round(time.monotonic() - start, 3),
        }
    return {
        "ok": True,
        "sha": target.sha,
        "launch": launch,
        "release_dir": str(release_dir),
        "startup_seconds": round(evidence.startup_seconds, 3),
        "seconds": round(time.monotonic() - start, 3),
        "provenance_ok": evidence.provenance.get("ok", False),
        "gate": documents.plain(evidence.gate) if evidence.gate else {},
    }


def restore_after_failure(ctx: Context, failed_sha: str) -> dict[str, Any]:
    """Put the live release back after a failure. With none (the host's first release
    failed) there is nothing to put back and nothing was lost: the service is stopped,
    and that is the rollback (``stopped``), not a failed one."""
    target = ctx.state.current
    if target is None:
        ctx.manager.stop()
        reason = (
            "nothing to put back: no release was released on this host yet, so nothing was "
            "lost; the service is stopped. Fix the release and promote again"
        )
        ctx.reporter.note(f"rollback: {reason}")
        return {"ok": True, "sha": None, "stopped": True, "reason": reason}
    if target.sha == failed_sha:
        ctx.manager.stop()
        reason = "no earlier release is recorded on this host; the service was stopped"
        ctx.reporter.note(f"rollback: {reason}")
        return {"ok": False, "sha": None, "reason": reason}
    result = restore(ctx, target)
    if result["ok"]:
        ctx.reporter.note(f"rolled back: {target.sha[:12]} is serving again and verified")
    else:
        ctx.reporter.note(
            f"ROLLBACK FAILED: {result['reason']}\n" + WHAT_TO_DO.format(root=ctx.cfg.host_root)
        )
    return result


def mark_pending(ctx: Context, kind: str, sha: str, release_dir: Path) -> None:
    """Written before the service is touched, cleared by the record: if this process dies
    in between, the next run finds it (:func:`recover`)."""
    ctx.state.pending = Pending(
        kind=kind,
        sha=sha,
        release_dir=str(release_dir),
        at=rec.stamp(),
        pid=os.getpid(),
        run=ctx.run_id,
    )
    ctx.state.save()


@interrupts.putting_back()  # what it puts back, a stop signal does not cut short
def recover(ctx: Context) -> dict[str, Any] | None:
    """Finish what a promote or rollback that died after its switch left behind (a lost
    SSH connection, a kill): put the last recorded live release back, verified, and record
    the attempt. Called under the host lock by the next promote or rollback."""
    pending = ctx.state.pending
    if not pending:
        return None
    sha = pending.sha
    live = ctx.state.current
    back = live.sha[:12] if live else "nothing (no release was recorded)"
    ctx.reporter.note(
        f"an interrupted {pending.kind} of {sha[:12]} (started "
        f"{pending.at or '?'}) left the service half switched; putting back {back}"
    )
    with ctx.runner.stage("recover") as st:
        with gpu_lease(ctx.lease_path, f"recover from {sha[:12]}", ctx.cfg.host.lease_timeout):
            if live is None:
                ctx.manager.stop()
                result = {"ok": True, "sha": None, "reason": "no earlier release: service stopped"}
            else:
                result = restore(ctx, live)
        st.detail = f"back to {back}" if result["ok"] else "FAILED"
    reason = (
        f"interrupted after the switch (started {pending.at or '?'}); rolled back by the next run"
    )
    # never "rolled back" untrue: a restore that failed leaves no verified release serving
    verdict = "rolled_back" if result["ok"] else "failed"
    if not result["ok"]:
        reason = f"{reason}; the rollback failed too: no verified release is serving"
    record = rec.ReleaseRecord.new(ctx.cfg, sha, live.sha if live else None, verdict)
    record.reason, record.rollback, record.stages = reason, result, ctx.runner.as_list()
    record.run = ctx.run_id
    tagged = _released_before(ctx, sha, pending.at, pending.run)
    if tagged is not None:
        # the promote got as far as its record and tag, then died before the host state
        # said so: the tag stays on origin, and this release's note says it is superseded
        record.supersedes = tagged
        record.reason = reason = (
            f"{reason}; it had been recorded released and tagged {tagged['tag']} just before "
            "the interruption: that tag stays, this record supersedes it"
        )
        ctx.reporter.note(f"the release record and tag {tagged['tag']} of {sha[:12]} are "
                          f"superseded by its {verdict} record")  # fmt: skip
    record.warnings = list(ctx.warnings) or None
    written = rec.publish(ctx.cfg, ctx.deployer.repo, record, None, ctx.scrubber)
    warn_unpushed(ctx, written)
    when = rec.stamp()
    ctx.state.history.append(
        Entry(
            sha=sha,
            release_dir=pending.release_dir,
            verdict=verdict,
            at=when,
            tag=tagged["tag"] if tagged else "",
            reason=reason,
        )
    )
    ctx.state.pending = None
    ctx.state.save()
    if not result["ok"]:
        raise RollbackFailed(
            f"recovering from the interrupted promote of {sha[:12]} failed: {result['reason']}",
            hint=WHAT_TO_DO.format(root=ctx.cfg.host_root),
        )
    result["recovered"] = sha
    return result


def warn_unpushed(ctx: Context, written: dict[str, Any]) -> None:
    """Said the same way by promote, rollback and recover: the record is kept, not lost."""
    for line in written["publish"].get("warnings", []):
        ctx.reporter.note(f"warning: {line}")
    if not written["publish"]["pushed"]:
        ctx.reporter.note(
            f"warning: the record was not pushed: {written['publish']['error']}; it is kept "
            f"in {rec.unpushed_path(ctx.cfg)} and pushed by the next release command"
        )


def _released_before(ctx: Context, sha: str, since: str, run: str = "") -> dict[str, str] | None:
    """This host's ``released`` record of ``sha`` made by the interrupted run — the run
    its pending marker names (``run``); for a marker from before runs were named, one at
    or after ``since``: a clock that jumped back during the run misses it — with its tag;
    None when the run died before recording. A note that cannot be read is looked past
    (the host's own copy of its records still counts) and said."""
    try:
        text = ctx.deployer.repo.notes(sha)
    except ServegateError as exc:
        line = (
            f"the release note of {sha[:12]} could not be read ({exc}): whether the "
            "interrupted run had recorded it released is judged from this host's own copy"
        )
        ctx.reporter.note(f"warning: {line}")
        ctx.warnings.append(line)
        text = ""
    records = rec.host_records(ctx.cfg, text, sha)
    for r in reversed(records):
        mine = r.run == run if run else r.at >= since
        if r.verdict == "released" and mine:
            return {"verdict": "released", "tag": r.tag or "", "at": r.at}
    return None


def no_verified_release(ctx: Context) -> bool:
    """Whether the last promote or recover failed and its rollback too: the release the
    host state names as live is not what serves (it may be stopped or half started)."""
    history = ctx.state.history
    return bool(history) and history[-1].verdict == "failed"


def pick_target(ctx: Context, to: str | None) -> Entry:
    if to:
        target = ctx.state.released(to)
        if target is None:
            raise NothingToDo(
                f"{to} was never released on this host",
                hint="`release history` lists the releases this host can go back to",
            )
        return target
    if ctx.state.previous is None:
        raise NothingToDo(
            "there is no previous release to roll back to",
            hint="`release history` lists releases; use --to SHA to pick one",
        )
    return ctx.state.previous


def _put_back_after_stop(ctx: Context, target: Entry, current: Entry) -> NoReturn:
    """A stop signal cut the rollback to ``target`` short after its switch: the release
    that was serving is put back, verified, whatever signal comes next."""
    with interrupts.putting_back():
        back = restore(ctx, current)
        if back["ok"]:
            ctx.state.pending = None
            ctx.state.save()
    if not back["ok"]:
        raise RollbackFailed(
            f"the rollback to {target.sha[:12]} was interrupted, and putting "
            f"{current.sha[:12]} back failed: {ctx.scrubber.text(back['reason'])}",
            hint=WHAT_TO_DO.format(root=ctx.cfg.host_root),
        )
    raise Interrupted(
        f"interrupted: the rollback to {target.sha[:12]} was stopped; {current.sha[:12]}, "
        "which was serving, is back and verified",
        hint="run `release rollback` again to go back",
    )


def restore_problem(ctx: Context, target: Entry) -> str:
    """Why ``target`` could not be started again from its files ("" when it could): its
    checkout is gone, or a built artifact is missing or differs from what was built."""
    if ctx.deployer.rebuilds_on_restore:
        return ""  # in-place: the build runs again on restore
    where = Path(target.release_dir)
    if not where.is_dir():
        return f"the release directory of {target.sha[:12]} ({where}) is gone"
    for rel, want in sorted(target.artifacts.items()):
        path = where / rel
        got = sha256_file(path) if path.is_file() else "missing"
        if got != want:
            now = "missing" if got == "missing" else f"now sha256 {got[:16]}…"
            return f"{rel} of {target.sha[:12]} is not what was built (sha256 {want[:16]}…, {now})"
    return ""


def check_restorable(ctx: Context, target: Entry) -> None:
    """The target's checkout and built artifacts are there and are what was built: a
    rollback that cannot start must not stop the live release first."""
    problem = restore_problem(ctx, target)
    if problem:
        raise PreflightFailed(
            f"{problem}: a rollback to it would stop the live release and start nothing",
            hint=f"promote {target.sha[:12]} again (`release promote --allow-non-ff "
            f"{target.sha}`), which rebuilds it",
        )


def check_launch(ctx: Context, target: Entry) -> None:
    """The launch a rollback to ``target`` installs — the one it was kept with, else
    today's render — can be written as a unit exactly: a refusal comes before the live
    release is stopped (ConfigError)."""
    where = Path(target.release_dir)
    kept, _ = bringup.kept_launch(ctx, target.sha, where)
    managers.refuse(ctx.manager, kept or ctx.spec(where, target.sha))


def rollback(ctx: Context, to: str | None) -> dict[str, Any]:
    """``release rollback [--to SHA]``: make an earlier release live again, verified."""
    bringup.check_host_root(ctx)  # before its lock file is made in it
    with HostLock(ctx.lock_path, f"release rollback {to or ''}".strip()):
        recovered = recover(ctx)
        interrupts.stop_if_received()  # a stop during the recover: switch nothing more
        current = ctx.state.current
        if recovered is not None and (to is None or (current and current.sha.startswith(to))):
            recovered["stages"] = ctx.runner.as_list()
            return recovered  # the interrupted release is undone: that was the rollback
        target = pick_target(ctx, to)
        again = current is not None and current.sha == target.sha
        if again and not no_verified_release(ctx):
            raise NothingToDo(
                f"{target.sha[:12]} is already the live release",
                hint="`release verify` proves what serves; `release history` lists the "
                "releases to go back to with --to",
            )
        with ctx.runner.stage("preflight"):
            bringup.check_host_root(ctx)
            bringup.check_port_free(ctx)
            check_restorable(ctx, target)  # before the healthy live release is stopped
            check_launch(ctx, target)
        what = f"release rollback to {target.sha[:12]}"
        with gpu_lease(ctx.lease_path, what, ctx.cfg.host.lease_timeout):
            mark_pending(ctx, "rollback", target.sha, Path(target.release_dir))
            try:
                result = restore(ctx, target)
            except KeyboardInterrupt:
                if current is None or again:
                    raise  # nothing else to put back: `release recover` finishes it
                _put_back_after_stop(ctx, target, current)
            if not result["ok"] and current is not None and not again:
                back = restore(ctx, current)  # the release that was serving, back
                if back["ok"]:
                    ctx.state.pending = None
                    ctx.state.save()
                    raise ServiceFailed(
                        f"the rollback to {target.sha[:12]} failed: "
                        f"{ctx.scrubber.text(result['reason'])}\n"
                        f"{current.sha[:12]}, which was serving, is back and verified",
                        hint="`release history` shows the releases; fix the target or pick "
                        "another with --to",
                    )
        if not result["ok"]:
            raise RollbackFailed(
                ctx.scrubber.text(result["reason"]), hint=WHAT_TO_DO.format(root=ctx.cfg.host_root)
            )
        with interrupts.putting_back(), ctx.runner.stage("record"):
            typed = rec.ReleaseRecord.new(
                ctx.cfg, target.sha, current.sha if current else None, "rollback"
            )
            typed.stages, typed.rollback = ctx.runner.as_list(), dict(result)
            typed.run = ctx.run_id
            record = rec.publish(ctx.cfg, ctx.deployer.repo, typed, None, ctx.scrubber)
            warn_unpushed(ctx, record)
            when = rec.stamp()
            entry = Entry(
                sha=target.sha,
                release_dir=result["release_dir"],
                verdict="rollback",
                at=when,
                tag=target.tag,
                reason=f"requested (from {current.sha[:12] if current else 'nothing'})",
                startup_seconds=result["startup_seconds"],
                artifacts=dict(target.artifacts),
            )
            ctx.state.pending = None
            if not again:  # starting the recorded live release again keeps its previous
                ctx.state.previous = current
            ctx.state.current = entry
            ctx.state.history.append(entry)
            ctx.state.save()
        result["record"] = record
        result["stages"] = ctx.runner.as_list()
        return result
