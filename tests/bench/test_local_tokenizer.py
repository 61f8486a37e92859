"""Sizing prompts for a server without ``/tokenize`` (``transformers serve``) with the
model's own tokenizer files, read by the serving environment's Python."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from importlib import resources
from pathlib import Path
from typing import Any

import pytest

from servegate.bench import cases, driver, fixtures, sizing
from servegate.demo import vllm_env
from servegate.engine import adapters
from servegate.engine.openai import Endpoint
from servegate.errors import BenchFailed
from tests.bench.test_stream_faults import (  # noqa: F401  (the fixture)
    GATE_CONFIG,
    WORDS,
    Engine,
    engine,
)
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
    bench = driver.Bench(spec, tmp_path / "r.json", environ={"XDG_CACHE_HOME": str(tmp_path)})
    bench.prepare()
    assert bench.result["engine"]["tokenizer_source"] == f"tokenizer files {model}"
    helper = bench._tokenizer.local if bench._tokenizer else None
    assert helper is not None
    assert helper.proc.poll() is None  # kept to count the answers
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
        bench.release()
    assert helper.proc.poll() is not None  # released: no helper left behind


def test_usage_is_checked_against_the_answer_counted_by_the_tokenizer_files(
    engine: tuple[str, type[Engine]],  # noqa: F811
    model: Path,
    tmp_path: Path,
) -> None:
    """``transformers serve`` has no /tokenize: the model's own tokenizer files count the
    streamed text again, and a usage that claims 1.6x the tokens (a decode rate 1.6x too
    fast) makes the trial invalid; the honest count does not."""
    url, handler = engine
    spec = cases.Spec(Endpoint(url, engine=adapters.TRANSFORMERS), "m",
                      cases.parse_cases(["regular"], ["1k"], [1]), warmup=False, max_tokens=40,
                      tokenizer=str(model), tokenizer_python=str(PYTHON))  # fmt: skip
    local = sizing.LocalTokenizer(model, str(PYTHON))
    try:
        streamed = "".join(WORDS[i % len(WORDS)] + " " for i in range(40))
        truth = local.count_text(streamed)
    finally:
        local.close()
    seen = {}
    for claim in (None, int(truth * 1.6)):
        handler.claim = claim
        bench = driver.Bench(replace(spec, max_tokens=claim or 40), tmp_path / "r.json",
                             environ={"XDG_CACHE_HOME": str(tmp_path)})  # fmt: skip
        bench.prepare()
        try:
            (trial,) = bench.measure(spec.cases[0], 1)["groups"][0]["trials"]
        finally:
            bench.finish()
        assert trial["recounted_tokens"] == truth
        seen[claim] = trial
    honest, lying = seen[None], seen[int(truth * 1.6)]
    assert "usage_exceeds_stream" not in honest["invalid_reasons"]
    assert "usage_exceeds_stream" in lying["invalid_reasons"]
    assert f"tokenizer files {model}" in lying["reason_details"]["usage_exceeds_stream"]


def test_unreadable_tokenizer_files_are_a_clear_failure(tmp_path: Path) -> None:
    if not PYTHON.exists():
        pytest.skip(f"the demo's vLLM environment (transformers) is not installed ({PYTHON})")
    with pytest.raises(BenchFailed, match="could not be read") as caught:
        sizing.LocalTokenizer(tmp_path / "no-model", str(PYTHON))
    assert "--tokenizer-python" in (caught.value.hint or "")
    with pytest.raises(BenchFailed, match="cannot start"):
        sizing.LocalTokenizer(tmp_path, str(tmp_path / "no-python"))


def test_the_tokenizer_helper_runs_no_module_from_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``python -c`` puts its working directory first on sys.path: servegate run from a
    checkout that holds a ``transformers/`` package (or a ``json.py``) must not run it.
    The helper takes its working directory off its module path first."""
    checkout = tmp_path / "checkout"
    marker = tmp_path / "ran"
    for name in ("transformers/__init__.py", "json.py"):
        module = checkout / name
        module.parent.mkdir(parents=True, exist_ok=True)
        module.write_text(f"open({str(marker)!r}, 'a').write({name!r})\nraise SystemExit(3)\n")
    (tmp_path / "model").mkdir()
    monkeypatch.chdir(checkout)
    python = str(PYTHON) if PYTHON.exists() else sys.executable
    with contextlib.suppress(BenchFailed):  # no tokenizer files there: what ran matters
        sizing.LocalTokenizer(Path("../model"), python).close()
    assert not marker.exists(), marker.read_text()


class _Counter:
    """A tokenizer stand-in: characters per token, the same fingerprint for any ratio
    (as a changed tokenizer whose short probe still tokenizes the same)."""

    def __init__(self, chars_per_token: float) -> None:
        self.ratio = chars_per_token
        self.fingerprint = "same-probe"
        self.available = True
        self.local = None

    def tokenize(
        self, endpoint: Endpoint, model: str, messages: list[dict[str, Any]]
    ) -> dict[str, Any]:
        text = "".join(str(m["content"]) for m in messages)
        return {"count": int(len(text) / self.ratio)}


def test_a_cached_size_is_counted_again_and_redone_when_the_tokenizer_changed(
    tmp_path: Path,
) -> None:
    fixture = fixtures.load("regular")
    environ = {"XDG_CACHE_HOME": str(tmp_path)}
    ep = Endpoint("http://127.0.0.1:9", engine=adapters.TRANSFORMERS)

    def messages(text: str) -> list[dict[str, Any]]:
        return [{"role": "user", "content": text}]

    def sized(counter: _Counter) -> sizing.Sized:
        return sizing.size(ep, "m", counter, fixture, 4096, messages, environ)  # type: ignore[arg-type]

    first = sized(_Counter(4.0))
    assert first.method == "tokenize"
    assert abs((first.tokens or 0) - 4096) <= 8
    again = sized(_Counter(4.0))  # unchanged: the cache, counted once more
    assert (again.method, again.chars, again.tokens) == ("cache", first.chars, first.tokens)
    changed = sized(_Counter(3.0))  # the same probe, another tokenizer: sized anew
    assert changed.method == "tokenize"
    assert changed.chars != first.chars
    assert abs((changed.tokens or 0) - 4096) <= 8


def _helpers() -> set[int]:
    """The tokenizer helpers this test process has up now (their pids)."""
    found = set()
    for proc in Path("/proc").iterdir():
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            parent = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if parent == os.getpid() and b"-c" in argv and sizing._LOCAL.encode() in argv:
            found.add(int(proc.name))
    return found


def test_a_bench_killed_outright_leaves_no_helper_and_nothing_on_disk(
    model: Path, tmp_path: Path
) -> None:
    """SIGKILL gives the bench no chance to clean up: the helper must end by itself (its
    stdin closes with the bench) and must have made nothing on disk to leave behind."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    script = (
        "import os, signal, sys\n"
        "from pathlib import Path\n"
        "from servegate.bench import sizing\n"
        f"helper = sizing.LocalTokenizer(Path({str(model)!r}), {str(PYTHON)!r})\n"
        "print(helper.proc.pid, flush=True)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=120, env={**os.environ, "TMPDIR": str(tmp)})  # fmt: skip
    assert run.returncode == -signal.SIGKILL, run.stderr[-2000:]
    helper = int(run.stdout.split()[0])
    deadline = time.monotonic() + 30
    while Path(f"/proc/{helper}").exists() and time.monotonic() < deadline:
        if (Path(f"/proc/{helper}") / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
            break  # ended; a zombie until its new parent reaps it
        time.sleep(0.1)
    stat = Path(f"/proc/{helper}/stat")
    assert not stat.exists() or stat.read_text().rsplit(")", 1)[1].split()[0] == "Z"
    # torch, imported by transformers, keeps its compile cache there for every run
    assert [p.name for p in tmp.iterdir() if not p.name.startswith("torchinductor_")] == []


def test_the_gate_leaves_no_tokenizer_helper_whatever_stops_it(
    engine: tuple[str, type[Engine]],  # noqa: F811
    model: Path,
    tmp_path: Path,
) -> None:
    """The helper stays up through a bench run to count every answer; an error that is
    not the bench's own (here: the reporter raising while a trial is shown) still takes
    it down when the gate returns."""
    from servegate import config
    from servegate.pipeline.stages import QuietReporter
    from servegate.release import bench_gate

    class Boom(QuietReporter):
        def note(self, message: str) -> None:
            if "regular-1k #1" in message:  # a measured trial shown: the helper is up
                assert _helpers() - before
                raise RuntimeError("the terminal went away")

    url, _ = engine
    files = f'[bench]\ntokenizer = "{model}"\ntokenizer_python = "{PYTHON}"\n'
    text = GATE_CONFIG.format(root=tmp_path).replace("[bench]\n", files)
    cfg = config.parse(text, environ={"XDG_CACHE_HOME": str(tmp_path)})
    before = _helpers()
    with pytest.raises(RuntimeError, match="terminal went away"):
        bench_gate.run(cfg, Endpoint(url, engine=adapters.TRANSFORMERS), "m", "b" * 40, None,
                       None, Boom(), {"XDG_CACHE_HOME": str(tmp_path)},
                       first_release=True)  # fmt: skip
    assert _helpers() == before


def test_a_helper_that_prints_something_else_is_a_clear_failure(tmp_path: Path) -> None:
    """A Python whose startup prints a line on stdout (a wrapper's banner) would shift
    every count by one answer: it is refused, and the helper is stopped."""
    noisy = tmp_path / "python"
    noisy.write_text("#!/bin/sh\necho 'welcome to the cluster'\ncat > /dev/null\n")
    noisy.chmod(0o755)
    before = _helpers()
    with pytest.raises(BenchFailed, match="printed 'welcome to the cluster"):
        sizing.LocalTokenizer(tmp_path, str(noisy))
    assert _helpers() == before
