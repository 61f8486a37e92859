"""The host's SSH key as securesystemslib's key and signer (``ssh-keygen -Y sign``).

Apart from :mod:`servegate.release.attest` so that securesystemslib (45 ms to import) is
loaded by the commands that sign or verify attestations only, not by every command that
imports the release record.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from securesystemslib.exceptions import UnverifiedSignatureError
from securesystemslib.signer import Key, SecretsHandler, Signature, Signer

from servegate.errors import ConfigError
from servegate.release.attest import NAMESPACE, _keygen, _said, sha256, verify_ssh


class SshKey(Key):
    """An SSH public key as securesystemslib's Key: keyid is its SHA256 fingerprint."""

    def __init__(self, keyid: str, public: str, principal: str) -> None:
        keytype = public.split()[0]
        super().__init__(keyid, keytype, "sshsig", {"public": public, "principal": principal})

    @property
    def public(self) -> str:
        return str(self.keyval["public"])

    @classmethod
    def from_dict(cls, keyid: str, key_dict: dict[str, Any]) -> SshKey:
        keyval = key_dict.get("keyval", {})
        return cls(keyid, str(keyval.get("public", "")), str(keyval.get("principal", "")))

    def to_dict(self) -> dict[str, Any]:
        return {"keytype": self.keytype, "scheme": self.scheme, "keyval": dict(self.keyval)}

    def verify_signature(self, signature: Signature, data: bytes) -> None:
        principal = str(self.keyval["principal"])
        line = f'{principal} namespaces="{NAMESPACE}" {self.public}\n'
        if not verify_ssh(line, principal, signature.signature, data):
            raise UnverifiedSignatureError(f"not signed by {principal} ({self.keyid})")


class SshSigner(Signer):
    """Signs with the host's SSH private key through ``ssh-keygen -Y sign``."""

    def __init__(self, key: Path, principal: str) -> None:
        self.key = key
        self.principal = principal
        public = _keygen(["-y", "-P", "", "-f", str(key)])
        if public.returncode:
            raise ConfigError(
                f"attest.key {key} is not an SSH private key ssh-keygen can read without a "
                f"passphrase ({_said(public)})",
                hint="give a key made with `ssh-keygen -t ed25519 -N ''`, or set attest.key = "
                '"" to write the attestations unsigned',
            )
        text = " ".join(public.stdout.decode().split()[:2])
        with tempfile.NamedTemporaryFile("w", suffix=".pub") as handle:
            handle.write(text + "\n")
            handle.flush()
            listed = _keygen(["-l", "-E", "sha256", "-f", handle.name])
        fingerprint = listed.stdout.decode().split()[1] if listed.returncode == 0 else ""
        self._key = SshKey(fingerprint or f"SHA256:{sha256(text.encode())}", text, principal)

    @classmethod
    def from_priv_key_uri(
        cls,
        priv_key_uri: str,
        public_key: Key,
        secrets_handler: SecretsHandler | None = None,
    ) -> SshSigner:
        if not priv_key_uri.startswith("ssh:") or not isinstance(public_key, SshKey):
            raise ValueError(f"not an SSH key URI: {priv_key_uri}")
        return cls(Path(priv_key_uri[4:]), str(public_key.keyval["principal"]))

    @property
    def public_key(self) -> SshKey:
        return self._key

    def sign(self, payload: bytes) -> Signature:
        done = _keygen(["-Y", "sign", "-f", str(self.key), "-n", NAMESPACE], payload)
        if done.returncode or b"BEGIN SSH SIGNATURE" not in done.stdout:
            raise ConfigError(
                f"ssh-keygen could not sign with attest.key {self.key}: {_said(done)}"
            )
        return Signature(self._key.keyid, done.stdout.hex())  # DSSE's sig is its base64
