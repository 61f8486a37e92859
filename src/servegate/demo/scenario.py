"""The demo's commits: two good ones, one that fails provenance, one that fails the gate."""

from __future__ import annotations

from servegate.demo.sandbox import Sandbox, commit

SHARED_COPY = '''

def shared_copy(path: Path) -> Path:
    """One copy of the kernels for every checkout on the box, to skip rebuilds."""
    cache = Path(tempfile.gettempdir()) / "demo_stack-kernels"
    cache.mkdir(exist_ok=True)
    tmp = cache / f".{path.name}.{os.getpid()}"
    shutil.copy2(path, tmp)
    os.replace(tmp, cache / path.name)
    return cache / path.name


if __name__ == "__main__":'''


GRID_OLD = """  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] += a * x[i];"""
GRID_NEW = """  int stride = gridDim.x * blockDim.x;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) y[i] += a * x[i];"""


def good_first(sb: Sandbox) -> str:
    return commit(sb, "demo stack: gfx1030 kernels v1 and the vLLM launcher")


def good_second(sb: Sandbox) -> str:
    return commit(
        sb,
        "kernels v2: grid-stride scale_add",
        [
            ("demo_stack/__init__.py", "KERNELS_VERSION = 1", "KERNELS_VERSION = 2"),
            ("kernels/version.h", "DEMO_KERNELS_VERSION 1", "DEMO_KERNELS_VERSION 2"),
            ("kernels/demo_kernels.hip", GRID_OLD, GRID_NEW),
        ],
    )


def bad_shared_kernels(sb: Sandbox) -> str:
    """Healthy and answering — but it maps a copy of its kernels from outside the release,
    the way a stale extension reaches a live service. Provenance must catch it."""
    serve = "demo_stack/serve.py"
    return commit(
        sb,
        "launcher: load kernels from a shared cache",
        [
            (serve, "import sys\n", "import os\nimport shutil\nimport sys\nimport tempfile\n"),
            (serve, '\n\nif __name__ == "__main__":', SHARED_COPY),
            (serve, "load_kernels(LIBRARY)", "load_kernels(shared_copy(LIBRARY))"),
        ],
    )


def slow_prefill(sb: Sandbox) -> str:
    """Loads its kernels from the release again and serves every answer — but caps the
    scheduler at 8 batched tokens a step "so a decode step never waits behind a prefill":
    a 2k-token prompt now takes 256 engine steps instead of one, and prefill is about five
    times slower than the live release's. The bench gate must fail it."""
    serve = "demo_stack/serve.py"
    return commit(
        sb,
        "launcher: kernels from the release again; cap batched tokens for flat decode latency",
        [
            (serve, "import os\nimport shutil\nimport sys\nimport tempfile\n", "import sys\n"),
            (serve, SHARED_COPY, '\n\nif __name__ == "__main__":'),
            (serve, "load_kernels(shared_copy(LIBRARY))", "load_kernels(LIBRARY)"),
            (
                serve,
                'sys.argv[0] = "vllm.entrypoints.openai.api_server"',
                'sys.argv[0] = "vllm.entrypoints.openai.api_server"\n'
                '    sys.argv += ["--max-num-batched-tokens", "8"]  # decode never waits',
            ),
        ],
    )
