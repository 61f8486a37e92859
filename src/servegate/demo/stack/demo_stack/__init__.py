"""A tiny serving stack: a GPU kernel library plus vLLM's OpenAI server."""

KERNELS_VERSION = 1
