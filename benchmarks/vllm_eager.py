"""What torch.compile costs and buys the CPU demo's vLLM: the demo's tiny model served
compiled (vLLM's default) and eager (``--enforce-eager``, the ``cpu-demo`` profile), each
from an empty compile cache, as every new release starts. For each: seconds from launch
to a healthy server, and seconds for each of a few requests of about 4,500 prompt tokens
and 512 out.

    .venv/bin/python benchmarks/vllm_eager.py --out FILE [--requests 3]

Needs the demo's vLLM environment (installed on first use, about 2 minutes).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import httpx

from servegate.demo.local_server import vllm_server


def measure(extra: list[str], requests: int) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="vllm-eager-") as d:
        caches = {"VLLM_CACHE_ROOT": f"{d}/vllm", "TORCHINDUCTOR_CACHE_DIR": f"{d}/inductor",
                  "TRITON_CACHE_DIR": f"{d}/triton"}  # fmt: skip
        started = time.monotonic()
        with vllm_server(Path(d), *extra, env_extra=caches) as server:
            ready = time.monotonic() - started
            took = []
            for _ in range(requests):
                t = time.monotonic()
                r = httpx.post(server.url + "/v1/completions", timeout=600, json={
                    "model": "demo", "prompt": "hello " * 1500, "max_tokens": 512,
                    "ignore_eos": True})  # fmt: skip
                r.raise_for_status()
                assert r.json()["usage"]["completion_tokens"] == 512
                took.append(round(time.monotonic() - t, 2))
    return {"argv_extra": extra, "start_s": round(ready, 1), "request_s": took}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--requests", type=int, default=3)
    args = p.parse_args()
    doc = {
        "command": " ".join(["benchmarks/vllm_eager.py", *sys.argv[1:]]),
        "cpus": os.cpu_count(),
        "compiled": measure([], args.requests),
        "eager": measure(["--enforce-eager"], args.requests),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps(doc))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
