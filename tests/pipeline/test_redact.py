"""The redaction policy on names and values: what counts as a secret, and what a
scrubbed text still says."""

from __future__ import annotations

import pytest

from servegate.pipeline import redact


@pytest.mark.parametrize(
    "name",
    ["HF_TOKEN", "OPENAI_API_KEY", "MY_APIKEY", "AWS_SECRET_ACCESS_KEY", "DB_PASSWORD",
     "GITHUB_TOKENS", "SESSION_COOKIE", "--api-key", "--hf-token", "tiny_secret_token",
     "AUTH", "GPG_PRIVATE_KEY", "VLLM_API_KEY"],
)  # fmt: skip
def test_secret_names(name: str) -> None:
    assert redact.is_secret(name)
    assert not redact.shown(name)


@pytest.mark.parametrize(
    "name", ["TOKENIZERS_PARALLELISM", "--tokenizer", "--tokenizer-mode", "AUTHOR", "MONKEYS2"]
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
    assert text.startswith("false alarm 5%; token <redacted sha256:")
    assert "hf_realSECRET" not in text
    assert "sk-live-1" not in text
