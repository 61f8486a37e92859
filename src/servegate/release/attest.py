"""Signed in-toto attestations of every released and rolled-back SHA
(docs/attestations.md).

A release record is servegate's own JSON, sealed by a key only the host holds: another
team's deploy job or an auditor has to trust servegate to read it. Beside each record the
host writes in-toto Statements (v1) in DSSE envelopes, one a line, in the notes ref
``refs/notes/servegate-attestations`` (pushed, fetched and merged like the records):

- a **SLSA Provenance v1** predicate for the build: the stack commit, the digests of the
  config and of the launch, the toolchains, servegate itself;
- a **verification summary** (SLSA VSA v1) of what servegate verified on the live
  service: the provenance evidence, the gate's checks, the digest of the policy used, the
  verdict;
- the bench gate's **test result** (in-toto's test-result predicate), naming the bench
  result file it judged by its digest.

Their subjects are the release commit (``gitCommit``) and every hashed artifact
(``sha256``).

Why ``ssh-keygen`` signs: the box already has SSH keys, OpenSSH's ``ssh-keygen -Y`` is the
maintained signer git uses for SSH-signed commits, and an auditor verifies with that same
tool and an allowed-signers file (OpenSSH's own format, kept in the stack repository)
without servegate. Each DSSE signature is the SSH signature (namespace
``servegate-attestation``) of the envelope's pre-authentication encoding; the envelope and
that encoding are securesystemslib's (in-toto's library). A raw ed25519 signature would
need a crypto library at the auditor's end: OpenSSH 9 cannot export an ed25519 key in a
form openssl verifies.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import os
import re
import stat
import subprocess
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from servegate import hostpaths
from servegate.config import Config
from servegate.errors import AttestationFailed, ConfigError
from servegate.pipeline.git import ATTEST_REF, Identity, StackRepo

if TYPE_CHECKING:  # securesystemslib (45 ms to import) loads where a record is signed
    from servegate.release.sshsig import SshSigner

STATEMENT = "https://in-toto.io/Statement/v1"
PAYLOAD_TYPE = "application/vnd.in-toto+json"
PROVENANCE = "https://slsa.dev/provenance/v1"
VSA = "https://slsa.dev/verification_summary/v1"
TEST_RESULT = "https://in-toto.io/attestation/test-result/v0.1"
#: what a servegate build is (SLSA's buildType); docs/attestations.md describes it
BUILD_TYPE = "urn:servegate:build:v1"
#: the gate's policy (the VSA's policy.uri); its digest names the settings used
POLICY = "urn:servegate:gate:v1"
#: the namespace of every SSH signature servegate makes (``ssh-keygen -n``): a signature
#: made for anything else (a git commit, a file) is never an attestation's
NAMESPACE = "servegate-attestation"
#: the verdicts that are attested
ATTESTED = ("released", "rolled_back")
#: the largest envelope written or read (a few kB each)
MAX_ENVELOPE = 256 * 1024
#: seconds ssh-keygen may take
SSH_KEYGEN_TIMEOUT = 60.0


def host_uri(host_id: str) -> str:
    """The builder and verifier id of a host: its records' ``host_id``."""
    return f"urn:servegate:host:{host_id}"


def canonical(doc: Any) -> bytes:
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# -- signing --------------------------------------------------------------------------


def _keygen(argv: list[str], data: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    """``ssh-keygen`` with ``data`` on its stdin; its stdout and stderr apart (a signature
    is written to stdout, its chatter to stderr). No agent: only the named key signs."""
    env = {k: v for k, v in os.environ.items() if k != "SSH_AUTH_SOCK"}
    try:
        return subprocess.run(
            ["ssh-keygen", *argv], input=data, capture_output=True,
            timeout=SSH_KEYGEN_TIMEOUT, env=env, check=False,
        )  # fmt: skip
    except FileNotFoundError:
        raise ConfigError(
            "ssh-keygen is not installed: attestations are signed and verified with it",
            hint="install OpenSSH's client (Debian: openssh-client)",
        ) from None
    except subprocess.TimeoutExpired:
        raise ConfigError(
            f"ssh-keygen {argv[0]} {argv[1]} took over {SSH_KEYGEN_TIMEOUT:.0f} s"
        ) from None


def _said(done: subprocess.CompletedProcess[bytes]) -> str:
    """ssh-keygen's last line of complaint, or its exit status."""
    lines = done.stderr.decode(errors="replace").strip().splitlines()
    return lines[-1] if lines else f"exit {done.returncode}"


def check_key(path: Path) -> None:
    """The signing key must be this user's own regular file that no one else can read
    (ConfigError, exit 2, before anything changes)."""
    try:
        st = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        raise ConfigError(
            f"attest.key {path} does not exist",
            hint="make one with `ssh-keygen -t ed25519 -N '' -f KEY` and add its public key to "
            'the allowed-signers file, or set attest.key = "" to write unsigned attestations',
        ) from None
    if not stat.S_ISREG(st.st_mode):
        raise ConfigError(f"attest.key {path} is not a regular file (a link or a directory)")
    if st.st_uid != os.geteuid():
        raise ConfigError(
            f"attest.key {path} belongs to uid {st.st_uid}, not to this user ({os.geteuid()})",
            hint="sign with a key of the user servegate runs as",
        )
    if st.st_mode & 0o077:
        raise ConfigError(
            f"attest.key {path} is readable or writable by others (mode "
            f"{stat.S_IMODE(st.st_mode):04o}): a signing key must be private",
            hint=f"chmod 600 {path}",
        )


def signer_of(cfg: Config, host_id: str) -> SshSigner | None:
    """The host's signer (None: ``attest.key`` is unset); ConfigError when the key cannot
    sign, before anything changes."""
    if not cfg.attest.key:
        return None
    path = Path(cfg.attest.key).expanduser()
    check_key(path)
    from servegate.release.sshsig import SshSigner

    return SshSigner(path, cfg.attest.principal or f"servegate@{host_id}")


def verify_ssh(allowed: str, principal: str, sig_hex: str, data: bytes) -> str:
    """The key fingerprint (``SHA256:…``) when ``sig_hex`` (a DSSE signature as
    securesystemslib holds it: the hex of an armored SSH signature) is ``principal``'s
    signature of ``data`` in :data:`NAMESPACE` by the allowed-signers text ``allowed``;
    "" when it is not. The fingerprint is ssh-keygen's, never the envelope's own keyid."""
    try:
        armored = bytes.fromhex(sig_hex)
    except (ValueError, TypeError):
        return ""
    with _files(allowed, armored) as (signers, sig):
        done = _keygen(
            ["-Y", "verify", "-f", signers, "-I", principal, "-n", NAMESPACE, "-s", sig], data
        )
    if done.returncode:
        return ""
    said = re.search(r"key (SHA256:[A-Za-z0-9+/=]+)", done.stdout.decode(errors="replace"))
    return said[1] if said else "SHA256:?"


def principals(allowed: str, sig_hex: str) -> list[str]:
    """The names the allowed-signers text gives the key that made ``sig_hex`` (none: the
    key is not allowed). Says nothing of whether the signature holds."""
    try:
        armored = bytes.fromhex(sig_hex)
    except (ValueError, TypeError):
        return []
    with _files(allowed, armored) as (signers, sig):
        done = _keygen(["-Y", "find-principals", "-s", sig, "-f", signers])
    return done.stdout.decode(errors="replace").split() if done.returncode == 0 else []


@contextmanager
def _files(allowed: str, armored: bytes) -> Iterator[tuple[str, str]]:
    with tempfile.TemporaryDirectory(prefix="servegate-attest-") as tmp:
        signers, sig = Path(tmp) / "allowed_signers", Path(tmp) / "sig"
        signers.write_text(allowed)
        sig.write_bytes(armored)
        yield str(signers), str(sig)


# -- statements -----------------------------------------------------------------------


def _file_digest(path: str | Path) -> str | None:
    try:
        return sha256(Path(path).read_bytes())
    except OSError:
        return None


def subjects(doc: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The release commit and every hashed artifact of a record."""
    found: list[dict[str, Any]] = [
        {"name": "commit", "uri": f"git+{doc['remote']}", "digest": {"gitCommit": doc["sha"]}}
    ]
    for path, digest in sorted((doc.get("artifacts") or {}).items()):
        found.append({"name": path, "digest": {"sha256": digest}})
    return found


def policy_digest(cfg: Config) -> str:
    """The digest of the settings the gate judged by: bench, gate, load, provenance,
    probes and trend."""
    settings = {
        name: dataclasses.asdict(getattr(cfg, name))
        for name in ("bench", "gate", "load", "provenance", "probes", "trend")
    }
    return sha256(canonical(json.loads(json.dumps(settings, default=str))))


def _bench_check(doc: Mapping[str, Any]) -> Mapping[str, Any] | None:
    for check in (doc.get("gate") or {}).get("checks", []):
        if check.get("name") == "bench":
            return dict(check)
    return None


def statements(cfg: Config, doc: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The statements of one record as written (``doc``: sealed, scrubbed)."""
    subject = subjects(doc)
    builder = host_uri(str(doc["host_id"]))
    version = {"servegate": str(doc.get("servegate_version", ""))}
    commit = str(doc.get("servegate_commit") or "")
    launch = doc.get("launch") or {}
    config_digest = _file_digest(cfg.path) if cfg.path else None
    servegate_dep: dict[str, Any] = {"uri": f"pkg:pypi/servegate@{version['servegate']}"}
    if commit:
        servegate_dep["digest"] = {"gitCommit": commit}
    toolchains = [
        t.get("toolchain", {}) for t in doc.get("build_targets") or [] if isinstance(t, dict)
    ]
    runtime = {
        "service_manager": doc.get("service_manager"),
        "compile_cache_key": launch.get("compile_cache_key", ""),
        "engine": (doc.get("startup_log") or {}).get("facts", {}),
    }
    provenance = {
        "buildDefinition": {
            "buildType": BUILD_TYPE,
            "externalParameters": {
                "stack": {"remote": doc["remote"], "branch": doc["branch"], "commit": doc["sha"]},
                "config": {"digest": {"sha256": config_digest}} if config_digest else None,
                "launch": {
                    "profile": launch.get("profile", ""),
                    "digest": {"sha256": sha256(canonical(launch))},
                },
            },
            "internalParameters": {
                "strategy": doc.get("strategy"),
                "archs": list(cfg.build.archs),
                "toolchains": toolchains,
            },
            "resolvedDependencies": [subject[0] | {"name": "stack"}, servegate_dep],
        },
        "runDetails": {
            "builder": {"id": builder, "version": version},
            "metadata": {"invocationId": str(doc.get("run") or doc["at"]), "finishedOn": doc["at"]},
            "byproducts": [
                {
                    "name": "runtime",
                    "content": base64.b64encode(canonical(runtime)).decode(),
                    "mediaType": "application/json",
                }
            ],
        },
    }
    gate = doc.get("gate") or {}
    proof = doc.get("provenance") or {}
    bench = _bench_check(doc)
    result_file = str((bench or {}).get("evidence", {}).get("result_file") or "")
    result_digest = _file_digest(result_file) if result_file else None
    bench_input = (
        [{"name": Path(result_file).name, "digest": {"sha256": result_digest}}]
        if result_digest else []
    )  # fmt: skip
    policy = {"uri": POLICY, "digest": {"sha256": policy_digest(cfg)}}
    vsa = {
        "verifier": {"id": builder, "version": version},
        "timeVerified": doc["at"],
        "resourceUri": f"git+{doc['remote']}@{doc['sha']}",
        "policy": policy,
        "inputAttestations": bench_input,
        "verificationResult": "PASSED" if doc["verdict"] == "released" else "FAILED",
        "verifiedLevels": [],
        "slsaVersion": "1.0",
        "servegate": {
            "verdict": doc["verdict"],
            "reason": str(doc.get("reason") or "")[:2000],
            "host": doc.get("host"),
            "run": doc.get("run"),
            "previous_sha": doc.get("previous_sha"),
            "provenance": {
                "ok": proof.get("ok"),
                "evidence": proof.get("evidence"),
                "weaker": [str(w)[:500] for w in proof.get("weaker", [])][:20],
            },
            "gate": {
                "verdict": gate.get("verdict", ""),
                "checks": [
                    {
                        "name": c.get("name"),
                        "verdict": c.get("verdict"),
                        "reason": str(c.get("reason", ""))[:500],
                    }
                    for c in gate.get("checks", [])
                ],
            },
        },
    }
    found = [
        _statement(subject, PROVENANCE, provenance),
        _statement(subject, VSA, vsa),
    ]
    if bench is not None:
        rows = bench.get("evidence", {}).get("rows", [])
        named = {v: [_row_name(r) for r in rows if r.get("verdict") == v]
                 for v in ("PASS", "INCONCLUSIVE", "FAIL")}  # fmt: skip
        verdict = bench.get("verdict")
        test = {
            "result": {"PASS": "PASSED", "FAIL": "FAILED"}.get(str(verdict), "WARNED"),
            "configuration": [*bench_input, {"name": "gate policy", **policy}],
            "passedTests": named["PASS"],
            "warnedTests": named["INCONCLUSIVE"],
            "failedTests": named["FAIL"],
        }
        found.append(_statement(subject, TEST_RESULT, test))
    return found


def _row_name(row: Mapping[str, Any]) -> str:
    case = row.get("case") or row.get("name") or ""
    return f"{case}:{row.get('metric', '')}" if case else str(row.get("metric", ""))


def _statement(subject: list[dict[str, Any]], kind: str, predicate: Any) -> dict[str, Any]:
    return {"_type": STATEMENT, "subject": subject, "predicateType": kind, "predicate": predicate}


# -- writing --------------------------------------------------------------------------


@dataclass
class Written:
    """What :func:`write` put beside a record (the record's ``attestation`` section)."""

    ref: str = ATTEST_REF
    signed: bool = False
    #: the signer's name and key fingerprint ("" when unsigned)
    principal: str = ""
    keyid: str = ""
    #: why they are unsigned ("" when signed)
    unsigned: str = ""
    #: each envelope's predicate type and the sha256 of its line
    envelopes: list[dict[str, str]] = field(default_factory=list)


@dataclass
class Unsigned:
    """No signer, and why."""

    why: str


def envelopes(
    cfg: Config, doc: Mapping[str, Any], signer: SshSigner | Unsigned
) -> tuple[list[str], Written]:
    """The envelope lines of a record and their summary. A signing failure leaves every
    one of them unsigned, and says why (the release is live by then: it is not undone)."""
    written = Written(unsigned=signer.why if isinstance(signer, Unsigned) else "")
    from securesystemslib import dsse

    made = [(st, dsse.Envelope(canonical(st), PAYLOAD_TYPE, {})) for st in statements(cfg, doc)]
    if not isinstance(signer, Unsigned):
        try:
            for _, env in made:
                env.sign(signer)
        except ConfigError as exc:
            written.unsigned = str(exc)
            for _, env in made:
                env.signatures.clear()
        else:
            written.signed, written.principal = True, signer.principal
            written.keyid = signer.public_key.keyid
    lines = [json.dumps(env.to_dict(), sort_keys=True) for _, env in made]
    written.envelopes = [
        {"predicateType": st["predicateType"], "sha256": sha256(line.encode())}
        for (st, _), line in zip(made, lines, strict=True)
    ]
    return lines, written


def write(repo: StackRepo, sha: str, lines: list[str], identity: Identity) -> None:
    """Append the envelopes to the attestations note of ``sha``, one a line."""
    repo.append_note(sha, "\n".join(lines), identity, ref=ATTEST_REF)


# -- verifying ------------------------------------------------------------------------


@dataclass
class Verified:
    """``release verify --attestation``: what held and what did not."""

    sha: str
    ok: bool = False
    #: the newest trusted attestation's run, verdict, signer and time
    signer: str = ""
    verdict: str = ""
    at: str = ""
    #: each envelope found and why it is trusted or not
    envelopes: list[dict[str, str]] = field(default_factory=list)
    #: what failed the policy (empty when ok)
    problems: list[str] = field(default_factory=list)
    #: what was not checked, and why
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def parse_lines(text: str) -> list[dict[str, Any]]:
    """The JSON objects of a note, one a line (``git notes append`` and merges add blank
    lines and sort them); lines over :data:`MAX_ENVELOPE` or not JSON are left out."""
    found = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{") and len(line) <= MAX_ENVELOPE:
            try:
                doc = json.loads(line)
            except ValueError:
                continue
            if isinstance(doc, dict):
                found.append(doc)
    return found


#: the most signatures an envelope may carry, and envelopes a note, that are verified
#: (each costs ssh-keygen runs: a note stuffed with junk must not hold the host lock)
MAX_SIGNATURES = 4
MAX_ENVELOPES = 200


def printable(text: object, limit: int = 200) -> str:
    """``text`` as one line of printable characters (a hostile note's fields are shown)."""
    return "".join(c if c.isprintable() else "?" for c in str(text))[:limit]


def _trusted(
    env_doc: Mapping[str, Any], allowed: str, principal: str
) -> tuple[dict[str, Any] | None, str, str]:
    """(statement, signer, "") for an envelope signed by ``principal`` with a key the
    allowed-signers text allows it; else (None, "", why not). Anything malformed is
    untrusted with the reason, never an error."""
    from securesystemslib import dsse

    try:
        env = dsse.Envelope.from_dict(dict(env_doc))
        payload_type = str(env.payload_type)
        sigs = list(env.signatures.values())
        pae = env.pae()
    except Exception as exc:  # a hostile line: whatever it breaks, it is not trusted
        return None, "", f"not a DSSE envelope ({printable(repr(exc), 120)})"
    if payload_type != PAYLOAD_TYPE:
        return None, "", f"payload type {printable(payload_type, 80)!r} is not an in-toto statement"
    if not sigs:
        return None, "", "unsigned: trusted by nobody"
    if len(sigs) > MAX_SIGNATURES:
        return None, "", f"{len(sigs)} signatures (at most {MAX_SIGNATURES} are read)"
    signer, others = "", []
    for sig in sigs:
        names = principals(allowed, str(sig.signature))
        if principal in names:
            fingerprint = verify_ssh(allowed, principal, str(sig.signature), pae)
            if fingerprint:
                signer = f"{principal} ({fingerprint})"
                break
        others += [n for n in names if n != principal]
    if not signer:
        if others:
            return (
                None,
                "",
                (
                    f"signed by {printable(', '.join(others), 120)}, an allowed signer but not "
                    f"this host's ({principal}): another host's signer cannot speak for this one"
                ),
            )
        return (
            None,
            "",
            (
                f"not signed by {principal} with a key the allowed-signers file allows it, or the "
                "signature does not match the statement"
            ),
        )
    try:
        statement = json.loads(env.payload)
    except ValueError:
        return None, "", "the signed payload is not JSON"
    if not isinstance(statement, dict) or statement.get("_type") != STATEMENT:
        return None, "", "the signed payload is not an in-toto Statement v1"
    return statement, signer, ""


def verify(
    text: str,
    sha: str,
    host_id: str,
    allowed: str,
    checkout: Path | None,
    principal: str = "",
) -> Verified:
    """The attestations of ``sha`` (``text``: its note, and the host's own copy) against
    the allowed-signers text: only envelopes signed by this host's ``principal``
    (``servegate@<host_id>`` when "") count; the newest trusted verification summary of
    this host must say released, and its run's provenance statement must name ``sha`` and
    the artifacts the checkout holds."""
    out = Verified(sha=sha)
    principal = principal or f"servegate@{host_id}"
    trusted: list[tuple[dict[str, Any], str]] = []
    lines = list({json.dumps(d, sort_keys=True): d for d in parse_lines(text)}.values())
    if len(lines) > MAX_ENVELOPES:
        out.notes.append(f"{len(lines)} envelopes; the first {MAX_ENVELOPES} were read")
    for env_doc in lines[:MAX_ENVELOPES]:
        statement, signer, why = _trusted(env_doc, allowed, principal)
        kind = str(statement.get("predicateType", "")) if statement else ""
        if statement is None:
            out.envelopes.append({"trusted": "no", "why": why})
            continue
        if not _shaped(statement):
            why = "a statement not of the shape servegate writes"
            out.envelopes.append({"trusted": "no", "predicateType": printable(kind), "why": why})
            continue
        commits = [s.get("digest", {}).get("gitCommit") for s in statement.get("subject", [])
                   if isinstance(s, dict) and isinstance(s.get("digest"), dict)]  # fmt: skip
        if sha not in commits:
            out.envelopes.append({"trusted": "no", "predicateType": kind, "why": (
                f"signed by {signer}, but it attests {', '.join(str(c)[:12] for c in commits)}, "
                f"not {sha[:12]} (an attestation of another commit, replayed)")})  # fmt: skip
            continue
        host = _host_of(statement)
        if host is not None and host != host_uri(host_id):
            out.envelopes.append({"trusted": "no", "predicateType": kind, "why": (
                f"signed by {signer}, but made by {str(host)[:120]}, not this host "
                f"({host_uri(host_id)})")})  # fmt: skip
            continue
        out.envelopes.append({"trusted": "yes", "predicateType": kind, "signer": signer})
        trusted.append((statement, signer))
    summaries = [(s, who) for s, who in trusted if s["predicateType"] == VSA]
    if not summaries:
        seen = (
            f"{len(out.envelopes)} envelope(s) found, none trusted"
            if out.envelopes
            else "no attestation of it at all"
        )
        out.problems.append(
            f"no verification summary of {sha[:12]} by this host is signed by an allowed "
            f"signer ({seen})"
        )
        return out
    newest, signer = max(summaries, key=lambda p: str(p[0]["predicate"].get("timeVerified", "")))
    predicate = newest["predicate"]
    out.signer, out.at = signer, str(predicate.get("timeVerified", ""))
    out.verdict = str(predicate.get("servegate", {}).get("verdict", ""))
    if predicate.get("verificationResult") != "PASSED" or out.verdict != "released":
        out.problems.append(
            f"the newest attestation of {sha[:12]} ({out.at}) says {out.verdict or 'nothing'}, "
            f"not released: {str(predicate.get('servegate', {}).get('reason', ''))[:300]}"
        )
    run = predicate.get("servegate", {}).get("run")
    builds = [s for s, _ in trusted if s["predicateType"] == PROVENANCE and
              s["predicate"].get("runDetails", {}).get("metadata", {}).get("finishedOn")
              == predicate.get("timeVerified")]  # fmt: skip
    if not builds:
        out.problems.append(f"no signed build provenance of the run {run} that released it")
        return out
    artifacts = {
        s["name"]: s["digest"]["sha256"] for s in builds[-1]["subject"]
        if isinstance(s, dict) and "sha256" in s.get("digest", {})
    }  # fmt: skip
    if newest["subject"] != builds[-1]["subject"]:
        out.problems.append("the summary and the build provenance name different subjects")
    if checkout is None:
        out.notes.append(
            f"no checkout of {sha[:12]} on this host: its {len(artifacts)} artifact(s) were "
            "not hashed again"
        )
    else:
        for name, digest in sorted(artifacts.items()):
            path = checkout / name
            now = _file_digest(path) if path.resolve().is_relative_to(checkout.resolve()) else None
            if now != digest:
                out.problems.append(
                    f"{name}: the checkout's file {'is missing' if now is None else 'differs'}"
                    f" (attested sha256 {digest[:16]}…" + (f", now {now[:16]}…)" if now else ")")
                )
    out.ok = not out.problems
    return out


def _shaped(statement: Mapping[str, Any]) -> bool:
    """Subjects a list of descriptors with digests, a predicate an object (and a summary's
    servegate section one too)."""
    subject, predicate = statement.get("subject"), statement.get("predicate")
    return (
        isinstance(subject, list)
        and all(isinstance(x, dict) and isinstance(x.get("digest"), dict) for x in subject)
        and isinstance(predicate, dict)
        and isinstance(predicate.get("servegate", {}), dict)
        and isinstance(predicate.get("runDetails", {}), dict)
    )


def _host_of(statement: Mapping[str, Any]) -> str | None:
    """The host that made a build provenance or a verification summary; None for a
    statement that names none (a test result is read with its run's summary)."""
    predicate = statement.get("predicate") or {}
    if statement.get("predicateType") == PROVENANCE:
        return str(predicate.get("runDetails", {}).get("builder", {}).get("id", ""))
    if statement.get("predicateType") == VSA:
        return str(predicate.get("verifier", {}).get("id", ""))
    return None


def kept(cfg: Config, sha: str) -> list[str]:
    """This host's own copy of its envelopes of ``sha`` (a push to origin that rewrote
    the notes ref cannot remove them)."""
    try:
        fd = os.open(hostpaths.of(cfg).attestations, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return []
    with os.fdopen(fd, encoding="utf-8", errors="replace") as f:
        text = f.read()
    found = []
    for doc in parse_lines(text):
        try:
            statement = json.loads(base64.b64decode(doc["payload"]))
            commits = [s["digest"].get("gitCommit") for s in statement["subject"]]
        except (KeyError, TypeError, ValueError, AttributeError):
            continue
        if sha in commits:
            found.append(json.dumps(doc, sort_keys=True))
    return found


def allowed_signers(cfg: Config, repo: StackRepo, path: Path | None = None) -> tuple[str, str]:
    """The allowed-signers text and where it came from: ``path`` when given, else
    ``attest.allowed_signers`` at the tip of the configured branch as last fetched (what
    the team reviewed; never the file of the commit being verified, which would let a
    commit name its own signer)."""
    if path is not None:
        try:
            return path.read_text(), str(path)
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"--allowed-signers {path} cannot be read: {exc}") from None
    where = f"origin/{cfg.stack.branch}:{cfg.attest.allowed_signers}"
    blob = repo.show_file(repo.branch_ref, cfg.attest.allowed_signers)
    return (blob or b"").decode(errors="replace"), where


def check_release(
    cfg: Config,
    repo: StackRepo,
    sha: str,
    host_id: str,
    checkout: Path | None,
    allowed_path: Path | None = None,
) -> Verified:
    """:func:`verify` of ``sha``'s attestations as this repository holds them (fetch
    first: origin's are merged in, and trusted only by their signatures)."""
    allowed, where = allowed_signers(cfg, repo, allowed_path)
    text = repo.notes(sha, ref=ATTEST_REF) + "\n" + "\n".join(kept(cfg, sha))
    principal = cfg.attest.principal or f"servegate@{host_id}"
    found = verify(text, sha, host_id, allowed, checkout, principal)
    if not any(line.strip() and not line.lstrip().startswith("#") for line in allowed.splitlines()):
        found.problems.insert(
            0, f"no allowed signers: {where} is missing or empty, so no signature is trusted"
        )
        found.ok = False
    found.notes.append(f"signers allowed by {where}")
    return found


def failure(found: Verified) -> AttestationFailed:
    """The error of an attestation that did not verify."""
    return AttestationFailed(
        f"the attestation of {found.sha[:12]} does not verify: " + "; ".join(found.problems[:5]),
        hint="`release verify --attestation SHA --json` lists every envelope and why it is or "
        "is not trusted; docs/attestations.md says how a host signs and how a signer is allowed",
    )
