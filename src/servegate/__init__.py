"""servegate: deploy an exact Git SHA of a serving stack, prove the live process runs it,
gate it, and roll back by itself when any of that fails."""

__version__ = "0.1.0"
