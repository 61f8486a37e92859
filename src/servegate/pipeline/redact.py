"""What of an environment or a command line may reach a record, a log or ``--json``.

Redaction by default: an environment variable's *name* is always kept, its *value* only
when the name is on the allowlist of engine tuning and path variables below and does not
look secret. Every other value becomes ``<redacted sha256:…>``: a hash salted with the
host's own salt (``<host.root>/salt``, 0600), so two records of one host still show that
a value stayed the same without showing it. Command-line values after ``--api-key`` and
the like, and the password of any URL with credentials, are redacted the same way.

Hand-written because it is a small policy over strings, and the policy is the point.
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
from collections.abc import Mapping, Sequence
from pathlib import Path

#: a name that looks secret: its value never leaves the process, allowlisted or not
SECRET_NAME = re.compile(
    r"(KEY|TOKEN|SECRET|PASSWORD|PASSWD|PASSPHRASE|CREDENTIAL|AUTH|COOKIE|SESSION|PRIVATE)",
    re.IGNORECASE,
)
#: command-line options whose value is a secret
SECRET_FLAGS = ("--api-key", "--hf-token", "--token", "--password", "--secret")
#: names whose values are engine tuning or paths, recorded as they are
ALLOWED_NAME = re.compile(
    r"^(VLLM_|HIP_|HSA_|ROCM_|ROCBLAS_|HIPBLASLT_|MIOPEN_|AMD_|GPU_|PYTORCH_|TORCH_|"
    r"TORCHINDUCTOR_|TRITON_|OMP_|KMP_|MKL_|CUDA_|NCCL_|RCCL_|NVIDIA_|CUBLAS_|TOKENIZERS_|"
    r"SERVEGATE_|PYTHON|LD_LIBRARY_PATH$|LD_PRELOAD$|PATH$|HOME$|USER$|LANG$|LC_|TZ$|"
    r"HF_HUB_OFFLINE$|HF_HUB_CACHE$|HF_HOME$|TRANSFORMERS_OFFLINE$|XDG_)"
)
#: scheme://user:password@host — the password part
URL_CREDENTIALS = re.compile(r"(?P<head>[a-zA-Z][\w+.-]*://[^:/@\s]+:)(?P<secret>[^@/\s]+)(?=@)")
SALT_FILE = "salt"


def host_salt(root: Path) -> str:
    """The host's salt, made once (0600) under ``root``; "" when it cannot be kept."""
    path = root / SALT_FILE
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        pass
    except OSError:
        return ""
    salt = secrets.token_hex(16)
    try:
        root.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        return path.read_text().strip()
    except OSError:
        return ""
    with os.fdopen(fd, "w") as handle:
        handle.write(salt + "\n")
    return salt


def hidden(value: str, salt: str) -> str:
    digest = hashlib.sha256(f"{salt}\0{value}".encode()).hexdigest()[:16]
    return f"<redacted sha256:{digest}>"


def is_secret(name: str) -> bool:
    return bool(SECRET_NAME.search(name))


def shown(name: str) -> bool:
    """Whether ``name``'s value may be recorded as it is."""
    return bool(ALLOWED_NAME.match(name)) and not is_secret(name)


def text(value: str, salt: str) -> str:
    """A free-form value with any URL password redacted."""
    return URL_CREDENTIALS.sub(lambda m: m.group("head") + hidden(m.group("secret"), salt), value)


def value(name: str, raw: str | None, salt: str) -> str | None:
    if raw is None:
        return None
    return text(raw, salt) if shown(name) else hidden(raw, salt)


def env(mapping: Mapping[str, str], salt: str) -> dict[str, str]:
    return {k: hidden(v, salt) if not shown(k) else text(v, salt) for k, v in mapping.items()}


def argv(args: Sequence[str], salt: str) -> list[str]:
    out: list[str] = []
    hide_next = False
    for arg in args:
        if hide_next:
            out.append(hidden(arg, salt))
            hide_next = False
        elif arg in SECRET_FLAGS:
            out.append(arg)
            hide_next = True
        elif any(arg.startswith(flag + "=") for flag in SECRET_FLAGS):
            flag, secret = arg.split("=", 1)
            out.append(f"{flag}={hidden(secret, salt)}")
        else:
            out.append(text(arg, salt))
    return out


def cmdline(line: str, salt: str) -> str:
    """A space-joined command line (as /proc shows it), redacted."""
    return " ".join(argv(line.split(" "), salt))
