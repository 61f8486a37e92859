"""Load the stack's kernel library, then run Hugging Face's ``transformers serve``.

Run as ``python -m demo_stack.serve_hf MODEL <transformers serve options>`` from the
checkout.
"""

import runpy
import sys

from demo_stack.serve import LIBRARY, load_kernels


if __name__ == "__main__":
    KERNELS = load_kernels(LIBRARY)
    sys.argv[1:1] = ["serve"]
    runpy.run_module("transformers.cli.transformers", run_name="__main__", alter_sys=True)
