"""The release record: JSON in a git note on the released SHA, plus an annotated tag."""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import hmac
import json
import os
import re
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from servegate import __version__, about, documents, hostpaths
from servegate.config import Config
from servegate.errors import CommandFailed, ConfigError
from servegate.pipeline import atomic
from servegate.pipeline.git import ATTEST_REF, NOTES_REF, Identity, StackRepo
from servegate.pipeline.redact import Scrubber, host_salt
from servegate.release import attest

if TYPE_CHECKING:
    from servegate.release.sshsig import SshSigner

SCHEMA = 1


def now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def stamp() -> str:
    """When a record or a state entry is written: to the millisecond, so that two
    releases of one second still sort in the order they were made (``release recover
    --rebuild-state`` orders the records by it)."""
    return now().isoformat(timespec="milliseconds")


def tag_name(pattern: str, sha: str, when: dt.datetime, n: int) -> str:
    return (
        pattern.replace("{date}", when.strftime("%Y%m%d"))
        .replace("{time}", when.strftime("%H%M%S"))
        .replace("{short}", sha[:12])
        .replace("{sha}", sha)
        .replace("{n}", str(n))
    )


def host_id(cfg: Config) -> str:
    """This host's identity, stable across restarts and hostname changes (containers get a
    new hostname each start): ``host.id``, else the machine id, else the hostname."""
    if cfg.host.id:
        return cfg.host.id
    try:
        machine = Path("/etc/machine-id").read_text().strip()
    except OSError:
        machine = ""
    return f"machine:{machine}" if machine else f"hostname:{socket.gethostname()}"


#: fields left out of a record while unset: a rolled-back attempt has no tag, a rollback
#: no build; the others are always written, null when unknown
OPTIONAL = frozenset(
    ["tag", "total_seconds", "startup_seconds", "artifacts", "code_objects", "build_targets",
     "build_log", "launch", "lint", "startup_log", "service_manager", "service_pid",
     "provenance", "gate", "reason", "rollback", "supersedes", "warnings", "run", "attestation",
     "seal"]
)  # fmt: skip


@dataclass
class CheckRecord:
    """One gate check as a release record keeps it."""

    name: str
    #: PASS, FAIL or INCONCLUSIVE
    verdict: str
    reason: str = ""
    seconds: float = 0.0
    #: what the check measured and judged, in its own shape (the bench check's samples
    #: and rows, the load check's sweep: each read by its check, typed there)
    evidence: dict[str, Any] = field(default_factory=dict)


@dataclass
class GateRecord:
    """The gate's verdict and its checks, in the order they ran ("" and none: the run
    ended before the gate)."""

    verdict: str = ""
    checks: list[CheckRecord] = field(default_factory=list)

    def check(self, name: str) -> CheckRecord | None:
        """The check of that name, if it ran."""
        return next((c for c in self.checks if c.name == name), None)


@dataclass
class ReleaseRecord:
    """One line of a release note: every promote, automatic rollback, requested rollback
    and recovery writes one (docs/records.md, "The release record")."""

    verdict: str  # released | rolled_back | rollback | failed
    sha: str
    previous_sha: str | None
    host: str
    host_id: str
    branch: str
    remote: str
    strategy: str
    at: str
    schema: int = SCHEMA
    kind: str = "servegate.release"
    servegate_version: str = __version__
    #: the commit servegate itself was installed from ("" when the installer recorded none)
    servegate_commit: str = field(default_factory=lambda: about.installed_from()["commit"])
    tag: str | None = None
    stages: list[dict[str, Any]] = field(default_factory=list)
    total_seconds: float | None = None
    startup_seconds: float | None = None
    artifacts: dict[str, str] | None = None
    code_objects: dict[str, Any] | None = None
    build_targets: list[Any] | None = None
    build_log: str | None = None
    launch: dict[str, Any] | None = None
    lint: list[dict[str, str]] | None = None
    startup_log: dict[str, Any] | None = None
    service_manager: str | None = None
    service_pid: int | None = None
    provenance: dict[str, Any] | None = None
    gate: GateRecord | None = None
    reason: str | None = None
    rollback: dict[str, Any] | None = None
    #: a released record (and its tag) this one overrides: ``{verdict, tag, at}``
    supersedes: dict[str, str] | None = None
    #: what went wrong after the release was proven and did not undo it (old releases
    #: that could not be pruned)
    warnings: list[str] | None = None
    #: the run (promote, rollback, recover) that wrote it, as its pending marker names it:
    #: a recover finds what an interrupted run recorded by this, not by the clock
    run: str | None = None
    #: the in-toto attestations written beside a released or rolled-back record
    #: (:mod:`servegate.release.attest`): signed or why not, and each envelope's digest
    attestation: attest.Written | None = None
    #: the host's seal of the record as written (:func:`seal`; added by :func:`publish`)
    seal: str | None = None

    @classmethod
    def new(cls, cfg: Config, sha: str, previous: str | None, verdict: str) -> ReleaseRecord:
        return cls(
            verdict=verdict,
            sha=sha,
            previous_sha=previous,
            host=socket.gethostname(),
            host_id=host_id(cfg),
            branch=cfg.stack.branch,
            remote=cfg.stack.remote,
            strategy=cfg.host.strategy,
            at=stamp(),
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            k: v for k, v in dataclasses.asdict(self).items() if v is not None or k not in OPTIONAL
        }


#: what the host's seal key is for (the key is derived from the host's secret salt)
SEAL_PURPOSE = b"servegate release record seal v1"


def seal(doc: Mapping[str, Any], salt: str) -> str:
    """The host's seal of a record: an HMAC-SHA256, under a key only this host holds (its
    salt, 0600 in the host root), of the record's canonical JSON without its seal.

    Every host of a fleet, and anyone who may push to origin, writes the same notes ref;
    the box merges origin's notes into its own. A record's ``host_id`` names a host but
    proves nothing (every record on origin shows it), so the records a box trusts as its
    own (the gate's baseline, ``release verify``'s build hashes, a rebuilt state) are
    those it sealed itself."""
    key = hmac.new(salt.encode(), SEAL_PURPOSE, hashlib.sha256).digest()
    body = {k: v for k, v in doc.items() if k != "seal"}
    blob = json.dumps(body, sort_keys=True).encode()
    return hmac.new(key, blob, hashlib.sha256).hexdigest()


def sealed(doc: Mapping[str, Any], salt: str) -> bool:
    """Whether ``doc`` carries this host's seal (``salt``: the host's secret salt)."""
    mark = doc.get("seal")
    return isinstance(mark, str) and hmac.compare_digest(mark.encode(), seal(doc, salt).encode())


def host_records(
    cfg: Config, text: str, sha: str, kept: list[dict[str, Any]] | None = None
) -> list[ReleaseRecord]:
    """This host's records of ``sha``, oldest first (:func:`sealed_records`, less those
    that do not read as a record)."""
    return sealed_records(cfg, text, sha, kept)[0]


def sealed_records(
    cfg: Config, text: str, sha: str, kept: list[dict[str, Any]] | None = None
) -> tuple[list[ReleaseRecord], list[str]]:
    """This host's records of ``sha``, oldest first, typed: those it sealed, in the
    note's ``text`` and in its own copy (:func:`logged`), once each; and why each sealed
    line that is not a release record as this servegate reads it was left out. A record
    that names this host but carries no seal of its key (pushed to origin by someone
    else, or written before servegate sealed records) is not this host's; one removed
    from the note (a push to origin can rewrite the notes ref) is still found in the copy
    (``kept``: the copy already read, by a caller that reads many SHAs' records)."""
    salt = host_salt(cfg.host_root)
    mine = host_id(cfg)
    found: dict[str, dict[str, Any]] = {}
    for r in [*parse_notes(text), *(logged(cfg) if kept is None else kept)]:
        if r.get("sha") == sha and r.get("host_id") == mine and sealed(r, salt):
            found.setdefault(r["seal"], r)
    records, skipped = [], []
    for r in found.values():
        try:
            records.append(documents.read(ReleaseRecord, r))
        except documents.DocumentError as exc:
            skipped.append(
                f"a record of {sha[:12]} at {str(r.get('at'))[:40]!r} is skipped: {exc} "
                "(not a record servegate writes)"
            )
    return sorted(records, key=lambda r: r.at), skipped


def logged(cfg: Config) -> list[dict[str, Any]]:
    """The records in this host's own copy (``<host.root>/records.jsonl``); unreadable
    lines are skipped (their seals are checked by the reader)."""
    try:
        fd = os.open(hostpaths.of(cfg).records, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return []
    with os.fdopen(fd, encoding="utf-8", errors="replace") as f:
        return parse_notes(f.read())


def _keep(cfg: Config, line: str, path: Path | None = None) -> None:
    """Append a sealed record (or the lines of its attestations) to the host's own copy,
    durably, before it goes anywhere else."""
    path = path or hostpaths.of(cfg).records
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        data = (line + "\n").encode()
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":  # a line torn by a crash or a
            data = b"\n" + data  # full disk: this record must not be glued onto it
        while data:
            data = data[os.write(fd, data) :]
        os.fsync(fd)
    finally:
        os.close(fd)


def parse_notes(text: str) -> list[dict[str, Any]]:
    """A note holds one JSON record a line (``git notes append`` adds blank lines between;
    merging with origin's notes sorts the lines): the records, oldest first by ``at``."""
    records = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                records.append(json.loads(line))
            except ValueError:
                continue
    return sorted(records, key=lambda r: str(r.get("at", "")))


def publish(
    cfg: Config,
    repo: StackRepo,
    record: ReleaseRecord,
    tag: str | None,
    scrubber: Scrubber | None = None,
) -> dict[str, Any]:
    """Note (and tag) locally, then push both; returns the record as written, with
    ``publish`` (what reached origin) added. A failed push is reported, not fatal: the
    release is live and verified either way. ``scrubber``: the written record is
    scrubbed of the launch's secret values (the caller's --json shows the same)."""
    doc = record.as_dict()
    if scrubber is not None:
        scrubber.inplace(doc)
    doc = dict(json.loads(json.dumps(doc, sort_keys=True)))  # sealed as readers parse it
    envelopes: list[str] = []
    if record.verdict in attest.ATTESTED:
        try:
            envelopes, written = attest.envelopes(cfg, doc, _signer(cfg))
        except Exception as exc:  # the release is live: it gets its record, whatever this was
            envelopes, written = [], attest.Written(unsigned=f"no attestation made: {exc!r}")
        doc["attestation"] = dataclasses.asdict(written)
    doc["seal"] = seal(doc, host_salt(cfg.host_root))
    line = json.dumps(doc, sort_keys=True)
    _keep(cfg, line)
    identity = Identity(cfg.release.identity_name, cfg.release.identity_email)
    sha = record.sha
    repo.append_note(sha, line, identity)
    refs = [f"{NOTES_REF}:{NOTES_REF}"]
    noted = ""
    if envelopes:
        try:  # the release is proven: a note that cannot be written costs it nothing
            _keep(cfg, "\n".join(envelopes), hostpaths.of(cfg).attestations)
            attest.write(repo, sha, envelopes, identity)
            refs.append(f"{ATTEST_REF}:{ATTEST_REF}")
        except Exception as exc:
            noted = f"the attestations were not noted in {ATTEST_REF}: {exc}"
    if tag:
        message = f"servegate release {sha[:12]} ({record.verdict})"
        repo.tag(tag, sha, message, identity)
        refs.append(f"refs/tags/{tag}:refs/tags/{tag}")
    if not cfg.release.push:
        doc["publish"] = {"pushed": False, "refs": refs, "error": "release.push = false"}
    else:
        doc["publish"] = push_pending(cfg, repo, refs)
    if noted:
        doc["publish"].setdefault("warnings", []).append(noted)
    return doc


def _signer(cfg: Config) -> SshSigner | attest.Unsigned:
    """The host's signer; a key that cannot sign now (checked before the promote changed
    anything, so removed or changed since) leaves the attestations unsigned, with why."""
    try:
        return attest.signer_of(cfg, host_id(cfg)) or attest.Unsigned("attest.key is not set")
    except ConfigError as exc:
        return attest.Unsigned(str(exc))


def unpushed_path(cfg: Config) -> Path:
    return hostpaths.of(cfg).unpushed


#: one entry of the unpushed list: ``refs/…:refs/…``, the same name on both sides
REFSPEC = re.compile(r"^(refs/(?:notes|tags)/[^:\s]+):\1$")


def unpushed(cfg: Config) -> list[str]:
    """Refs a run made and could not push (pushed by the next run of any release command);
    entries that are not such a refspec are left out (:func:`unpushed_checked` says so)."""
    return unpushed_checked(cfg)[0]


def unpushed_checked(cfg: Config) -> tuple[list[str], list[str]]:
    """The unpushed refspecs, and a warning for each entry of the file left out."""
    path = unpushed_path(cfg)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return [], []
    except (OSError, ValueError) as exc:
        return [], [f"{path} is not readable JSON ({exc}); it is ignored and replaced"]
    if not isinstance(data, list):
        return [], [f"{path} is not a list of refspecs; it is ignored and replaced"]
    good: list[str] = []
    warnings: list[str] = []
    for entry in data:
        if isinstance(entry, str) and REFSPEC.match(entry):
            good.append(entry)
        else:
            warnings.append(
                f"{path}: {str(entry)[:80]!r} is not a refspec servegate writes "
                "(refs/notes/… or refs/tags/…, the same on both sides); dropped"
            )
    return good, warnings


def push_pending(cfg: Config, repo: StackRepo, refs: Sequence[str] = ()) -> dict[str, Any]:
    """Push ``refs`` and whatever an earlier run could not push, one ref at a time (one
    that origin rejects holds back no other); what fails is kept for the next run. Kept
    refs that no longer exist here are dropped with a warning."""
    kept, warnings = unpushed_checked(cfg)
    todo: list[str] = []
    for spec in dict.fromkeys([*kept, *refs]):
        if spec in refs or repo.has_ref(spec.split(":", 1)[0]):
            todo.append(spec)
        else:
            warnings.append(f"{spec.split(':', 1)[0]} no longer exists here; not pushed, dropped")
    if not todo:
        unpushed_path(cfg).unlink(missing_ok=True)
        return {"pushed": True, "refs": [], "error": "", "warnings": warnings}
    errors: list[str] = []
    failed: list[str] = []
    # kept before the first network call: a push cut off (Ctrl-C, a killed run) leaves
    # the list for the next run, never nothing
    atomic.write_json(unpushed_path(cfg), todo)
    try:
        repo.fetch_notes()  # merged first: the notes push is a fast-forward of origin's
    except CommandFailed as exc:
        failed, errors = list(todo), [str(exc)]
    else:
        for spec in todo:
            try:
                repo.push([spec])
            except CommandFailed as exc:
                failed.append(spec)
                errors.append(f"{spec.split(':', 1)[0]}: {exc}")
    pushed = [r for r in todo if r not in failed]
    if failed:
        atomic.write_json(unpushed_path(cfg), failed)
        return {"pushed": False, "refs": todo, "pushed_refs": pushed, "error": "; ".join(errors),
                "kept": str(unpushed_path(cfg)), "warnings": warnings}  # fmt: skip
    unpushed_path(cfg).unlink(missing_ok=True)
    return {"pushed": True, "refs": todo, "error": "", "warnings": warnings}
