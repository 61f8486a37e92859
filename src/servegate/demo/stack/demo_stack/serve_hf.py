"""Load the stack's kernel library, then run Hugging Face's ``transformers serve``.

Run as ``python -m demo_stack.serve_hf MODEL <transformers serve options>`` from the
checkout.
"""

import os
import runpy
import sys

from demo_stack.serve import LIBRARY, load_kernels


if __name__ == "__main__":
    KERNELS = load_kernels(LIBRARY)
    # torch's CPU threads: as many as cores by default, which on a small box that also
    # runs the bench client (or a neighbour) are more runnable threads than cores, and
    # its parallel regions then wait on a thread that is not running
    THREADS = int(os.environ.get("DEMO_TORCH_THREADS") or 0)
    if THREADS > 0:
        import torch

        torch.set_num_threads(THREADS)
    sys.argv[1:1] = ["serve"]
    runpy.run_module("transformers.cli.transformers", run_name="__main__", alter_sys=True)
