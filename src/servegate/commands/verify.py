from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from pathlib import Path

from servegate.commands import args as common_args
from servegate.config import Config
from servegate.errors import NothingToDo, ProvenanceMismatch, ServegateError
from servegate.output import Output
from servegate.pipeline.stages import QuietReporter
from servegate.release import bringup
from servegate.release.context import Context


def run(cfg: Config, out: Output) -> int:
    ctx = Context.create(cfg, QuietReporter(), os.environ)
    current = ctx.state.current
    if current is None:
        return out.error(
            NothingToDo(
                "no release is recorded on this host", hint="run `release promote <sha>` first"
            )
        )
    evidence = bringup.Evidence()
    try:
        recorded = _recorded_artifacts(ctx, current.sha, current.artifacts)
        report = bringup.prove(
            ctx, current.sha, Path(current.release_dir), current.artifacts, evidence
        )
        if recorded is None:
            report.weaker.append(
                f"no release record of this host for {current.sha[:12]}: the build hashes in "
                "state.json were not checked against one"
            )
    except ServegateError as err:
        if out.json_mode:
            return out.emit(evidence.provenance, err.exit_code, err)
        return out.error(err)
    if out.json_mode:
        return out.emit(report.as_dict())
    rows = [
        [str(p["pid"]), str(p["ppid"]), p["evidence"], p["cwd"], p["cmdline"][:60]]
        for p in report.processes
    ]
    out.table(
        f"live service runs {current.sha[:12]}", ["pid", "ppid", "evidence", "cwd", "command"], rows
    )
    for ext in report.extensions:
        out.line(
            f"  pid {ext['pid']} maps {ext['path']} sha256 {ext['sha256'][:16]}… ✓ "
            f"(by {ext['method']})"
        )
    for name, origin in report.modules.items():
        how = report.modules_evidence.get(name, "inferred")
        why = (
            "a live frame runs it" if how == "observed" else "resolved by the service's interpreter"
        )
        out.line(f"  module {name} → {origin} ✓ ({how}: {why})")
    mapped = ", ".join(f"{n} {k}" for k, n in sorted(report.mapped_summary.items()))
    out.line(f"  mapped files: {mapped or 'none'}; nothing foreign")
    for hook in report.hooks:
        out.line(f"  start-up hook ({hook['verdict']}): {hook['path']} — {hook['why']}")
    for line in report.weaker:
        out.line(f"  weaker evidence: {line}")
    out.line(
        f"provenance OK ({report.evidence}): {len(report.processes)} process(es) run "
        f"{current.release_dir}"
    )
    return 0


def _recorded_artifacts(
    ctx: Context, sha: str, state_artifacts: Mapping[str, str]
) -> Mapping[str, str] | None:
    """The build hashes this host's latest sealed release record of ``sha`` holds (None:
    no record with them). The live libraries are checked against state.json's copy; a
    copy that record contradicts (someone who could write the host root rebuilt a
    library and wrote its hash there) is refused, not believed. Only this host's sealed
    records count, so the latest is its own last build of the SHA (a promote of the SHA
    again may rebuild it with other hashes)."""
    kept = [r.artifacts for r in bringup.host_released(ctx, sha) if r.artifacts is not None]
    for recorded in kept[-1:]:
        if dict(recorded) != dict(state_artifacts):
            differ = sorted(
                k for k in set(recorded) | set(state_artifacts)
                if recorded.get(k) != state_artifacts.get(k)
            )  # fmt: skip
            raise ProvenanceMismatch(
                f"state.json's build hashes for {sha[:12]} differ from its release record's "
                f"({', '.join(differ[:5])}): the host state or the records were changed after "
                "the release",
                hint="`release recover --rebuild-state` makes the state again from the "
                "records; then `release verify` (if they still differ, compare the records "
                "with origin's: `git notes --ref refs/notes/servegate show <sha>` in a clone)",
            )
    return kept[-1] if kept else None


def attestation(cfg: Config, out: Output, requested: str, allowed: Path | None) -> int:
    """``release verify --attestation SHA``: the SHA's signed attestations against the
    allowed signers and the policy (docs/attestations.md)."""
    from servegate.release import attest
    from servegate.release import record as rec

    ctx = Context.create(cfg, QuietReporter(), os.environ)
    try:
        repo = ctx.deployer.repo
        repo.fetch()
        sha = repo.resolve(requested)
        current = ctx.state.current
        checkout = Path(current.release_dir) if current and current.sha == sha else None
        if checkout is None and (cfg.host_root / "releases" / sha).is_dir():
            checkout = cfg.host_root / "releases" / sha
        found = attest.check_release(cfg, repo, sha, rec.host_id(cfg), checkout, allowed)
        if repo.notes_warning:
            found.notes.append(repo.notes_warning)
    except ServegateError as err:
        return out.error(err)
    if not found.ok:
        failed = attest.failure(found)
        if out.json_mode:
            return out.emit(found.as_dict(), failed.exit_code, failed)
        for env in found.envelopes:
            out.line(f"  {env.get('predicateType', 'envelope')}: trusted {env['trusted']}"
                     f" — {env.get('why') or env.get('signer', '')}")  # fmt: skip
        return out.error(failed)
    if out.json_mode:
        return out.emit(found.as_dict())
    for env in found.envelopes:
        why = env.get("why") or f"signed by {env.get('signer', '')}"
        out.line(f"  {env.get('predicateType', 'envelope')}: trusted {env['trusted']} — {why}")
    for note in found.notes:
        out.line(f"  {note}")
    out.line(
        f"attestation OK: {sha[:12]} released on this host at {found.at}, signed by {found.signer}"
    )
    return 0


def add_arguments(p: argparse.ArgumentParser) -> None:
    common_args.common(p)
    p.add_argument(
        "--attestation",
        metavar="SHA",
        default="",
        help="verify the signed in-toto attestations of SHA instead of the live processes: "
        "signer allowed, subjects its checkout and artifacts, verdict released (exit 22 if not)",
    )
    p.add_argument(
        "--allowed-signers",
        metavar="FILE",
        type=Path,
        default=None,
        help="with --attestation: this allowed-signers file instead of attest.allowed_signers "
        "at the tip of the configured branch",
    )


def main(cfg: Config, args: argparse.Namespace, out: Output) -> int:
    if args.attestation:
        return attestation(cfg, out, args.attestation, args.allowed_signers)
    return run(cfg, out)
