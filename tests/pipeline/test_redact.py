"""The redaction policy on names and values: what counts as a secret, and what a
scrubbed text still says."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from servegate.errors import StateInvalid
from servegate.pipeline import redact


@pytest.mark.parametrize(
    "name",
    ["HF_TOKEN", "OPENAI_API_KEY", "MY_APIKEY", "AWS_SECRET_ACCESS_KEY", "DB_PASSWORD",
     "GITHUB_TOKENS", "SESSION_COOKIE", "--api-key", "--hf-token", "tiny_secret_token",
     "AUTH", "GPG_PRIVATE_KEY", "VLLM_API_KEY", "VLLM_API_KEY2", "TOKEN_1", "KEY2",
     "HTTP_AUTHORIZATION", "AUTHORIZATION", "BEARER", "--bearer", "MONKEYS2"],
)  # fmt: skip
def test_secret_names(name: str) -> None:
    assert redact.is_secret(name)
    assert not redact.shown(name)


@pytest.mark.parametrize(
    "name", ["TOKENIZERS_PARALLELISM", "--tokenizer", "--tokenizer-mode", "AUTHOR", "KEYBOARD"]
)
def test_names_that_only_contain_a_secret_word(name: str) -> None:
    assert not redact.is_secret(name)


def test_tokenizers_parallelism_is_recorded_as_it_is() -> None:
    assert redact.env({"TOKENIZERS_PARALLELISM": "false"}, "salt") == {
        "TOKENIZERS_PARALLELISM": "false"
    }


def test_plain_values_are_not_scrubbed_out_of_free_text() -> None:
    found = redact.secrets_of(
        {"SOME_FLAG": "false", "RETRIES": "1234", "HF_TOKEN": "hf_realSECRET"},
        ["--api-key", "sk-live-1", "--enable-x", "true"],
    )
    assert found == {"hf_realSECRET", "sk-live-1"}
    scrub = redact.Scrubber(found, "salt")
    text = scrub.text("false alarm 5%; token hf_realSECRET and key sk-live-1 in the log")
    # in free text every secret is the same mark: where it sits says nothing of its value
    assert text == "false alarm 5%; token <redacted> and key <redacted> in the log"


def test_a_secret_that_is_a_common_word_leaves_servegates_own_fields_alone() -> None:
    """A secret equal to "released" or "main" must not turn a record's verdict or branch
    into a redaction (the record would be unreadable to recover, status and history, and
    the redaction's place would name the secret)."""
    scrub = redact.Scrubber({"released", "main"}, "salt")
    record: dict[str, Any] = {"verdict": "released", "branch": "main", "sha": "a" * 40,
              "reason": "the main server released its port",
              "stages": [{"name": "gate", "status": "ok", "detail": "main: released"}]}  # fmt: skip
    scrub.inplace(record)
    assert record["verdict"] == "released"
    assert record["branch"] == "main"
    assert record["stages"][0]["name"] == "gate"
    assert record["reason"] == "the <redacted> server <redacted> its port"
    assert record["stages"][0]["detail"] == "<redacted>: <redacted>"


def test_the_first_value_after_a_secret_flag_is_hidden_even_if_it_starts_with_a_dash() -> None:
    args = ["vllm", "--api-key", "-Zs3cr3tDASH", "--port", "8000", "--passphrase", "-x-y-z"]
    shown = redact.argv(args, "salt")
    assert "-Zs3cr3tDASH" not in shown
    assert "-x-y-z" not in shown
    assert shown[3:5] == ["--port", "8000"]
    assert {"-Zs3cr3tDASH", "-x-y-z"} <= redact.secrets_of({}, args)


def test_values_filled_from_servegate_environment_are_secret_whatever_the_name() -> None:
    env = {"VLLM_HTTP_HEADERS": "X-Team: hf_EXPANDED_LEAK", "VLLM_LOGGING_LEVEL": "INFO"}
    recorded = redact.env(env, "salt", {"VLLM_HTTP_HEADERS"})
    assert recorded["VLLM_HTTP_HEADERS"].startswith("<redacted sha256:")
    assert recorded["VLLM_LOGGING_LEVEL"] == "INFO"
    assert redact.secrets_of(env, [], {"VLLM_HTTP_HEADERS"}) == {"X-Team: hf_EXPANDED_LEAK"}


def test_credentials_inside_any_value_are_redacted() -> None:
    for raw in ("Authorization: Bearer sk-JSONAUTH1", "curl -H 'authorization: sk-JSONAUTH1'",
                "Bearer sk-JSONAUTH1", "basic sk-JSONAUTH1"):  # fmt: skip
        out = redact.text(raw, "salt")
        assert "sk-JSONAUTH1" not in out, raw
        assert "<redacted sha256:" in out, raw
    # once redacted, a second pass leaves it as it is
    once = redact.text("Authorization: Bearer sk-JSONAUTH1", "salt")
    assert redact.text(once, "salt") == once
    assert redact.env({"VLLM_HTTP_HEADERS": "Authorization: Bearer sk-1234567"}, "s")[
        "VLLM_HTTP_HEADERS"
    ].startswith("Authorization: <redacted sha256:")


def test_numeric_secrets_are_scrubbed_short_numbers_and_booleans_are_not() -> None:
    found = redact.secrets_of(
        {"PIN_TOKEN": "987654321098", "API_KEY2": "12345", "AUTH_ON": "false"}, []
    )
    assert found == {"987654321098"}
    assert "987654321098" not in redact.Scrubber(found, "s").text("token 987654321098 used")
    assert redact.env({"TOKENIZERS_PARALLELISM": "false"}, "s")["TOKENIZERS_PARALLELISM"] == (
        "false"
    )


def test_every_string_inside_a_secret_keys_json_value_is_scrubbed() -> None:
    arg = '  {"headers": {"Authorization": ["Bearer sk-JSONAUTH", {"x": "nested-secret"}]}}'
    found = redact.secrets_of({}, ["--kv-transfer-config", arg])
    assert {"Bearer sk-JSONAUTH", "nested-secret"} <= found
    recorded = " ".join(redact.argv(["--kv-transfer-config", arg], "salt"))
    assert "sk-JSONAUTH" not in recorded
    assert "nested-secret" not in recorded
    env = {"MY_CREDENTIALS": '{"user": "bob-the-user", "keys": ["k-one-1", "k-two-2"]}'}
    assert {"bob-the-user", "k-one-1", "k-two-2"} <= redact.secrets_of(env, [])


def test_secret_url_fragments_are_redacted() -> None:
    out = redact.text("https://auth.example/cb#access_token=abc123xyz&state=1", "salt")
    assert "abc123xyz" not in out
    assert "state=1" in out


def test_an_unreadable_salt_is_an_error_never_an_unsalted_hash(tmp_path: Path) -> None:
    (tmp_path / "salt").mkdir()
    with pytest.raises(StateInvalid, match="salt"):
        redact.host_salt(tmp_path)
    (tmp_path / "salt").rmdir()
    (tmp_path / "salt").write_bytes(b"\xff\xfe not text")
    with pytest.raises(StateInvalid, match="not a private file"):  # 0644: others read it
        redact.host_salt(tmp_path)
    (tmp_path / "salt").chmod(0o600)
    with pytest.raises(StateInvalid, match="not a salt") as err:
        redact.host_salt(tmp_path)
    assert err.value.hint.startswith(f"remove {tmp_path / 'salt'}")
    (tmp_path / "salt").unlink()
    made = redact.host_salt(tmp_path)
    assert len(made) == 32
    assert redact.host_salt(tmp_path) == made


# tokens by their shape, whatever the name they hide under (made up, never real)
GHP = "ghp_" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8"
HF = "hf_" + "QwErTyUiOpAsDfGhJkLzXcVbNm12345678"
AWS = "AKIA" + "IOSFODNN7EXAMPLE"
SLACK = "xoxb-" + "2048-4096-abcdefghij"
JWT = "eyJhbGciOiJIUzI1NiJ9" + ".eyJzdWIiOiIxMjM0In0" + ".c2lnbmF0dXJlLXBhcnQ"


@pytest.mark.parametrize("token", [GHP, HF, AWS, SLACK, JWT])
def test_a_token_is_redacted_by_its_shape_under_any_name(token: str) -> None:
    env = redact.env({"PYTHONWARNINGS": f"ignore,{token}", "VLLM_NOTE": token}, "salt")
    assert token not in json.dumps(env)
    assert env["VLLM_NOTE"].startswith("<redacted sha256:")
    args = redact.argv(["serve", f"--note={token}", "--comment", f"see {token}"], "salt")
    assert token not in " ".join(args)
    assert args[0] == "serve"
    scrubbed = redact.Scrubber([], "salt").text(f"error: build printed {token} and died")
    assert token not in scrubbed
    assert scrubbed.startswith("error: build printed <redacted sha256:")


def test_plain_values_that_look_a_little_like_tokens_stay() -> None:
    for plain in ("hf_transfer", "ghp_short", "VLLM_USE_V1", "/opt/venv/bin/python",
                  "eyes.on.it", "AKIA"):  # fmt: skip
        assert redact.text(plain, "salt") == plain
