"""The trend of this host's releases, from its release records: the newest release
against the best of the window before it, and the change points of every case's
metrics (``release history``, ``servegate report``). The statistics are
:mod:`servegate.judging.trend`'s."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from servegate import hostpaths
from servegate.bench import results
from servegate.config import Config
from servegate.errors import ServegateError
from servegate.judging import noise, trend
from servegate.release import bench_gate
from servegate.release.deploy import make_deployer
from servegate.release.record import ReleaseRecord, host_id, host_records, logged
from servegate.release.state import HostState


def records(cfg: Config) -> list[ReleaseRecord]:
    """This host's records of every SHA in its history (each SHA once), oldest first by
    SHA's first appearance, then by time; a SHA whose note cannot be read is left out."""
    if not cfg.host.root or not hostpaths.of(cfg).state.exists():
        return []
    state = HostState.load(hostpaths.of(cfg).state)
    repo = make_deployer(cfg).repo
    kept = logged(cfg)
    out: list[ReleaseRecord] = []
    for sha in dict.fromkeys(e.sha for e in state.history):
        try:
            out += host_records(cfg, repo.notes(sha), sha, kept)
        except ServegateError:
            continue
    return out


def summary(cfg: Config, recs: list[ReleaseRecord] | None = None) -> dict[str, Any]:
    """The newest released record with bench samples judged against the trend of those
    before it (:func:`servegate.judging.trend.judge`, with ``[trend]``'s window and anchor
    and the gate's error rates), and the change points per ``case:metric`` of every
    released record measured like it. ``why`` alone when there is nothing to judge."""
    recs = records(cfg) if recs is None else recs
    newest = next(
        (doc for r in reversed(sorted(recs, key=lambda r: r.at))
         if r.verdict == "released" and (doc := bench_gate.recorded_samples(r))),
        None,
    )  # fmt: skip
    if newest is None:
        return {"why": "no released record with bench samples on this host"}
    try:
        digest = str(results.from_record(newest, "").fingerprint.get("digest") or "")
    except (AttributeError, KeyError, TypeError, ValueError):
        return {"why": "the newest release's bench samples are damaged"}
    past, skipped = trend.history_samples(
        recs, digest=digest, host=host_id(cfg), samples_of=bench_gate.recorded_samples
    )
    if not past:
        return {"why": "the newest release's bench samples cannot be read", "skipped": skipped}
    found, about = noise.load(cfg.host_root, digest)
    judged = judge(cfg, past[-1].samples, past[:-1], found)
    return {
        "latest": past[-1].sha,
        "records": len(past),
        "skipped": skipped,
        "noise": about,
        "judged": judged,
        "change_points": trend.shifts(past, bench_gate.rules(cfg), alpha=cfg.gate.false_alarm),
    }


def judge(
    cfg: Config,
    candidate: results.Samples,
    past: list[trend.Past],
    found: Mapping[str, noise.Noise],
) -> dict[str, Any]:
    """:func:`servegate.judging.trend.judge` with ``[trend]``'s window and anchor, the gate's
    error rates and the box's measured restart offsets ``found``."""
    return trend.judge(
        candidate, past, bench_gate.rules(cfg),
        window=cfg.trend.window, anchor=cfg.trend.anchor or None,
        false_alarm=cfg.gate.false_alarm, miss=cfg.gate.miss,
        offsets={k: v.offset for k, v in found.items()}, drift=cfg.gate.drift,
    )  # fmt: skip


def judge_candidate(cfg: Config, candidate: results.Samples, sha: str) -> dict[str, Any]:
    """The candidate ``sha``'s bench samples, measured by its gate now, against this host's
    released records measured like them (the bench gate's trend check)."""
    digest = str(candidate.fingerprint.get("digest") or "")
    past, skipped = trend.history_samples(
        records(cfg), digest=digest, host=host_id(cfg), samples_of=bench_gate.recorded_samples
    )
    found, about = noise.load(cfg.host_root, digest)
    judged = judge(cfg, candidate, past, found)
    return {**judged, "records": len(past), "skipped": skipped, "noise": about}
