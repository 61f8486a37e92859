"""AMD GPUs through ``amd-smi`` (ROCm 6+): filled in below."""

from __future__ import annotations

from servegate.gpu.health import Runner, Snapshot, ToolFailed

TOOL = "amd-smi"


def read(snap: Snapshot, run: Runner, timeout: float) -> None:
    raise ToolFailed("amd-smi is not read yet")
