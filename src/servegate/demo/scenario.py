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


IMPORTS = "import os\nimport shutil\nimport sys\nimport tempfile\nfrom pathlib import Path\n"

GRID_OLD = """  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] += a * x[i];"""
GRID_NEW = """  int stride = gridDim.x * blockDim.x;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) y[i] += a * x[i];"""


def good_first(sb: Sandbox) -> str:
    return commit(sb, f"demo stack: {sb.arch} kernels v1 and the {sb.engine} launcher")


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
    serve = sb.launcher
    return commit(
        sb,
        "launcher: load kernels from a shared cache",
        [
            (serve, "import sys\n", IMPORTS),
            (serve, '\n\nif __name__ == "__main__":', SHARED_COPY),
            (serve, "load_kernels(LIBRARY)", "load_kernels(shared_copy(LIBRARY))"),
        ],
    )


def slow_prefill(sb: Sandbox) -> str:
    """Loads its kernels from the release again and serves every answer — but slower.

    vLLM: caps the scheduler at 8 batched tokens a step "so a decode step never waits
    behind a prefill": a 2k-token prompt now takes 256 engine steps instead of one, and
    prefill is about five times slower than the live release's. ``transformers serve`` on
    a GPU: a batching step of 8,192 tokens instead of 2,048 "for throughput", a change a
    team could well make, which on one H200 prefills a 16k prompt at about 0.91x (a
    modest loss the 5 % prefill rule must catch). On a CPU: eager attention "for the
    reference implementation's numbers", which writes out every attention matrix that
    the default (SDPA) kernels never materialise. The bench gate must fail it."""
    serve = sb.launcher
    if sb.engine == "vllm":
        message = "cap batched tokens for flat decode latency"
        anchor = 'sys.argv[0] = "vllm.entrypoints.openai.api_server"'
        slower = '\n    sys.argv += ["--max-num-batched-tokens", "8"]  # decode never waits'
    elif sb.gpu:
        message = "bigger batching steps for throughput"
        anchor = 'sys.argv[1:1] = ["serve"]'
        slower = '\n    sys.argv += ["--cb-max-batch-tokens", "8192"]  # fewer, fuller steps'
    else:
        message = "eager attention, the reference implementation's numbers"
        anchor = 'sys.argv[1:1] = ["serve"]'
        slower = '\n    sys.argv += ["--attn-implementation", "eager"]  # reference numerics'
    return commit(
        sb,
        f"launcher: kernels from the release again; {message}",
        [
            (serve, IMPORTS, "import sys\n"),
            (serve, SHARED_COPY, '\n\nif __name__ == "__main__":'),
            (serve, "load_kernels(shared_copy(LIBRARY))", "load_kernels(LIBRARY)"),
            (serve, anchor, anchor + slower),
        ],
    )
