"""Which GPU server is quiet enough for a 5 % gate: the within-start noise of
``transformers serve`` by model size, batching mode and environment, measured with the
gate's own bench settings.

    python3 benchmarks/gpu_server_noise.py --out DIR [--reps 8] [--tier 16k]
        [--max-tokens 64] [--config NAME:HIDDENxLAYERS[:FLAGS][:ENV=V,...] ...]

Run where ``gpu_gate_power.py`` runs (a CUDA GPU, torch, transformers and the ``transformers
serve`` extras; servegate on ``PYTHONPATH``). For each ``--config`` it makes (once per
shape) a random-weight Llama in bfloat16 on the GPU, serves it with ``transformers serve``
plus the config's flags and environment, warms it up, measures ``--reps`` trials of one
case exactly as the gate would, and stops it. Prints, and writes to
``server-noise.json``, per config: the median TTFT, prefill and decode rates, their
within-start CV, every trial's values, and the server's start time. Default configs: a
small model (hidden 1024, 16 layers) and a 2B-parameter one (hidden 4096, 16 layers),
each without and with ``--continuous-batching``, the larger one also with CUDA graphs and
under ``CUDA_LAUNCH_BLOCKING=1`` (a debugging setting a team could leave on).

On the H200 (``benchmarks/h200/server-noise.json``), the server's Python sets the pace
and the noise without CUDA graphs: within-start CV 3-16 % of TTFT and prefill, 4-14 % of
decode; with ``--continuous-batching --cb-use-cuda-graph`` 1.1 % and 0.5 %: the quiet
server for a 5 % gate (slower, though: it pads its batches).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from importlib import resources
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_gate_power import METRICS, Server, load_cfg, measure

DEFAULT_CONFIGS = [
    "small:1024x16",
    "small-cb:1024x16:--continuous-batching",
    "large:4096x16",
    "large-cb:4096x16:--continuous-batching",
    "large-cb-graph:4096x16:--continuous-batching --cb-use-cuda-graph",
    "large-blocking:4096x16::CUDA_LAUNCH_BLOCKING=1",
]


def parse(spec: str) -> dict[str, Any]:
    """``NAME:HIDDENxLAYERS[:FLAGS][:ENV=V,...]``."""
    parts = spec.split(":")
    hidden, layers = (int(x) for x in parts[1].split("x"))
    flags = parts[2].split() if len(parts) > 2 and parts[2] else []
    env = dict(kv.split("=", 1) for kv in parts[3].split(",")) if len(parts) > 3 else {}
    return {"name": parts[0], "hidden": hidden, "layers": layers, "flags": flags, "env": env}


def make(work: Path, hidden: int, layers: int) -> Path:
    model = work / f"model-{hidden}x{layers}"
    if not model.exists():
        maker = resources.files("servegate.demo") / "make_model.py"
        shape = ["--hidden", str(hidden), "--layers", str(layers), "--max-positions", "140000",
                 "--no-eos", "--dtype", "bfloat16", "--device", "cuda"]  # fmt: skip
        subprocess.run([sys.executable, "-c", maker.read_text(), str(model), *shape], check=True)
    return model


def cv(values: list[float]) -> float | None:
    if len(values) < 2:
        return None
    return round(statistics.stdev(values) / statistics.fmean(values), 4)


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--reps", type=int, default=8)
    parser.add_argument("--tier", default="16k")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--config", action="append", default=[])
    parser.add_argument("--deadline", type=float, default=0.0, help="seconds (0: none)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="sg-gpu-noise-"))
    started = time.monotonic()
    report: dict[str, Any] = {"tier": args.tier, "max_tokens": args.max_tokens, "configs": []}
    for spec in args.config or DEFAULT_CONFIGS:
        if args.deadline and time.monotonic() - started > args.deadline:
            print(f"deadline: {spec} not measured", flush=True)
            break
        c = parse(spec)
        row: dict[str, Any] = {**c}
        t0 = time.monotonic()
        model = make(work, c["hidden"], c["layers"])
        row["make_s"] = round(time.monotonic() - t0, 1)
        server = Server(c["name"], model, c["flags"], work, extra_env=c["env"])
        try:
            t0 = time.monotonic()
            server.start()
            row["start_s"] = round(time.monotonic() - t0, 1)
            cfg = load_cfg(work, model, args, "live")
            samples = measure(cfg, server, args.reps, work / f"{c['name']}.json")
            for cid, cs in samples.cases.items():
                for m in ("ttft_s", *METRICS):
                    values = [round(v, 4) for v in cs.metrics.get(m, [])]
                    row[f"{cid}:{m}"] = {
                        "median": statistics.median(values) if values else None,
                        "cv": cv(values),
                        "values": values,
                    }
        except (SystemExit, Exception) as exc:  # a config that fails is a finding too
            row["error"] = f"{type(exc).__name__}: {exc}"
            log = work / f"{c['name']}.log"
            row["log_tail"] = log.read_text(errors="replace")[-3000:] if log.exists() else ""
        finally:
            server.stop()
        report["configs"].append(row)
        summary = {k: (v["median"], v["cv"]) for k, v in row.items() if ":" in k}
        print(f"{c['name']}: start {row.get('start_s')} s {summary} {row.get('error', '')}",
              flush=True)  # fmt: skip
        (args.out / "server-noise.json").write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
