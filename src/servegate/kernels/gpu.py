"""Is there a GPU on this machine? (NVIDIA through nvidia-smi, AMD through rocminfo.)"""

from __future__ import annotations

import shutil

from servegate.pipeline import proc


def detect() -> str:
    """A one-line description of the GPUs here, or "" when there is none."""
    if shutil.which("nvidia-smi"):
        out = proc.run(["nvidia-smi", "-L"], check=False, timeout=30)
        if out.ok and "GPU" in out.output:
            return out.output.strip().splitlines()[0]
    if shutil.which("rocminfo"):
        out = proc.run(["rocminfo"], check=False, timeout=30)
        names = sorted({w for w in out.output.split() if w.startswith("gfx")})
        if out.ok and names:
            return "AMD GPU " + ", ".join(names)
    return ""
