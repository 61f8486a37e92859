"""Rebuild src/servegate/engine/rules/vllm-envs.txt from an installed vLLM.

python tools/make_vllm_envs.py /path/to/site-packages/vllm/envs.py 0.32.0
"""

from __future__ import annotations

import sys
from pathlib import Path

from servegate.engine.vllm_envs import SNAPSHOT, from_file

OUT = Path(__file__).resolve().parents[1] / "src/servegate/engine/rules" / SNAPSHOT


def main(envs_py: str, version: str) -> int:
    names = sorted(from_file(Path(envs_py)))
    header = f"# vLLM {version}: the keys of vllm/envs.py environment_variables"
    OUT.write_text("\n".join([header, *names]) + "\n")
    print(f"{OUT}: {len(names)} names")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(*sys.argv[1:3]))
