"""Signed in-toto attestations (docs/attestations.md): real promotes against a real
supervisord and a small real server, real git, real ``ssh-keygen`` signing and
verification; then every way to make a verification lie. One released and one
rolled-back release are made once for the module (the tests that follow read them)."""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import git
import pytest

from servegate import config as config_mod
from servegate.engine.managers.supervisor import Supervisor
from servegate.pipeline.git import ATTEST_REF, commit_all, init_repo, push_branch
from servegate.release import attest
from servegate.release import record as rec
from servegate.release.sshsig import SshSigner
from tests.conftest import DEV, STACK_TEMPLATE, Stack, config_text, free_port

REPO = Path(__file__).resolve().parents[2]
PRINCIPAL = "box-1@example.org"
pytestmark = pytest.mark.skipif(
    shutil.which("ssh-keygen") is None or shutil.which("jq") is None,
    reason="ssh-keygen (OpenSSH) and jq are needed to sign and to verify as an auditor",
)


@dataclass
class Attested:
    stack: Stack
    cfg: config_mod.Config
    path: Path
    key: Path
    allowed: str
    good: str
    bad: str
    #: everything the promotes and verifications printed
    printed: str
    env: dict[str, str]

    def text(self, sha: str) -> str:
        origin = git.Repo(self.stack.origin)
        try:
            return str(origin.git.notes("--ref", ATTEST_REF, "show", sha))
        except git.GitCommandError:
            return ""  # no note
        finally:
            origin.close()

    def cli(self, *argv: str) -> subprocess.CompletedProcess[str]:
        """``release ARGV``; ``config check …`` as servegate's own command."""
        words = list(argv) if argv[0] == "config" else ["release", *argv]
        done = subprocess.run(
            [sys.executable, "-m", "servegate", *words, "--config", str(self.path)],
            capture_output=True, text=True, env=self.env, timeout=300, check=False,
        )  # fmt: skip
        self.printed += done.stdout + done.stderr
        return done

    def checkout(self, sha: str) -> Path:
        return self.cfg.host_root / "releases" / sha


def keygen(path: Path, comment: str) -> str:
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
        check=True,
    )  # fmt: skip
    return " ".join(path.with_suffix(".pub").read_text().split()[:2])


@pytest.fixture(scope="module")
def attested(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Attested]:
    tmp = tmp_path_factory.mktemp("attest")
    home = tmp / "home"
    env = {**os.environ, "HOME": str(home), "XDG_STATE_HOME": str(home / ".local" / "state"),
           "XDG_CONFIG_HOME": str(home / ".config"), "XDG_CACHE_HOME": str(home / ".cache")}  # fmt: skip
    origin, work = tmp / "origin.git", tmp / "work"
    init_repo(origin, bare=True)
    init_repo(work).create_remote("origin", str(origin))
    shutil.copytree(STACK_TEMPLATE, work, dirs_exist_ok=True)
    stack = Stack(origin, work)
    key = tmp / "keys" / "host_ed25519"
    key.parent.mkdir()
    public = keygen(key, "box-1")
    allowed = f'{PRINCIPAL} namespaces="{attest.NAMESPACE}" {public}\n'
    (work / ".servegate").mkdir()
    (work / ".servegate" / "allowed_signers").write_text(allowed)
    path = tmp / "servegate.toml"
    path.write_text(
        config_text(stack, tmp / "host", free_port())
        + f'\n[attest]\nkey = "{key}"\nprincipal = "{PRINCIPAL}"\n'
    )
    cfg = config_mod.load(path, {})
    done = Attested(stack, cfg, path, key, allowed, "", "", "", env)
    try:
        done.good = stack.commit("ok", "good")
        first = done.cli("promote", done.good, "--json")
        assert first.returncode == 0, first.stderr[-3000:]
        done.bad = stack.commit("foreign-so", "maps its library from elsewhere")
        second = done.cli("promote", done.bad, "--json")
        assert second.returncode == 8, second.stderr[-3000:]
        yield done
    finally:
        Supervisor(cfg).shutdown_daemon()


def envelopes(text: str) -> list[dict[str, Any]]:
    return attest.parse_lines(text)


def statement(env: dict[str, Any]) -> dict[str, Any]:
    return dict(json.loads(base64.b64decode(env["payload"])))


def resigned(env: dict[str, Any], st: dict[str, Any], key: Path, principal: str) -> str:
    """The envelope of ``st`` signed with ``key``: what someone holding that key can make."""
    from securesystemslib import dsse

    new = dsse.Envelope(attest.canonical(st), attest.PAYLOAD_TYPE, {})
    new.sign(SshSigner(key, principal))
    return json.dumps(new.to_dict())


def forged_release(a: Attested, key: Path, principal: str, newest: bool = False) -> list[str]:
    """The rolled-back release's statements, rewritten to say released (``newest``: and
    later than any run), signed with ``key`` as ``principal``: what a holder of that key
    can make."""
    forged = []
    for env in envelopes(a.text(a.bad)):
        st = statement(env)
        if st["predicateType"] == attest.VSA:
            st["predicate"]["verificationResult"] = "PASSED"
            st["predicate"]["servegate"]["verdict"] = "released"
            if newest:
                st["predicate"]["timeVerified"] = "2999-01-01T00:00:00Z"
        forged.append(resigned(env, st, key, principal))
    return forged


def host_id(a: Attested) -> str:
    return rec.host_id(a.cfg)


def test_a_release_and_a_rollback_are_attested_signed_and_verified(attested: Attested) -> None:
    a = attested
    good = [statement(e) for e in envelopes(a.text(a.good))]
    kinds = {s["predicateType"] for s in good}
    assert kinds == {attest.PROVENANCE, attest.VSA}  # no bench gate configured: no test result
    for s in good:
        assert s["_type"] == attest.STATEMENT
        digests = {d["name"]: d["digest"] for d in s["subject"]}
        assert digests["commit"] == {"gitCommit": a.good}
        library = (a.checkout(a.good) / "build" / "libtiny.so").read_bytes()
        assert digests["build/libtiny.so"] == {"sha256": attest.sha256(library)}
    (vsa,) = [s["predicate"] for s in good if s["predicateType"] == attest.VSA]
    assert vsa["verificationResult"] == "PASSED"
    assert vsa["servegate"]["verdict"] == "released"
    assert vsa["servegate"]["provenance"]["ok"] is True
    assert vsa["verifier"]["id"] == attest.host_uri(host_id(a))
    (build,) = [s["predicate"] for s in good if s["predicateType"] == attest.PROVENANCE]
    assert build["buildDefinition"]["externalParameters"]["config"]["digest"]["sha256"] == (
        attest.sha256(a.path.read_bytes())
    )
    # the record says it was signed, by whom, and which envelopes it wrote
    origin = git.Repo(a.stack.origin)
    record = json.loads(origin.git.notes("--ref", "refs/notes/servegate", "show", a.good))
    origin.close()
    written = record["attestation"]
    assert written["signed"] is True
    assert written["principal"] == PRINCIPAL
    assert written["keyid"].startswith("SHA256:")
    assert [e["sha256"] for e in written["envelopes"]] == [
        attest.sha256(line.encode()) for line in a.text(a.good).splitlines() if line.strip()
    ]

    ok = a.cli("verify", "--attestation", a.good)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert f"attestation OK: {a.good[:12]} released on this host" in ok.stdout
    assert PRINCIPAL in ok.stdout

    # the rolled-back one is attested too, and fails the policy
    bad = [statement(e)["predicate"] for e in envelopes(a.text(a.bad))]
    (summary,) = [p for p in bad if "verificationResult" in p]
    assert summary["verificationResult"] == "FAILED"
    assert summary["servegate"]["verdict"] == "rolled_back"
    refused = a.cli("verify", "--attestation", a.bad, "--json")
    assert refused.returncode == 22, refused.stderr
    doc = json.loads(refused.stdout)
    assert "says rolled_back, not released" in doc["error"]["message"]


def test_an_auditor_verifies_with_ssh_keygen_and_jq_alone(
    attested: Attested, tmp_path: Path
) -> None:
    """docs/attestations.md's auditor block, as written, in a fresh clone of origin."""
    block = re.search(
        r"<!-- auditor -->\s*```sh\n(.*?)```\s*<!-- /auditor -->",
        (REPO / "docs" / "attestations.md").read_text(), re.S,
    )  # fmt: skip
    assert block, "docs/attestations.md has no auditor block"
    clone = tmp_path / "clone"
    git.Repo.clone_from(str(attested.stack.origin), clone).close()
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "SHA": attested.good,
           "SIGNER": PRINCIPAL}  # fmt: skip
    # a tag named like the remote branch, allowing an attacker: the block reads the branch
    attacker = tmp_path / "attacker_ed25519"
    keygen(attacker, "attacker")
    with git.Repo(clone) as repo:
        public = " ".join(attacker.with_suffix(".pub").read_text().split()[:2])
        (clone / ".servegate" / "allowed_signers").write_text(
            f'{PRINCIPAL} namespaces="{attest.NAMESPACE}" {public}\n'
        )
        repo.git.add("-A")
        with repo.git.custom_environment(**DEV.env):
            repo.git.commit("-qm", "the attacker's signers")
        repo.git.tag("origin/main")
        repo.git.reset("--hard", "HEAD~1")
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", block.group(1)],
        cwd=clone, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert out.count(f'Good "servegate-attestation" signature for {PRINCIPAL}') == 2, out
    assert f"{attest.VSA} names the commit: true" in out
    assert f"{attest.PROVENANCE} names the commit: true" in out
    assert "PASSED" in out

    # the same block on a statement changed after signing: ssh-keygen refuses it
    notes = clone / "tampered"
    lines = envelopes(attested.text(attested.good))
    env_doc = lines[0]
    st = statement(env_doc)
    st["subject"][0]["digest"]["gitCommit"] = "0" * 40
    env_doc["payload"] = base64.b64encode(attest.canonical(st)).decode()
    notes.write_text(json.dumps(env_doc) + "\n")
    script = block.group(1).replace(
        "git notes --ref servegate-attestations show \"$SHA\" | grep '^{' > envelopes.jsonl",
        f"cp {notes} envelopes.jsonl",
    )
    assert script != block.group(1)
    tampered = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        cwd=clone, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert tampered.returncode != 0
    assert "Good" not in tampered.stdout + tampered.stderr


def _verify(a: Attested, text: str, sha: str = "", **kw: Any) -> attest.Verified:
    sha = sha or a.good
    return attest.verify(
        text, sha, kw.get("host", host_id(a)), kw.get("allowed", a.allowed),
        kw.get("checkout", a.checkout(sha)), PRINCIPAL,
    )  # fmt: skip


def test_the_genuine_attestation_verifies(attested: Attested) -> None:
    found = _verify(attested, attested.text(attested.good))
    assert found.ok, found.problems
    assert found.verdict == "released"
    assert found.signer.startswith(PRINCIPAL)


def test_a_note_changed_after_signing_is_not_trusted(attested: Attested) -> None:
    a = attested
    changed = []
    for env in envelopes(a.text(a.good)):
        st = statement(env)
        if st["predicateType"] == attest.VSA:
            st["predicate"]["servegate"]["reason"] = "looks fine"
        else:
            st["subject"].append({"name": "extra.so", "digest": {"sha256": "0" * 64}})
        env["payload"] = base64.b64encode(attest.canonical(st)).decode()
        changed.append(json.dumps(env))
    found = _verify(a, "\n".join(changed))
    assert not found.ok
    assert all(e["trusted"] == "no" for e in found.envelopes)
    assert all("does not match" in e["why"] for e in found.envelopes)


def test_a_rolled_back_verdict_rewritten_as_released_and_signed_by_another_key_is_refused(
    attested: Attested, tmp_path: Path
) -> None:
    a = attested
    other = tmp_path / "other_ed25519"
    keygen(other, "someone")
    forged = forged_release(a, other, PRINCIPAL)  # the allowed name, another key
    found = _verify(a, "\n".join(forged), a.bad)
    assert not found.ok
    assert all("not signed by" in e["why"] for e in found.envelopes), found.envelopes
    # allowed for another namespace only (e.g. git commit signing): still not trusted
    public = " ".join(other.with_suffix(".pub").read_text().split()[:2])
    git_only = a.allowed + f'{PRINCIPAL} namespaces="git" {public}\n'
    assert not _verify(a, "\n".join(forged), a.bad, allowed=git_only).ok


def test_an_unsigned_attestation_is_trusted_by_nobody(attested: Attested) -> None:
    a = attested
    bare = []
    for env in envelopes(a.text(a.good)):
        env["signatures"] = []
        bare.append(json.dumps(env))
    found = _verify(a, "\n".join(bare))
    assert not found.ok
    assert {e["why"] for e in found.envelopes} == {"unsigned: trusted by nobody"}


def test_a_replayed_attestation_of_another_commit_or_host_is_refused(attested: Attested) -> None:
    a = attested
    replayed = _verify(a, a.text(a.good), a.bad)  # good's signed envelopes on bad's note
    assert not replayed.ok
    assert all("replayed" in e["why"] for e in replayed.envelopes), replayed.envelopes
    elsewhere = _verify(a, a.text(a.good), host="another-box")
    assert not elsewhere.ok
    assert all("not this host" in e["why"] for e in elsewhere.envelopes), elsewhere.envelopes


def test_an_artifact_changed_after_signing_is_caught(attested: Attested, tmp_path: Path) -> None:
    a = attested
    copy = tmp_path / "checkout"
    shutil.copytree(a.checkout(a.good), copy, symlinks=True)
    (copy / "build" / "libtiny.so").write_bytes(b"\x7fELF rebuilt by someone else")
    found = _verify(a, a.text(a.good), checkout=copy)
    assert not found.ok
    assert any("build/libtiny.so: the checkout's file differs" in p for p in found.problems)
    (copy / "build" / "libtiny.so").unlink()
    gone = _verify(a, a.text(a.good), checkout=copy)
    assert any("is missing" in p for p in gone.problems)


def test_no_allowed_signers_trusts_nobody(attested: Attested) -> None:
    found = _verify(attested, attested.text(attested.good), allowed="")
    assert not found.ok


def _secret_forms(key: Path) -> list[str]:
    """The forms the key's secret (its ed25519 seed) would take in text: hex, and base64
    at each of the three byte alignments (the middle, which no neighbour changes). The
    private key file also holds the public key, which every signature carries: only the
    secret is looked for."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import load_ssh_private_key

    private = load_ssh_private_key(key.read_bytes(), password=None)
    assert isinstance(private, Ed25519PrivateKey)
    seed = private.private_bytes_raw()
    forms = [seed.hex(), "PRIVATE KEY"]
    for pad in range(3):
        encoded = base64.b64encode(bytes(pad) + seed + bytes(3)).decode()
        forms.append(encoded[4:-8])
    return forms


def test_the_signing_key_never_leaves_its_file(attested: Attested) -> None:
    a = attested
    forms = _secret_forms(a.key)
    origin = git.Repo(a.stack.origin)
    notes = origin.git.notes("--ref", "refs/notes/servegate", "show", a.good)
    origin.close()
    seen = {"outputs": a.printed, "attestations": a.text(a.good) + a.text(a.bad), "notes": notes}
    for path in a.cfg.host_root.rglob("*"):
        if path.is_file() and not path.is_symlink():
            seen[str(path)] = path.read_bytes().decode(errors="replace")
    assert len(seen) > 10  # the host root's records, logs, state and releases were read
    leaks = [where for where, text in seen.items() if any(f in text for f in forms)]
    assert leaks == []


def test_a_key_others_can_read_stops_the_promote_before_anything_changes(
    attested: Attested,
) -> None:
    a = attested
    before = (a.cfg.host_root / "state.json").read_bytes()
    a.key.chmod(0o644)
    try:
        nxt = a.stack.commit("ok", "after a careless chmod")
        done = a.cli("promote", nxt)
    finally:
        a.key.chmod(0o600)
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"chmod 600 {a.key}" in done.stderr
    assert (a.cfg.host_root / "state.json").read_bytes() == before


def test_require_live_refuses_a_live_release_whose_attestation_does_not_verify(
    attested: Attested,
) -> None:
    a = attested
    strict = a.path.with_name("strict.toml")
    strict.write_text(a.path.read_text() + "require_live = true\n")
    before = (a.cfg.host_root / "state.json").read_bytes()
    # the team drops the box's key from the allowed signers on main
    (a.stack.work / ".servegate" / "allowed_signers").write_text("# nobody\n")
    nxt = commit_all(a.stack.work, "allow nobody", DEV)
    push_branch(a.stack.work)
    done = subprocess.run(
        [sys.executable, "-m", "servegate", "release", "promote", nxt, "--config", str(strict)],
        capture_output=True, text=True, env=a.env, timeout=300, check=False,
    )  # fmt: skip
    (a.stack.work / ".servegate" / "allowed_signers").write_text(a.allowed)
    commit_all(a.stack.work, "allow the box again", DEV)
    push_branch(a.stack.work)
    assert done.returncode == 22, done.stdout + done.stderr
    assert "no allowed signers" in done.stderr
    assert (a.cfg.host_root / "state.json").read_bytes() == before


def test_hostile_attestations_on_origin_are_merged_but_never_trusted(
    attested: Attested, tmp_path: Path
) -> None:
    a = attested
    attacker = tmp_path / "attacker_ed25519"
    keygen(attacker, "attacker")
    forged = forged_release(a, attacker, PRINCIPAL, newest=True)
    clone = tmp_path / "clone"
    repo = git.Repo.clone_from(str(a.stack.origin), clone)
    repo.git.fetch("origin", f"+{ATTEST_REF}:{ATTEST_REF}")
    with repo.git.custom_environment(**DEV.env):
        repo.git.notes("--ref", ATTEST_REF, "append", "-m", "\n".join(forged), a.bad)
    repo.git.push("origin", f"{ATTEST_REF}:{ATTEST_REF}")
    refused = a.cli("verify", "--attestation", a.bad, "--json")
    assert refused.returncode == 22, refused.stdout + refused.stderr
    found = json.loads(refused.stdout)["result"]
    assert sum("not signed by" in e.get("why", "") for e in found["envelopes"]) == len(forged)
    assert found["verdict"] == "rolled_back"  # the genuine summary, not the forged newer one
    assert a.cli("verify", "--attestation", a.good).returncode == 0

    # a note too large to read is not merged at all, and the box's own stay as they were
    repo.git.fetch("origin", f"+{ATTEST_REF}:{ATTEST_REF}")
    before = repo.git.rev_parse(ATTEST_REF)
    huge = tmp_path / "huge.json"
    huge.write_text("{" + "x" * 1_200_000 + "}")
    with repo.git.custom_environment(**DEV.env):
        repo.git.notes("--ref", ATTEST_REF, "append", "-F", str(huge), a.good)
    repo.git.push("origin", f"{ATTEST_REF}:{ATTEST_REF}")
    big = a.cli("verify", "--attestation", a.good, "--json")
    assert big.returncode == 0, big.stdout + big.stderr
    assert any(
        "attestations were not merged" in n for n in json.loads(big.stdout)["result"]["notes"]
    )
    repo.git.push("--force", "origin", f"{before}:{ATTEST_REF}")
    repo.close()


def test_attestations_origin_refused_are_pushed_by_the_next_run(attested: Attested) -> None:
    a = attested
    hook = a.stack.origin / "hooks" / "pre-receive"
    hook.write_text(
        "#!/bin/sh\nwhile read old new ref; do\n"
        f'  [ "$ref" = "{ATTEST_REF}" ] && {{ echo "attestations closed" >&2; exit 1; }}\n'
        "done\nexit 0\n"
    )
    hook.chmod(0o755)
    try:
        first = a.stack.commit("ok", "while origin refuses attestations")
        done = a.cli("promote", first, "--json")
        assert done.returncode == 0, done.stderr[-2000:]
        published = json.loads(done.stdout)["result"]["record"]["publish"]
        assert published["pushed"] is False
        assert any(ATTEST_REF in r for r in json.loads(
            (a.cfg.host_root / "unpushed.json").read_text()))  # fmt: skip
        assert a.text(first) == ""  # origin has the record, not the attestations
    finally:
        hook.unlink()
    second = a.stack.commit("ok", "origin open again")
    assert a.cli("promote", second, "--json").returncode == 0
    assert len(envelopes(a.text(first))) == 2
    assert a.cli("verify", "--attestation", second).returncode == 0


def test_another_hosts_signer_cannot_speak_for_this_host(
    attested: Attested, tmp_path: Path
) -> None:
    a = attested
    other = tmp_path / "box2_ed25519"
    public = keygen(other, "box-2")
    fleet = a.allowed + f'box-2@example.org namespaces="{attest.NAMESPACE}" {public}\n'
    forged = forged_release(a, other, "box-2@example.org", newest=True)
    found = _verify(a, a.text(a.bad) + "\n" + "\n".join(forged), a.bad, allowed=fleet)
    assert not found.ok
    assert found.verdict == "rolled_back"
    assert sum("cannot speak for this one" in e.get("why", "") for e in found.envelopes) == 2


def test_malformed_or_stuffed_envelopes_are_untrusted_not_a_crash(attested: Attested) -> None:
    a = attested
    hostile = [
        '{"payload":"e30=","payloadType":"application/vnd.in-toto+json",'
        '"signatures":[{"keyid":null,"sig":"AAAA"}]}',
        '{"payload":"e30=","payloadType":"application/vnd.in-toto+json","signatures":[{}]}',
        '{"payload":7,"payloadType":[],"signatures":"x"}',
        json.dumps({"payload": "e30=", "payloadType": attest.PAYLOAD_TYPE,
                    "signatures": [{"keyid": str(i), "sig": "AAAA"} for i in range(500)]}),
    ]  # fmt: skip
    found = _verify(a, "\n".join(hostile) + "\n" + a.text(a.good))
    assert found.ok, found.problems  # the genuine ones still verify
    assert [e["trusted"] for e in found.envelopes[:4]] == ["no"] * 4
    assert "500 signatures" in found.envelopes[3]["why"]
    assert found.signer.startswith(f"{PRINCIPAL} (SHA256:")


def test_a_later_rollback_stays_found_when_origins_notes_are_rewritten(
    attested: Attested, tmp_path: Path
) -> None:
    """Someone who may push to origin rewrites the attestations note of a SHA that was
    released and later rolled back, keeping only the release: the host's own copy still
    holds the rollback, and the newest run decides."""
    a = attested
    origin_note = a.text(a.good)
    record = json.loads(
        git.Repo(a.stack.origin).git.notes("--ref", "refs/notes/servegate", "show", a.good)
    )
    record.update(verdict="rolled_back", at="2998-01-01T00:00:00Z", reason="rolled back later")
    later, _ = attest.envelopes(a.cfg, record, SshSigner(a.key, PRINCIPAL))
    rec._keep(a.cfg, "\n".join(later), a.cfg.host_root / "attestations.jsonl")
    clone = tmp_path / "clone"
    with git.Repo.clone_from(str(a.stack.origin), clone) as repo:
        repo.git.fetch("origin", f"+{ATTEST_REF}:{ATTEST_REF}")
        with repo.git.custom_environment(**DEV.env):
            repo.git.notes("--ref", ATTEST_REF, "add", "-f", "-m", origin_note, a.good)
        repo.git.push("origin", f"{ATTEST_REF}:{ATTEST_REF}")
    done = a.cli("verify", "--attestation", a.good, "--json")
    assert done.returncode == 22, done.stdout
    assert json.loads(done.stdout)["result"]["verdict"] == "rolled_back"
    # and the note removed from origin altogether: the host's copy still answers
    with git.Repo(clone) as repo:
        with repo.git.custom_environment(**DEV.env):
            repo.git.notes("--ref", ATTEST_REF, "remove", a.good)
        repo.git.push("origin", f"{ATTEST_REF}:{ATTEST_REF}")
    gone = a.cli("verify", "--attestation", a.good, "--json")
    assert json.loads(gone.stdout)["result"]["verdict"] == "rolled_back"
    # put the host's copy back as it was for the tests after this one
    copy = a.cfg.host_root / "attestations.jsonl"
    copy.write_text("".join(
        line + "\n" for line in copy.read_text().splitlines()
        if line.strip() and line not in later
    ))  # fmt: skip
    with git.Repo(clone) as repo:
        with repo.git.custom_environment(**DEV.env):
            repo.git.notes("--ref", ATTEST_REF, "add", "-f", "-m", origin_note, a.good)
        repo.git.push("origin", f"{ATTEST_REF}:{ATTEST_REF}")
    assert a.cli("verify", "--attestation", a.good).returncode == 0


def test_attestations_that_cannot_be_noted_cost_a_proven_release_nothing(
    attested: Attested, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The attestations note cannot be written after the release was proven (a stale
    lock on the ref, a full disk): the release stays live, its record says why the note
    is missing, and the host's own copy still verifies it."""
    from servegate.errors import CommandFailed
    from servegate.pipeline.stages import QuietReporter
    from servegate.release.context import Context
    from servegate.release.promote import promote

    a = attested

    def locked(*args: object, **kw: object) -> None:
        raise CommandFailed("git notes append: Unable to create '…/servegate-attestations.lock'")

    monkeypatch.setattr(attest, "write", locked)
    nxt = a.stack.commit("ok", "while the attestations ref is locked")
    outcome = promote(Context.create(a.cfg, QuietReporter(), a.env), nxt)
    assert outcome.verdict == "released", outcome.reason
    published = outcome.record["publish"]
    assert any("were not noted" in w for w in published["warnings"]), published
    monkeypatch.undo()
    assert a.cli("verify", "--attestation", nxt).returncode == 0


def test_config_check_says_who_signs_and_refuses_a_key_others_can_read(
    attested: Attested,
) -> None:
    a = attested
    ok = a.cli("config", "check", "--offline")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert f"attestations signed by {PRINCIPAL} (SHA256:" in ok.stdout
    a.key.chmod(0o640)
    try:
        bad = a.cli("config", "check", "--offline")
    finally:
        a.key.chmod(0o600)
    assert bad.returncode == 2, bad.stdout + bad.stderr
    assert f"chmod 600 {a.key}" in bad.stderr
