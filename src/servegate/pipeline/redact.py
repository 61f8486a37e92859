"""What of an environment or a command line may reach a record, a log or ``--json``.

Redaction by default: an environment variable's *name* is always kept, its *value* only
when the name is on the allowlist of engine tuning and path variables below and does not
look secret. Every other value becomes ``<redacted sha256:…>``: a hash salted with the
host's own salt (``<host.root>/salt``, 0600), so two records of one host still show that
a value stayed the same without showing it. Command-line values after ``--api-key`` and
the like, and the password of any URL with credentials, are redacted the same way.
Wherever free text is redacted (:func:`text`: allowlisted values, command lines, every
string of a record and of what is printed), a value shaped like a well-known token is
too, whatever its name:
GitHub, GitLab, OpenAI, AWS, Slack, Stripe, PyPI, npm, JWTs and more, by the patterns of
Yelp's maintained ``detect-secrets`` (its regex detectors, :data:`TOKEN_DETECTORS`), and
Hugging Face's ``hf_…`` and GitHub's fine-grained ``github_pat_…``, which it lacks.

Hand-written because it is a small policy over strings, and the policy is the point.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import json
import os
import re
import secrets
import stat
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from servegate.errors import StateInvalid

#: a name that looks secret: its value never leaves the process, allowlisted or not. The
#: word must end a part of the name, digits allowed after it (``HF_TOKEN``,
#: ``OPENAI_API_KEY``, ``APIKEY``, ``VLLM_API_KEY2``, ``TOKEN_1``, ``--api-key``), so
#: ``TOKENIZERS_PARALLELISM`` or ``--tokenizer`` are not secrets.
SECRET_NAME = re.compile(
    r"(KEY|TOKEN|SECRET|PASSWORD|PASSWD|PASSPHRASE|CREDENTIAL|AUTHORIZATION|AUTH|BEARER|"
    r"COOKIE|SESSION|PRIVATE)S?[0-9]*(?=$|[_.-])",
    re.IGNORECASE,
)
#: values too plain to be anybody's secret: never scrubbed out of free text (a number of
#: six digits or more may be a PIN or a numeric token: it is scrubbed)
PLAIN_VALUE = re.compile(r"^(true|false|yes|no|on|off|none|null|[0-9.]{1,5})$", re.IGNORECASE)
#: command-line options whose value is a secret
SECRET_FLAGS = (
    "--api-key",
    "--hf-token",
    "--token",
    "--password",
    "--pass",
    "--passphrase",
    "--secret",
    "--bearer",
)
#: credentials inside any value: ``Authorization: …`` (the rest of the line), and the
#: token after ``Bearer``/``Basic``
AUTH_HEADER = re.compile(
    r"(\b(?:proxy-)?authorization\s*[:=]\s*+)(?!<redacted)([^\r\n\"']+)", re.IGNORECASE
)
AUTH_SCHEME = re.compile(
    r"(\b(?:bearer|basic)\s++)(?!<redacted)([A-Za-z0-9._~+/=:-]{6,})", re.IGNORECASE
)
#: names whose values are engine tuning or paths, recorded as they are
ALLOWED_NAME = re.compile(
    r"^(VLLM_|HIP_|HSA_|ROCM_|ROCBLAS_|HIPBLASLT_|MIOPEN_|AMD_|GPU_|PYTORCH_|TORCH_|"
    r"TORCHINDUCTOR_|TRITON_|OMP_|KMP_|MKL_|CUDA_|NCCL_|RCCL_|NVIDIA_|CUBLAS_|TOKENIZERS_|"
    r"SERVEGATE_|PYTHON|LD_LIBRARY_PATH$|LD_PRELOAD$|PATH$|HOME$|USER$|LANG$|LC_|TZ$|"
    r"HF_HUB_OFFLINE$|HF_HUB_CACHE$|HF_HOME$|TRANSFORMERS_OFFLINE$|XDG_)"
)
#: a URL: its userinfo and secret-looking query values are redacted
URL = re.compile(r"[a-zA-Z][\w+.-]*://\S+")
SECRET_QUERY = re.compile(
    r"([?&#](?:[^=&#\s]*(?:key|token|secret|password|sig|signature|auth|credential)[^=&#\s]*)=)"
    r"([^&\s#]+)",
    re.IGNORECASE,
)
SALT_FILE = "salt"


def host_salt(root: Path) -> str:
    """The host's salt, made once (0600) under ``root``. A salt that exists but cannot be
    read is an error (:class:`StateInvalid`): unsalted hashes of short secrets could be
    reversed by trying values."""
    path = root / SALT_FILE
    try:
        return _read_salt(path)
    except FileNotFoundError:
        pass
    salt = secrets.token_hex(16)
    try:
        root.mkdir(parents=True, exist_ok=True, mode=0o700)  # the host root: closed to others
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        return _read_salt(path)
    except OSError as exc:
        raise StateInvalid(
            f"cannot make the host's redaction salt {path}: {exc.strerror or exc}",
            hint=f"make {root} a directory this user can write (mode 0700)",
        ) from exc
    with os.fdopen(fd, "w") as handle:
        handle.write(salt + "\n")
    return salt


def _read_salt(path: Path) -> str:
    fix = (
        f"remove {path} (servegate makes a new one; earlier records' hashes then no longer "
        "compare with new ones, and their seals no longer show them as this host's: the "
        "next promote has no gate baseline), or make it a readable file of this user's"
    )
    try:  # FileNotFoundError: the caller makes one
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise StateInvalid(
            f"the host's redaction salt {path} cannot be read (a link is not followed): "
            f"{exc.strerror or exc}",
            hint=fix,
        ) from exc
    try:
        info = os.fstat(fd)
        raw = os.read(fd, 4096) if stat.S_ISREG(info.st_mode) else b""
    finally:
        os.close(fd)
    # the key that seals this host's records and salts its redaction hashes: no one
    # else may read it (a copy without -p, an image shared by a fleet)
    if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise StateInvalid(
            f"the host's salt {path} is not a private file of this user's (owner uid "
            f"{info.st_uid}, mode {oct(stat.S_IMODE(info.st_mode))}): whoever could read it "
            "could seal records in this host's name",
            hint=f"if no one else has read it: chown $(id -u) {path} && chmod 600 {path}; "
            f"otherwise {fix}",
        )
    try:
        salt = raw.decode("ascii").strip()
    except UnicodeDecodeError:
        salt = ""
    if not re.fullmatch(r"[0-9a-f]{16,128}", salt):
        raise StateInvalid(
            f"the host's redaction salt {path} is not a salt servegate made (hex digits)",
            hint=fix,
        )
    return salt


def hidden(value: str, salt: str) -> str:
    digest = hashlib.sha256(f"{salt}\0{value}".encode()).hexdigest()[:16]
    return f"<redacted sha256:{digest}>"


def is_secret(name: str) -> bool:
    """Whether a variable, option or JSON key's name looks like it holds a secret."""
    return bool(SECRET_NAME.search(name))


def shown(name: str) -> bool:
    """Whether ``name``'s value may be recorded as it is."""
    return bool(ALLOWED_NAME.match(name)) and not is_secret(name)


#: detect-secrets' detectors whose patterns match a token by its own shape (module, class);
#: those that match a keyword's context, an IP address or a key file's first line are
#: left out
TOKEN_DETECTORS = (
    ("artifactory", "ArtifactoryDetector"), ("aws", "AWSKeyDetector"),
    ("discord", "DiscordBotTokenDetector"), ("github_token", "GitHubTokenDetector"),
    ("gitlab_token", "GitLabTokenDetector"), ("jwt", "JwtTokenDetector"),
    ("mailchimp", "MailchimpDetector"), ("npm", "NpmDetector"), ("openai", "OpenAIDetector"),
    ("pypi_token", "PypiTokenDetector"), ("sendgrid", "SendGridDetector"),
    ("slack", "SlackDetector"), ("square_oauth", "SquareOAuthDetector"),
    ("stripe", "StripeDetector"), ("telegram_token", "TelegramBotTokenDetector"),
    ("twilio", "TwilioKeyDetector"),
)  # fmt: skip
#: token shapes detect-secrets does not know: Hugging Face access tokens, GitHub's
#: fine-grained personal access tokens, and a whole JWT (its pattern stops before the
#: signature)
EXTRA_TOKENS = (
    r"\bhf_[A-Za-z0-9]{30,}",
    r"\bgithub_pat_[A-Za-z0-9_]{22,}",
    r"\beyJ[A-Za-z0-9_=-]+\.[A-Za-z0-9_=-]+\.[A-Za-z0-9_.+/=-]+",
)


@functools.cache
def token_shapes() -> re.Pattern[str]:
    """One pattern matching any well-known token's shape."""
    parts = list(EXTRA_TOKENS)
    for module, name in TOKEN_DETECTORS:
        detector = getattr(importlib.import_module(f"detect_secrets.plugins.{module}"), name)
        for pattern in detector.denylist:
            flags = "i" if pattern.flags & re.IGNORECASE else ""
            parts.append(f"(?{flags}:{pattern.pattern})" if flags else f"(?:{pattern.pattern})")
    return re.compile("|".join(parts))


def text(value: str, salt: str) -> str:
    """A free-form value with every URL's credentials and secret query values redacted,
    the credentials of an ``Authorization:`` header or after ``Bearer``/``Basic``, and
    every value shaped like a well-known token (:func:`token_shapes`)."""
    value = token_shapes().sub(lambda m: hidden(m.group(0), salt) if m.group(0) else "", value)
    value = AUTH_HEADER.sub(lambda m: m.group(1) + hidden(m.group(2).strip(), salt), value)
    value = AUTH_SCHEME.sub(lambda m: m.group(1) + hidden(m.group(2), salt), value)
    return URL.sub(lambda m: _url(m.group(0), salt), value)


def _url(url: str, salt: str) -> str:
    scheme, _, rest = url.partition("://")
    at = rest.rfind("@", 0, _host_end(rest))
    if at >= 0:  # user:password@ (or a token as the user): everything up to the last @
        userinfo = rest[:at]
        user, colon, _pw = userinfo.partition(":")
        shown_user = user if colon else ""
        rest = f"{shown_user}{':' if colon else ''}{hidden(userinfo, salt)}@{rest[at + 1 :]}"
    rest = SECRET_QUERY.sub(lambda m: m.group(1) + hidden(m.group(2), salt), rest)
    return f"{scheme}://{rest}"


def _host_end(rest: str) -> int:
    """Where the authority part ends: the first / ? or # after the last @ (a password may
    hold / or @)."""
    last_at = rest.rfind("@")
    for i in range(max(last_at, 0), len(rest)):
        if rest[i] in "/?#":
            return i
    return len(rest)


def quoted(name: str, raw: object) -> str:
    """A value for an error message: quoted when its name may be shown, else not at all."""
    return repr(raw) if shown(name) else "<a value not shown: secret or not allowlisted>"


def value(name: str, raw: str | None, salt: str) -> str | None:
    if raw is None:
        return None
    return text(raw, salt) if shown(name) else hidden(raw, salt)


def env(mapping: Mapping[str, str], salt: str, secret: Iterable[str] = ()) -> dict[str, str]:
    """The environment as a record may hold it; ``secret``: names whose values are hidden
    whatever the name (filled from ``${NAME}`` in servegate's environment)."""
    hide = set(secret)
    return {
        k: hidden(v, salt) if k in hide or not shown(k) else text(v, salt)
        for k, v in mapping.items()
    }


def _secret_flag(arg: str) -> bool:
    name = arg.split("=", 1)[0].lower().replace("_", "-")
    return name.startswith("--") and (name in SECRET_FLAGS or is_secret(name))


def _json_arg(arg: str, salt: str) -> str | None:
    """A JSON argument with the values of secret-looking keys redacted; None: not JSON."""
    if arg.lstrip()[:1] not in ("{", "["):
        return None
    try:
        doc = json.loads(arg)
    except ValueError:
        return None

    def walk(node: Any) -> Any:
        if isinstance(node, dict):
            return {k: hidden(json.dumps(v), salt) if is_secret(str(k)) else walk(v)
                    for k, v in node.items()}  # fmt: skip
        if isinstance(node, list):
            return [walk(v) for v in node]
        return text(node, salt) if isinstance(node, str) else node

    return json.dumps(walk(doc), separators=(",", ":"))


def argv(args: Sequence[str], salt: str, mask: str | None = None) -> list[str]:
    """A command line as a record may hold it: every value of a secret-looking option
    (``--api-key``, ``--api_key``, ``--hf-token``, ``--openai-api-key``…, up to the next
    option: vLLM takes several keys), secret keys inside JSON arguments, URL credentials.
    ``mask``: hidden values become this constant instead of a salted hash."""

    def hide(value: str) -> str:
        return mask if mask is not None else hidden(value, salt)

    out: list[str] = []
    hiding = first = False
    for arg in args:
        if arg.startswith("-") and len(arg) > 1 and not first:
            hiding = False
        first = False
        if hiding:
            out.append(hide(arg))
        elif _secret_flag(arg) and "=" in arg:
            flag, secret = arg.split("=", 1)
            out.append(f"{flag}={hide(secret)}")
        elif _secret_flag(arg):
            out.append(arg)
            hiding = first = True  # its first value is a secret even if it starts with -
        elif "=" in arg and arg.startswith("--") and (j := _json_arg(arg.split("=", 1)[1], salt)):
            out.append(f"{arg.split('=', 1)[0]}={j}")
        else:
            out.append(_json_arg(arg, salt) or text(arg, salt))
    return out


def secrets_of(env: Mapping[str, str], args: Sequence[str], secret: Iterable[str] = ()) -> set[str]:
    """The raw values :func:`env` and :func:`argv` would hide: what must never appear in
    any text servegate records or prints (a service log quoting its own arguments).
    ``secret``: names whose values are secret whatever the name."""
    hide = set(secret)
    found = {v for k, v in env.items() if k in hide or not shown(k)}
    for k, v in env.items():
        if is_secret(k):
            found |= _json_secrets(v, under_secret=True)
    hiding = first = False
    for arg in args:
        if arg.startswith("-") and len(arg) > 1 and not first:
            hiding = False
        first = False
        if hiding:
            found.add(arg)
        elif _secret_flag(arg):
            if "=" in arg:
                found.add(arg.split("=", 1)[1])
                found |= _json_secrets(arg.split("=", 1)[1], under_secret=True)
            else:
                hiding = first = True
        else:
            found |= _json_secrets(
                arg.split("=", 1)[1] if arg.startswith("--") and "=" in arg else arg
            )
    return plain_dropped(found)


def plain_dropped(values: Iterable[str]) -> set[str]:
    """``values`` less those too short or too plain to be a secret ("1", "on", "false":
    replacing every "false" in a record would garble it)."""
    return {v for v in values if len(v) >= 4 and not PLAIN_VALUE.match(v)}


def _json_secrets(arg: str, under_secret: bool = False) -> set[str]:
    """The values under secret-looking keys of a JSON argument: the value as written and
    every string inside it. ``under_secret``: the whole document is a secret's value."""
    if arg.lstrip()[:1] not in ("{", "["):
        return set()
    try:
        doc = json.loads(arg)
    except ValueError:
        return set()
    out: set[str] = set()

    def strings(node: Any) -> None:
        if isinstance(node, str):
            out.add(node)
        elif isinstance(node, dict):
            for v in node.values():
                strings(v)
        elif isinstance(node, list):
            for v in node:
                strings(v)
        elif node is not None and not isinstance(node, bool):
            out.add(json.dumps(node))

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                if is_secret(str(k)):
                    out.add(v if isinstance(v, str) else json.dumps(v))
                    strings(v)
                else:
                    walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    if under_secret:
        strings(doc)
    else:
        walk(doc)
    return out


#: fields servegate writes itself from its own vocabulary and Git (a verdict, a SHA, a
#: time, a tag): never scrubbed. A secret that happens to equal "released" or "main"
#: must not turn a record's verdict or branch into a redaction (nor reveal, by where the
#: redaction sits, which word the secret is).
OWN_FIELDS = frozenset([
    "verdict", "sha", "previous_sha", "host_id", "branch", "strategy", "at", "tag", "kind",
    "schema", "servegate_version", "servegate_commit", "service_manager", "status", "name",
    "frames_status", "method", "class",
])  # fmt: skip
#: what a secret value becomes inside free text: the same for every secret, so its
#: place in a text says nothing about which value it was
IN_TEXT = "<redacted>"


class Scrubber:
    """Replaces known secret values wherever they appear in a text or a JSON document
    (servegate's own fields, :data:`OWN_FIELDS`, excepted)."""

    def __init__(self, values: Iterable[str], salt: str) -> None:
        self.salt = salt
        self.values = sorted(set(values), key=len, reverse=True)

    def text(self, value: str) -> str:
        for secret in self.values:
            if secret in value:
                value = value.replace(secret, IN_TEXT)
        return text(value, self.salt)

    def inplace(self, obj: Any) -> None:
        """Scrub every string inside ``obj`` (dicts and lists changed in place, so every
        reference to them sees the scrubbed values)."""
        if isinstance(obj, dict):
            for k, v in obj.items():
                if k in OWN_FIELDS and isinstance(v, str | int | float | bool | None):
                    continue
                if isinstance(v, str):
                    obj[k] = self.text(v)
                else:
                    self.inplace(v)
        elif isinstance(obj, list):
            for i, v in enumerate(obj):
                if isinstance(v, str):
                    obj[i] = self.text(v)
                else:
                    self.inplace(v)
