"""Load the stack's kernel library, then run vLLM's OpenAI-compatible server.

Run as ``python -m demo_stack.serve <vllm api_server arguments>`` from the checkout.
"""

import ctypes
import runpy
import sys
from pathlib import Path

import demo_stack

LIBRARY = Path(__file__).resolve().parent.parent / "build" / "libdemo_kernels.so"


def load_kernels(path: Path) -> ctypes.CDLL:
    lib = ctypes.CDLL(str(path))
    version = lib.demo_kernels_version()
    if version != demo_stack.KERNELS_VERSION:
        raise SystemExit(f"{path} is kernels version {version}, expected {demo_stack.KERNELS_VERSION}")
    print(f"demo_stack: loaded {path} (kernels version {version})", flush=True)
    return lib


if __name__ == "__main__":
    KERNELS = load_kernels(LIBRARY)
    sys.argv[0] = "vllm.entrypoints.openai.api_server"
    runpy.run_module("vllm.entrypoints.openai.api_server", run_name="__main__", alter_sys=True)
