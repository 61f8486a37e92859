"""Nothing leaked: secrets in the service's environment and command line never reach a
record, ``--json``, the notes pushed to origin or a world-readable file — and provenance
still proves the live process got the same values."""

from __future__ import annotations

import json
import os
import stat
import time
from collections.abc import Iterator
from pathlib import Path

import git
import pytest

from servegate import config as config_mod
from servegate import envfile
from servegate.cli import main, release_main
from servegate.engine.managers.supervisor import Supervisor
from servegate.errors import ConfigError
from tests.conftest import Stack, config_text, free_port

SECRETS = ("hunter2", "sk-live-123", "hf_abcdefSECRET", "pa55w0rd", "sk-second-456",
           "sk-under-789", "hf_json_SECRET", "redis_SECRET", "qs_SECRET")  # fmt: skip


def hostile_config(tmp_path: Path, stack: Stack) -> Path:
    text = config_text(stack, tmp_path / "host", free_port())
    text = text.replace(
        '"--port", "{port}"]',
        '"--port", "{port}", "--api-key", "sk-live-123", "sk-second-456", "--api_key", '
        '"sk-under-789", "--hf-overrides", \'{"hf_token": "hf_json_SECRET"}\']',
    )
    text = text.replace(
        'TINY_SECRET_TOKEN = "hunter2"',
        'TINY_SECRET_TOKEN = "hunter2"\nHF_TOKEN = "${HF_TOKEN}"\n'
        'VLLM_REMOTE_URL = "https://user:pa55w0rd@mirror.invalid/models"\n'
        'VLLM_KV_STORE = "redis://:redis_SECRET@cache.invalid:6379/0"\n'
        'VLLM_MODEL_URL = "https://hub.invalid/m?token=qs_SECRET&rev=main"',
    )
    text = text.replace(
        'env = ["PYTHONPATH"]', 'env = ["PYTHONPATH", "HF_TOKEN", "TINY_SECRET_TOKEN"]'
    )
    path = tmp_path / "servegate.toml"
    path.write_text(text)
    return path


@pytest.fixture
def hostile(tmp_path: Path, stack: Stack, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The hostile config, HF_TOKEN set in servegate's environment; the daemon stopped after."""
    monkeypatch.setenv("HF_TOKEN", "hf_abcdefSECRET")
    path = hostile_config(tmp_path, stack)
    yield path
    Supervisor(config_mod.load(path, {})).shutdown_daemon()


def leaks(text: str) -> list[str]:
    return [s for s in SECRETS if s in text]


def test_secrets_stay_out_of_records_json_notes_and_readable_files(
    hostile: Path,
    stack: Stack,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = hostile
    cfg = config_mod.load(path, {})
    assert "hf_abcdefSECRET" not in path.read_text()  # the config holds only ${HF_TOKEN}
    first = stack.commit()
    assert release_main(["promote", first, "--config", str(path), "--json"]) == 0
    out = capsys.readouterr().out
    assert leaks(out) == []
    record = json.loads(out)["result"]["record"]
    assert record["provenance"]["ok"]  # the live process got the very values
    launch_env = record["launch"]["env"]
    assert launch_env["HF_TOKEN"].startswith("<redacted sha256:")
    assert launch_env["PYTHONPATH"] == str(cfg.host_root / "releases" / first)  # allowlisted
    assert launch_env["VLLM_REMOTE_URL"].startswith("https://user:<redacted sha256:")
    assert launch_env["VLLM_MODEL_URL"].endswith("&rev=main")  # the rest stays readable
    assert "--api-key" in record["launch"]["argv"]
    # a second release: the same value shows the same hash, never the value
    second = stack.commit(message="again")
    assert release_main(["promote", second, "--config", str(path), "--json"]) == 0
    again = json.loads(capsys.readouterr().out)["result"]["record"]
    assert again["launch"]["env"]["HF_TOKEN"] == launch_env["HF_TOKEN"]
    assert release_main(["verify", "--config", str(path), "--json"]) == 0
    assert leaks(capsys.readouterr().out) == []
    # a release that prints its own arguments and environment, then dies: the log
    # tail in the failure, the record and the note is scrubbed of every secret value
    loud = stack.commit("print-args-exit")
    assert release_main(["promote", loud, "--config", str(path), "--json"]) == 7
    failed = capsys.readouterr()
    assert leaks(failed.out + failed.err) == []
    assert "non-default args" in json.loads(failed.out)["result"]["record"]["reason"]
    # what went to origin
    origin = git.Repo(stack.origin)
    for sha in (first, second, loud):
        assert leaks(origin.git.notes("--ref", "refs/notes/servegate", "show", sha)) == []
    origin.close()
    # every file servegate keeps on the host: either clean, or readable by its owner only
    for f in cfg.host_root.rglob("*"):
        if not f.is_file() or f.is_symlink() or "releases" in f.parts:
            continue
        found = leaks(f.read_text(errors="replace"))
        if found:
            mode = stat.S_IMODE(f.stat().st_mode)
            assert mode & 0o077 == 0, f"{f} holds {found} and is {oct(mode)}"


def test_an_unset_secret_reference_stops_before_the_live_service_is_touched(
    hostile: Path,
    stack: Stack,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = hostile
    cfg = config_mod.load(path, {})
    good = stack.commit()
    assert release_main(["promote", good, "--config", str(path)]) == 0
    monkeypatch.delenv("HF_TOKEN")
    nxt = stack.commit(message="next")
    capsys.readouterr()
    assert release_main(["promote", nxt, "--config", str(path), "--json"]) == 2
    doc = json.loads(capsys.readouterr().out)
    assert "refers to ${HF_TOKEN}, which is not set" in doc["error"]["message"]
    monkeypatch.setenv("HF_TOKEN", "hf_abcdefSECRET")  # verify compares with the value
    assert release_main(["verify", "--config", str(path)]) == 0  # still the good one
    state = json.loads((cfg.host_root / "state.json").read_text())
    assert state["current"]["sha"] == good


def test_a_secret_from_the_env_file_reaches_the_service_and_no_record(
    hostile: Path,
    stack: Stack,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``service.env_file``: the secret lives in a 0600 file on the box, neither in
    servegate.toml nor in servegate's environment; the live process gets it (provenance
    compares the values), no record shows it. A file others may read is refused before
    the live service is touched."""
    monkeypatch.delenv("HF_TOKEN")
    secrets = tmp_path / "secrets.env"
    secrets.write_text("# the box's secrets\nexport HF_TOKEN='hf_abcdefSECRET'\n")
    secrets.chmod(0o600)
    text = hostile.read_text().replace(
        "[service.env]", f'env_file = "{secrets}"\n\n[service.env]', 1
    )
    hostile.write_text(text)
    cfg = config_mod.load(hostile, {})
    first = stack.commit()
    assert release_main(["promote", first, "--config", str(hostile), "--json"]) == 0
    out = capsys.readouterr().out
    assert leaks(out) == []
    record = json.loads(out)["result"]["record"]
    assert record["provenance"]["ok"]  # HF_TOKEN is a checked variable: the live value matched
    assert record["launch"]["env"]["HF_TOKEN"].startswith("<redacted sha256:")
    # a neighbour could read it: refused, exit 2, the release that serves stays
    secrets.chmod(0o644)
    nxt = stack.commit(message="next")
    assert release_main(["promote", nxt, "--config", str(hostile), "--json"]) == 2
    doc = json.loads(capsys.readouterr().out)
    assert "readable or writable by others" in doc["error"]["message"]
    assert "chmod 600" in doc["error"]["hint"]
    # a link to the file is refused too (it could be swapped for another user's file)
    secrets.chmod(0o600)
    link = tmp_path / "link.env"
    link.symlink_to(secrets)
    hostile.write_text(text.replace(f'env_file = "{secrets}"', f'env_file = "{link}"'))
    assert release_main(["promote", nxt, "--config", str(hostile)]) == 2
    assert "symbolic link is refused" in capsys.readouterr().err
    hostile.write_text(text)
    state = json.loads((cfg.host_root / "state.json").read_text())
    assert state["current"]["sha"] == first
    assert release_main(["verify", "--config", str(hostile)]) == 0


def test_env_file_format_is_read_exactly_or_refused() -> None:
    text = "A=1\n\n# c\nexport B=x\nC=\"a b#c\"\nD='$x'\nE=\n"
    assert envfile.parse(text) == {"A": "1", "B": "x", "C": "a b#c", "D": "$x", "E": ""}
    for bad in ("A", "1A=x", "A B=x", "A='x", 'A=x"', "A=\"x'"):
        with pytest.raises(ConfigError, match=":1:"):
            envfile.parse(bad)


AUDIT_SECRETS = ("-Zs3cr3tDASH", "hf_EXPANDED_LEAK", "sk-ALLOWLEAK", "sk-JSONAUTH",
                 "987654321098", "hunter2")  # fmt: skip


def test_secrets_shaped_to_slip_past_the_names_stay_out_of_notes_json_and_stderr(
    tmp_path: Path,
    stack: Stack,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A secret option value starting with '-', a numeric token, a bearer token inside a
    JSON header, a value filled from ``${NAME}`` under an allowlisted name, a key name
    ending in a digit: none reaches origin's notes, --json, the progress lines or a
    build failure's log tail."""
    monkeypatch.setenv("MY_API_TOKEN", "hf_EXPANDED_LEAK")
    text = config_text(stack, tmp_path / "host", free_port())
    text = text.replace(
        '"--port", "{port}"]',
        '"--port", "{port}", "--api-key", "-Zs3cr3tDASH", "--token", "987654321098", '
        '"--kv-transfer-config", \'{"headers": {"Authorization": "Bearer sk-JSONAUTH"}}\']',
    )
    text = text.replace(
        'TINY_SECRET_TOKEN = "hunter2"',
        'TINY_SECRET_TOKEN = "hunter2"\nTOKENIZERS_PARALLELISM = "false"\n'
        'VLLM_HTTP_HEADERS = "Authorization: Bearer ${MY_API_TOKEN}"\n'
        'VLLM_API_KEY2 = "sk-ALLOWLEAK"',
    ).replace("startup_timeout = 8", "startup_timeout = 14")
    path = tmp_path / "servegate.toml"
    path.write_text(text)
    server = stack.work / "tinystack" / "server.py"
    server.write_text(
        server.read_text().replace(
            'print("tiny: warming up slowly", flush=True)',
            'print(f"tiny: warming up slowly, args {sys.argv[1:]}", flush=True)',
        )
    )
    build = stack.work / "build.sh"
    build.write_text(
        build.read_text().replace(
            "set -euo pipefail", 'set -euo pipefail\nset -x\n: "download --token $MY_API_TOKEN"'
        )
    )

    def found(text: str) -> list[str]:
        return [s for s in AUDIT_SECRETS if s in text]

    try:
        first = stack.commit()
        assert release_main(["promote", first, "--config", str(path), "--json"]) == 0
        out = capsys.readouterr().out
        assert found(out) == []
        env = json.loads(out)["result"]["record"]["launch"]["env"]
        assert env["TOKENIZERS_PARALLELISM"] == "false"  # not a secret: shown as it is
        assert env["VLLM_HTTP_HEADERS"].startswith("<redacted sha256:")
        assert (
            found(git.Git(stack.origin).notes("--ref", "refs/notes/servegate", "show", first)) == []
        )

        dies = stack.commit("print-args-exit")
        assert release_main(["promote", dies, "--config", str(path), "--json"]) == 7
        io = capsys.readouterr()
        assert found(io.out + io.err) == []
        assert (
            found(git.Git(stack.origin).notes("--ref", "refs/notes/servegate", "show", dies)) == []
        )

        broken = stack.commit("build-fail")
        assert release_main(["promote", broken, "--config", str(path)]) == 5
        io = capsys.readouterr()
        assert "download --token" in io.err  # the log tail is shown, the token is not
        assert found(io.out + io.err) == []

        slow = stack.commit("slow-start")  # human mode: a progress line every 10 s
        assert release_main(["promote", slow, "--config", str(path)]) == 7
        io = capsys.readouterr()
        assert "warming up slowly" in io.err
        assert found(io.out + io.err) == []
    finally:
        Supervisor(config_mod.load(path, {})).shutdown_daemon()


def test_an_env_file_that_is_a_fifo_is_refused_at_once(tmp_path: Path) -> None:
    fifo = tmp_path / "secrets.env"
    os.mkfifo(fifo, 0o600)
    started = time.monotonic()
    with pytest.raises(ConfigError, match="not a regular file"):
        envfile.load(fifo)
    assert time.monotonic() - started < 5  # never waits for a writer


def test_an_api_key_a_header_cannot_carry_is_named_never_printed(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("K", "sk-sécret-1234")
    argv = ["bench", "compare", "--a-url", "http://127.0.0.1:9", "--b-url", "http://127.0.0.1:9",
            "--api-key-env", "K", "--no-lease"]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "cannot carry" in err
    assert "sécret" not in err
    # a server that is not there is a bench failure with its address, not a traceback
    monkeypatch.setenv("K", "sk-plain-1234")
    assert main(argv) == 13
    err = capsys.readouterr().err
    assert "does not answer /v1/models (ConnectError" in err
    assert "sk-plain-1234" not in err


def test_an_env_file_with_line_separators_other_tools_split_differently_is_refused() -> None:
    for odd in ("A=1\r\nB=2\n", "A=x\u2028B=y\n", "A=x\x1cB=y\n"):
        with pytest.raises(ConfigError, match="line-separator"):
            envfile.parse(odd)
