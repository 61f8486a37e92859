"""A real vLLM (CPU) server with the demo's tiny model: for the bench tests and benchmarks."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import httpx

from servegate.demo import vllm_env
from servegate.pipeline.stages import QuietReporter


@dataclass(frozen=True)
class Server:
    url: str
    log: Path
    port: int


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextmanager
def vllm_server(
    workdir: Path, *extra: str, home: Path | None = None, env_extra: dict[str, str] | None = None
) -> Iterator[Server]:
    """Make the tiny model under ``workdir`` (once) and serve it until the block ends."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("XDG_")}
    if home is not None:
        env["HOME"] = str(home)  # where the vLLM venv and its compile cache live
    python = vllm_env.ensure(env, QuietReporter())
    model = workdir / "model"
    if not model.exists():
        maker = resources.files("servegate.demo") / "make_model.py"
        subprocess.run([str(python), "-c", maker.read_text(), str(model)], check=True,
                       env=env, capture_output=True, timeout=600)  # fmt: skip
    port = free_port()
    log = workdir / f"vllm-{port}.log"
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", VLLM_CPU_KVCACHE_SPACE="1",
               TOKENIZERS_PARALLELISM="false", **(env_extra or {}))  # fmt: skip
    argv = [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
            "--served-model-name", "demo", "--host", "127.0.0.1", "--port", str(port),
            "--max-model-len", "10240", "--gpu-memory-utilization", "0.3",
            "--dtype", "float32", *extra]  # fmt: skip
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 600
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"vLLM exited {proc.returncode}: {log.read_text()[-3000:]}")
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("vLLM did not become healthy in 600 s")
            time.sleep(1)
        yield Server(url, log, port)
    finally:
        os.killpg(proc.pid, 15)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()
