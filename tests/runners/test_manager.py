"""The runner manager against a local HTTP server that answers as GitHub's REST API
documents it, and a real ``run.sh`` executable in the runner directory (the Actions
runner's own program is the unit's edge: it would need GitHub to take a job).

Documented shapes (docs.github.com/en/rest/actions/self-hosted-runners, API version
2022-11-28):

- ``POST /repos/{owner}/{repo}/actions/runners/generate-jitconfig`` with
  ``{"name", "runner_group_id", "labels": [1..100], "work_folder"}`` → ``201
  {"runner": {"id", "name", "os", "status", "busy", "labels": [...]}, "encoded_jit_config"}``;
  a name already registered → 409, a bad token → 401, fields refused → 422.
- ``POST /app/installations/{installation_id}/access_tokens`` authenticated by the App's
  JWT (RS256; ``iat``, ``exp`` at most 10 minutes later, ``iss``) → ``201 {"token",
  "expires_at"}``.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime as dt
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa

from servegate.errors import ConfigError
from servegate.runners import manager

TOKEN = "github_pat_11AAAAtest"
MINTED = "ghs_installationtoken"


class GitHub:
    """The two endpoints, with the checks GitHub makes, and a log of what was asked."""

    def __init__(self, app_key: rsa.RSAPrivateKey) -> None:
        self.public = app_key.public_key()
        self.requests: list[dict[str, Any]] = []
        self.names: set[str] = set()
        self.next_id = 40
        github = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                size = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(size) or b"{}")
                seen = {"path": self.path, "headers": dict(self.headers), "body": body}
                github.requests.append(seen)
                status, answer = github.answer(self.path, self.headers, body)
                data = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def _jwt_ok(self, jwt: str) -> bool:
        head, body, sig = jwt.split(".")
        pad = "=" * (-len(sig) % 4)
        try:
            self.public.verify(base64.urlsafe_b64decode(sig + pad), f"{head}.{body}".encode(),
                               padding.PKCS1v15(), hashes.SHA256())  # fmt: skip
        except Exception:
            return False
        claims = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
        now = time.time()
        return bool(claims["iat"] <= now and claims["exp"] - claims["iat"] <= 600
                    and claims["exp"] > now and claims["iss"] == "1234")  # fmt: skip

    def answer(self, path: str, headers: Any, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        if headers.get("X-GitHub-Api-Version") != "2022-11-28":
            return 400, {"message": "unsupported API version"}
        if headers.get("Accept") != "application/vnd.github+json":
            return 415, {"message": "Unsupported Media Type"}
        auth = str(headers.get("Authorization", "")).removeprefix("Bearer ")
        if path == "/app/installations/99/access_tokens":
            if not self._jwt_ok(auth):
                return 401, {"message": "A JSON web token could not be decoded"}
            expires = dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)
            return 201, {"token": MINTED, "expires_at": expires.strftime("%Y-%m-%dT%H:%M:%SZ")}
        if path != "/repos/team/stack/actions/runners/generate-jitconfig":
            return 404, {"message": "Not Found"}
        if auth not in (TOKEN, MINTED):
            return 401, {"message": "Bad credentials"}
        labels = body.get("labels")
        if (not isinstance(body.get("name"), str) or not isinstance(body.get("runner_group_id"), int)
                or not isinstance(labels, list) or not 1 <= len(labels) <= 100):  # fmt: skip
            return 422, {"message": "Invalid request."}
        if body["name"] in self.names:
            return 409, {"message": "Already exists - A runner with the same name already exists."}
        self.names.add(body["name"])
        self.next_id += 1
        runner = {"id": self.next_id, "name": body["name"], "os": "unknown", "status": "offline",
                  "busy": False, "labels": [{"id": 0, "name": n, "type": "read-only"}
                                            for n in labels]}  # fmt: skip
        encoded = base64.b64encode(json.dumps({"runner": self.next_id}).encode()).decode()
        return 201, {"runner": runner, "encoded_jit_config": encoded}


@pytest.fixture
def app_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


@pytest.fixture
def github(app_key: rsa.RSAPrivateKey) -> Iterator[GitHub]:
    gh = GitHub(app_key)
    thread = threading.Thread(target=gh.server.serve_forever, daemon=True)
    thread.start()
    yield gh
    gh.server.shutdown()
    gh.server.server_close()


@pytest.fixture
def runner_dir(tmp_path: Path) -> Path:
    """An Actions runner directory whose run.sh takes its one job: it records what it
    was given and leaves a process behind, as a sloppy job does."""
    d = tmp_path / "actions-runner"
    d.mkdir()
    (d / "run.sh").write_text(
        "#!/bin/sh\n"
        f'echo "args=$* jit=$ACTIONS_RUNNER_INPUT_JITCONFIG marker=$SERVEGATE_RUNNER" >> {d}/jobs.log\n'
        f"cat /proc/$$/cmdline >> {d}/cmdlines\n"
        f"sleep 300 &\necho $! >> {d}/children\n"
        "exit 0\n"
    )
    (d / "run.sh").chmod(0o755)
    return d


def spec(github: GitHub, runner_dir: Path) -> manager.ManagerSpec:
    return manager.ManagerSpec("https://github.com/team/stack", "box1",
                               ("self-hosted", "linux", "box1"), runner_dir,
                               api_url=github.url)  # fmt: skip


def write_key(path: Path, key: rsa.RSAPrivateKey) -> Path:
    """The App's private key as GitHub hands it out: PEM, readable by its owner only."""
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                       serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))  # fmt: skip
    path.chmod(0o600)
    return path


def token_file(tmp_path: Path, mode: int = 0o600) -> str:
    path = tmp_path / "token"
    path.write_text(TOKEN + "\n")
    path.chmod(mode)
    return str(path)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat.split(")")[-1].split()[0] != "Z"


def test_a_fresh_runner_takes_each_job_and_what_it_left_is_ended(
    github: GitHub, runner_dir: Path, tmp_path: Path
) -> None:
    creds = manager.Credentials.from_options({}, token_file=token_file(tmp_path))
    s = spec(github, runner_dir)
    api = manager.Api(s, creds)
    lines: list[str] = []
    try:
        done = manager.serve(s, api, {"PATH": os.environ["PATH"]}, turns=2, log=lines.append,
                             sleep=lambda _: None)  # a stand-in job ends at once  # fmt: skip
    finally:
        api.close()
    assert [o.exit_code for o in done] == [0, 0]
    assert len({o.runner for o in done}) == 2  # a new runner (and name) a job
    asked = [r for r in github.requests if r["path"].endswith("generate-jitconfig")]
    assert len(asked) == 2
    for r, outcome in zip(asked, done, strict=True):
        assert r["headers"]["Authorization"] == f"Bearer {TOKEN}"
        assert r["body"] == {"name": outcome.runner, "runner_group_id": 1,
                             "labels": ["self-hosted", "linux", "box1"],
                             "work_folder": "_work"}  # fmt: skip
    jobs = (runner_dir / "jobs.log").read_text().splitlines()
    encoded = [base64.b64encode(json.dumps({"runner": i}).encode()).decode() for i in (41, 42)]
    assert jobs == [f"args= jit={e} marker=box1" for e in encoded]
    # the configuration never sat on a command line another user of the box can read
    assert encoded[0] not in (runner_dir / "cmdlines").read_text()
    assert "ACTIONS_RUNNER_INPUT_JITCONFIG" not in os.environ
    # the process the job left behind was ended by the clean-up after it
    for pid in map(int, (runner_dir / "children").read_text().split()):
        deadline = time.monotonic() + 10
        while alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not alive(pid), pid
    assert not any(TOKEN in line or encoded[0] in line for line in lines)  # secrets unprinted


def test_a_github_app_mints_one_installation_token_and_reuses_it(
    github: GitHub, runner_dir: Path, tmp_path: Path, app_key: rsa.RSAPrivateKey
) -> None:
    pem = write_key(tmp_path / "app.pem", app_key)
    creds = manager.Credentials.from_options({}, app_id="1234", installation_id="99",
                                             app_key=str(pem))  # fmt: skip
    s = spec(github, runner_dir)
    api = manager.Api(s, creds)
    try:
        done = manager.serve(s, api, {"PATH": os.environ["PATH"]}, turns=2,
                             log=lambda _: None, sleep=lambda _: None)  # fmt: skip
    finally:
        api.close()
    assert [o.exit_code for o in done] == [0, 0]
    paths = [r["path"] for r in github.requests]
    assert paths.count("/app/installations/99/access_tokens") == 1
    jit = [r for r in github.requests if r["path"].endswith("generate-jitconfig")]
    assert all(r["headers"]["Authorization"] == f"Bearer {MINTED}" for r in jit)


def test_a_forged_app_key_is_refused_by_github_and_no_runner_starts(
    github: GitHub, runner_dir: Path, tmp_path: Path
) -> None:
    other = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = write_key(tmp_path / "other.pem", other)
    creds = manager.Credentials.from_options({}, app_id="1234", installation_id="99",
                                             app_key=str(pem))  # fmt: skip
    s = spec(github, runner_dir)
    api = manager.Api(s, creds)
    lines: list[str] = []
    try:
        (done,) = manager.serve(s, api, {}, turns=1, pause=0, log=lines.append)
    finally:
        api.close()
    assert "GitHub answered 401" in done.skipped
    assert not (runner_dir / "jobs.log").exists()


def test_a_bad_token_and_a_taken_name_say_what_to_do(
    github: GitHub, runner_dir: Path, tmp_path: Path
) -> None:
    s = spec(github, runner_dir)
    api = manager.Api(s, manager.Credentials(token="nope"))
    try:
        with pytest.raises(Exception, match="GitHub answered 401 Bad credentials") as err:
            api.jitconfig("box1-x")
        assert "wrong or expired" in str(getattr(err.value, "hint", ""))
        api.credentials = manager.Credentials(token=TOKEN)
        api.jitconfig("box1-y")
        with pytest.raises(Exception, match="409") as err:
            api.jitconfig("box1-y")
        assert "already registered" in str(getattr(err.value, "hint", ""))
    finally:
        api.close()


def test_secrets_come_from_private_files_or_the_environment_only(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="readable or writable by others"):
        manager.Credentials.from_options({}, token_file=token_file(tmp_path, 0o644))
    with pytest.raises(ConfigError, match="no token"):
        manager.Credentials.from_options({})
    assert manager.Credentials.from_options({"GH": " t \n"}, token_env="GH").token == "t"
    with pytest.raises(ConfigError, match="together"):
        manager.Credentials.from_options({}, app_id="1")
    with pytest.raises(ConfigError, match="not https://HOST/OWNER/REPO"):
        manager.Scope.from_url("team/stack")
    assert manager.Scope.from_url("https://github.com/team").jit_path == (
        "/orgs/team/actions/runners/generate-jitconfig"
    )


def test_the_unit_keeps_the_manager_running_and_carries_no_secret(
    runner_dir: Path, tmp_path: Path
) -> None:
    s = manager.ManagerSpec("https://github.com/team/stack", "box1", ("x",), runner_dir)
    here = os.getcwd()
    os.chdir(tmp_path)
    try:  # relative paths as typed become the unit's absolute ones
        argv = manager.unit_argv(s, token_file="tok")
        app = manager.unit_argv(s, app=("1", "2", "keys/app.pem"))
    finally:
        os.chdir(here)
    unit = manager.render_unit(s, argv)
    assert "Restart=always" in unit
    assert "--write-unit" not in unit
    assert f'ExecStart="{sys.executable}" "-m" "servegate" "runner" "serve"' in unit
    assert argv[argv.index("--token-file") + 1] == str(tmp_path / "tok")
    assert argv[argv.index("--dir") + 1] == str(runner_dir)
    assert app[app.index("--app-key") + 1] == str(tmp_path / "keys/app.pem")
    # the manager refuses to write a unit that could not see a token from this shell
    run = subprocess.run(
        [sys.executable, "-m", "servegate", "runner", "serve", "--url", s.url,
         "--dir", str(runner_dir), "--token-env", "GH", "--write-unit"],
        env={**os.environ, "GH": "secret", "XDG_CONFIG_HOME": str(tmp_path / "cfg")},
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert run.returncode == 2, run.stderr
    assert "cannot see GH" in run.stderr
    assert not (tmp_path / "cfg").exists()


def test_a_runner_that_fails_at_once_backs_off_instead_of_registering_in_a_loop(
    github: GitHub, runner_dir: Path
) -> None:
    (runner_dir / "run.sh").write_text("#!/bin/sh\nexit 1\n")
    s = spec(github, runner_dir)
    api = manager.Api(s, manager.Credentials(token=TOKEN))
    waits: list[float] = []
    try:
        done = manager.serve(s, api, {}, turns=6, pause=1.0, log=lambda _: None,
                             sleep=waits.append)  # fmt: skip
    finally:
        api.close()
    assert [o.exit_code for o in done] == [1] * 6
    assert waits == [1.0, 2.0, 4.0, 8.0, 16.0]  # doubling, up to MAX_PAUSE


def test_a_job_never_sees_the_token_that_registers_runners(
    github: GitHub, runner_dir: Path
) -> None:
    (runner_dir / "run.sh").write_text(
        f"#!/bin/sh\nenv | grep -E 'TOKEN|MY_GH' >> {runner_dir}/env.log\nexit 0\n"
    )
    s = spec(github, runner_dir)
    api = manager.Api(s, manager.Credentials(token=TOKEN))
    environ = {"PATH": os.environ["PATH"], "GITHUB_TOKEN": TOKEN, "GH_TOKEN": TOKEN,
               "MY_GH": TOKEN, "KEEP": "1"}  # fmt: skip
    try:
        manager.serve(s, api, environ, turns=1, log=lambda _: None,
                      hidden=(*manager.CREDENTIAL_VARIABLES, "MY_GH"))  # fmt: skip
    finally:
        api.close()
    seen = (runner_dir / "env.log").read_text() if (runner_dir / "env.log").exists() else ""
    assert TOKEN not in seen


def test_a_bad_app_key_or_an_odd_answer_is_a_clear_error_not_a_crash(
    runner_dir: Path, tmp_path: Path
) -> None:
    pem = tmp_path / "bad.pem"
    pem.write_text("-----BEGIN PRIVATE KEY-----\nnot a key\n-----END PRIVATE KEY-----\n")
    pem.chmod(0o600)
    with pytest.raises(ConfigError, match="not a PEM private key"):
        manager.Credentials.from_options({}, app_id="1", installation_id="2", app_key=str(pem))

    class Html(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_POST(self) -> None:
            body = b"<html>a proxy's login page</html>"
            self.send_response(201)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Html)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        s = manager.ManagerSpec("https://github.com/team/stack", "box1", ("x",), runner_dir,
                                api_url=f"http://127.0.0.1:{server.server_address[1]}")  # fmt: skip
        api = manager.Api(s, manager.Credentials(token=TOKEN))
        try:
            (done,) = manager.serve(s, api, {}, turns=1, log=lambda _: None)
        finally:
            api.close()
    finally:
        server.shutdown()
        server.server_close()
    assert "not a JSON object" in done.skipped
    assert not (runner_dir / "jobs.log").exists()


def test_runner_serve_that_never_got_a_runner_exits_non_zero(
    runner_dir: Path, tmp_path: Path
) -> None:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed = sock.getsockname()[1]
    run = subprocess.run(
        [sys.executable, "-m", "servegate", "runner", "serve", "--url",
         "https://github.com/team/stack", "--dir", str(runner_dir), "--token-env", "GH",
         "--api-url", f"http://127.0.0.1:{closed}", "--turns", "1"],
        env={**os.environ, "GH": TOKEN}, capture_output=True, text=True, timeout=60,
        check=False,
    )  # fmt: skip
    assert run.returncode not in (0, 70), run.stderr
    assert "none of 1 turn(s) got a runner" in run.stderr
    assert TOKEN not in run.stdout + run.stderr


def test_a_release_managers_runner_refuses_a_pull_requests_job_in_its_hook(
    github: GitHub, runner_dir: Path, tmp_path: Path
) -> None:
    """Under ``runner serve --release-ref``, the one-job runner runs servegate's job-start
    hook once GitHub hands it a job (as the real runner runs ACTIONS_RUNNER_HOOK_JOB_STARTED,
    with the job's GITHUB_* variables): a pull request's job fails there; a job of the
    release ref goes on."""
    (runner_dir / "run.sh").write_text(
        "#!/bin/sh\n"
        f'echo "unit=$SERVEGATE_RUNNER_RELEASE_REF" >> {runner_dir}/jobs.log\n'
        "for job in pull_request:refs/pull/7/merge workflow_dispatch:refs/heads/main; do\n"
        "  event=${job%%:*}; ref=${job#*:}\n"
        "  GITHUB_EVENT_NAME=$event GITHUB_REF=$ref GITHUB_REPOSITORY=team/stack "
        'GITHUB_WORKFLOW_REF="team/stack/.github/workflows/x.yml@$ref" '
        '"$ACTIONS_RUNNER_HOOK_JOB_STARTED" > /dev/null\n'
        f'  echo "$event=$?" >> {runner_dir}/jobs.log\n'
        "done\n"
    )
    creds = manager.Credentials.from_options({}, token_file=token_file(tmp_path))
    s = dataclasses.replace(
        spec(github, runner_dir), release_ref="refs/heads/main", release_repo="team/stack"
    )
    api = manager.Api(s, creds)
    try:
        manager.serve(s, api, {"PATH": os.environ["PATH"]}, turns=1, log=lambda _: None,
                      sleep=lambda _: None)  # fmt: skip
    finally:
        api.close()
    assert (runner_dir / "jobs.log").read_text().split() == [
        "unit=refs/heads/main",
        "pull_request=1",
        "workflow_dispatch=0",
    ]
    assert "--release-ref" in manager.unit_argv(s)
