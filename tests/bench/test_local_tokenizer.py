"""Sizing prompts for a server without ``/tokenize`` (``transformers serve``) with the
model's own tokenizer files, read by the serving environment's Python."""

from __future__ import annotations

import subprocess
from importlib import resources
from pathlib import Path

import pytest

from servegate.bench import cases, runner, sizing
from servegate.demo import vllm_env
from servegate.engine import adapters
from servegate.engine.openai import Endpoint
from servegate.errors import BenchFailed
from tests.bench.test_stream_faults import Engine, engine  # noqa: F401  (the fixture)
from tests.conftest import REAL_HOME

PYTHON = vllm_env.venv_dir({"XDG_CACHE_HOME": str(REAL_HOME / ".cache")}) / "bin" / "python"


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo's tiny model (a BPE tokenizer trained here, a chat template)."""
    if not PYTHON.exists():
        pytest.skip(f"the demo's vLLM environment (transformers) is not installed ({PYTHON})")
    out = tmp_path_factory.mktemp("model")
    maker = resources.files("servegate.demo") / "make_model.py"
    subprocess.run([str(PYTHON), "-c", maker.read_text(), str(out)], check=True,
                   capture_output=True, timeout=600)  # fmt: skip
    return out


def test_prompts_are_sized_with_the_models_tokenizer_files(
    engine: tuple[str, type[Engine]],  # noqa: F811
    model: Path,
    tmp_path: Path,
) -> None:
    url, _ = engine
    spec = cases.Spec(Endpoint(url, engine=adapters.TRANSFORMERS), "m",
                      cases.parse_cases(["regular", "coding"], ["1k"], [1]), warmup=False,
                      tokenizer=str(model), tokenizer_python=str(PYTHON))  # fmt: skip
    bench = runner.Bench(spec, tmp_path / "r.json", environ={"XDG_CACHE_HOME": str(tmp_path)})
    bench.prepare()
    assert bench.result["engine"]["tokenizer_source"] == f"tokenizer files {model}"
    local = sizing.LocalTokenizer(model, str(PYTHON))
    try:
        for key in ("regular-1k", "coding-1k"):
            sized = bench.result["sizing"][key]
            assert sized["method"] == "tokenizer files"
            # the tier for this tokenizer, to the line the prompt is cut at (well inside
            # the trial's 2 % tolerance)
            assert abs(sized["tokens"] - 1024) <= 10, sized
            # what the trial will send, counted again by the tokenizer: the sized count
            profile = key.split("-")[0]
            messages = bench._sizing_messages(profile, bench.prompts[key])
            assert local.tokenize(messages)["count"] == sized["tokens"]
    finally:
        local.close()


def test_unreadable_tokenizer_files_are_a_clear_failure(tmp_path: Path) -> None:
    if not PYTHON.exists():
        pytest.skip(f"the demo's vLLM environment (transformers) is not installed ({PYTHON})")
    with pytest.raises(BenchFailed, match="could not be read") as caught:
        sizing.LocalTokenizer(tmp_path / "no-model", str(PYTHON))
    assert "--tokenizer-python" in (caught.value.hint or "")
    with pytest.raises(BenchFailed, match="cannot start"):
        sizing.LocalTokenizer(tmp_path, str(tmp_path / "no-python"))
