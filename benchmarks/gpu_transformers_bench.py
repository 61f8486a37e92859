"""The mission's long tiers on a real GPU server: ``servegate bench`` against
``transformers serve`` on one GPU.

    python3 benchmarks/gpu_transformers_bench.py --out DIR [--tiers 16k,128k]
        [--profiles regular,coding] [--repetitions 2] [--max-tokens 256]
        [--serve "OPTIONS"] [--load-rates 1,4,16 [--load-only] ...]

Run on a machine with a CUDA GPU and a Python that has torch, transformers and the
``transformers serve`` extras (fastapi, uvicorn, openai); servegate on ``PYTHONPATH``.
It makes a random-weight Llama here (vocab 4096, hidden 512, 8 layers, 140,000
positions, a BPE tokenizer trained on local text, no end-of-sequence token so every
answer is exactly ``--max-tokens`` long), serves it in bfloat16 with ``transformers
serve``, and measures it with ``servegate bench --engine transformers``: prompts sized
with the model's own tokenizer files (the server has no ``/tokenize``), every trial
checked for validity. Writes ``result.json`` (the bench's result file), ``bench.json``
(its ``--json`` answer), ``server.log`` and ``nvidia-smi.txt`` into ``--out`` and prints
the per-case table. ``--serve`` adds options to ``transformers serve`` (the quiet
continuous-batching server of ``gpu_gate_power.py``: ``--serve "--continuous-batching
--cb-use-cuda-graph --cb-block-size 256 --cb-num-blocks 256 --cb-max-batch-tokens
2048"``); ``--load-only`` runs only the load sweep (``load.json``, ``load.txt``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from importlib import resources
from pathlib import Path

import httpx


def gpu_names() -> str:
    """The GPUs as nvidia-smi names them, counted: "1x NVIDIA H100 80GB HBM3"."""
    out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                         capture_output=True, text=True, check=True).stdout.split("\n")  # fmt: skip
    names = [n.strip() for n in out if n.strip()]
    return ", ".join(f"{names.count(n)}x {n}" for n in dict.fromkeys(names)) or "no GPU"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serve_command(model: Path, port: int, extra: list[str] | None = None) -> list[str]:
    exe = shutil.which("transformers")
    head = [exe] if exe else [sys.executable, "-m", "transformers.cli.transformers"]
    return [
        *head,
        "serve",
        str(model),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--dtype",
        "bfloat16",
        "--device",
        "cuda:0",
        *(extra or []),
    ]


def wait_up(url: str, proc: subprocess.Popen[bytes], timeout: float) -> None:
    """Until /health answers 200 (pinned to a local path, the model is that path: its
    /v1/models lists only the download cache)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"transformers serve exited with {proc.returncode}")
        try:
            if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(2)
    raise SystemExit(f"transformers serve was not up within {timeout:.0f} s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--tiers", default="16k,128k")
    parser.add_argument("--profiles", default="regular,coding")
    parser.add_argument("--repetitions", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument(
        "--load-rates", default="", help="also a load sweep at these rates (e.g. 1,4,16)"
    )
    parser.add_argument("--load-tiers", default="1k,4k", help="the load sweep's prompts")
    parser.add_argument("--load-duration", default="20", help="seconds a load point")
    parser.add_argument("--load-only", action="store_true", help="no single-stream bench")
    parser.add_argument("--serve", default="", help="more options for transformers serve")
    args = parser.parse_args()
    extra = args.serve.split()
    args.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="sg-gpu-"))
    model = work / "model"
    maker = resources.files("servegate.demo") / "make_model.py"
    start = time.monotonic()
    subprocess.run(
        [
            sys.executable,
            "-c",
            maker.read_text(),
            str(model),
            "--hidden",
            "512",
            "--layers",
            "8",
            "--max-positions",
            "140000",
            "--no-eos",
        ],
        check=True,
    )
    print(f"model made in {time.monotonic() - start:.0f} s", flush=True)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "HF_HUB_CACHE": str(work / "hub"), "HF_HUB_OFFLINE": "1"}
    (work / "hub").mkdir()
    log = (args.out / "server.log").open("wb")
    server = subprocess.Popen(
        serve_command(model, port, extra), stdout=log, stderr=subprocess.STDOUT, env=env
    )
    try:
        wait_up(url, server, 300)
        served = str(model)
        print(f"transformers serve up in {time.monotonic() - start:.0f} s: {served}", flush=True)
        cfg = work / "bench.toml"
        cfg.write_text(
            "[bench]\n"
            f'tokenizer = "{model}"\n'
            f'tokenizer_python = "{sys.executable}"\n'
            "# random weights: the answers are noise in which a piece can repeat past the\n"
            "# field's 20 % (code text: `*` past 35 %) and words run long (127 of 128 words\n"
            "# in one 256-token answer): the content rules are off, as in the GPU demo;\n"
            "# every timing rule and the recount of usage stay\n"
            "max_dominant_ratio = 1.0\n"
            "min_unique_ratio = 0.0\n"
            "min_zlib_ratio = 0.0\n"
            f"min_text_tokens = {args.max_tokens // 4}\n"
        )
        command = [
            sys.executable,
            "-m",
            "servegate",
            "bench",
            "--config",
            str(cfg),
            "--url",
            url,
            "--engine",
            "transformers",
            "--model",
            served,
            "--tiers",
            args.tiers,
            "--profiles",
            args.profiles,
            "--repetitions",
            str(args.repetitions),
            "--max-tokens",
            str(args.max_tokens),
            "--seed",
            "-1",
            "--no-lease",
            "--output",
            str(args.out / "result.json"),
            "--server-command",
            " ".join(serve_command(model, port, extra)),
            "--system",
            f"{gpu_names()}, transformers serve, bfloat16",
            "--json",
        ]
        done = None
        if not args.load_only:
            done = subprocess.run(command, capture_output=True, text=True, check=False)
            (args.out / "bench.json").write_text(done.stdout)
            (args.out / "bench.stderr").write_text(done.stderr)
        if args.load_rates:
            load_cmd = [
                *command[:4], "load", "--config", str(cfg), "--url", url,
                "--engine", "transformers", "--model", served, "--rates", args.load_rates,
                "--duration", args.load_duration, "--tiers", args.load_tiers,
                "--profiles", "regular", "--max-tokens", "64", "--seed", "-1", "--no-lease",
                "--goodput", "ttft:1s,itl:50ms", "--output", str(args.out / "load.json"),
            ]  # fmt: skip
            swept = subprocess.run(load_cmd, capture_output=True, text=True, check=False)
            (args.out / "load.txt").write_text(swept.stdout + swept.stderr)
            print(swept.stdout[-6000:], flush=True)
        smi = subprocess.run(["nvidia-smi"], capture_output=True, text=True, check=False)
        (args.out / "nvidia-smi.txt").write_text(smi.stdout)
        if done is None:
            return 0
        result = json.loads((args.out / "result.json").read_text())
        print(
            f"servegate bench exited {done.returncode}; sizing: {json.dumps(result.get('sizing'))}"
        )
        head = f"{'case':<14}{'valid':>7}{'prompt':>8}{'TTFT s':>9}{'prefill tok/s':>15}"
        print(head + f"{'decode tok/s':>14}")
        for row in result["performance_table"]:
            print(
                f"{row['case']:<14}{row['valid_trials']:>3}/{row['trials']:<3}"
                f"{row['prompt_tokens'] or 0:>8.0f}{row['ttft_s'] or 0:>9.3f}"
                f"{row['prefill_tps'] or 0:>15,.0f}{row['generation_tps'] or 0:>14,.1f}"
            )
        for case in result["cases"]:
            for group in case["groups"]:
                for t in group["trials"]:
                    if not t["performance_valid"]:
                        print(f"{case['id']}: invalid — {t['reason_details']}"[:300])
        if done.returncode:
            print(done.stderr[-3000:])
        return done.returncode
    finally:
        server.terminate()
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
