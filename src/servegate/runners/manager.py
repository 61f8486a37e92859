"""``servegate runner serve``: keep one fresh just-in-time runner ready on this box.

An ephemeral runner registered once takes one job and is gone until someone registers
it again. The manager closes that loop: before each job it runs the job-start checks
(leftover processes of an earlier job ended, the GPUs idle: :mod:`runners.hooks`),
asks GitHub for a just-in-time runner configuration (the REST API's
``generate-jitconfig``: a single-use registration for one runner and one job, nothing
to deregister), starts ``run.sh`` with it for exactly that job, cleans up after it,
and starts over. A systemd user unit (``--write-unit``) keeps the manager itself
running across crashes and reboots.

Authentication, from the environment or a file only this user can read:

- a fine-grained personal access token with the repository's "Administration: write"
  permission (or the organisation's "Self-hosted runners: write"): ``--token-env`` /
  ``--token-file``;
- a GitHub App: ``--app-id``, ``--installation-id`` and ``--app-key`` (its private key,
  PEM, 0600): the manager signs a 10-minute JWT (RS256) and exchanges it for an
  installation token (``POST /app/installations/{id}/access_tokens``), renewed before it
  expires.

The requests follow GitHub's documented shapes (``X-GitHub-Api-Version: 2022-11-28``);
the JIT configuration is a secret: it reaches ``run.sh`` in its environment
(``ACTIONS_RUNNER_INPUT_JITCONFIG``, readable only by this user, where ``--jitconfig``
on the command line would be readable by every user of the box), and is never printed
or written. The JWT is signed here
with ``cryptography`` (already a dependency through Paramiko) rather than PyJWT: three
base64url fields and one RSA signature.
"""

from __future__ import annotations

import base64
import json
import re
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from servegate import envfile
from servegate.engine.managers.systemd import quote_arg
from servegate.errors import ConfigError, PreflightFailed
from servegate.runners import hooks

API_VERSION = "2022-11-28"
#: how the Actions runner takes a just-in-time configuration besides ``--jitconfig``
JIT_VARIABLE = "ACTIONS_RUNNER_INPUT_JITCONFIG"
REPO_URL = re.compile(r"^https://[^/]+/(?P<owner>[\w.-]+)(?:/(?P<repo>[\w.-]+))?/?$")


@dataclass(frozen=True)
class Scope:
    """Where runners register: a repository (``owner/repo``) or an organisation."""

    owner: str
    repo: str = ""

    @classmethod
    def from_url(cls, url: str) -> Scope:
        m = REPO_URL.match(url.strip())
        if not m:
            raise ConfigError(
                f"--url {url!r} is not https://HOST/OWNER/REPO or https://HOST/ORG",
                hint="e.g. --url https://github.com/team/v620-vllm",
            )
        return cls(m["owner"], m["repo"] or "")

    @property
    def jit_path(self) -> str:
        if self.repo:
            return f"/repos/{self.owner}/{self.repo}/actions/runners/generate-jitconfig"
        return f"/orgs/{self.owner}/actions/runners/generate-jitconfig"


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def check_key(pem: bytes, where: str = "--app-key") -> None:
    """The App's key is read when the manager starts, not at its first job."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    try:
        key = serialization.load_pem_private_key(pem, password=None)
    except (ValueError, TypeError) as exc:
        raise ConfigError(
            f"{where} is not a PEM private key without a passphrase ({exc})",
            hint="download the App's private key (Settings → Developer settings → GitHub "
            "Apps → Private keys) and point --app-key at the .pem file",
        ) from None
    if not isinstance(key, rsa.RSAPrivateKey):
        raise ConfigError(f"{where} is not an RSA private key (GitHub Apps sign with RS256)")


def app_jwt(app_id: str, pem: bytes, now: float | None = None) -> str:
    """The JWT a GitHub App authenticates with: RS256, issued 60 s in the past (clock
    drift), valid 9 minutes (GitHub allows 10)."""
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import padding, rsa

    key = serialization.load_pem_private_key(pem, password=None)
    if not isinstance(key, rsa.RSAPrivateKey):
        raise ConfigError("--app-key is not an RSA private key (GitHub Apps sign with RS256)")
    t = int(now if now is not None else time.time())
    head = _b64(json.dumps({"alg": "RS256", "typ": "JWT"}, separators=(",", ":")).encode())
    body = _b64(
        json.dumps({"iat": t - 60, "exp": t + 540, "iss": app_id}, separators=(",", ":")).encode()
    )
    signature = key.sign(f"{head}.{body}".encode(), padding.PKCS1v15(), hashes.SHA256())
    return f"{head}.{body}.{_b64(signature)}"


@dataclass
class Credentials:
    """A token, or a GitHub App that mints installation tokens."""

    token: str = ""
    app_id: str = ""
    installation_id: str = ""
    app_key: bytes = b""
    _minted: tuple[str, float] = field(default=("", 0.0), repr=False)

    @classmethod
    def from_options(
        cls,
        environ: Mapping[str, str],
        token_env: str = "",
        token_file: str = "",
        app_id: str = "",
        installation_id: str = "",
        app_key: str = "",
    ) -> Credentials:
        if app_id or installation_id or app_key:
            if not (app_id and installation_id and app_key):
                raise ConfigError(
                    "a GitHub App needs --app-id, --installation-id and --app-key together"
                )
            pem = envfile.read_private(app_key, "--app-key", fix="save the App's private key "
                                       f"there and chmod 600 {app_key}").encode()  # fmt: skip
            check_key(pem, app_key)
            return cls(app_id=app_id, installation_id=installation_id, app_key=pem)
        if token_file:
            token = envfile.read_private(token_file, "--token-file").strip()
        else:
            token = environ.get(token_env or "GITHUB_TOKEN", "").strip()
        if not token:
            raise ConfigError(
                f"no token: {token_env or 'GITHUB_TOKEN'} is empty and no --token-file given",
                hint="a fine-grained token with Administration: write on the repository "
                "(export GITHUB_TOKEN=… or --token-file FILE, mode 0600), or a GitHub App",
            )
        return cls(token=token)

    def bearer(self, http: httpx.Client, now: Callable[[], float] = time.time) -> str:
        """The token to send: the configured one, or a fresh installation token."""
        if self.token:
            return self.token
        token, expires = self._minted
        if token and expires - now() > 120:
            return token
        jwt = app_jwt(self.app_id, self.app_key, now())
        resp = http.post(
            f"/app/installations/{self.installation_id}/access_tokens",
            headers={"Authorization": f"Bearer {jwt}"},
        )
        body = _answer(resp, 201, "an installation token for the GitHub App")
        minted = str(body.get("token") or "")
        if not minted:
            raise PreflightFailed("GitHub answered no installation token")
        when = str(body.get("expires_at") or "")
        try:
            import datetime as dt

            expires = dt.datetime.fromisoformat(when.replace("Z", "+00:00")).timestamp()
        except ValueError:
            expires = now() + 3000
        self._minted = (minted, expires)
        return minted


def _json(resp: httpx.Response) -> Any:
    try:
        return resp.json()
    except ValueError:
        return None


def _answer(resp: httpx.Response, want: int, what: str) -> dict[str, Any]:
    if resp.status_code != want:
        body = _json(resp)
        message = str(body.get("message", "")) if isinstance(body, dict) else resp.text[:200]
        hint = {
            401: "the token or the App's key is wrong or expired",
            403: "the token lacks the permission (Administration: write on the repository, "
            "or Self-hosted runners: write on the organisation), or the runner group is "
            "not yours to use",
            404: "the repository, organisation, installation or runner group does not "
            "exist, or the token cannot see it",
            409: "a runner of that name is already registered",
            422: "GitHub refused the request's fields (name, labels, runner group)",
        }.get(resp.status_code, "see GitHub's message")
        raise PreflightFailed(f"{what}: GitHub answered {resp.status_code} {message}", hint=hint)
    body = _json(resp)
    if not isinstance(body, dict):
        raise PreflightFailed(
            f"{what}: GitHub's answer is not a JSON object",
            hint="check --api-url: it must be the REST API (https://api.github.com, or "
            "https://HOST/api/v3 on GitHub Enterprise Server)",
        )
    return body


@dataclass(frozen=True)
class ManagerSpec:
    url: str
    name: str
    labels: tuple[str, ...]
    directory: Path
    api_url: str = "https://api.github.com"
    runner_group_id: int = 1
    work_folder: str = "_work"
    #: a release runner's ref (``refs/heads/main``): its jobs must be of that ref
    release_ref: str = ""
    #: and its repository (``owner/repo``)
    release_repo: str = ""


class Api:
    """The two REST calls the manager makes."""

    def __init__(self, spec: ManagerSpec, credentials: Credentials, timeout: float = 30.0):
        self.spec = spec
        self.scope = Scope.from_url(spec.url)
        self.credentials = credentials
        self.http = httpx.Client(
            base_url=spec.api_url.rstrip("/"),
            timeout=timeout,
            headers={"Accept": "application/vnd.github+json",
                     "X-GitHub-Api-Version": API_VERSION,
                     "User-Agent": "servegate-runner-manager"},
        )  # fmt: skip

    def close(self) -> None:
        self.http.close()

    def jitconfig(self, name: str) -> tuple[int, str]:
        """(runner id, encoded JIT configuration) for a new runner called ``name``."""
        token = self.credentials.bearer(self.http)
        resp = self.http.post(
            self.scope.jit_path,
            headers={"Authorization": f"Bearer {token}"},
            json={
                "name": name,
                "runner_group_id": self.spec.runner_group_id,
                "labels": list(self.spec.labels),
                "work_folder": self.spec.work_folder,
            },
        )
        body = _answer(resp, 201, f"a just-in-time runner configuration for {name}")
        encoded = body.get("encoded_jit_config")
        found = body.get("runner")
        runner: dict[str, Any] = found if isinstance(found, dict) else {}
        if not isinstance(encoded, str) or not encoded:
            raise PreflightFailed("GitHub's answer carried no encoded_jit_config")
        return int(runner.get("id") or 0), encoded


@dataclass
class Outcome:
    """One turn of the loop."""

    runner: str
    runner_id: int = 0
    exit_code: int | None = None
    skipped: str = ""
    seconds: float = 0.0

    @property
    def bad(self) -> bool:
        """No job ran well: skipped, or the runner failed or gave up at once."""
        return bool(self.skipped) or self.exit_code != 0 or self.seconds < QUICK_EXIT


#: variables that hold GitHub credentials, never passed to a job
CREDENTIAL_VARIABLES = ("GITHUB_TOKEN", "GH_TOKEN", "GH_ENTERPRISE_TOKEN", "GITHUB_PAT")


def one_turn(
    spec: ManagerSpec,
    api: Api,
    environ: Mapping[str, str],
    turn: int,
    log: Callable[[str], None] = print,
    before: Callable[[Mapping[str, str]], int] = lambda env: hooks.job_started(env, False),
    after: Callable[[Mapping[str, str]], int] = hooks.job_completed,
    hidden: Sequence[str] = CREDENTIAL_VARIABLES,
) -> Outcome:
    """Checks, a fresh runner for one job, clean-up."""
    name = f"{spec.name}-{int(time.time())}-{turn}"
    # a job must never see the token that registers runners (jobs read the runner's
    # environment): only the one-job configuration goes to run.sh
    env = {k: v for k, v in environ.items() if k not in hidden} | {hooks.MARKER: spec.name}
    if spec.release_ref:
        env[hooks.RELEASE_REF] = spec.release_ref
        env[hooks.RELEASE_REPO] = spec.release_repo
    if before(env) != 0:
        return Outcome(name, skipped="the job-start checks failed (see above): no runner offered")
    run_sh = spec.directory / "run.sh"
    if not run_sh.exists():
        raise PreflightFailed(
            f"{run_sh} not found: the Actions runner is not unpacked in {spec.directory}",
            hint="download and unpack the runner there (tar xzf actions-runner-linux-*.tar.gz)",
        )
    runner_id, encoded = api.jitconfig(name)
    log(f"servegate: runner {name} (id {runner_id}) waits for one job")
    started = time.monotonic()
    # in the runner's environment (ACTIONS_RUNNER_INPUT_JITCONFIG, which the runner reads
    # and clears), not on its command line: /proc/PID/cmdline is readable by every user on
    # the box, /proc/PID/environ only by this one
    # the job's own checks (which job it is: a release runner refuses a pull request's)
    # run in the runner's job-start hook, once GitHub has handed it a job
    started_hook = hooks.write_script(spec.directory, "started")
    done = subprocess.run(
        [str(run_sh)], cwd=spec.directory, check=False,
        env={**env, JIT_VARIABLE: encoded, "ACTIONS_RUNNER_HOOK_JOB_STARTED": str(started_hook)},
    )  # fmt: skip
    log(f"servegate: runner {name} exited {done.returncode}")
    after({**env, "GITHUB_WORKSPACE": str(spec.directory / spec.work_folder)})
    return Outcome(name, runner_id, done.returncode, seconds=time.monotonic() - started)


#: a runner that exits sooner than this took no job (a broken unpack, an old runner)
QUICK_EXIT = 5.0
#: the longest wait between bad turns
MAX_PAUSE = 600.0


def serve(
    spec: ManagerSpec,
    api: Api,
    environ: Mapping[str, str],
    turns: int = 0,
    pause: float = 30.0,
    log: Callable[[str], None] = print,
    hidden: Sequence[str] = CREDENTIAL_VARIABLES,
    sleep: Callable[[float], None] = time.sleep,
) -> list[Outcome]:
    """Run turns until stopped (``turns``: that many, for tests and one-offs). A bad turn
    (GitHub unreachable, checks failed, a runner that failed or exited at once) waits
    ``pause`` seconds, doubling up to 10 minutes while they stay bad: a broken runner
    must not register runners as fast as GitHub answers."""
    done: list[Outcome] = []
    n = 0
    wait = pause
    while not turns or n < turns:
        n += 1
        try:
            outcome = one_turn(spec, api, environ, n, log, hidden=hidden)
        except (PreflightFailed, httpx.HTTPError) as exc:
            log(f"servegate: no runner this turn: {exc}")
            outcome = Outcome(f"{spec.name}-{n}", skipped=str(exc))
        done.append(outcome)
        if not outcome.bad:
            wait = pause
        elif not turns or n < turns:
            log(f"servegate: waiting {wait:.0f}s before the next runner")
            sleep(wait)
            wait = min(wait * 2, MAX_PAUSE)
    return done


def render_unit(spec: ManagerSpec, argv: Sequence[str]) -> str:
    """The systemd user unit that keeps the manager running."""
    lines = [
        "[Unit]",
        f"Description=servegate runner manager {spec.name} (one just-in-time runner a job)",
        "After=network-online.target",
        "",
        "[Service]",
        "Type=simple",
        f"WorkingDirectory={spec.directory}",
        f"ExecStart={' '.join(quote_arg(a) for a in argv)}",
        "Restart=always",
        "RestartSec=15",
        "KillMode=control-group",
        "TimeoutStopSec=120",
        "",
        "[Install]",
        "WantedBy=default.target",
        "",
    ]
    return "\n".join(lines)


def unit_argv(
    spec: ManagerSpec,
    token_env: str = "",
    token_file: str = "",
    app: tuple[str, str, str] | None = None,
) -> list[str]:
    """The manager's command line for its unit: every path absolute (the unit runs in
    the runner's directory, not where this was typed), no ``--write-unit``."""
    argv = [sys.executable, "-m", "servegate", "runner", "serve", "--url", spec.url,
            "--labels", ",".join(spec.labels), "--name", spec.name,
            "--dir", str(spec.directory.resolve()), "--api-url", spec.api_url,
            "--runner-group", str(spec.runner_group_id)]  # fmt: skip
    if spec.release_ref:
        argv += ["--release-ref", spec.release_ref, "--release-repo", spec.release_repo]
    if app is not None:
        app_id, installation, key = app
        argv += ["--app-id", app_id, "--installation-id", installation,
                 "--app-key", str(Path(key).expanduser().resolve())]  # fmt: skip
    elif token_file:
        argv += ["--token-file", str(Path(token_file).expanduser().resolve())]
    elif token_env:
        argv += ["--token-env", token_env]
    return argv


def unit_name(spec: ManagerSpec) -> str:
    return f"servegate-runner-manager-{spec.name}.service"
